"""Compiling a worker's next group while it trains the current one (``CompileAhead``)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from ihsweep.configuration.grid import Plan
from ihsweep.runs import claims
from ihsweep.runs.rundir import read_status
from ihsweep.training import runner, stopping
from ihsweep.workers import compile_cache

log = logging.getLogger("ihsweep")

# Who compiles which group ahead in this process, (run directory, group id) -> its CompileAhead:
# sibling workers (threads: sweep.devices_per_worker) each take the next group nobody compiles
# yet, rather than all compiling the same one, and a worker that claims a group a sibling
# compiled ahead has the sibling drop what it built (``claimed``).
_AHEAD: dict = {}
_AHEAD_LOCK = threading.Lock()
_IN_FLIGHT: set = set()  # the _Compile threads not yet finished, in this process


def end_process_if_compiling(code: int) -> None:
  """After a stop request or an error (``code`` not 0), ends the process now with ``code`` (after
  flushing its logs and output) if a compile ahead is still in flight: the sweep has recorded
  everything, and a daemon thread still inside XLA when the interpreter finalizes aborts the
  process ("terminate called …") as it returns. After a sweep that ended normally (a compile a
  sibling's claim dropped may still run), and in a job of several processes (every process must
  reach jax.distributed's shutdown), it waits for the compiles instead. Returns when none is in
  flight."""
  import jax

  alive = [c for c in list(_IN_FLIGHT) if c.thread.is_alive()]
  if not alive:
    return
  if (code == 0 and not stopping.stop_requested()) or jax.process_count() > 1:
    log.info("waiting for %d compile(s) ahead to end", len(alive))
    for c in alive:
      c.thread.join()
    return
  import sys

  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os._exit(code)


class _Compile:
  """One group's compile on a daemon thread (a stop request never waits for it to finish)."""

  def __init__(self, group: runner.ResolvedGroup, run):
    self.group, self.dropped = group, False
    self.done = threading.Event()
    self._lock = threading.Lock()
    self.thread = threading.Thread(
      target=self._run, args=(run,), name=f"ihsweep-compile-{group.id}", daemon=True
    )
    _IN_FLIGHT.add(self)
    self.thread.start()

  def _run(self, run) -> None:
    try:
      run(self.group)  # logs its own errors
    except BaseException:  # noqa: BLE001, S110 — not an Exception (SystemExit, …): the thread ends
      pass
    finally:
      _IN_FLIGHT.discard(self)
      with self._lock:
        self.done.set()
        if self.dropped:  # a sibling took the group meanwhile: its parts are not needed here
          self.group.release()

  def drop(self) -> None:
    """The group went to another worker: release its parts now, or once the compile ends."""
    with self._lock:
      self.dropped = True
      if self.done.is_set():
        self.group.release()


class CompileAhead:
  """Compiles the programs of the group a worker will probably take next on a background thread
  while it trains the current one (``runner.precompile`` of the worker's ``ResolvedGroup``): its
  ``fit`` then runs the compiled programs, and another worker taking the group finds them in
  the persistent compilation cache.

  ``workers``: how many workers take these groups at once (this process's side by side, times
  the processes of a jax.distributed job; independent processes cannot be counted): those not
  holding a claim now will claim the first groups nobody holds, so those are not compiled
  here."""

  def __init__(self, plan: Plan, workdir: str, workers: int = 1):
    self.plan, self.workdir, self.workers = plan, workdir, workers
    self.on = compile_cache.enabled()
    self.pending: dict = {}  # group id → _Compile

  def after(self, group, worker) -> None:
    """Starts compiling a group of ``worker``'s (a ``sweep`` worker: its ``groups`` and
    ``resolve``) after ``group`` in plan order that nobody holds or has finished and no other
    worker of this process compiles ahead, as the worker resolved it, past the first free ones
    the workers holding no claim are about to take (another worker may still take it first:
    then it drops what it built, ``claimed``)."""
    groups = worker.groups
    if not self.on or group not in groups or self.pending:
      return
    free, held = [], 0
    for g in groups:
      state = read_status(self.workdir, g.id)["state"]
      if state in ("pending", "interrupted") and claims.read_claim(self.workdir, g.id) is None:
        free.append(g)
      elif state not in ("done", "failed"):
        held += 1
    # the workers holding no claim now take the first free groups: not compiled here
    skip = max(self.workers - held, 0)
    for later in groups[groups.index(group) + 1 :]:
      key = (self.workdir, later.id)
      if later in free:
        if skip > 0:
          skip -= 1
          continue
        with _AHEAD_LOCK:
          if key in _AHEAD:  # a sibling worker compiles it: the next one is this worker's
            continue
          _AHEAD[key] = self
        self.pending[later.id] = _Compile(worker.resolve(later), self._compile)
        return

  @staticmethod
  def _compile(group: runner.ResolvedGroup) -> None:
    try:
      seconds = runner.precompile(group)
      log.info("compiled group %s's programs ahead in %.1f s", group.id, sum(seconds.values()))
    except Exception as e:  # noqa: BLE001 — not fatal: the group's fit compiles it again
      log.warning(
        "compiling group %s ahead failed (its training compiles it again and reports any "
        "error): %s: %s",
        group.id,
        type(e).__name__,
        e,
      )

  def wait_for(self, group) -> bool:
    """Before training ``group``: lets a compilation of it that is under way finish (its fit
    then loads the programs rather than compiling them a second time beside it). Returns False
    without waiting further if a stop is requested meanwhile."""
    pending = self.pending.pop(group.id, None)
    if pending is None:
      return True
    with _AHEAD_LOCK:
      _AHEAD.pop((self.workdir, group.id), None)
    while not pending.done.wait(0.2):
      if stopping.stop_requested():
        return False
    return True

  def claimed(self, group_id: str) -> None:
    """This worker claimed ``group_id``: a sibling that compiled it ahead drops its parts."""
    with _AHEAD_LOCK:
      other = _AHEAD.get((self.workdir, group_id))
      if other is None or other is self:
        return
      del _AHEAD[(self.workdir, group_id)]
    other.drop(group_id)

  def drop(self, group_id: str) -> None:
    pending = self.pending.pop(group_id, None)
    if pending is not None:
      log.info("group %s: a sibling worker took it; its compile ahead here is dropped", group_id)
      pending.drop()

  def close(self) -> None:
    """Ends this worker's compiles ahead: their parts are released (a compile in flight
    finishes on its daemon thread, unwaited), and a later sweep in this process may compile
    them ahead again."""
    with _AHEAD_LOCK:
      for gid in list(self.pending):
        _AHEAD.pop((self.workdir, gid), None)
    for pending in self.pending.values():
      pending.drop()
    self.pending.clear()
