"""Running a sweep: workers take the planned groups (``ihsweep.configuration.grid``) and train
each as one vmapped ensemble (``runner.fit``); the run directory (``ihsweep.runs.rundir``) is
their only meeting point: no scheduler of our own.

Every ``ihsweep run`` process on the same
run directory is a **worker** over its own devices (``jax.local_devices()``, or the first
``mesh.num_devices`` of them): independent processes (SLURM job-array tasks, one per GPU or
several sharing one; one per TPU host; several local processes) or the processes of one
jax.distributed job. Inside such a job the sweep runs in phases (``phases``:
``phases.plan_phases``, computed alike by every process; ``sweep.processes_per_worker``):
in each, the processes form workers of p consecutive processes (``sharding.Team``) — p = 1:
process-local groups; p > 1: a worker spanning p hosts, whose first process claims and writes
and whose processes all train the group on a mesh over their devices — that take the phase's
groups; a process done with its share waits on the run directory for the phase's other groups
(``_wait_for_phase``), then all form the next phase's workers. A worker takes the next group
that is neither done nor held, most expensive first, by writing a claim in the group's
directory (``claims.try_claim``); it trains the group on as many of its devices as the
group's mesh can use (at most E · B: ``sharding.usable_devices``), refreshing the claim's
heartbeat, then takes the next. A group is trained by one worker at a time; a group whose
worker died (a dead pid on the same host, or a heartbeat older than
``IHSWEEP_CLAIM_STALE_S``) is taken over — by a worker still running (one with nothing left to
take waits for that while others hold groups, unless ``sweep.wait_to_take_over`` is False) or
by a rerun — and resumed from its last full-state checkpoint. A group that fails is recorded
and not retried by workers that saw it fail; a rerun retries it.

Run directory (``ihsweep run --workdir=DIR``)::

  DIR/config.json      the sweep's resolved config
  DIR/cells.csv        one row per cell (written before training; status columns refreshed)
  DIR/claims.jsonl     every claim, takeover and release: which worker trained which group
  DIR/workers.jsonl    each process's worker layout as it started (``ihsweep status`` shows it)
  DIR/sweep.json       summary: per-group state, budget, compute saved by early stops
  DIR/groups/g000/     one group's run directory (runner.fit) + status.json (+ claim.json
                       while a worker holds it)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import traceback

import numpy as np

from ihsweep.base import atomic, environment, sharding
from ihsweep.base.errors import IhsweepError, StorageFault
from ihsweep.configuration import config as config_lib
from ihsweep.configuration import grid as grid_lib
from ihsweep.configuration.fields import WorkdirError
from ihsweep.configuration.grid import Plan, make_plan
from ihsweep.runs import claims, ownership
from ihsweep.runs.rundir import group_dir, read_status, saved_steps, write_cells, write_status
from ihsweep.training import evaluation, resume, runner, stopping, worker_fit
from ihsweep.training import progress as progress_lib
from ihsweep.workers.compile_ahead import CompileAhead
from ihsweep.workers.sweep_progress import SweepProgress
from ihsweep.workers.sweep_status import summarize
from ihsweep.workers.worker_layout import Resolutions, Worker, phase_workers, phases

log = logging.getLogger("ihsweep")


class GroupFailed(IhsweepError, RuntimeError):
  """A group raised under several processes (recorded in its status.json); the sweep ends."""

  def __init__(self, group_id: str, error: Exception):
    self.group_id = group_id
    super().__init__(f"group {group_id} failed: {type(error).__name__}: {error}")


@dataclasses.dataclass
class SweepResult:
  groups: dict  # group id → status dict
  summary: dict
  interrupted: bool = False


def run(cfg, workdir: str, *, progress: bool = True) -> SweepResult:
  """Plans and trains a sweep into ``workdir`` (module docstring: layout and scheduling rule).

  Groups already ``done`` are skipped, partial ones resume from their checkpoints, failed ones
  are retried. A group that raises is recorded as ``failed`` (error and traceback in its
  ``status.json``) and the sweep goes on. A stop request (SIGTERM) checkpoints the running group,
  marks it ``interrupted`` and returns with ``interrupted=True``.

  Raises:
    ConfigError / DataError: before anything is compiled (``make_plan``; a group its worker's
      devices cannot train, ``worker_fit.check_sweep``; an unwritable workdir; a workdir
      holding a sweep with a different config).
  """
  import jax

  plan = make_plan(cfg)
  # Every group checked for the worker that would train it before the run directory exists,
  # as `ihsweep plan` checks it for the devices it plans: on a worker's slice of this process's
  # devices (all of them for sweep.devices_per_worker = 0), its memory on every device of a
  # multi-process job (the widest placement needs the least per device).
  job = len(jax.devices()) if jax.process_count() > 1 else 0
  worker_fit.check_sweep(cfg, plan, jax.local_devices(), job_devices=job)
  ownership.check_workdir(workdir, "sweep")
  # Every process of a jax.distributed job has checked the directory before any writes in it.
  sharding.barrier("ihsweep-workdir-checked")
  with progress_lib.logs_above_bars(progress):
    return _run_worker(cfg, plan, workdir, progress)


def _common(group) -> dict:
  """The status fields every state of a group records."""
  return {
    "cells": [c.id for c in group.cells],
    "num_steps": group.num_steps,
    "batch_size": int(group.cfg.train.batch_size),
    "context_size": int(group.cfg.train.context_size),
  }


def _done_status(group, out, common: dict) -> dict:
  """The ``status.json`` of a group ``fit`` trained to its end (``out``: its ``FitResult``)."""
  ids = [c.id for c in group.cells]
  diverged = {str(ids[j]): int(d) for j, d in enumerate(out.diverged_at) if d >= 0}
  crossed = {str(ids[j]): c for j, c in enumerate(out.crossed or []) if c is not None}
  if diverged:
    log.warning("group %s: cells %s diverged (loss NaN/inf; frozen)", group.id, ", ".join(diverged))
  # a finite final loss above ln V + 1 nat (evaluation.not_learning): diverged or did not learn
  stuck = {}
  if out.losses is not None:
    losses = np.asarray(out.losses, float)
    vocab = int(group.cfg.model.vocab_size)
    line, _ = evaluation.not_learning_line(losses, vocab, ids)
    stuck = {str(ids[j]): float(losses[j]) for j in evaluation.not_learning(losses, vocab)}
    if line:
      log.warning("group %s: %s", group.id, line)
  return dict(
    state="done",
    **common,
    step=out.step,
    stopped_early=out.stopped_early,
    diverged=diverged,
    not_learning=stuck,
    resumed_from=out.resumed_from,
    crossed=crossed,
    timings=out.timings.to_json(),
  )


def _stop_rule(cfg, group):
  if cfg.sweep.budget != "emergence":
    return None
  return evaluation.EmergenceStop(
    cfg.sweep.stop_metric, cfg.sweep.stop_threshold, cfg.sweep.stop_margin, len(group.cells)
  )


def _describe(group, i: int, n: int, common: dict) -> None:
  log.info(
    "group %s (%d/%d): cells %s, E = %d, B = %d, C = %d, %s updates (%s); law: "
    "transition near update %s",
    group.id,
    i + 1,
    n,
    grid_lib.ranges(common["cells"]),
    len(group.cells),
    common["batch_size"],
    common["context_size"],
    f"{group.num_steps:,}",
    group.cap_reason,
    f"{group.law_updates:,.0f}",
  )


PREPARE_LOCK = ".prepare.lock"  # held by the worker that writes a new sweep's first files


def _prepare(cfg, plan: Plan, workdir: str) -> None:
  """Writes config.json and cells.csv, or checks that a sweep already there has the same
  config. Workers starting together on a new directory take turns under ``PREPARE_LOCK`` (the
  first writes, the others then check against it); one that waits says on whom every few
  seconds, and a stop request ends the wait."""
  cells = os.path.join(workdir, "cells.csv")
  if not os.path.exists(cells):
    os.makedirs(workdir, exist_ok=True)
    while True:
      try:
        with atomic.brief_lock(os.path.join(workdir, PREPARE_LOCK), patience=5.0):
          if not os.path.exists(cells):  # config.json first: cells.csv says both are there
            resume.write_resolved_config(cfg, workdir)
            write_cells(plan, workdir)
            return
        break
      except atomic.LockBusy as e:
        if stopping.stop_requested():
          raise stopping.Interrupted(workdir, 0) from None
        log.warning("waiting for %s to write the sweep's config.json and cells.csv (%s)",
                    e.holder, "not answering for over 5 s: paused or hung")  # fmt: skip
  resume.check_resumable(cfg, workdir)
  resume.write_resolved_config(cfg, workdir)
  write_cells(plan, workdir)


def _next_group(groups: list, workdir: str, since: float, devices: list[str], siblings):
  """``(group, event, waiting)``: the first of ``groups`` (plan order: most expensive first)
  this worker now holds (``event``: "claimed" or "taken over"), else ``(None, None, waiting)``
  with ``waiting`` the groups other live workers hold. Claims take no lock
  (``claims.try_claim``). Groups this process's workers saw fail (or meet a storage fault) in
  this run are skipped."""
  waiting = []
  for group in groups:
    if group.id in siblings.faulted:
      continue
    status = read_status(workdir, group.id)
    if status["state"] == "done" or (
      status["state"] == "failed" and float(status.get("failed_at", 0)) >= since
    ):
      continue
    event = claims.try_claim(workdir, group.id, devices)
    if event:
      return group, event, []
    waiting.append(group.id)
  return None, None, waiting


class Siblings:
  """What the workers of one process share in a phase: a stop for all of them once one meets an
  error that ends the process (each stops at its next group boundary), every such error with
  its worker and group, and the groups that met a storage fault (no sibling retries them)."""

  def __init__(self, count: int = 1):
    self.count = count
    self.stop = threading.Event()
    self.errors: list = []  # (worker name, group id or None, exception)
    self.faulted: set = set()
    self.lock = threading.Lock()

  def failed(self, worker: str, group_id: str | None, error: BaseException) -> None:
    with self.lock:
      self.errors.append((worker, group_id, error))
    self.stop.set()


def _run_worker(cfg, plan: Plan, workdir: str, progress: bool) -> SweepResult:
  import jax

  atomic.record_lock_times(environment.get("IHSWEEP_LOCK_TIMES"))  # benchmarks/claims_lock.py
  steps = phases(cfg, plan)
  _prepare(cfg, plan, workdir)
  layout = layout_words(cfg, steps)
  claims.log_layout(workdir, layout)
  log.info(
    "sweep: %d cells in %d groups (%s budget); worker %s, %s; cells.csv in %s",
    len(plan.cells),
    len(plan.groups),
    plan.budget,
    claims.worker_id(),
    layout,
    workdir,
  )
  first = phase_workers(cfg, plan, steps[0])[0]
  tracker = SweepProgress(cfg, plan, workdir, first.devices, first.local, progress)
  tracker.report()
  result, trained = None, []
  shared = Resolutions()  # each group resolved once per device layout in this process
  try:
    for i, phase in enumerate(steps):
      workers = phase_workers(cfg, plan, phase, shared)
      if len(workers) > 1:
        result = _side_by_side(cfg, plan, workdir, workers, trained, tracker)
      else:
        ahead = CompileAhead(plan, workdir, _job_workers(workers))
        try:
          result = _work(
            cfg, plan, workdir, progress, workers[0], ahead, trained, tracker, Siblings()
          )
        finally:
          ahead.close()
      if jax.process_count() > 1 and i + 1 < len(steps):
        # Every process ends the phase together (the next one forms other workers): it waits
        # on the run directory until the phase's groups are finished, then meets the others;
        # a stop request in any process stops all of them here.
        _wait_for_phase(workdir, workers[0].groups, result.interrupted)
        if sharding.any_process(result.interrupted or stopping.stop_requested()):
          result.interrupted = True
          break
      elif jax.process_count() > 1 and not result.interrupted:
        # The last phase: a process done with its share still waits on the run directory for
        # the other workers' groups; exiting now would leave it in jax.distributed's shutdown
        # barrier, which ends every process of the job (the ones still training included)
        # after its timeout (300 s). Then its result reports the whole sweep.
        _wait_for_phase(workdir, workers[0].groups, False)
        result = _recorded_result(plan, workdir, stopping.stop_requested())
  finally:
    tracker.close()
  log.info("worker %s: trained %s", claims.worker_id(), ", ".join(trained) or "no group")
  return result


def _job_workers(workers: list) -> int:
  """How many workers take a phase's groups at once: this process's, times the job's processes
  over the processes of a worker (independent processes cannot be counted)."""
  import jax

  return len(workers) * max(jax.process_count() // len(workers[0].team.processes), 1)


def layout_words(cfg, steps: list) -> str:
  """How this process's workers are laid out, for the run log's first line: each phase's
  workers (of how many processes, or how many side by side in this process, of how many
  devices) and where the layout came from (``sweep.devices_per_worker``: given, or auto)."""
  import jax

  fixed = int(cfg.sweep.get("devices_per_worker", 0))
  per_process = len(config_lib.process_devices(cfg))
  parts = []
  for i, p in enumerate(steps):
    if p.processes_per_worker > 1:
      where = f"workers of {p.processes_per_worker} processes × {per_process} device(s)"
    else:
      size = p.devices_per_worker or per_process
      count = per_process // size
      where = (
        f"{count} worker(s) of {size} {jax.default_backend()} device(s) "
        f"{'side by side ' if count > 1 else ''}in {'each' if jax.process_count() > 1 else 'this'}"
        f" process"
      )
    parts.append(f"phase {i + 1}: {len(p.groups)} group(s) on {where}" if len(steps) > 1 else where)
  if fixed:
    source = f"sweep.devices_per_worker = {fixed}"
  elif int(cfg.mesh.num_devices):
    source = f"mesh.num_devices = {cfg.mesh.num_devices}: a group's mesh, a whole worker"
  else:
    source = "sweep.devices_per_worker = 0: auto, the plan's best layout for the groups' costs"
  return "; ".join(parts) + f" ({source})"


def _side_by_side(cfg, plan: Plan, workdir: str, workers: list, trained: list, tracker):
  """A phase's workers of this process over slices of its devices, one thread each (worker
  ``K`` named ``…/wK`` in claims): each claims, trains and records the phase's groups on its own
  slice as a separate process would (``_work``; the devices run the programs the threads
  dispatch side by side). A worker whose group fails records it and goes on; an error that ends
  a worker (a storage fault) stops its siblings at their next group boundary (``Siblings``),
  each such error is logged with its worker and group, and the first is raised once every
  worker has ended. Returns the phase's result as the run directory records it."""
  siblings = Siblings(len(workers))

  def work(index: int, worker: Worker) -> None:
    claims.set_thread_worker(index)
    ahead = CompileAhead(plan, workdir, _job_workers(workers))
    try:  # no per-group bars: several groups train at once; the sweep's line follows them
      _work(cfg, plan, workdir, False, worker, ahead, trained, tracker, siblings)
    except BaseException as e:  # noqa: BLE001 — raised below, after its siblings end
      siblings.failed(claims.worker_id(), getattr(e, "group_id", None), e)
    finally:
      ahead.close()

  threads = [
    threading.Thread(target=work, args=(i, worker), name=f"ihsweep-worker-{i}")
    for i, worker in enumerate(workers)
  ]
  for thread in threads:
    thread.start()
  for thread in threads:
    while thread.is_alive():  # in short waits: a signal (stop request) is handled meanwhile
      thread.join(0.5)
  log.info(
    "the %d workers of this process: trained %s", len(workers), ", ".join(trained) or "no group"
  )
  if siblings.errors:
    for name, group_id, e in siblings.errors:
      log.error(
        "worker %s ended%s: %s: %s",
        name,
        f" in group {group_id}" if group_id else "",
        type(e).__name__,
        e,
      )
    raise siblings.errors[0][2]
  return _recorded_result(plan, workdir, stopping.stop_requested())


def _wait_for_phase(workdir: str, groups: list, interrupted: bool) -> None:
  """Returns once every group of a phase is done or failed, or one was interrupted (here or by
  another worker), or this process is asked to stop: a process that finished its share of a
  phase waits on the run directory, not inside a collective, while the others train."""
  while not (interrupted or stopping.stop_requested()):
    states = [read_status(workdir, g.id)["state"] for g in groups]
    if "interrupted" in states or all(s in ("done", "failed") for s in states):
      return
    time.sleep(min(claims.claim_heartbeat_s(), 2.0))


def _fit_memory(worker: Worker, workdir: str) -> None:
  """Before any group trains: each of the worker's unfinished groups is resolved for the
  worker's devices (``runner.resolve``, once per device layout in the process:
  ``worker_layout.Resolutions``; validated and checked when the sweep was planned, its memory
  chosen here, compiled against the devices' capacity where it is known), so a group that fits
  at no setting is refused (``memory.DoesNotFit``) before hours of other groups."""
  for group in worker.groups:
    if read_status(workdir, group.id)["state"] != "done":
      worker.resolve(group)


def _work(
  cfg,
  plan: Plan,
  workdir: str,
  progress: bool,
  worker: Worker,
  ahead: CompileAhead,
  trained: list,
  tracker: SweepProgress,
  siblings: Siblings,
) -> SweepResult:
  """A worker's loop: claim the next of its groups, train it, record it (and report the
  sweep's progress: ``SweepProgress``); until none is left, a stop is requested, or a sibling
  worker of this process met an error that ends the process (``siblings.stop``: checked between
  groups).
  In a worker of several processes its lead claims and writes and tells the others which
  group (``sharding.lead_value``); all of them train it. Appends the ids of the groups it
  finished to ``trained`` (every phase's, for the sweep's last log line)."""
  import jax

  since, n = time.time(), len(plan.groups)
  _fit_memory(worker, workdir)
  # Inside a jax.distributed job a dead process ends the job: nobody is left to take over.
  wait = cfg.sweep.wait_to_take_over and jax.process_count() == 1
  interrupted, announced = False, None
  while True:
    if sharding.any_process(stopping.stop_requested(), worker.team):
      interrupted = True
      break
    if siblings.stop.is_set():
      log.warning("worker %s: stops, as a sibling worker ended in an error", claims.worker_id())
      break
    group, event, waiting = _agree_on_next(plan, worker, workdir, since, siblings)
    if group is None:
      # groups this process's other workers hold end with it: no takeover to wait for
      waiting = [g for g in waiting if not claims.held_here(workdir, g)]
      if not waiting or not wait:
        break
      if announced != waiting:
        log.info(
          "nothing left to take: waiting while other workers hold %s (to take over any "
          "whose worker dies)",
          ", ".join(waiting),
        )
        announced = waiting
      _sleep(claims.claim_heartbeat_s(), siblings.stop)
      continue
    announced = None
    if siblings.stop.is_set() and len(worker.team.processes) == 1:  # stopped while it claimed
      claims.release_claim(workdir, group.id, "pending")
      continue
    ahead.claimed(group.id)
    common, group_devices = _start_group(plan, workdir, worker, group, event)
    _describe(group, plan.groups.index(group), n, common)
    state = _train_group(
      cfg, plan, workdir, progress, worker, ahead, group, common, group_devices, trained, tracker,
      siblings,
    )  # fmt: skip
    if state == "lost":
      continue
    interrupted = state == "interrupted"
    tracker.report()
    if interrupted:
      break
  return _recorded_result(plan, workdir, interrupted)


def _sleep(seconds: float, stop: threading.Event) -> None:
  """Sleeps ``seconds``, or less once a stop is requested or ``stop`` is set."""
  end = time.monotonic() + seconds
  while time.monotonic() < end and not (stopping.stop_requested() or stop.is_set()):
    time.sleep(min(0.2, max(end - time.monotonic(), 0)))


def _agree_on_next(plan: Plan, worker: Worker, workdir: str, since: float, siblings) -> tuple:
  """``(group or None, claim event, groups others hold)``: the lead claims the next group
  (``_next_group``); a worker of several processes then agrees on it with its lead."""
  team = worker.team
  group, event, waiting = None, None, []
  if team.leads:
    group, event, waiting = _next_group(
      worker.groups, workdir, since, [str(d) for d in worker.devices], siblings
    )
  if len(team.processes) > 1:
    index = sharding.lead_value(plan.groups.index(group) if group else -1, team)
    group = plan.groups[index] if index >= 0 else None
  return group, event, waiting


def _start_group(plan: Plan, workdir: str, worker: Worker, group, event) -> tuple[dict, list]:
  """``(the status fields common to the group's records, its devices)`` for a group just
  claimed (``event``: how); its lead records it running."""
  team = worker.team
  common = _common(group)
  attempts = int(read_status(workdir, group.id).get("attempts", 0)) + 1
  common["attempts"] = attempts
  if event == "taken over":
    saved = bool(_state_steps(workdir, group))
    log.warning(
      "group %s: %s",
      group.id,
      "resuming from its last full-state checkpoint"
      if saved
      else "no full-state checkpoint was saved: training it from the start",
    )
  group_devices = list(worker.resolve(group).devices)
  common["devices"] = len(group_devices)
  if len(team.processes) > 1:
    common["processes"] = list(team.processes)
  if team.leads:
    write_status(workdir, group.id, state="running", **common, worker=claims.worker_id())
    write_cells(plan, workdir)
  return common, group_devices


def _state_steps(workdir: str, group) -> list[int]:
  """The updates of ``group``'s complete full-state checkpoints (``rundir.saved_steps``)."""
  return saved_steps(os.path.join(group_dir(workdir, group.id), "checkpoints", "state"))


def _train_group(
  cfg, plan, workdir, progress, worker, ahead, group, common, group_devices, trained, tracker,
  siblings,
) -> str:  # fmt: skip
  """Trains one claimed group and records how it ended: 'done' (appended to ``trained``,
  counted by ``tracker``), 'lost' (its claim was taken over meanwhile), 'interrupted', or
  'failed' (recorded; in a worker of several processes, raised as ``GroupFailed``)."""
  import jax

  me, several, lead = claims.worker_id(), len(worker.team.processes) > 1, worker.team.leads
  desc = f"{group.id} B={common['batch_size']} C={common['context_size']} E={len(group.cells)}"
  state = "failed"
  try:
    # A worker spanning processes: a peer that stops answering ends this process (the others
    # may wait for it inside the group's collectives), and the group is marked failed first.
    lost = sharding.when_peer_lost(
      lambda reason: write_status(
        workdir, group.id, state="failed", **common, error=reason, process=jax.process_index()
      )
    )
    # The claim's heartbeat beats from the claim on, through a wait for the compile-ahead.
    with (
      lost if several else contextlib.nullcontext(),
      claims.ClaimHeartbeat(workdir, group.id) if lead else _NoHeartbeat() as beat,
    ):
      if not ahead.wait_for(group):  # a stop request while its compile ahead runs
        raise stopping.Interrupted(group_dir(workdir, group.id), _saved_step(workdir, group))
      ahead.after(group, worker)
      out = runner.fit(
        worker.resolve(group),
        group_dir(workdir, group.id),
        progress=progress,
        desc=desc,
        stop_rule=_stop_rule(cfg, group),
        keep_bar=False,  # the sweep's bar and progress line follow the group
      )
    if beat.lost.is_set():
      log.error(
        "group %s: this worker's claim was taken over while it trained (it stopped "
        "answering for over %gs); its results are left to the new worker",
        group.id,
        claims.claim_stale_s(),
      )
      state = "lost"
      return state
    if lead:
      write_status(workdir, group.id, **_done_status(group, out, common), worker=me)
    state = "done"
    trained.append(group.id)
    tracker.finished(group, out, len(group_devices))
  except stopping.Interrupted as e:
    if lead:
      write_status(workdir, group.id, state="interrupted", step=e.step, **common, worker=me)
    state = "interrupted"
  except Exception as e:  # noqa: BLE001 — recorded, and the worker goes on
    fault = StorageFault.of(e, group_dir(workdir, group.id))
    if fault is not None:  # a storage fault: every later group would meet it; a rerun resumes
      state = "interrupted"
      _record_fault(workdir, group, common, me, fault, siblings)
      if fault is e:
        raise
      raise fault from e
    if lead and _in_use_by_another(e, workdir, group):
      state = "lost"
      return state
    _record_failure(workdir, group, common, me, e)
    if several:
      # The team's other processes may wait for this one inside the group's collectives,
      # so they cannot agree to skip it: end the sweep (a rerun retries).
      raise GroupFailed(group.id, e) from e
  finally:
    if group.id in worker.resolved:
      worker.resolved[group.id].release()
    if state != "lost" and lead:
      claims.release_claim(workdir, group.id, state)
    if lead:
      write_cells(plan, workdir)
  return state


def _in_use_by_another(e: Exception, workdir: str, group) -> bool:
  """Whether ``e`` says that another live worker trains ``group`` (its directory is locked,
  or the claim is no longer this worker's): then this worker backs off, records nothing and
  leaves the group to it (``claims.try_claim``'s rule), instead of recording it failed."""
  in_use = isinstance(e, WorkdirError) and "in use by" in str(e)
  if not (in_use or not claims.holds_claim(workdir, group.id)):
    return False
  log.warning(
    "group %s: another worker trains it (%s); left to it",
    group.id,
    f"its directory is in use: {e}" if in_use else "its claim was taken over",
  )
  return True


def _saved_step(workdir: str, group) -> int:
  """The update a rerun resumes ``group`` from: its last full-state checkpoint's, else 0."""
  return (_state_steps(workdir, group) or [0])[-1]


def _record_fault(workdir: str, group, common: dict, me: str, fault, siblings) -> None:
  """A storage fault in ``group``: said at once (with the worker), the group kept from this
  process's other workers (they would meet the same fault), and recorded 'interrupted' with
  the fault in its status.json where the storage still takes a small write."""
  fault.group_id = group.id
  siblings.faulted.add(group.id)
  siblings.stop.set()
  if siblings.count > 1:  # one worker: the process's last line says it, at once
    log.error("group %s: worker %s met a storage fault: %s", group.id, me, fault)
  with contextlib.suppress(OSError):
    write_status(
      workdir,
      group.id,
      state="interrupted",
      **common,
      worker=me,
      error=f"storage fault: {fault}",
      step=_saved_step(workdir, group),
    )


def _record_failure(workdir: str, group, common: dict, me: str, e: Exception) -> None:
  """Logs a group that raised ``e`` and records it failed, with the traceback being handled
  (call inside the ``except``)."""
  log.error("group %s failed: %s: %s", group.id, type(e).__name__, e)
  write_status(
    workdir,
    group.id,
    state="failed",
    **common,
    worker=me,
    error=f"{type(e).__name__}: {e}",
    traceback=traceback.format_exc(),
    failed_at=time.time(),
  )


def _recorded_result(plan: Plan, workdir: str, interrupted: bool) -> SweepResult:
  """Writes sweep.json from every group's status (``atomic.rewrite_when_free``: workers
  finishing together never wait on each other) and returns the sweep's result as the run
  directory now records it."""

  written = []

  def write() -> None:
    written.append(summarize(plan, workdir))
    atomic.atomic_write_json(os.path.join(workdir, "sweep.json"), written[-1])

  atomic.rewrite_when_free(os.path.join(workdir, ".sweep.lock"), write)
  summary = written[-1] if written else summarize(plan, workdir)
  return SweepResult(
    groups={g.id: read_status(workdir, g.id) for g in plan.groups},
    summary=summary,
    interrupted=interrupted,
  )


class _NoHeartbeat:
  """A team member that is not its lead keeps no claim: nothing to refresh."""

  def __enter__(self):
    import threading

    self.lost = threading.Event()
    return self

  def __exit__(self, *exc):
    return False
