"""Running a sweep: workers take the planned groups (``ihsweep.plan``) and train each as one
vmapped ensemble (``runner.fit``); the run directory (``ihsweep.rundir``) is their only meeting
point: no scheduler of our own.

Every ``ihsweep run`` process on the same
run directory is a **worker** over its own devices (``jax.local_devices()``, or the first
``mesh.num_devices`` of them): independent processes (SLURM job-array tasks, one per GPU or
several sharing one; one per TPU host; several local processes) or the processes of one
jax.distributed job. Inside such a job the sweep runs in phases (``phases``:
``placement.plan_phases``, computed alike by every process; ``sweep.processes_per_worker``):
in each, the processes form workers of p consecutive processes (``sharding.Team``) — p = 1:
process-local groups; p > 1: a worker spanning p hosts, whose first process claims and writes
and whose processes all train the group on a mesh over their devices — that take the phase's
groups; a process done with its share waits on the run directory for the phase's other groups
(``_wait_for_phase``), then all form the next phase's workers. A worker takes the next group
that is neither done nor held, most expensive first, by writing a claim in the group's
directory (``rundir.try_claim``); it trains the group on as many of its devices as the
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
  DIR/sweep.json       summary: per-group state, budget, compute saved by early stops
  DIR/groups/g000/     one group's run directory (runner.fit) + status.json (+ claim.json
                       while a worker holds it)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import traceback

from ihsweep import plan as plan_lib
from ihsweep import rundir
from ihsweep.errors import IhsweepError
from ihsweep.plan import Plan, make_plan
from ihsweep.rundir import group_dir, read_status, write_cells, write_status

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
    ConfigError / DataError: before anything is compiled (``make_plan``; an unwritable
      workdir; a workdir holding a sweep with a different config).
  """
  from ihsweep import runner, sharding

  plan = make_plan(cfg)
  rundir.check_workdir(workdir, "sweep")
  # Every process of a jax.distributed job has checked the directory before any writes in it.
  sharding.barrier("ihsweep-workdir-checked")
  with runner.logs_above_bars(progress):
    return _run_worker(cfg, plan, workdir, progress)


def _common(group) -> dict:
  """The status fields every state of a group records."""
  return {
    "cells": [c.id for c in group.cells],
    "num_steps": group.num_steps,
    "batch_size": int(group.cfg.train.batch_size),
    "context_size": int(group.cfg.train.context_size),
  }


def _done_status(group, out: dict, common: dict) -> dict:
  ids = [c.id for c in group.cells]
  diverged = {str(ids[j]): int(d) for j, d in enumerate(out["diverged_at"]) if d >= 0}
  crossed = {str(ids[j]): c for j, c in enumerate(out["crossed"] or []) if c is not None}
  if diverged:
    log.warning("group %s: cells %s diverged (loss NaN/inf; frozen)", group.id, ", ".join(diverged))
  timings = {k: round(float(v), 3) for k, v in (out.get("timings") or {}).items()}
  return dict(
    state="done",
    **common,
    step=out["step"],
    stopped_early=out["stopped_early"],
    diverged=diverged,
    resumed_from=out["resumed_from"],
    crossed=crossed,
    **({"timings": timings} if timings else {}),
  )


def _stop_rule(cfg, group):
  from ihsweep import runner

  if cfg.sweep.budget != "emergence":
    return None
  return runner.EmergenceStop(
    cfg.sweep.stop_metric, cfg.sweep.stop_threshold, cfg.sweep.stop_margin, len(group.cells)
  )


def _describe(group, i: int, n: int, common: dict) -> None:
  log.info(
    "group %s (%d/%d): cells %s, E = %d, B = %d, C = %d, %s updates (%s); law: "
    "transition near update %s",
    group.id,
    i + 1,
    n,
    plan_lib.ranges(common["cells"]),
    len(group.cells),
    common["batch_size"],
    common["context_size"],
    f"{group.num_steps:,}",
    group.cap_reason,
    f"{group.law_updates:,.0f}",
  )


class _Progress:
  """The sweep's progress, logged at its start and after each group this process trains (and
  drawn as a bar over the groups with ``progress``): the run directory's groups done / running
  / pending (a group whose worker is gone counts as pending: it is taken over), the tokens
  trained so far in all of them (done: up to their last update; others: their last logged
  update), and an ETA for the rest.

  The ETA ("~": an estimate) is the runtime model's seconds (``timing.runtime_model``: FLOPs at
  a share of the chip's peak; relative FLOPs on CPUs and unknown chips) for the updates left —
  each unfinished group's predicted updates (``placement.jobs_from_plan``: an 'emergence'
  budget's predicted stop) less those logged — scaled by measured / predicted seconds of the
  groups trained here (start-up included), and shared by the workers now training (this one
  and those holding groups). A group that stops early adds nothing more: its remaining updates
  are freed; with an 'emergence' budget the groups left are also expected to stop at the share
  of their predicted updates at which the groups finished here stopped (at most all of them).
  Before a group has finished here, the model's own seconds on a known chip, else no ETA."""

  def __init__(self, cfg, plan: Plan, workdir: str, devices: list, local: bool, progress: bool):
    from tqdm.auto import tqdm

    from ihsweep import placement, runner, timing

    self.plan, self.workdir = plan, workdir
    self.model = timing.runtime_model(devices)
    self.known_chip = self.model.flops_per_s > 1.0  # FlopsModel(1.0): relative FLOPs
    try:
      self.jobs = {j.id: j for j in placement.jobs_from_plan(cfg, plan)}
      self.devices = {g.id: len(runner.group_devices(g.cfg, devices, local)) for g in plan.groups}
    except Exception as e:  # noqa: BLE001 — the progress line must never stop a sweep
      log.debug("no runtime prediction for the sweep's progress: %s", e)
      self.jobs, self.devices = {}, {}
    self.measured_s = self.predicted_s = 0.0  # over the groups trained here
    self.trained_here = 0
    # Emergence budget: updates at which finished groups stopped, and their predicted updates.
    self.emergence = cfg.sweep.get("budget") == "emergence"
    self.stopped_at = self.planned = 0
    self.bar = tqdm(
      total=len(plan.groups),
      disable=not progress,
      desc="sweep",
      unit="group",
      dynamic_ncols=True,
      bar_format="{desc}: {n_fmt}/{total_fmt} groups done |{bar}| {elapsed}{postfix}",
    )

  def _seconds(self, group_id: str, updates: float) -> float:
    """The runtime model's seconds for ``updates`` of a group (its job's linear share)."""
    job = self.jobs[group_id]
    total = self.model.seconds(job, self.devices[group_id])["total_s"]
    return total * updates / max(job.updates, 1)

  def finished(self, group, out: dict, devices: int) -> None:
    """A group this process trained to its end (or early stop): its measured seconds against
    the model's for the updates it trained in this run."""
    updates = int(out["step"]) - int(out["resumed_from"] or 0)
    seconds = (out.get("timings") or {}).get("total_s")
    if group.id not in self.jobs or updates <= 0 or not seconds:
      return
    self.devices[group.id] = devices
    self.measured_s += float(seconds)
    self.predicted_s += self._seconds(group.id, updates)
    self.trained_here += 1
    self.stopped_at += int(out["step"])
    self.planned += self.jobs[group.id].updates

  def report(self) -> None:
    """Logs the progress line and refreshes the bar."""
    counts = {"done": 0, "running": 0, "pending": 0, "failed": 0}
    tokens, left_s, early = 0, 0.0, 0
    for group in self.plan.groups:
      status = read_status(self.workdir, group.id)
      state = rundir.group_state(self.workdir, group.id, status)
      per_update = (
        len(group.cells) * int(group.cfg.train.batch_size) * int(group.cfg.train.context_size)
      )
      if state == "done":
        step = int(status.get("step") or 0)
        early += bool(status.get("stopped_early"))
      else:
        step = rundir.last_step(os.path.join(group_dir(self.workdir, group.id), "train_log.jsonl"))
        step = int(step or 0)
        if group.id in self.jobs and state != "failed":
          planned = self.jobs[group.id].updates * self._stop_share()
          left_s += self._seconds(group.id, max(planned - step, 0))
      counts[state if state in counts else "pending"] += 1
      tokens += step * per_update
    eta, basis = self._eta(left_s, counts)
    log.info(
      "sweep progress: %d/%d groups done%s, %d running, %d pending%s; %s tokens trained; %s",
      counts["done"],
      len(self.plan.groups),
      f" ({early} stopped early)" if early else "",
      counts["running"],
      counts["pending"],
      f", {counts['failed']} failed" if counts["failed"] else "",
      f"{tokens:,}",
      basis,
    )
    self.bar.n = counts["done"]
    self.bar.set_postfix_str(f"{tokens:,} tokens; ETA {eta}", refresh=True)

  def _stop_share(self) -> float:
    """With an 'emergence' budget, the share of their predicted updates at which the groups
    finished here stopped (1 before any, or without that budget)."""
    if not self.emergence or not self.planned:
      return 1.0
    return min(self.stopped_at / self.planned, 1.0)

  def _eta(self, left_s: float, counts: dict) -> tuple[str, str]:
    """``(ETA as the bar shows it, the log line's ETA with what it is based on)``."""
    from ihsweep.prediction import duration

    if not counts["running"] and not counts["pending"]:
      return "—", "nothing left"
    if not self.jobs:
      return "?", "no ETA (no runtime prediction for this plan)"
    # Those holding groups, and this one while groups are left to take.
    workers = max(counts["running"] + (1 if counts["pending"] else 0), 1)
    if self.predicted_s > 0:
      ratio = self.measured_s / self.predicted_s
      eta = duration(left_s * ratio / workers)
      speed = self.model.flops_per_s / ratio  # what the model's FLOP/s per device came to
      share = self._stop_share()
      stops = (
        f", the groups left stopping at {share:.0%} of their predicted updates as those did"
        if share < 1
        else ""
      )
      return f"~{eta}", (
        f"ETA ~{eta}: the updates left at the {speed:.3g} FLOP/s per device (runtime model's "
        f"FLOPs) measured over the {self.trained_here} group(s) trained here, start-up "
        f"included{stops}; {workers} worker(s)"
      )
    if self.known_chip:
      eta = duration(left_s / workers)
      return f"~{eta}", (
        f"ETA ~{eta}: the updates left at the runtime model's {self.model.flops_per_s:.3g} FLOP/s "
        f"per device, no start-up; {workers} worker(s); measured speeds replace it as groups "
        f"finish"
      )
    return "?", "ETA once a group has finished here (no speed known for these devices yet)"

  def close(self) -> None:
    self.bar.close()


def _prepare(cfg, plan: Plan, workdir: str) -> None:
  """Writes config.json and cells.csv, or checks that a sweep already there has the same
  config (under the claims lock: workers may start together)."""
  from ihsweep import runner

  with rundir.claims_lock(workdir):
    if os.path.exists(os.path.join(workdir, "cells.csv")):
      runner.check_resumable(cfg, workdir)
    runner.write_resolved_config(cfg, workdir)
    write_cells(plan, workdir)


def _next_group(groups: list, workdir: str, since: float, devices: list[str]):
  """``(group, event, waiting)``: the first of ``groups`` (plan order: most expensive first)
  this worker now holds (``event``: "claimed" or "taken over"), else ``(None, None, waiting)``
  with ``waiting`` the groups other live workers hold."""
  waiting = []
  with rundir.claims_lock(workdir):
    for group in groups:
      status = read_status(workdir, group.id)
      if status["state"] == "done" or (
        status["state"] == "failed" and float(status.get("failed_at", 0)) >= since
      ):
        continue
      event = rundir.try_claim(workdir, group.id, devices)
      if event:
        return group, event, []
      waiting.append(group.id)
  return None, None, waiting


class _CompileAhead:
  """Compiles the programs of the group a worker will probably take next on a background thread
  while it trains the current one (``runner.precompile`` into the persistent compilation
  cache), so that the next ``fit`` loads them instead of compiling."""

  def __init__(self, plan: Plan, workdir: str):
    import concurrent.futures

    from ihsweep import compile_cache

    self.plan, self.workdir = plan, workdir
    self.on = compile_cache.enabled()
    self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ihsweep-compile")
    self.pending: dict = {}  # group id → future

  def after(self, group, groups: list, devices: list, local: bool) -> None:
    """Starts compiling the first of ``groups`` after ``group`` in plan order that nobody holds
    or has finished, for ``devices`` (another worker may take it first: then the cache still
    serves equal shapes)."""
    if not self.on or group not in groups:
      return
    for later in groups[groups.index(group) + 1 :]:
      if later.id in self.pending:
        return
      if (
        read_status(self.workdir, later.id)["state"] in ("pending", "interrupted")
        and rundir.read_claim(self.workdir, later.id) is None
      ):
        self.pending[later.id] = self.pool.submit(self._compile, later, devices, local)
        return

  def _compile(self, group, devices: list, local: bool) -> None:
    from ihsweep import runner

    try:
      seconds = runner.precompile(group.cfg, runner.group_devices(group.cfg, devices, local), local)
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


@dataclasses.dataclass
class _Worker:
  """Where a worker trains: its devices and the processes owning them (``sharding.Team``:
  this process alone for independent processes and process-local groups; several processes of
  a jax.distributed job for a worker spanning hosts), and the groups it may take."""

  devices: list
  team: object  # sharding.Team
  groups: list
  local: bool  # a process-local worker inside a jax.distributed job


def phases(cfg, plan: Plan) -> list:
  """The phases of a sweep inside a jax.distributed job of several processes
  (``placement.plan_phases``: in each, workers of ``processes_per_worker`` consecutive
  processes take that phase's groups; every process computes the same list). One phase of
  process-local workers holding every group when the job has one process.

  Raises:
    ConfigError: ``sweep.processes_per_worker`` that does not divide the process count, or
      with a group that cannot use all of a worker's devices; ``mesh.num_devices`` below a
      process's device count when a phase has workers spanning processes.
  """
  import jax

  from ihsweep import placement, timing
  from ihsweep.config import ConfigError

  n = jax.process_count()
  k = int(cfg.sweep.processes_per_worker)
  if n == 1:
    return [placement.Phase(1, tuple(g.id for g in plan.groups))]
  if k and n % k:
    raise ConfigError(
      "sweep.processes_per_worker", k, f"0 (chosen) or a divisor of the {n} processes of this job"
    )
  local = len(jax.local_devices())
  per_process = len(jax.local_devices()[: cfg.mesh.num_devices or None])
  try:
    steps = placement.plan_phases(
      placement.jobs_from_plan(cfg, plan),
      n,
      per_process,
      k,
      model=timing.runtime_model(jax.devices()),
    )
  except placement.LayoutError as e:
    why = str(e)  # the field and value once: ConfigError names them
    why = (
      why[len(f"sweep.processes_per_worker={k}: ") :]
      if why.startswith(f"sweep.processes_per_worker={k}: ")
      else why
    )
    raise ConfigError("sweep.processes_per_worker", k, why) from None
  if per_process < local and any(p.processes_per_worker > 1 for p in steps):
    # A team's mesh over part of each process's devices ends in mismatched collectives (gloo
    # aborts the job on CPU); refused before anything is compiled.
    raise ConfigError(
      "mesh.num_devices",
      cfg.mesh.num_devices,
      f"0 or {local} (all of a process's devices) when workers span processes "
      f"(sweep.processes_per_worker = {k}"
      f"{' chose phases with teams' if not k else ''}); or "
      f"sweep.processes_per_worker = 1 to keep every worker in one process",
    )
  return steps


def _phase_worker(cfg, plan: Plan, phase) -> _Worker:
  """This process's worker in ``phase``: the team of ``processes_per_worker`` consecutive
  processes it belongs to, their devices, and the phase's groups."""
  import jax

  from ihsweep import sharding

  k = int(phase.processes_per_worker)
  wanted = set(phase.groups)
  groups = [g for g in plan.groups if g.id in wanted]
  if k == 1:
    devices = jax.local_devices()[: cfg.mesh.num_devices or None]
    return _Worker(
      devices, sharding.Team((jax.process_index(),)), groups, local=jax.process_count() > 1
    )
  first = jax.process_index() // k * k
  team = sharding.Team(tuple(range(first, first + k)))
  per_process = len(jax.local_devices()[: cfg.mesh.num_devices or None])
  devices = []
  for p in team.processes:
    devices += [d for d in jax.devices() if d.process_index == p][:per_process]
  return _Worker(devices, team, groups, local=False)


def _run_worker(cfg, plan: Plan, workdir: str, progress: bool) -> SweepResult:
  import jax

  from ihsweep import runner, sharding

  steps = phases(cfg, plan)
  _prepare(cfg, plan, workdir)
  log.info(
    "sweep: %d cells in %d groups (%s budget); worker %s, %s; cells.csv in %s",
    len(plan.cells),
    len(plan.groups),
    plan.budget,
    rundir.worker_id(),
    "; ".join(
      f"phase {i + 1}: {len(p.groups)} group(s) on workers of {p.processes_per_worker} process(es)"
      for i, p in enumerate(steps)
    )
    if jax.process_count() > 1
    else f"{len(jax.local_devices())} {jax.default_backend()} device(s)",
    workdir,
  )
  ahead = _CompileAhead(plan, workdir)
  first = _phase_worker(cfg, plan, steps[0])
  tracker = _Progress(cfg, plan, workdir, first.devices, first.local, progress)
  tracker.report()
  result, trained = None, []
  try:
    for i, phase in enumerate(steps):
      worker = _phase_worker(cfg, plan, phase)
      result = _work(cfg, plan, workdir, progress, worker, ahead, trained, tracker)
      if jax.process_count() > 1 and i + 1 < len(steps):
        # Every process ends the phase together (the next one forms other workers): it waits
        # on the run directory until the phase's groups are finished, then meets the others;
        # a stop request in any process stops all of them here.
        _wait_for_phase(workdir, worker.groups, result.interrupted)
        if sharding.any_process(result.interrupted or runner.stop_requested()):
          result.interrupted = True
          break
      elif jax.process_count() > 1 and not result.interrupted:
        # The last phase: a process done with its share still waits on the run directory for
        # the other workers' groups; exiting now would leave it in jax.distributed's shutdown
        # barrier, which ends every process of the job (the ones still training included)
        # after its timeout (300 s). Then its result reports the whole sweep.
        _wait_for_phase(workdir, worker.groups, False)
        result = _recorded_result(plan, workdir, runner.stop_requested())
  finally:
    ahead.close()
    tracker.close()
  log.info("worker %s: trained %s", rundir.worker_id(), ", ".join(trained) or "no group")
  return result


def _wait_for_phase(workdir: str, groups: list, interrupted: bool) -> None:
  """Returns once every group of a phase is done or failed, or one was interrupted (here or by
  another worker), or this process is asked to stop: a process that finished its share of a
  phase waits on the run directory, not inside a collective, while the others train."""
  from ihsweep import runner

  while not (interrupted or runner.stop_requested()):
    states = [read_status(workdir, g.id)["state"] for g in groups]
    if "interrupted" in states or all(s in ("done", "failed") for s in states):
      return
    time.sleep(min(rundir.claim_heartbeat_s(), 2.0))


def _fit_memory(worker: _Worker, workdir: str) -> None:
  """Before any group trains: each of the worker's unfinished groups gets its memory setting
  for the worker's devices (``runner.resolve_memory``: compiled against the devices' capacity
  where it is known, recorded in the group's config), so a group that fits at no setting is
  refused (``memory.DoesNotFit``) before hours of other groups."""
  from ihsweep import runner

  for group in worker.groups:
    if read_status(workdir, group.id)["state"] == "done":
      continue
    devices = runner.group_devices(group.cfg, worker.devices, worker.local)
    group.cfg, _ = runner.resolve_memory(group.cfg, devices, f"group {group.id}")


def _work(
  cfg,
  plan: Plan,
  workdir: str,
  progress: bool,
  worker: _Worker,
  ahead: _CompileAhead,
  trained: list,
  tracker: _Progress,
) -> SweepResult:
  """A worker's loop: claim the next of its groups, train it, record it (and report the
  sweep's progress: ``_Progress``); until none is left.
  In a worker of several processes its lead claims and writes and tells the others which
  group (``sharding.lead_value``); all of them train it. Appends the ids of the groups it
  finished to ``trained`` (every phase's, for the sweep's last log line)."""
  import jax

  from ihsweep import runner, sharding

  me, since, n = rundir.worker_id(), time.time(), len(plan.groups)
  team, devices = worker.team, worker.devices
  _fit_memory(worker, workdir)
  several = len(team.processes) > 1
  lead = team.leads
  # Inside a jax.distributed job a dead process ends the job: nobody is left to take over.
  wait = cfg.sweep.wait_to_take_over and jax.process_count() == 1
  interrupted, announced = False, None
  while True:
    if sharding.any_process(runner.stop_requested(), team):
      interrupted = True
      break
    group, event, waiting = None, None, []
    if lead:
      group, event, waiting = _next_group(worker.groups, workdir, since, [str(d) for d in devices])
    if several:
      index = sharding.lead_value(plan.groups.index(group) if group else -1, team)
      group = plan.groups[index] if index >= 0 else None
    if group is None:
      if not waiting or not wait:
        break
      if announced != waiting:
        log.info(
          "nothing left to take: waiting while other workers hold %s (to take over any "
          "whose worker dies)",
          ", ".join(waiting),
        )
        announced = waiting
      time.sleep(rundir.claim_heartbeat_s())
      continue
    announced = None
    common = _common(group)
    attempts = int(read_status(workdir, group.id).get("attempts", 0)) + 1
    common["attempts"] = attempts
    if event == "taken over":
      log.warning(
        "group %s: taken over from a worker that stopped answering (claims.jsonl); "
        "resuming from its last checkpoint",
        group.id,
      )
    group_devices = runner.group_devices(group.cfg, devices, worker.local)
    common["devices"] = len(group_devices)
    if several:
      common["processes"] = list(team.processes)
    if lead:
      write_status(workdir, group.id, state="running", **common, worker=me)
      write_cells(plan, workdir)
    _describe(group, plan.groups.index(group), n, common)
    desc = f"{group.id} B={common['batch_size']} C={common['context_size']} E={len(group.cells)}"
    state = "failed"
    try:
      ahead.wait_for(group)
      ahead.after(group, worker.groups, devices, worker.local)
      # A worker spanning processes: a peer that stops answering ends this process (the others
      # may wait for it inside the group's collectives), and the group is marked failed first.
      lost = sharding.when_peer_lost(
        lambda reason: write_status(
          workdir, group.id, state="failed", **common, error=reason, process=jax.process_index()
        )
      )
      with (
        lost if several else contextlib.nullcontext(),
        rundir.ClaimHeartbeat(workdir, group.id) if lead else _NoHeartbeat() as beat,
      ):
        out = runner.fit(
          group.cfg,
          group_dir(workdir, group.id),
          progress=progress,
          desc=desc,
          stop_rule=_stop_rule(cfg, group),
          devices=group_devices,
          local=worker.local,
          keep_bar=False,  # the sweep's bar and progress line follow the group
        )
      if beat.lost.is_set():
        log.error(
          "group %s: this worker's claim was taken over while it trained (it stopped "
          "answering for over %gs); its results are left to the new worker",
          group.id,
          rundir.claim_stale_s(),
        )
        state = "lost"
        continue
      if lead:
        write_status(workdir, group.id, **_done_status(group, out, common), worker=me)
      state = "done"
      trained.append(group.id)
      tracker.finished(group, out, len(group_devices))
    except runner.Interrupted as e:
      if lead:
        write_status(workdir, group.id, state="interrupted", step=e.step, **common, worker=me)
      state, interrupted = "interrupted", True
    except runner.checkpoint.DiskFull:  # every later group would fail too; a rerun resumes
      state = "interrupted"
      raise
    except Exception as e:  # noqa: BLE001 — recorded, and the worker goes on
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
      if several:
        # The team's other processes may wait for this one inside the group's collectives,
        # so they cannot agree to skip it: end the sweep (a rerun retries).
        raise GroupFailed(group.id, e) from e
    finally:
      if state != "lost" and lead:
        rundir.release_claim(workdir, group.id, state)
      if lead:
        write_cells(plan, workdir)
    tracker.report()
    if interrupted:
      break
  return _recorded_result(plan, workdir, interrupted)


def _recorded_result(plan: Plan, workdir: str, interrupted: bool) -> SweepResult:
  """Writes sweep.json from every group's status (under the claims lock: workers finish
  together) and returns the sweep's result as the run directory now records it."""
  with rundir.claims_lock(workdir):
    summary = summarize(plan, workdir)
    rundir.atomic_write_json(os.path.join(workdir, "sweep.json"), summary)
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


def summarize(plan: Plan, workdir: str) -> dict:
  """Per-group state and totals: cells by state, diverged cells, and the compute the
  'emergence' budget saved (tokens not trained because a group stopped before its cap)."""
  groups, totals = [], {s: 0 for s in rundir.STATES}
  budget_tokens = used_tokens = 0
  for group in plan.groups:
    status = read_status(workdir, group.id)
    b, c = int(group.cfg.train.batch_size), int(group.cfg.train.context_size)
    e = len(group.cells)
    step = status.get("step")
    budget_tokens += e * group.num_steps * b * c
    if status["state"] == "done":
      used_tokens += e * step * b * c
    totals[status["state"]] += e
    groups.append(
      {
        "group": group.id,
        "state": status["state"],
        "cells": e,
        "batch_size": b,
        "context_size": c,
        "budget_updates": group.num_steps,
        "step": step,
        "stopped_early": status.get("stopped_early", False),
        "diverged": status.get("diverged", {}),
        "error": status.get("error"),
      }
    )
  done_budget = sum(
    g["cells"] * g["budget_updates"] * g["batch_size"] * g["context_size"]
    for g in groups
    if g["state"] == "done"
  )
  return {
    "cells": len(plan.cells),
    "groups": groups,
    "cells_by_state": totals,
    "diverged_cells": sum(len(g["diverged"]) for g in groups),
    "budget": plan.budget,
    "budget_tokens": budget_tokens,
    "done_budget_tokens": done_budget,
    "trained_tokens_done_groups": used_tokens,
    "saved_fraction": (1 - used_tokens / done_budget) if done_budget else 0.0,
  }


def format_summary(summary: dict) -> str:
  """The lines ``ihsweep run`` prints at the end."""
  by = summary["cells_by_state"]
  lines = [
    f"sweep: {summary['cells']} cells in {len(summary['groups'])} groups; cells "
    + ", ".join(f"{s}: {n}" for s, n in by.items() if n)
  ]
  if summary["diverged_cells"]:
    lines.append(f"diverged cells (loss NaN/inf, frozen): {summary['diverged_cells']}")
  if summary["budget"] == "emergence" and summary["done_budget_tokens"]:
    lines.append(
      f"early stops saved {summary['saved_fraction']:.1%} of the finished groups' "
      f"budget ({summary['done_budget_tokens'] - summary['trained_tokens_done_groups']:,}"
      f" of {summary['done_budget_tokens']:,} tokens)"
    )
  for g in summary["groups"]:
    if g["state"] == "failed":
      lines.append(f"  {g['group']} failed: {g['error']}")
  return "\n".join(lines)


class NotASweep(IhsweepError, ValueError):
  """A directory without a sweep's cells.csv."""


def status_rows(workdir: str, notes: list[str] | None = None) -> list[dict]:
  """Per-group state of a sweep directory, from its files only: ``group``, ``state`` (a
  'running' group whose claim is stale, or whose process is gone on this host, reads
  'stopped'), ``cells``, ``B``, ``C``, ``step`` (last logged update), ``budget``, ``diverged``
  cell ids, ``error``, ``worker`` (the claim's or the last status's; a worker spanning
  processes adds which) and ``reported_s_ago``
  (seconds since the claim's last heartbeat; None without a claim).

  A damaged or truncated cells.csv is read as the analysis reads it (``read_cells``,
  ``recover_cells``): the cells it lacks are rebuilt from the group directories, and one line
  naming the file and what was recovered is appended to ``notes``.

  Raises:
    NotASweep: no cells.csv in ``workdir``, or neither readable rows nor group directories.
  """
  import pandas as pd

  path = os.path.join(workdir, "cells.csv")
  found: list[str] = []
  cells, why = rundir.read_cells(path, found.append)
  if cells is None and not (
    os.path.exists(path) and os.path.isdir(os.path.join(workdir, "groups"))
  ):
    raise NotASweep(
      f"{workdir} is not a sweep run directory (no readable cells.csv: {why}); "
      f"`ihsweep run --config=FILE --workdir={workdir}` makes one"
    )
  if cells is None:
    found.append(f"it cannot be read as a cells table ({why})")
    cells = pd.DataFrame(
      {c: pd.Series(dtype=int) for c in (*rundir.REQUIRED_CELL_COLUMNS, "group")}
    )
  cells = rundir.recover_cells(workdir, cells, (), found.append)
  if found and notes is not None:
    notes.append(f"{path} is damaged or cut short: {'; '.join(found)}")
  if cells.empty:
    raise NotASweep(f"{path}: no usable rows, and no group directory to rebuild them from")
  rows = []
  for gid, members in cells.groupby("group", sort=True):
    status = read_status(workdir, gid)
    state = rundir.group_state(workdir, gid, status)
    claim = rundir.read_claim(workdir, gid)
    step = rundir.last_step(os.path.join(group_dir(workdir, gid), "train_log.jsonl"))
    first = members.iloc[0]
    budget = pd.to_numeric(
      members.get("budget_updates", pd.Series(dtype=float)), errors="coerce"
    ).max()
    rows.append(
      {
        "group": gid,
        "state": state,
        "cells": len(members),
        "B": int(first["batch_size"]),
        "C": int(first["context_size"]),
        "step": status.get("step", step) if state == "done" else (step or 0),
        "budget": int(status.get("num_steps", 0) if pd.isna(budget) else budget),
        "stopped_early": bool(status.get("stopped_early", False)),
        "diverged": sorted(int(c) for c in status.get("diverged", {})),
        "error": status.get("error"),
        "unreadable": status.get("unreadable", False),
        "unverified": status.get("unverified"),
        "worker": _worker_name((claim or status).get("worker"), status.get("processes")),
        "reported_s_ago": (time.time() - float(claim["heartbeat"])) if claim else None,
      }
    )
  return rows


def _worker_name(worker: str | None, processes: list | None) -> str | None:
  """The worker that holds or held a group: its (lead's) claim name, and for a worker spanning
  processes of a jax.distributed job, which ones (``processes`` of its status)."""
  if worker and processes and len(processes) > 1:
    return f"{worker} with processes {processes[0]}–{processes[-1]}"
  return worker


def format_status(workdir: str) -> str:
  """``ihsweep status``: one line per group and a count of cells by state (after a warning
  line when cells.csv is damaged: ``status_rows``)."""
  notes: list[str] = []
  rows = status_rows(workdir, notes)
  lines = [f"warning: {n}" for n in notes]
  lines.append(
    f"{'group':6s} {'state':11s} {'cells':>5s} {'B':>5s} {'C':>6s} {'updates':>17s}  notes"
  )
  counts: dict[str, int] = {}
  for r in rows:
    counts[r["state"]] = counts.get(r["state"], 0) + r["cells"]
    notes = []
    if r["stopped_early"]:
      notes.append("stopped early (emergence)")
    if r["diverged"]:
      notes.append(f"diverged cells {','.join(map(str, r['diverged']))}")
    if r["state"] == "stopped":
      notes.append("its worker is gone: a waiting worker or a rerun takes it over")
    elif r["state"] == "running" and r["worker"]:
      seen = r["reported_s_ago"]
      notes.append(
        f"worker {r['worker']}" + (f", last report {seen:.0f} s ago" if seen is not None else "")
      )
    if r["unreadable"]:
      notes.append("status.json unreadable: a rerun resumes it from its checkpoints")
    if r["unverified"]:
      notes.append(f"status.json says done, but {r['unverified']}: a rerun resumes it")
    if r["error"]:
      notes.append(r["error"].splitlines()[0][:120])
    lines.append(
      f"{r['group']:6s} {r['state']:11s} {r['cells']:5d} {r['B']:5d} {r['C']:6d} "
      f"{r['step']:>8,d}/{r['budget']:<8,d}  {'; '.join(notes)}"
    )
  lines.append("cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
  return "\n".join(lines)
