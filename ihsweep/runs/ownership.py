"""Which directories ihsweep may write: a new or empty one, or a run it made, and the lock that
keeps two runs out of one.

A run directory is ihsweep's once it holds ``RUN_MARKER``; runs made before the marker existed
are recognised by their layout (``run_kind``). Nothing else is ever written to: a user's
directory is refused untouched (``claim_workdir``). What a run directory holds (statuses,
``cells.csv``, the JSONL logs): ``rundir``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
import uuid

from ihsweep.base.atomic import LOCK_FILE, atomic_write_json, lock_text
from ihsweep.configuration import fields

RUN_MARKER = ".ihsweep-run"


# Our own files (lock, marker, write probes): a directory holding only these is empty.
_OURS = (".ihsweep.lock", RUN_MARKER, ".write-test.")


def _process_index() -> int:
  """This process's index in its jax.distributed job (0 alone). JAX is imported here, not at
  module level: ``ihsweep status`` reads run directories without it."""
  import jax

  return jax.process_index()


def _theirs(workdir: str) -> list[str]:
  """The entries of ``workdir`` ihsweep did not write before claiming it: all but ``_OURS`` and
  a ``logs/`` of launcher logs only (``launch/local_multiprocess.sh`` appends
  ``logs/process_<k>.log`` or ``logs/worker_<k>.log`` before the processes start)."""
  names = [n for n in os.listdir(workdir) if not n.startswith(_OURS)]
  logs = os.path.join(workdir, "logs")
  if (
    "logs" in names
    and os.path.isdir(logs)
    and all(re.fullmatch(r"(process|worker)_\d+\.log", n) for n in os.listdir(logs))
  ):
    names.remove("logs")
  return sorted(names)


def _ihsweep_config(workdir: str) -> bool:
  """Whether ``workdir/config.json`` is a config ihsweep resolved (its model/train/data
  sections)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      cfg = json.load(f)
  except (OSError, ValueError):
    return False
  return isinstance(cfg, dict) and {"model", "train", "data"} <= set(cfg)


def run_kind(workdir: str) -> str | None:
  """What ``workdir`` holds: ``"empty"`` (missing, or nothing but ihsweep's lock), ``"train"``
  (an ``ihsweep train`` run, or a group of a sweep), ``"sweep"`` (an ``ihsweep run`` sweep), or
  None (other files: not an ihsweep run). A run is recognised by ``RUN_MARKER``; one made
  before the marker existed by its ihsweep-resolved ``config.json`` beside ``cells.csv``
  (sweep) or ``checkpoints/`` (train); a sweep's not-yet-trained group directory
  (``SWEEP/groups/gNNN``) by its place.

  Raises:
    OSError: ``workdir`` is a file or cannot be listed.
  """
  try:
    names = _theirs(workdir)
  except FileNotFoundError:
    return "empty"
  marked = _marker_kind(workdir)
  if marked:
    return marked
  if sweep_group(workdir):
    return "train"
  if not names:
    return "empty"
  return _layout_kind(workdir)


def _marker_kind(path: str) -> str | None:
  """The ``kind`` in ``path``'s ``RUN_MARKER`` (``train`` or ``sweep``); None without one."""
  try:
    with open(os.path.join(path, RUN_MARKER)) as f:
      kind = json.load(f).get("kind")
    return kind if kind in ("train", "sweep") else None
  except (OSError, ValueError, AttributeError):
    return None


def run_identity(path: str) -> str | None:
  """What stays the same when a run directory is copied (``cp -a``, rsync) and differs between
  two runs: the ``run_id`` its ``RUN_MARKER`` holds (a random id written when the run was
  created), else, for a run made before ids, the marker's creation time with the resolved
  ``config.json``. None when there is no marker."""
  try:
    with open(os.path.join(path, RUN_MARKER)) as f:
      marker = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(marker, dict):
    return None
  if marker.get("run_id"):
    return str(marker["run_id"])
  try:
    with open(os.path.join(path, "config.json"), "rb") as f:
      config = hashlib.sha256(f.read()).hexdigest()
  except OSError:
    return None
  return f"{marker.get('created')}|{config}"


def _layout_kind(path: str) -> str | None:
  """``sweep`` or ``train`` by the layout a run made before the marker existed leaves: an
  ihsweep-resolved ``config.json`` beside ``cells.csv`` or ``checkpoints/``; else None."""
  if _ihsweep_config(path):
    if os.path.exists(os.path.join(path, "cells.csv")):
      return "sweep"
    if os.path.isdir(os.path.join(path, "checkpoints")):
      return "train"
  return None


def sweep_group(workdir: str) -> tuple[str, str] | None:
  """``(sweep directory, group id)`` when ``workdir`` is a group directory of a sweep
  (``SWEEP/groups/gNNN``, recognised by its place), else None.

  Raises:
    OSError: the would-be sweep directory is a file or cannot be listed.
  """
  path = os.path.abspath(workdir)
  groups = os.path.dirname(path)
  if os.path.basename(groups) == "groups" and run_kind(os.path.dirname(groups)) == "sweep":
    return os.path.dirname(groups), os.path.basename(path)
  return None


def enclosing_run(workdir: str) -> tuple[str, str] | None:
  """``(run directory, kind)`` of the nearest ihsweep run that holds ``workdir`` below it, else
  None. A sweep's own group directories (``SWEEP/groups/gNNN``, which the sweep creates and
  trains) do not count as inside it. Both the path as given and with symbolic links resolved
  are checked, so a link into a run is found too."""
  for path in dict.fromkeys((os.path.abspath(workdir), os.path.realpath(workdir))):
    child, parent = path, os.path.dirname(path)
    while parent != child:  # up to the root, whose dirname is itself
      kind = _marker_kind(parent) or _layout_kind(parent)
      if kind is not None:
        rel = os.path.relpath(path, parent).split(os.sep)
        own_group = (
          kind == "sweep" and len(rel) == 2 and rel[0] == "groups" and re.fullmatch(r"g\d+", rel[1])
        )
        if not own_group:
          return parent, kind
      child, parent = parent, os.path.dirname(parent)
  return None


def claim_workdir(workdir: str, kind: str | None = None, local: bool = False) -> None:
  """Checks that ``workdir`` may hold a run of ``kind`` (``train``, ``sweep``; None: either)
  and, given a kind, on process 0 (on this process with ``local``: a worker's process-local
  group) creates it and writes ``RUN_MARKER``. Refuses, touching
  nothing, a directory holding anything else: nothing of the user's is overwritten or deleted.

  Raises:
    WorkdirError: a non-empty directory that is no ihsweep run, a run of the other kind, a
      group directory of a sweep (unless ``kind`` is ``train``: the sweep trains it), a
      directory anywhere inside another run (``enclosing_run``: that run would later read or
      delete what is written there, e.g. its old full-state checkpoints), a symbolic link to
      nothing, or a directory that cannot be created or written.
  """
  outer = enclosing_run(workdir)
  if outer is not None:
    what = {"sweep": "an `ihsweep run` sweep", "train": "an `ihsweep train` run"}[outer[1]]
    raise fields.WorkdirError(
      workdir,
      "a directory outside every run directory",
      f"--workdir={workdir} is inside {outer[0]}, the run directory of {what}: that run reads "
      f"and deletes what it finds under its own directory; nothing was changed: give a "
      f"--workdir outside {outer[0]}",
    )
  if os.path.islink(workdir) and not os.path.exists(workdir):
    raise fields.WorkdirError(
      workdir,
      "an existing target",
      f"--workdir={workdir} is a symbolic link to "
      f"{os.readlink(workdir)}, which does not exist: create that directory, or give another "
      f"--workdir",
    )
  try:
    found = run_kind(workdir)
    # "train": the sweep's own fit. The path with links resolved too: a link to a sweep's
    # groups/ directory is that sweep's group all the same.
    group = (
      (sweep_group(workdir) or sweep_group(os.path.realpath(workdir))) if kind != "train" else None
    )
  except OSError as e:  # a file, a path through a file, an unreadable directory
    raise fields.WorkdirError(
      workdir, f"a directory this process can read and write ({e.strerror or e})"
    ) from None
  if group:
    raise fields.WorkdirError(
      workdir,
      "no group directory of a sweep",
      f"--workdir={workdir} is group {group[1]} of the sweep in {group[0]}: resume it with "
      f"`ihsweep run --workdir={group[0]}`",
    )
  if found is None or (kind and found not in ("empty", kind)):
    names = _theirs(workdir)
    what = {
      "train": "an `ihsweep train` run (use `ihsweep train` with it)",
      "sweep": "a sweep of `ihsweep run` (use `ihsweep run` with it)",
    }.get(found) or (
      f"files of its own ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) and no "
      f"ihsweep run"
    )
    runs = {"train": "an earlier train run", "sweep": "an earlier sweep"}.get(kind, "a run")
    raise fields.WorkdirError(
      workdir,
      f"a new or empty directory, or one that holds {runs} to resume; it "
      f"holds {what}; nothing was changed: use a new --workdir",
    )
  if kind is None or (_process_index() != 0 and not local):
    return
  path = os.path.join(workdir, RUN_MARKER)
  try:
    os.makedirs(workdir, exist_ok=True)
    if not os.path.exists(path):
      marker = {
        "kind": kind,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_id": uuid.uuid4().hex,  # run_identity: tells a copy of this run from another run
      }
      atomic_write_json(path, marker, indent=None)
  except OSError as e:
    raise fields.WorkdirError(
      workdir, f"a directory this process can write ({e.strerror or e})"
    ) from None


@contextlib.contextmanager
def workdir_lock(workdir: str, local: bool = False):
  """Holds an exclusive lock on ``workdir/.ihsweep.lock`` so that two runs never write one
  directory (``fcntl.flock``: released when the process ends, even by SIGKILL). In a
  multi-process run process 0 takes it for all (this process with ``local``: a worker's
  process-local group). Tries for a quarter of a second before giving up: another worker's
  ``atomic.lock_holder`` probe holds it for an instant.

  Raises:
    WorkdirError: another live process holds it.
  """
  if _process_index() != 0 and not local:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  f = open(os.path.join(workdir, LOCK_FILE), "a+")
  for attempt in range(6):
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      break
    except BlockingIOError:
      if attempt < 5:
        time.sleep(0.05)
        continue
      f.seek(0)
      holder = f.read().strip() or "another process"
      f.close()
      raise fields.WorkdirError(
        workdir,
        f"a directory no other run is using (in use by {holder}); wait for "
        f"that run or stop it (its progress: ihsweep status)",
      ) from None
  try:
    f.seek(0)
    f.truncate()
    f.write(f"{lock_text()}\n")
    f.flush()
    yield
  finally:
    f.close()


def check_workdir(workdir: str, kind: str | None = None) -> None:
  """Checks that ``workdir`` is new, empty or an ihsweep run to resume — of ``kind`` (``sweep``,
  ``train``) if given, which then marks it as one (``claim_workdir``); anything else is
  refused untouched — then creates it and checks that files can be written in it.

  Raises:
    WorkdirError: when it holds files that are no ihsweep run (of ``kind``) or is not a
      writable directory.
  """
  claim_workdir(workdir, kind)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write-test.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise fields.WorkdirError(
      workdir, f"a directory this process can write ({e.strerror or e})"
    ) from None
