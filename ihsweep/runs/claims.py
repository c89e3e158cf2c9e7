"""Claims: which worker trains which group of a sweep. The run directory is the only meeting
point of the workers (independent processes, SLURM array tasks, the processes of a
jax.distributed job, workers side by side in one process), and claims take no lock: a worker
claims a free group by creating ``groups/<id>/claim.json`` whole in one atomic step (a
complete temporary file hard-linked to that name, which fails if the name exists: the classic
lock-file idiom, atomic on local filesystems and NFS); refreshes the claim's heartbeat while
it trains (a complete file renamed over it); takes over a stale claim only after creating a
hard link named after that claim, which only one worker can do (``_take_over``); and removes
it when the group is finished. A paused or hung worker holds nothing another worker waits for.
Whether a claim's worker lives is decided by the group directory's lock
(``atomic.lock_holder``), which also keeps two workers from training one group should two
ever hold its claim. ``claims.jsonl`` logs every claim, takeover and release."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time

from ihsweep.base import environment
from ihsweep.base.atomic import (
  atomic_write_json,
  lock_holder,
  lock_text,
  name_thread_worker,
)

log = logging.getLogger("ihsweep")

CLAIM_FILE = "claim.json"
CLAIMS_LOG = "claims.jsonl"
WORKERS_LOG = "workers.jsonl"  # each process's worker layout as it started (``log_layout``)


def _claim_path(workdir: str, group_id: str) -> str:
  """``groups/<id>/claim.json``, in ``rundir.group_dir`` (not imported from there: rundir
  imports this module)."""
  return os.path.join(workdir, "groups", group_id, CLAIM_FILE)


def claim_heartbeat_s() -> float:
  """Seconds between a worker's claim refreshes (``IHSWEEP_CLAIM_HEARTBEAT_S``, default 10)."""
  return environment.claim_heartbeat_s()


def claim_stale_s() -> float:
  """Seconds without a refresh after which a claim is stale (``IHSWEEP_CLAIM_STALE_S``, default
  12 heartbeats, at least 3). Workers on several hosts compare their clocks with the heartbeat
  written by another: keep the hosts' clocks synchronised (NTP) and this well above the skew.
  On the claim's own host a dead pid makes it stale at once. A stale claim is still not taken
  over while a live process holds its group's directory (``try_claim``)."""
  return environment.claim_stale_s()


_thread_worker = threading.local()  # .index: this thread's worker in its process, if several


def set_thread_worker(index: int | None) -> None:
  """Names the calling thread worker ``index`` of its process (``sweep.devices_per_worker``:
  several workers in one process, one thread each); None: the process's one worker. The locks
  the thread takes name the worker too (``atomic.lock_text``)."""
  _thread_worker.index = index
  name_thread_worker(None if index is None else f"w{index}")


def worker_id() -> str:
  """This worker's name in claims: ``host:pid`` (``/pN`` added for process N of a
  jax.distributed job, ``/wK`` for worker K of several in one process)."""
  import jax  # here, not at module level: ``ihsweep status`` reads claims without JAX

  name = f"{socket.gethostname()}:{os.getpid()}"
  if jax.process_count() > 1:
    name = f"{name}/p{jax.process_index()}"
  index = getattr(_thread_worker, "index", None)
  return name if index is None else f"{name}/w{index}"


def read_claim(workdir: str, group_id: str) -> dict | None:
  """A group's claim (``worker``, ``host``, ``pid``, ``devices``, ``claimed``, ``heartbeat``:
  Unix time of the last refresh), or None if it has none (an unreadable claim reads as stale:
  ``heartbeat`` 0)."""
  return _read_claim(_claim_path(workdir, group_id))


def _read_claim(path: str) -> dict | None:
  try:
    with open(path) as f:
      claim = json.load(f)
    if isinstance(claim, dict) and "worker" in claim:
      return claim
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    pass
  return {"worker": "(unreadable claim)", "heartbeat": 0.0}


def held_here(workdir: str, group_id: str) -> bool:
  """Whether ``group_id``'s claim belongs to a worker of this process (a sibling thread:
  ``sweep.devices_per_worker``), which releases it before it ends and dies only with this
  process: nothing another worker of this process could take over."""
  claim = read_claim(workdir, group_id)
  return (
    bool(claim) and claim.get("host") == socket.gethostname() and (claim.get("pid") == os.getpid())
  )


def alive(status: dict) -> bool | None:
  """Whether a 'running' group's process still exists (None: another host, cannot tell)."""
  if status.get("host") != socket.gethostname() or "pid" not in status:
    return None
  try:
    os.kill(int(status["pid"]), 0)
    return True
  except ProcessLookupError:
    return False
  except PermissionError:
    return True


def claim_is_stale(claim: dict, now: float | None = None) -> bool:
  """Whether a claim's worker is gone: a dead pid on this host, or no heartbeat for
  ``claim_stale_s()`` seconds."""
  if alive(claim) is False:
    return True
  now = time.time() if now is None else now
  return now - float(claim.get("heartbeat", 0.0)) > claim_stale_s()


def group_state(workdir: str, group_id: str, status: dict) -> str:
  """``status["state"]``, except that a 'running' group whose worker is gone reads 'stopped':
  its process dead on this host, or its claim stale while no live process holds the group's
  directory (``try_claim``'s rule: a worker that is not answering but holds the directory, a
  paused or hung one, still reads 'running'; ``not_answering`` says so)."""
  if status["state"] != "running":
    return status["state"]
  claim = read_claim(workdir, group_id)
  if claim is None:
    return "stopped" if alive(status) is False else "running"
  if alive(claim) is False or (
    claim_is_stale(claim) and _group_lock_holder(workdir, group_id) is None
  ):
    return "stopped"
  return "running"


def not_answering(workdir: str, group_id: str) -> str | None:
  """Who holds a running group's directory while its claim has had no heartbeat for
  ``claim_stale_s()`` (a worker paused or hung: nothing takes the group over), else None."""
  claim = read_claim(workdir, group_id)
  if claim is None or not claim_is_stale(claim) or alive(claim) is False:
    return None
  return _group_lock_holder(workdir, group_id)


def _append_line(path: str, row: dict) -> None:
  """Appends ``row`` as one JSON line in a single ``write`` to a file opened for appending
  (``O_APPEND``): lines from several workers never interleave, and no lock is taken."""
  data = (json.dumps(row) + "\n").encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, data)
  finally:
    os.close(fd)


def log_layout(workdir: str, layout: str) -> None:
  """Appends this process's worker layout (``layout``: how its workers are laid out and why,
  the run log's words) to ``WORKERS_LOG``: ``ihsweep status`` names the layout of each process
  that holds a running group."""
  row = {"time": round(time.time(), 3), "process": worker_id(), "layout": layout}
  _append_line(os.path.join(workdir, WORKERS_LOG), row)


def read_layouts(workdir: str) -> dict[str, str]:
  """``{process name: its layout}`` from ``WORKERS_LOG`` (the last line per process; {} without
  the file; unreadable lines skipped)."""
  out = {}
  try:
    with open(os.path.join(workdir, WORKERS_LOG)) as f:
      for line in f:
        try:
          row = json.loads(line)
          out[str(row["process"])] = str(row["layout"])
        except (ValueError, KeyError, TypeError):
          continue
  except OSError:
    return {}
  return out


def _log_claim(workdir: str, event: str, group_id: str, **fields) -> None:
  row = {
    "time": round(time.time(), 3),
    "event": event,
    "group": group_id,
    "worker": worker_id(),
    **fields,
  }
  _append_line(os.path.join(workdir, CLAIMS_LOG), row)


def _complete_file(path: str, claim: dict) -> str:
  """``claim`` written whole to a temporary file beside ``path``; returns its name (for a hard
  link: ``atomic.atomic_file`` renames its temporary file, which would replace a claim)."""
  tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  try:
    os.write(fd, json.dumps(claim).encode())
  finally:
    os.close(fd)
  return tmp


def _write_claim(workdir: str, group_id: str, claim: dict) -> None:
  """Replaces claim.json by ``claim`` in one rename (a heartbeat, a reclaim)."""
  atomic_write_json(_claim_path(workdir, group_id), claim)


def _create_claim(path: str, claim: dict) -> bool:
  """Creates claim.json as ``claim`` if no claim is there: a complete file hard-linked to the
  name (``link`` fails if it exists; atomic on NFS too). Returns whether this call made it."""
  tmp = _complete_file(path, claim)
  try:
    os.link(tmp, path)
    return True
  except FileExistsError:
    return False
  finally:
    os.remove(tmp)


def _take_over(path: str, old: dict, claim: dict) -> bool:
  """Replaces the stale claim ``old`` at ``path`` by ``claim`` if no other worker does first:
  the taker hard-links the current claim.json to a name made of ``old``'s identity (its worker
  and heartbeat), which only one taker can create, checks that what it linked is ``old`` (not
  a refresh or a newer claim: compared by content, as inode numbers are reused at once), and
  only then renames its complete claim over it. Returns whether it did."""
  who = f"{old.get('worker')}.{old.get('heartbeat')}".replace("/", "-")
  marker = f"{path}.takeover.{who}"
  try:
    os.link(path, marker)
  except (FileExistsError, FileNotFoundError):
    return False  # another worker takes it over, or its worker released it
  try:
    if _read_claim(marker) != old:
      return False
    atomic_write_json(path, claim)
    return True
  finally:
    os.remove(marker)


def _group_lock_holder(workdir: str, group_id: str) -> str | None:
  return lock_holder(os.path.dirname(_claim_path(workdir, group_id)))


def _same_process(claim: dict) -> bool:
  return claim.get("host") == socket.gethostname() and claim.get("pid") == os.getpid()


_told: dict = {}  # (run directory, group id) -> why this process last left the group, once said


def _leave(workdir: str, group_id: str, why: str) -> None:
  """Says once per reason why this process leaves ``group_id`` to another worker."""
  key = (os.path.abspath(workdir), group_id)
  kind = why.split(":", 1)[0]
  if _told.get(key) != kind:
    _told[key] = kind
    log.info("group %s: %s", group_id, why)


def _ago(claim: dict, now: float) -> str:
  return f"{max(now - float(claim.get('heartbeat', 0.0)), 0.0):.0f} s ago"


def try_claim(workdir: str, group_id: str, devices: list[str]) -> str | None:
  """Claims ``group_id`` for this worker if nobody holds it or its claim is stale, taking no
  lock (module docstring). Returns None if another live worker holds it (or another worker
  claimed or took it over first), else the event logged: ``"claimed"`` or ``"taken over"``
  (from a stale claim, whose worker is named in the log). Why a group another process holds is
  left is logged once.

  The one rule of a takeover: the group's directory lock, not the claim's heartbeat, says
  whether its worker lives. A claim that looks stale (no refresh for ``claim_stale_s()``: a
  paused worker, a slow filesystem) is left alone while a live process holds the group's
  directory (``atomic.lock_holder``); only a dead or lockless holder's group is taken over."""
  import jax

  path = _claim_path(workdir, group_id)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  now = time.time()
  old = _read_claim(path)
  if old is not None and not claim_is_stale(old, now):
    if not _same_process(old):
      _leave(workdir, group_id, f"held: {old.get('worker')} trains it "
             f"(heartbeat {_ago(old, now)}); left to it")  # fmt: skip
    return None
  if old is not None:
    holder = _group_lock_holder(workdir, group_id)
    if holder is not None:
      _leave(
        workdir,
        group_id,
        f"not answering: its claim by {old.get('worker')} had its last heartbeat "
        f"{_ago(old, now)} (paused or hung), but its directory is held by {holder}, a live "
        "process: left to it",
      )
      return None
  claim = {
    "group": group_id,
    "worker": worker_id(),
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "process": jax.process_index(),
    "devices": devices,
    "claimed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "heartbeat": time.time(),
  }
  if not (_create_claim(path, claim) if old is None else _take_over(path, old, claim)):
    return None  # another worker claimed it or took it over first
  if old is None:
    _log_claim(workdir, "claimed", group_id, devices=devices)
    return "claimed"
  _log_claim(
    workdir,
    "taken over",
    group_id,
    devices=devices,
    previous=old.get("worker"),
    previous_heartbeat=old.get("heartbeat"),
  )
  log.warning(
    "group %s: taken over from %s, %s (claims.jsonl)",
    group_id,
    old.get("worker"),
    "whose process has died"
    if alive(old) is False
    else f"which stopped answering (last heartbeat {_ago(old, now)}) and holds nothing",
  )
  return "taken over"


def holds_claim(workdir: str, group_id: str) -> bool:
  """Whether ``group_id``'s claim is this worker's."""
  claim = read_claim(workdir, group_id)
  return claim is not None and claim.get("worker") == worker_id()


def refresh_claim(workdir: str, group_id: str) -> bool:
  """Refreshes this worker's claim on ``group_id`` (its heartbeat: a complete file renamed over
  claim.json); False if the claim is no longer this worker's (taken over after this worker
  stopped answering). A claim another worker wrote while this worker holds the group's
  directory lock (it trains the group; the other could not) is written back as this worker's
  and logged ``reclaimed``."""
  import jax

  me = worker_id()
  claim = read_claim(workdir, group_id)
  taken_from = False
  if claim is None or claim.get("worker") != me:
    if _group_lock_holder(workdir, group_id) != lock_text():
      return False
    taken_from = (claim or {}).get("worker")
    claim = {**(claim or {}), "group": group_id, "worker": me}
    claim.update(host=socket.gethostname(), pid=os.getpid(), process=jax.process_index())
  claim["heartbeat"] = time.time()
  _write_claim(workdir, group_id, claim)
  if taken_from is not False:
    _log_claim(workdir, "reclaimed", group_id, previous=taken_from)
  return True


def release_claim(workdir: str, group_id: str, state: str) -> None:
  """Removes this worker's claim on ``group_id`` (the group is ``state`` now); a claim that is
  no longer this worker's is left alone."""
  claim = read_claim(workdir, group_id)
  if claim is not None and claim.get("worker") == worker_id():
    with contextlib.suppress(FileNotFoundError):
      os.remove(_claim_path(workdir, group_id))
    _log_claim(workdir, "released", group_id, state=state)


class ClaimHeartbeat:
  """A daemon thread refreshing this worker's claim on a group every ``claim_heartbeat_s()``
  seconds while it trains (``with ClaimHeartbeat(workdir, group_id) as beat``); ``beat.lost``
  is set if the claim was taken over."""

  def __init__(self, workdir: str, group_id: str):
    self.workdir, self.group_id = workdir, group_id
    self.worker = getattr(_thread_worker, "index", None)  # the beat speaks for its worker
    self.lost = threading.Event()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name=f"ihsweep-claim-{group_id}", daemon=True)

  def _run(self) -> None:
    set_thread_worker(self.worker)
    while not self._stop.wait(claim_heartbeat_s()):
      try:
        if not refresh_claim(self.workdir, self.group_id):
          self.lost.set()
          return
      except OSError as e:  # a filesystem hiccup: the next beat tries again
        log.warning("could not refresh the claim on %s: %s", self.group_id, e)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
