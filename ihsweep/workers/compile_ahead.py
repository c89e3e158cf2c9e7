"""Compiling a worker's next group while it trains the current one (``CompileAhead``)."""

from __future__ import annotations

import logging
import threading

from ihsweep.configuration.grid import Plan
from ihsweep.runs import claims
from ihsweep.runs.rundir import read_status
from ihsweep.training import runner
from ihsweep.workers import compile_cache

log = logging.getLogger("ihsweep")

# Groups a worker of this process compiles ahead, (run directory, group id): sibling workers
# (threads: sweep.devices_per_worker) each take the next such group nobody compiles yet, rather
# than all compiling the same one.
_AHEAD: set = set()
_AHEAD_LOCK = threading.Lock()


class CompileAhead:
  """Compiles the programs of the group a worker will probably take next on a background thread
  while it trains the current one (``runner.precompile`` of the worker's ``ResolvedGroup``): its
  ``fit`` then runs the compiled programs, and another worker taking the group finds them in
  the persistent compilation cache."""

  def __init__(self, plan: Plan, workdir: str):
    import concurrent.futures

    self.plan, self.workdir = plan, workdir
    self.on = compile_cache.enabled()
    self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ihsweep-compile")
    self.pending: dict = {}  # group id → future
    self._mine: set = set()  # the ids this worker put in _AHEAD

  def after(self, group, worker) -> None:
    """Starts compiling the first of ``worker``'s groups (a ``sweep`` worker: its ``groups`` and
    ``resolve``) after ``group`` in plan order that nobody holds or has finished and no other
    worker of this process compiles ahead, as the worker resolved it (another worker may take it
    first: then the cache still serves equal shapes)."""
    groups = worker.groups
    if not self.on or group not in groups:
      return
    for later in groups[groups.index(group) + 1 :]:
      if later.id in self.pending:
        return
      key = (self.workdir, later.id)
      if (
        read_status(self.workdir, later.id)["state"] in ("pending", "interrupted")
        and claims.read_claim(self.workdir, later.id) is None
      ):
        with _AHEAD_LOCK:
          if key in _AHEAD:  # a sibling worker compiles it: the next one is this worker's
            continue
          _AHEAD.add(key)
        self._mine.add(later.id)
        self.pending[later.id] = self.pool.submit(self._compile, worker.resolve(later))
        return

  def _compile(self, group: runner.ResolvedGroup) -> None:
    try:
      seconds = runner.precompile(group)
      log.info("compiled group %s's programs ahead in %.1f s", group.id, sum(seconds.values()))
    except Exception as e:  # noqa: BLE001 — its fit reports any real error
      log.debug("compiling group %s ahead failed: %s", group.id, e)

  def wait_for(self, group) -> None:
    """Before training ``group``: lets a compilation of it that is under way finish (its fit
    then loads the programs rather than compiling them a second time beside it)."""
    future = self.pending.pop(group.id, None)
    if future is not None:
      future.result()

  def close(self) -> None:
    self.pool.shutdown(wait=False, cancel_futures=True)
    with _AHEAD_LOCK:  # a later sweep in this process compiles them ahead again
      _AHEAD.difference_update((self.workdir, gid) for gid in self._mine)
    self._mine.clear()
