"""Placing a sweep's groups on N devices and predicting its time (``ihsweep plan``): no training.

The rule (``ihsweep.workers.sweep``): the N devices form workers
  that take the planned groups in plan order (most expensive first) and dynamically: a worker
  that finishes takes the next pending group. A group trains on the largest number m of its
  worker's D devices its mesh can use (``sharding.usable_devices``: at most E · B); the
  worker's other D − m devices idle meanwhile. Simulated by list scheduling
  (``list_schedule.simulate``): each group, in plan order, starts on the worker that frees first
  (the lowest index among ties). Inside one jax.distributed job of P processes of d devices the
  sweep runs in **phases** (``phases.plan_phases``, ``phases.Phase``): in each, the processes
  form teams of p consecutive processes (p = 1: one process's local devices; p = P: one global
  mesh) that take that phase's groups, a group going to teams of p > 1 only if its mesh uses all
  p · d devices; a phase starts when the previous one has finished its groups. Independent
  processes (no jax.distributed) are one phase of p = 1.

Makespan = the last group's end; utilisation = the busy share of device-time,
Σ_g m_g · t_g / (N · makespan) (a device is busy while a group's mesh holds it, idle devices of a
worker whose group cannot use them all are not).

Time t_g of a group on m devices comes from a throughput model (``ihsweep.planning.timing``): a
given FLOP/s per device (perfect data-parallel scaling inside a worker, no start-up), or times
measured on this machine with the trainer's own programs.

Updates per group: its budget (``grid.Group.num_steps``), except under the 'emergence' budget,
whose groups stop at ``sweep.stop_margin`` × the first evaluation at which every model has
emerged: predicted from an emergence law (``predicted_updates``), capped by the budget.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
from typing import Any

from ihsweep.base.numbers import divisors
from ihsweep.compute import model as model_lib
from ihsweep.compute import schedule, train
from ihsweep.compute import schedule as schedule_lib
from ihsweep.configuration import fields
from ihsweep.configuration import grid as grid_lib
from ihsweep.data import documents
from ihsweep.data.probes import eval_layout
from ihsweep.planning import timing
from ihsweep.planning.list_schedule import (
  DEFAULT_DEVICES_PER_HOST,
  LAYOUT_TIE,
  Job,
  LayoutError,
  Schedule,
  candidate_layouts,
  choose_layout,
  worker_schedule,
)
from ihsweep.planning.phases import (
  MAX_PHASES,
  PHASE_TIE,
  PhasedSchedule,
  choose_local_devices,
  fills,
  plan_phases,
  timed_phase,
)
from ihsweep.planning.prediction import Prediction, local_workers

# ---- updates: the budget, or where an 'emergence' budget stops ----


def predicted_updates(cfg, group, law=None) -> tuple[int, str]:
  """``(updates, why)`` for a planned group. Budgets other than 'emergence' train the whole
  budget. 'emergence': the group stops at the first evaluation step at or after
  ``stop_margin`` × s, s the first evaluation step at or after the law's UPT(B, C) (when the
  models emerge), capped by the budget (``law``: an emergence law, default the sweep's)."""
  sweep = cfg.sweep
  cap = int(group.num_steps)
  if sweep.budget != "emergence":
    return cap, group.cap_reason

  every = schedule_lib.eval_interval(group.cfg)
  b, c = int(group.cfg.train.batch_size), int(group.cfg.train.context_size)
  upt = law.updates(b, c) if law is not None else group.law_updates
  crossed = math.ceil(upt / every) * every
  stop = math.ceil(sweep.stop_margin * crossed / every) * every
  if stop >= cap:
    return cap, f"cap ({group.cap_reason}): the law's stop {stop:,} is past it"
  return stop, f"stop at {sweep.stop_margin:g} × emergence near {upt:,.0f} (law), cap {cap:,}"


def jobs_from_plan(cfg, plan, law=None) -> list[Job]:
  """The plan's groups as jobs (plan order), with predicted updates."""
  jobs = []
  for g in plan.groups:
    updates, _ = predicted_updates(cfg, g, law)
    jobs.append(
      Job(
        id=g.id,
        n_models=int(g.cfg.ensemble.size),
        batch_size=int(g.cfg.train.batch_size),
        context_size=int(g.cfg.train.context_size),
        updates=updates,
        flops_per_update=g.cost_flops / max(g.num_steps, 1),
        cells=tuple(c.id for c in g.cells),
        cap_updates=int(g.num_steps),
        n_params=int(g.n_params),
        cfg=g.cfg,
        eval_parts=evaluation_flops(g.cfg, updates),
      )
    )
  return jobs


def evaluation_flops(cfg, updates: int) -> tuple:
  """Forward FLOPs of a group's online evaluations over ``updates`` updates, ``((probe FLOPs,
  eval.n_probes), (sequence FLOPs, eval.n_sequences))`` (``()`` without evaluation):
  evaluations at update 0, every ``schedule.eval_interval`` updates and at the end, each
  running every model on ``eval.n_probes`` probes of T tokens and ``eval.n_sequences``
  held-out sequences of C tokens at a third of the training FLOPs per token (PaLM appendix B:
  forward = 2N + 4·L·d·T of 6N + 12·L·d·T; ``model.flops_per_token``)."""
  every = schedule.eval_interval(cfg)
  if not every:
    return ()
  n_evals = updates // every + 1 + (1 if updates % every else 0)
  mcfg, _ = train.model_and_train_config(cfg)
  c = int(cfg.train.context_size)
  _, t = eval_layout(cfg.eval, c)
  n, s = int(cfg.eval.n_probes), int(cfg.eval.n_sequences)
  scale = n_evals * int(cfg.ensemble.size) / 3.0
  return (
    (scale * n * t * model_lib.flops_per_token(mcfg, t), n),
    (scale * s * c * model_lib.flops_per_token(mcfg, c), s),
  )


@contextlib.contextmanager
def data_unchecked():
  """``make_plan`` checks that each group's corpus can be found (``documents.document_source``);
  a plan from a given FLOP/s reads no data, so a machine without the corpus (C4 at study
  scale) may plan: that one check is skipped meanwhile (a stopgap until ``make_plan`` takes an
  option for it)."""
  from unittest import mock

  with mock.patch.object(documents, "document_source", lambda data_cfg: None):
    yield


def make_jobs(cfg, law=None, check_data: bool = True) -> tuple[Any, list[Job]]:
  """``(plan, jobs)`` for a sweep config, planned for any device count: ``grid.make_plan``
  validates every group's settings, none of the device rules, with the placement fields that
  would bind a device count reset (``sweep.placement = 'worker'``, ``mesh.num_devices = 0``,
  ``sweep.processes_per_worker = 0``, ``sweep.devices_per_worker = 0``); this machine's devices
  are not consulted. Whether each group fits the devices planned is checked by
  ``training.worker_fit.check_sweep`` on those devices (``ihsweep plan``, as ``ihsweep run``
  does on its own), and the placement rules are applied by ``plan_phases`` and
  ``worker_schedule``.

  Raises:
    ConfigError, DataError (``check_data``), LawError: as ``grid.make_plan``.
  """
  cfg = copy.deepcopy(cfg)
  with cfg.unlocked():
    if "sweep" not in cfg:
      cfg.sweep = fields.default_sweep()
    cfg.sweep.placement = "worker"
    if "processes_per_worker" in cfg.sweep:
      cfg.sweep.processes_per_worker = 0
    if "devices_per_worker" in cfg.sweep:  # checked by predict against the planned processes
      cfg.sweep.devices_per_worker = 0
    cfg.mesh.num_devices = 0
  with contextlib.nullcontext() if check_data else data_unchecked():
    plan = grid_lib.make_plan(cfg)
  return plan, jobs_from_plan(cfg, plan, law)


# ---- one prediction: both rules, the layouts, and how it reads ----


def processes_of(n_devices: int, devices_per_host: int) -> tuple[int, int]:
  """``(P, d)``: N devices as P processes (hosts) of d devices: d = one host's devices where
  they divide N, else the largest divisor of N up to a host (N smaller than a host: one
  process of N)."""
  d = max(k for k in divisors(n_devices) if k <= devices_per_host)
  return n_devices // d, d


def layout_schedule(
  jobs, model, n_devices: int, devices_per_worker: int, devices_per_process: int
) -> Schedule:
  """One phase of N / D workers of D devices (``worker_schedule``). D up to a process's
  devices: a group may use part of its worker; D a multiple of them (a worker of D / d
  processes): refused unless every group's mesh uses all D (``fills``)."""
  if devices_per_worker > devices_per_process:
    short = [j for j in jobs if not fills(j, devices_per_worker)]
    if short:
      j = short[0]
      return Schedule(
        "worker",
        n_devices,
        devices_per_worker,
        [],
        refused=f"{len(short)} of {len(jobs)} groups cannot use all "
        f"{devices_per_worker} devices, e.g. group {j.id} (E = "
        f"{j.n_models}, B = {j.batch_size})",
      )
  why = model.cannot_time(devices_per_worker)
  if why:
    return Schedule("worker", n_devices, devices_per_worker, [], unpredicted=why)
  return worker_schedule(jobs, model, n_devices, devices_per_worker)


def predict(
  cfg,
  n_devices: int,
  *,
  devices_per_worker: int | None = None,
  devices_per_host: int | None = None,
  flops_per_s: float | None = None,
  network=None,
  law=None,
  log=lambda line: None,
) -> Prediction:
  """Plans ``cfg``'s sweep on ``n_devices``. With ``flops_per_s`` the time is
  FLOPs-based (``timing.FlopsModel``, communication priced on ``network``, a ``chips.Network``,
  or none for None; data is not read); without, measured on this machine
  (``timing.MeasuredModel``: compiles and times a few groups, printing progress to ``log``).

  The N devices are P processes of d (``processes_of``: d = ``devices_per_host``, default
  ``DEFAULT_DEVICES_PER_HOST``, with ``flops_per_s``; measured, this machine's device count).
  The phases (``plan_phases``, chosen and timed with the model; a jax.distributed
  job chooses with ``timing.runtime_model``: relative FLOPs, or on a known accelerator its
  FLOP/s and network): ``devices_per_worker`` D, else the config's
  ``mesh.num_devices`` (a worker uses at most that many), give one phase of N / D workers (D a
  divisor of N up to a host, or a multiple of d: workers of D / d processes); else the config's
  ``sweep.processes_per_worker`` k >= 1 one phase of teams of k processes; else (0) the phases
  ``plan_phases`` chooses; a phase of process-local workers runs workers of the config's
  ``sweep.devices_per_worker`` side by side in each process, or (0, auto: what ``ihsweep run``
  does) of the D ``choose_local_devices`` finds fastest. The one-phase layouts beside them: D
  alone when given, else — FLOPs — every divisor of N up to a host and every team of several
  processes (``layout_schedule``); measured, d; and the phases' own D where they are one
  phase. The best of them (``best_layout``): the phases' layout, unless one is faster.

  Raises:
    LayoutError: a D that fits neither a host nor whole processes, a team some group cannot
      fill, or a ``sweep.processes_per_worker`` that does not divide P (the CLI checks its
      flags first; the config's fields are checked here).
    ConfigError, DataError, LawError: as ``grid.make_plan``.
  """
  # `run`'s check of the field, against the N devices planned (a ConfigError: one line)
  hint = f" (0 = as many of the {n_devices} devices as a group can use)"
  fields.check(cfg, "mesh.num_devices", hi=n_devices, hint=hint)
  plan, jobs = make_jobs(cfg, law, check_data=flops_per_s is None)
  model, host, n_processes, per_process = _throughput(
    jobs, n_devices, devices_per_host, flops_per_s, network, log
  )
  configured = int(cfg.mesh.num_devices)
  sweep = cfg.get("sweep", {})
  fixed = devices_per_worker or configured
  if fixed:
    source = "--devices_per_worker" if devices_per_worker else "the config's mesh.num_devices"
    sizes, phases, reason = _fixed_phases(
      jobs, model, n_devices, host, n_processes, per_process, fixed, source, devices_per_worker
    )
  else:
    if flops_per_s is not None:
      sizes = candidate_layouts(n_devices, per_process) + [
        p * per_process for p in divisors(n_processes) if p > 1
      ]
    else:
      sizes = [per_process]
    phases, reason = _default_phases(jobs, model, sweep, n_processes, per_process, flops_per_s)
  if len(phases) == 1 and phases[0].devices_per_worker not in sizes:
    sizes = sorted([*sizes, phases[0].devices_per_worker])  # e.g. auto's D on a measured plan
  layouts = [layout_schedule(jobs, model, n_devices, d, per_process) for d in sizes]
  phased = PhasedSchedule(n_devices, phases)
  chosen = _chosen_layout(layouts, phased)
  return Prediction(
    n_devices=n_devices,
    budget=plan.budget,
    n_cells=len(plan.cells),
    jobs=jobs,
    model=model,
    phased=phased,
    phases_reason=reason,
    layouts=layouts,
    layout=best_layout(layouts, phased, chosen),
    chosen_layout=chosen,
    n_processes=n_processes,
    devices_per_process=per_process,
    updates_note=_updates_note(cfg, law, plan) if plan.budget == "emergence" else "",
    schedule_note=schedule_note(cfg, plan),
    default_launch=not fixed,
    pinned_devices_per_worker=int(sweep.get("devices_per_worker", 0) or 0),
  )


def _chosen_layout(layouts: list[Schedule], phased: PhasedSchedule) -> Schedule | None:
  """The one-phase layout the plan's phases are (their one phase's D, timed), or None: several
  phases, or that layout refused or not predicted."""
  if len(phased.phases) != 1:
    return None
  d = phased.phases[0].devices_per_worker
  return next((s for s in layouts if s.devices_per_worker == d and s.makespan_s is not None), None)


def best_layout(layouts: list[Schedule], phased: PhasedSchedule, chosen: Schedule | None):
  """The one-phase layout a plan marks best (``Schedule``): its phases' own (``chosen``)
  unless ``choose_layout``'s pick beats the phases by more than ``PHASE_TIE`` — the plan then
  says why it is faster and how to run it. Within that tie the phases' layout wins: the two
  choices break ties differently (``choose_layout`` the fewest devices per worker,
  ``choose_local_devices`` without a priced network the most), and the plan's list, its best
  mark and its phases must name one layout."""
  fastest = choose_layout(layouts)
  if chosen is None or phased.beaten_by(fastest):
    return fastest
  return chosen


# ---- how to start a layout: the planned run's flags (the launch lines: ``launch``) ----

TPU_WORKDIR = "/mnt/shared"  # launch/tpu_pod.sh's own example: a filesystem every host mounts


def run_flags(found, workdir: str | None = None, tpu: bool = False) -> list[str]:
  """The ``ihsweep run`` flags of a planned sweep, from the plan's own command line (``found``:
  ``flags.split_args``'s flags): ``--config=FILE[:VARIANT]``, its ``--config.SECTION.FIELD``
  overrides, ``--grid`` and ``--zip`` as typed (``sweep.processes_per_worker`` and
  ``sweep.devices_per_worker`` left out: the layout's launch lines, ``launch.launch_lines``, set
  them), then ``--workdir``:
  ``workdir``, else ``runs/NAME`` (NAME: the config file's name and variant); on a TPU pod an
  absolute path every host mounts (``workdir`` if absolute, else ``TPU_WORKDIR``/``workdir``, or
  ``TPU_WORKDIR``/NAME without one)."""
  out, name = [], "sweep"
  for typed, flag, value in found:
    if flag not in ("config", "grid", "zip") or typed.endswith(
      ("sweep.processes_per_worker", "sweep.devices_per_worker")
    ):
      continue
    out.append(f"--{typed}" if value is None else f"--{typed}={value}")
    if typed == "config" and value:
      path, _, variant = value.partition(":")
      name = os.path.splitext(os.path.basename(path))[0]
      if variant:
        name += "_" + re.sub(r"[^A-Za-z0-9]+", "_", variant).strip("_")
  if tpu:  # a relative --workdir is kept, under the filesystem every host mounts
    workdir = (
      workdir
      if workdir and os.path.isabs(workdir)
      else os.path.normpath(f"{TPU_WORKDIR}/{workdir or name}")
    )
  return out + [f"--workdir={workdir or f'runs/{name}'}"]


def _throughput(jobs, n_devices, devices_per_host, flops_per_s, network, log) -> tuple:
  """``(model, devices per host, P, d)`` for ``predict``: a ``timing.FlopsModel`` on hosts of
  ``devices_per_host`` (default ``DEFAULT_DEVICES_PER_HOST``) with ``flops_per_s`` (pricing the
  groups by their compiled times on the network's chip where ``ihsweep plan --target`` left
  them for every group: ``FlopsModel.compiled_for``), else a
  ``timing.MeasuredModel`` on this machine's devices (a host)."""
  if flops_per_s is not None:
    host = devices_per_host or DEFAULT_DEVICES_PER_HOST
    n_processes, per_process = processes_of(n_devices, host)
    model = timing.FlopsModel(flops_per_s, network, per_process, planned_devices=n_devices)
    model = model.compiled_for(jobs)
    return model, host, n_processes, per_process
  import jax

  local = jax.local_devices()
  model = timing.MeasuredModel(jobs, local, log=log)
  host = len(local)
  n_processes, per_process = processes_of(n_devices, host)
  return model, host, n_processes, per_process


def _default_phases(jobs, model, sweep, n_processes, per_process, flops_per_s) -> tuple:
  """``(phases, reason)`` for ``predict`` without a fixed D: ``plan_phases`` with the config's
  ``sweep.processes_per_worker`` and, for its phases of process-local workers, the config's
  ``sweep.devices_per_worker`` or (0) the D ``ihsweep run`` takes: ``choose_local_devices``
  with the plan's FLOPs model, or measured with this machine's runtime model (timed as
  measured).

  Raises:
    LayoutError: a ``sweep.devices_per_worker`` that does not divide a process's devices.
  """
  teams = int(sweep.get("processes_per_worker", 0) or 0)
  local = given = int(sweep.get("devices_per_worker", 0) or 0)
  if local < 0 or (local and per_process % local):
    raise LayoutError(
      f"the config's sweep.devices_per_worker={local} is not allowed: 0 (auto) or a divisor "
      f"of a process's {per_process} devices"
    )
  if local:
    phases = plan_phases(jobs, n_processes, per_process, teams, model=model, local_devices=local)
  elif flops_per_s is not None:
    local, phases = choose_local_devices(jobs, n_processes, per_process, teams, model=model)
  else:
    import jax

    chooser = timing.runtime_model(jax.local_devices())
    local, _ = choose_local_devices(jobs, n_processes, per_process, teams, model=chooser)
    phases = plan_phases(jobs, n_processes, per_process, teams, model=model, local_devices=local)
  return phases, _chosen_reason(teams, n_processes, per_process, local, bool(given))


def _fixed_phases(
  jobs, model, n_devices, host, n_processes, per_process, fixed, source, devices_per_worker
) -> tuple:
  """``(sizes, phases, reason)`` for ``predict`` with D = ``fixed`` devices per worker (from
  ``source``): one phase of N / D workers, or of teams of D / d processes (a multiple of d,
  only as ``devices_per_worker``).

  Raises:
    LayoutError: a D that fits neither a host nor whole processes, or a team some group cannot
      fill.
  """
  multiple = (
    devices_per_worker
    and fixed > per_process
    and not fixed % per_process
    and not n_processes % (fixed // per_process)
  )
  if not multiple and (n_devices % fixed or fixed > host or per_process % fixed):
    more = (
      f", or a multiple of a process's {per_process} dividing N (workers of several processes)"
      if devices_per_worker
      else ""
    )
    raise LayoutError(
      f"{fixed} devices per worker ({source}): need a divisor of a process's "
      f"{per_process} devices (a host holds whole workers; N = {n_devices}){more}"
    )
  if multiple:
    refused = layout_schedule(jobs, model, n_devices, fixed, per_process).refused
    if refused:
      allowed = [k for k in candidate_layouts(n_devices, per_process)] + [
        p * per_process
        for p in divisors(n_processes)
        if p > 1 and all(fills(j, p * per_process) for j in jobs)
      ]
      raise LayoutError(
        f"{fixed} devices per worker ({source}, workers of "
        f"{fixed // per_process} processes × {per_process}): {refused}; "
        f"allowed: {', '.join(map(str, allowed))}"
      )
    phases = plan_phases(jobs, n_processes, per_process, fixed // per_process, model=model)
  else:
    phases = [timed_phase(jobs, model, n_devices, fixed, 1, 0.0, 0)]
  reason = f"{source}: one phase of {n_devices // fixed} worker(s) × {fixed} device(s)"
  return [fixed], phases, reason


def _chosen_reason(teams: int, n_processes: int, per_process: int, local: int, given: bool) -> str:
  """Where ``predict``'s phases came from without a fixed D: the config's teams, or chosen;
  and the devices of each process-local worker (``local``: the config's
  ``sweep.devices_per_worker`` where ``given``, else auto's choice)."""
  side = f"; in a phase of process-local workers, {local_workers(per_process, local)}" + (
    " (the config's sweep.devices_per_worker)"
    if given
    else f" (sweep.devices_per_worker = 0, auto: of the divisors of {per_process}, the "
    f"shortest makespan; within {LAYOUT_TIE:.0%}, the fewest devices per worker where the "
    f"network is priced, else the most)"
  )
  if teams:
    return (
      f"the config's sweep.processes_per_worker={teams}: one phase of teams of {teams} "
      f"process(es)" + (side if teams == 1 else "")
    )
  return (
    f"chosen (sweep.processes_per_worker=0): at most {MAX_PHASES} phases of teams "
    f"of p processes (p dividing P = {n_processes}, ascending; p > 1 only for groups "
    f"whose mesh uses all p × {per_process} devices), the shortest makespan; within "
    f"{PHASE_TIE:.0%} of it, the fewest phases, then the smallest teams" + side
  )


def _updates_note(cfg, law, plan) -> str:
  """How an 'emergence' budget's updates are predicted, and what its groups' learning-rate
  schedules span (``Prediction.updates_note``)."""
  sweep = cfg.sweep
  source = law.source if law is not None else "the sweep's law (sweep.law_file or the study's)"
  note = (
    f"'emergence' budget: a group is predicted to stop at {sweep.stop_margin:g} × the "
    f"evaluation where the law ({source}) puts its transition, capped by its budget "
    f"({sweep.law_multiple:g} × the sweep's law); give --law=FILE (e.g. a law fitted to "
    f"an earlier run) to predict the stops"
  )
  return note


def schedule_note(cfg, plan) -> str:
  """The learning-rate schedule the groups train with and what its horizon is: the updates it
  spans per group and where they come from (``Prediction.schedule_note``; ``grid.make_plan``
  sets them)."""
  sweep, tr = cfg.sweep, cfg.train
  spans = [int(g.cfg.train.get("schedule_steps", 0)) or g.num_steps for g in plan.groups]
  lo, hi = min(spans), max(spans)
  updates = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
  stops = sweep.budget in ("law", "emergence")
  if sweep.get("schedule_horizon", "budget") == "tokens":
    source = (
      f"the experiment's {sweep.tokens:,} tokens per model, ceil(sweep.tokens / (B·C)) "
      f"(sweep.schedule_horizon 'tokens')" + (", the stop only ends training" if stops else "")
    )
  elif any(g.cfg.train.get("schedule_steps", 0) for g in plan.groups):
    source = "train.schedule_steps where set (0: the group's updates; training stops at them)"
  else:
    source = "each group's updates (sweep.schedule_horizon 'budget'" + (
      "; 'tokens' keeps the schedule of sweep.tokens, a stop then only ends training)"
      if stops
      else ")"
    )
  return (
    f"{tr.schedule!r} after a linear warmup over {tr.warmup_frac * 100:g}% of the horizon; horizon "
    f"{updates} updates per group: {source}"
  )
