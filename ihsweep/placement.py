"""Placing a sweep's groups on N devices and predicting its time (``ihsweep plan``): no training.

The rule (``ihsweep.sweep``): the N devices form workers
  that take the planned groups in plan order (most expensive first) and dynamically: a worker
  that finishes takes the next pending group. A group trains on the largest number m of its
  worker's D devices its mesh can use (``sharding.usable_devices``: at most E · B); the
  worker's other D − m devices idle meanwhile. Simulated by list scheduling (``simulate``):
  each group, in plan order, starts on the worker that frees first (the lowest index among
  ties). Inside one jax.distributed job of P processes of d devices the sweep runs in
  **phases** (``plan_phases``, ``Phase``): in each, the processes form teams of p consecutive
  processes (p = 1: one process's local devices; p = P: one global mesh) that take that
  phase's groups, a group going to teams of p > 1 only if its mesh uses all p · d devices; a
  phase starts when the previous one has finished its groups. Independent processes (no
  jax.distributed) are one phase of p = 1.

Makespan = the last group's end; utilisation = the busy share of device-time,
Σ_g m_g · t_g / (N · makespan) (a device is busy while a group's mesh holds it, idle devices of a
worker whose group cannot use them all are not).

Time t_g of a group on m devices comes from a throughput model (``ihsweep.timing``): a given
FLOP/s per device (perfect data-parallel scaling inside a worker, no start-up), or times
measured on this machine with the trainer's own programs.

Updates per group: its budget (``plan.Group.num_steps``), except under the 'emergence' budget,
whose groups stop at ``sweep.stop_margin`` × the first evaluation at which every model has
emerged: predicted from an emergence law (``predicted_updates``), capped by the budget.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import dataclasses
import functools
import heapq
import itertools
import math
from typing import Any

from ihsweep import sharding
from ihsweep.errors import IhsweepError
from ihsweep.sharding import divisors


class LayoutError(IhsweepError, ValueError):
  """Devices per worker that do not fit the devices (not a divisor of N, over a host and not
  whole processes), a team size that does not divide the processes, or a team some group
  cannot fill."""


DEFAULT_DEVICES_PER_HOST = 8  # 8 GPUs per node, 8 TPU chips per v5e/v6e host (4 on v4/v5p)
LAYOUT_TIE = 0.01  # makespans within 1% count as equal: the layout with fewer devices wins


@dataclasses.dataclass
class Job:
  """One group as placement sees it.

  id: the group's id (``g000``); cells: its cell ids; n_models: E; batch_size: B;
  context_size: C; updates: predicted updates; cap_updates: the budget's (``num_steps``);
  flops_per_update: E · B · C · training FLOPs per token; n_params: per model; cfg: the run
  config (the measured model compiles it; None for hand-built jobs); eval_parts: the online
  evaluations' forward FLOPs over the predicted updates, ``((FLOPs, items), ...)`` for the
  probes and the held-out sequences (``evaluation_flops``): each part is split over a data axis
  that divides its items, else repeated on each of its devices.
  """

  id: str
  n_models: int
  batch_size: int
  context_size: int
  updates: int
  flops_per_update: float
  cells: tuple = ()
  cap_updates: int = 0
  n_params: int = 0
  cfg: Any = None
  eval_parts: tuple = ()

  @property
  def eval_flops(self) -> float:
    return sum(flops for flops, _ in self.eval_parts)

  @property
  def cost_flops(self) -> float:
    return self.updates * self.flops_per_update


@dataclasses.dataclass
class Slot:
  """One group on one worker: ``devices`` (m) of it busy from ``start_s`` to ``end_s``;
  ``phase``: the index of its phase (``Phase``; 0 outside phases)."""

  group: str
  worker: int
  devices: int
  start_s: float
  end_s: float
  phase: int = 0


def busy_share(slots, n_devices: int, span: float) -> float:
  """Utilisation: Σ m · t over ``slots`` / (N · ``span``), in [0, 1] (0 for an empty span)."""
  if span <= 0:
    return 0.0
  return sum(s.devices * (s.end_s - s.start_s) for s in slots) / (n_devices * span)


@dataclasses.dataclass
class Schedule:
  """A rule's schedule on ``n_devices`` (``n_workers`` × ``devices_per_worker``). ``refused``:
  why the rule cannot run the sweep (no slots then); ``unpredicted``: why its times are unknown
  (e.g. a mesh larger than the measuring machine)."""

  rule: str  # "worker"
  n_devices: int
  devices_per_worker: int
  slots: list
  refused: str | None = None
  unpredicted: str | None = None

  @property
  def n_workers(self) -> int:
    return self.n_devices // self.devices_per_worker

  @property
  def makespan_s(self) -> float | None:
    if self.refused or self.unpredicted:
      return None
    return max((s.end_s for s in self.slots), default=0.0)

  @property
  def utilisation(self) -> float | None:
    """Σ m · t / (N · makespan), in [0, 1]."""
    span = self.makespan_s
    return None if span is None else busy_share(self.slots, self.n_devices, span)

  def to_json(self) -> dict:
    return {
      "rule": self.rule,
      "n_devices": self.n_devices,
      "devices_per_worker": self.devices_per_worker,
      "n_workers": self.n_workers,
      "refused": self.refused,
      "unpredicted": self.unpredicted,
      "makespan_s": self.makespan_s,
      "utilisation": self.utilisation,
      "schedule": [dataclasses.asdict(s) for s in self.slots],
    }


def simulate(entries, n_devices: int, devices_per_worker: int, rule: str = "worker") -> Schedule:
  """List scheduling of ``entries`` = ``[(group id, devices m, seconds[, first_s])]`` in plan
  order on ``n_devices / devices_per_worker`` identical workers: each starts on the worker that
  frees first (the lowest index among ties), as workers claiming the next pending group do.
  ``first_s`` (default 0) is added when the group is its worker's first: start-up that later
  groups hide behind the previous group's training (compiling ahead)."""
  n_workers = n_devices // devices_per_worker
  free = [(0.0, w) for w in range(n_workers)]  # (free at, worker), a heap
  started = set()
  slots = []
  for group, devices, seconds, *first in entries:
    if not 1 <= devices <= devices_per_worker:
      raise ValueError(f"group {group}: {devices} devices on a worker of {devices_per_worker}")
    at, worker = heapq.heappop(free)
    end = at + seconds + (first[0] if first and worker not in started else 0.0)
    started.add(worker)
    slots.append(Slot(group, worker, devices, at, end))
    heapq.heappush(free, (end, worker))
  return Schedule(rule, n_devices, devices_per_worker, slots)


def _entry(job, model, devices: int) -> tuple:
  """``(id, m, seconds, first_s)`` of a job on m devices: compile time a model says is hidden
  behind the previous group's training (``hidden_s``) is charged only to a worker's first."""
  t = model.seconds(job, devices)
  hidden = t.get("hidden_s", 0.0)
  return job.id, devices, t["total_s"] - hidden, hidden


@functools.lru_cache(maxsize=4096)
def group_devices(n_models: int, batch_size: int, devices_per_worker: int) -> int:
  """m: how many of a worker's D devices a group of E models with batch size B trains on (the
  longest prefix ``sharding.usable_devices`` accepts; at most E · B)."""
  try:  # the common case, D itself, in one call (usable_devices tries D, D − 1, … in turn)
    sharding.mesh_shape(n_models, batch_size, devices_per_worker)
    return devices_per_worker
  except sharding.MeshError:
    pass
  return len(
    sharding.usable_devices(
      n_models, batch_size, list(range(min(devices_per_worker, n_models * batch_size)))
    )
  )


def worker_schedule(jobs, model, n_devices: int, devices_per_worker: int) -> Schedule:
  """W = N / D workers, each group on m = ``group_devices`` of its worker."""
  entries = [
    _entry(job, model, group_devices(job.n_models, job.batch_size, devices_per_worker))
    for job in jobs
  ]
  return simulate(entries, n_devices, devices_per_worker, "worker")


def candidate_layouts(n_devices: int, devices_per_host: int) -> list[int]:
  """Devices per worker to try: the divisors of N that also divide one host's devices (a worker
  is one process, and a host holds a whole number of workers; N below a host's devices: the
  divisors of N)."""
  host = min(n_devices, devices_per_host)
  return [d for d in range(1, host + 1) if n_devices % d == 0 and host % d == 0]


def choose_layout(schedules: list[Schedule]) -> Schedule:
  """The schedule with the shortest makespan; makespans within ``LAYOUT_TIE`` of it count as
  equal and the one with the fewest devices per worker wins (less data-axis communication,
  where the model prices none, and more workers to take over a failed one). Refused or
  unpredicted schedules are skipped (the first schedule when all are)."""
  timed = [s for s in schedules if s.makespan_s is not None]
  if not timed:
    return schedules[0]
  best = min(s.makespan_s for s in timed)
  return min(
    (s for s in timed if s.makespan_s <= best * (1 + LAYOUT_TIE)),
    key=lambda s: s.devices_per_worker,
  )


# ---- phases: one jax.distributed job, teams of processes whose size changes between phases ----

PHASE_TIE = 0.01  # phase plans within 1% of the best makespan count as equal (see plan_phases)
MAX_PHASES = 3
SEARCH_WORK = 3_000_000  # about the most list-scheduling steps plan_phases takes (_cut_search)


@dataclasses.dataclass
class Phase:
  """One phase of a sweep inside one jax.distributed job of P processes of d devices each.

  The processes form ``n_workers`` = P / p workers ("teams") of ``processes_per_worker`` = p
  consecutive processes: team t is processes t · p … t · p + p − 1 (process indices), and trains
  a group on a mesh over all its ``devices_per_worker`` = p · d devices (p = 1: one process's
  local devices, of which a group may use part; p = P: one global mesh). The teams claim
  the phase's ``groups`` dynamically in the order given (plan order: most expensive first); the
  phase ends when all of them are done, then the next phase starts.

  slots: the predicted schedule (``Slot``, times in seconds from the sweep's start: with
  ``timing.FlopsModel(1.0)`` in FLOPs, relative times); start_s / end_s: when the phase starts
  and ends; n_devices: the job's N = P · d (what utilisation is a share of). (``ihsweep plan
  --devices_per_worker=D`` with D below a process's devices: p = 1, ``devices_per_worker`` D,
  several workers per process.)
  """

  processes_per_worker: int
  groups: tuple[str, ...]
  devices_per_worker: int = 0
  n_workers: int = 0
  n_devices: int = 0
  slots: list = dataclasses.field(default_factory=list)
  start_s: float = 0.0
  end_s: float = 0.0

  @property
  def makespan_s(self) -> float:
    return self.end_s - self.start_s

  @property
  def utilisation(self) -> float:
    """Σ m · t / (N · (end − start)) over the phase's groups, in [0, 1]."""
    return busy_share(self.slots, self.n_devices, self.makespan_s)

  def to_json(self) -> dict:
    return {
      "processes_per_worker": self.processes_per_worker,
      "devices_per_worker": self.devices_per_worker,
      "n_workers": self.n_workers,
      "groups": list(self.groups),
      "start_s": self.start_s,
      "end_s": self.end_s,
      "utilisation": self.utilisation,
    }


@dataclasses.dataclass
class PhasedSchedule:
  """The schedule: ``phases`` one after another on ``n_devices``."""

  n_devices: int
  phases: list

  @property
  def slots(self) -> list:
    return [s for p in self.phases for s in p.slots]

  @property
  def makespan_s(self) -> float:
    return self.phases[-1].end_s if self.phases else 0.0

  @property
  def utilisation(self) -> float:
    """Σ m · t / (N · makespan) over every phase's groups, in [0, 1]."""
    return busy_share(self.slots, self.n_devices, self.makespan_s)


def fills(job, devices: int) -> bool:
  """Whether a group's mesh can use all ``devices`` (``sharding.mesh_shape`` accepts the
  count): what a team of several processes needs, as none of its processes may be left without
  devices."""
  return group_devices(job.n_models, job.batch_size, devices) == devices


def time_phases(jobs, phases, n_processes: int, devices_per_process: int, model=None) -> list:
  """``[(processes_per_worker p, group ids)]`` (or ``Phase``\\ s) timed one after another with
  ``model`` (default ``timing.FlopsModel(1.0)``): each phase list-scheduled (``simulate``) on its
  P / p teams of p · d devices, each group on ``group_devices`` of them (all of them where p > 1,
  which ``plan_phases`` ensures), starting ``model.phase_switch_s`` after the previous one.
  Returns ``Phase``\\ s with slots, start and end; a slot's ``worker`` is its team
  within the phase and ``phase`` the phase's index."""
  from ihsweep import timing

  model = model or timing.FlopsModel(1.0)
  by_id = {j.id: j for j in jobs}
  n_devices = n_processes * devices_per_process
  out, at = [], 0.0
  for index, phase in enumerate(phases):
    p, groups = (phase.processes_per_worker, phase.groups) if isinstance(phase, Phase) else phase
    at += model.phase_switch_s if index else 0.0  # the barrier and the new teams' compiling
    out.append(
      _timed_phase(
        [by_id[g] for g in groups], model, n_devices, p * devices_per_process, p, at, index
      )
    )
    at = out[-1].end_s
  return out


def _timed_phase(
  jobs, model, n_devices, devices_per_worker, processes_per_worker, start_s, index
) -> Phase:
  entries = [
    _entry(job, model, group_devices(job.n_models, job.batch_size, devices_per_worker))
    for job in jobs
  ]
  s = simulate(entries, n_devices, devices_per_worker)
  slots = [
    dataclasses.replace(x, start_s=start_s + x.start_s, end_s=start_s + x.end_s, phase=index)
    for x in s.slots
  ]
  return Phase(
    processes_per_worker=processes_per_worker,
    groups=tuple(j.id for j in jobs),
    devices_per_worker=devices_per_worker,
    n_workers=n_devices // devices_per_worker,
    n_devices=n_devices,
    slots=slots,
    start_s=start_s,
    end_s=max((x.end_s for x in slots), default=start_s),
  )


def _check_processes(n_processes, devices_per_process, processes_per_worker) -> None:
  for name, value, low in (
    ("n_processes", n_processes, 1),
    ("devices_per_process", devices_per_process, 1),
    ("processes_per_worker", processes_per_worker, 0),
  ):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise LayoutError(f"{name}={value!r} is not allowed: an integer >= {low}")
  if processes_per_worker and n_processes % processes_per_worker:
    raise LayoutError(
      f"sweep.processes_per_worker={processes_per_worker} is not allowed on {n_processes} "
      f"processes: 0 (phases chosen) or a divisor of the process count "
      f"({', '.join(map(str, divisors(n_processes)))})"
    )


def plan_phases(
  jobs, n_processes: int, devices_per_process: int, processes_per_worker: int = 0, *, model=None
) -> list[Phase]:
  """The phases a sweep inside one jax.distributed job runs in: pure and deterministic, so that
  every process computes the same phases from the same jobs.

  Args:
    jobs: the plan's groups (``jobs_from_plan``), in plan order (most expensive first).
    n_processes: P, the job's processes; devices_per_process: d, each one's local devices.
    processes_per_worker: 0 = choose the phases (below); k >= 1 = one phase of P / k teams of
      k processes holding every group (``sweep.processes_per_worker``).
    model: the time model (default ``timing.FlopsModel(1.0)``: relative times, enough to choose
      when no communication is priced, as that model is linear; ``timing.runtime_model`` on a
      known accelerator prices the data axis's all-reduce and the phase switch); team sizes it
      cannot time (``cannot_time``) are skipped.

  Choosing (processes_per_worker = 0): team sizes p are the divisors of P; a group may go to a
  phase with p > 1 only if its mesh uses all p · d devices (``fills``), with p = 1 it may use
  part of a process's devices. The groups are ordered by the largest team size they fill,
  then E · B, then cost (ascending), and cut into at most ``MAX_PHASES`` consecutive runs, run
  i on teams of p_i with p_1 < p_2 < …; every phase is list-scheduled most expensive first
  (``simulate``) and the sweep's makespan is the sum of the phases' and of the switches between
  them (``model.phase_switch_s`` each). For each sequence of team
  sizes the best cut is found exactly (a minimum over the cut points, phase makespans computed
  once per (p, run)); among the sequences within ``PHASE_TIE`` (1%) of the best makespan the one
  with fewer phases, then smaller teams (largest first), wins. Cost: O(|divisors| · n²) phase
  schedules, fewer cut points past ``SEARCH_WORK`` (``_cut_search``): exp1's 25 groups on 32
  processes take milliseconds, 1,000 groups on 128 processes about a second.

  Returns:
    ``Phase``\\ s in ascending team size, each with its groups in plan order, slots, start and
    end (``time_phases``); every group in exactly one phase; [] for no jobs.

  Raises:
    LayoutError: a count that is not an integer in range; ``processes_per_worker`` not a
      divisor of P; with k > 1, groups whose mesh cannot use all k · d devices (named, with the
      team sizes every group fills).
  """
  from ihsweep import timing

  _check_processes(n_processes, devices_per_process, processes_per_worker)
  model = model or timing.FlopsModel(1.0)
  jobs = list(jobs)
  if not jobs:
    return []
  d = devices_per_process
  if processes_per_worker:
    k = processes_per_worker
    short = [j for j in jobs if k > 1 and not fills(j, k * d)]
    if short:
      allowed = [p for p in divisors(n_processes) if p == 1 or all(fills(j, p * d) for j in jobs)]
      names = ", ".join(f"{j.id} (E = {j.n_models}, B = {j.batch_size})" for j in short[:5])
      raise LayoutError(
        f"sweep.processes_per_worker={k}: {len(short)} of {len(jobs)} groups cannot use all "
        f"{k * d} devices of a team of {k} processes × {d} (a mesh needs a divisor e of "
        f"them dividing E with the rest dividing B; at most E · B): {names}"
        f"{', …' if len(short) > 5 else ''}; allowed: 0 (phases chosen) or "
        f"{', '.join(map(str, allowed))}"
      )
    return time_phases(jobs, [(k, tuple(j.id for j in jobs))], n_processes, d, model)
  sizes = [p for p in divisors(n_processes) if p == 1 or model.cannot_time(p * d) is None]
  runs = _cut_search(jobs, sizes, n_processes, d, model)
  plan_index = {j.id: i for i, j in enumerate(jobs)}
  phases = [(p, tuple(sorted(ids, key=plan_index.get))) for p, ids in runs]
  return time_phases(jobs, phases, n_processes, d, model)


def _cut_search(jobs, sizes, n_processes, d, model) -> list:
  """``[(p, group ids)]``: the best cut of the ordered groups into runs of increasing team
  sizes (``plan_phases``). Cut points: every position while |sizes| · n³ list-scheduling steps
  stay within ``SEARCH_WORK``, else the positions where the order's (largest team, E · B)
  changes and m evenly spaced ones (m ≈ √(SEARCH_WORK / (|sizes| · n)))."""
  fit = {p: [p == 1 or fills(j, p * d) for j in jobs] for p in sizes}
  largest = [max(p for p in sizes if fit[p][i]) for i in range(len(jobs))]
  key = [(largest[i], jobs[i].n_models * jobs[i].batch_size) for i in range(len(jobs))]
  order = sorted(range(len(jobs)), key=lambda i: (*key[i], jobs[i].cost_flops, i))
  n, inf = len(order), math.inf
  if len(sizes) * n**3 <= SEARCH_WORK:
    cuts_at = list(range(n + 1))
  else:
    m = max(16, math.isqrt(int(SEARCH_WORK // (len(sizes) * n))))
    cuts_at = sorted(
      {round(k * n / m) for k in range(m + 1)}
      | {j for j in range(1, n) if key[order[j]] != key[order[j - 1]]}
    )
  at_cut = set(cuts_at)
  # span[p][i, j]: the makespan of ordered groups i … j − 1 on the P / p teams of p processes
  # (absent where one of them does not fill a team), list-scheduled in plan order
  span = {}
  for p in sizes:
    teams, devices = n_processes // p, p * d
    entries = [
      _entry(job, model, group_devices(job.n_models, job.batch_size, devices)) for job in jobs
    ]  # plan order
    table = span[p] = {}
    for i in cuts_at[:-1]:
      longest, members = 0.0, []
      for j in range(i + 1, n + 1):
        k = order[j - 1]
        if not fit[p][k]:
          break
        bisect.insort(members, k)
        longest = max(longest, entries[k][2] + entries[k][3])
        if j in at_cut:
          table[i, j] = (
            longest if j - i <= teams else _makespan([entries[m] for m in members], teams)
          )
  suffixes = {}

  def suffix(tail):  # {i: (the best makespan of groups i … n − 1 on runs of tail, its cuts)}
    if tail not in suffixes:
      table = span[tail[0]]
      if len(tail) == 1:
        suffixes[tail] = {i: (table.get((i, n), inf), ()) for i in cuts_at[:-1]}
      else:
        rest = suffix(tail[1:])
        suffixes[tail] = {
          i: min(
            ((table.get((i, c), inf) + rest[c][0], (c, *rest[c][1])) for c in cuts_at if i < c < n),
            key=lambda x: x[0],
            default=(inf, ()),
          )
          for i in cuts_at[:-1]
        }
    return suffixes[tail]

  best = []  # (makespan, team sizes, cuts)
  for count in range(1, min(MAX_PHASES, len(sizes), n) + 1):
    for seq in itertools.combinations(sizes, count):
      if count == 1:
        total, cuts = span[seq[0]].get((0, n), inf), ()
      else:
        rest = suffix(seq[1:])
        total, cuts = min(
          (
            (span[seq[0]].get((0, c), inf) + rest[c][0], (c, *rest[c][1]))
            for c in cuts_at
            if 0 < c < n
          ),
          key=lambda x: x[0],
          default=(inf, ()),
        )
      if total < inf:
        best.append((total + (count - 1) * model.phase_switch_s, seq, cuts))
  top = min(t for t, _, _ in best)
  _, seq, cuts = min(
    (b for b in best if b[0] <= top * (1 + PHASE_TIE)),
    key=lambda b: (len(b[1]), tuple(reversed(b[1])), b[0], b[2]),
  )
  bounds = (0, *cuts, n)
  return [
    (p, [jobs[order[i]].id for i in range(bounds[k], bounds[k + 1])]) for k, p in enumerate(seq)
  ]


def _makespan(entries, teams: int) -> float:
  """The end of list scheduling ``entries`` (in order) on ``teams`` identical workers, as
  ``simulate`` (a worker's first group pays its ``first_s``)."""
  if teams == 1:
    return sum(t for _, _, t, _ in entries) + (entries[0][3] if entries else 0.0)
  free = [(0.0, w, True) for w in range(min(teams, len(entries)))]
  end = 0.0
  for _, _, t, first in entries:
    at, w, fresh = heapq.heappop(free)
    done = at + t + (first if fresh else 0.0)
    end = max(end, done)
    heapq.heappush(free, (done, w, False))
  return end


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
  from ihsweep import schedule as schedule_lib

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
  from ihsweep import model as model_lib
  from ihsweep import schedule, train
  from ihsweep.data.probes import eval_layout

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
  """``make_plan`` checks that each group's corpus can be found (``natural.document_source``);
  a plan from a given FLOP/s reads no data, so a machine without the corpus (C4 at study
  scale) may plan: that one check is skipped meanwhile (a stopgap until ``make_plan`` takes an
  option for it)."""
  from unittest import mock

  from ihsweep.data import natural

  with mock.patch.object(natural, "document_source", lambda data_cfg: None):
    yield


def make_jobs(cfg, law=None, check_data: bool = True) -> tuple[Any, list[Job]]:
  """``(plan, jobs)`` for a sweep config, planned for any device count: groups are validated
  as a worker of this process would run them (``sweep.placement = 'worker'``,
  ``mesh.num_devices = 0``: a group smaller than the devices runs on part of them;
  ``sweep.processes_per_worker = 0``: checked against this machine's process count otherwise),
  so that planning N devices this machine lacks is not refused here; the rules are applied by
  ``plan_phases`` and ``worker_schedule``.

  Raises:
    ConfigError, DataError (``check_data``), LawError: as ``plan.make_plan``.
  """
  from ihsweep import config as config_lib
  from ihsweep import plan as plan_lib

  cfg = copy.deepcopy(cfg)
  with cfg.unlocked():
    if "sweep" not in cfg:
      cfg.sweep = config_lib.default_sweep()
    cfg.sweep.placement = "worker"
    if "processes_per_worker" in cfg.sweep:
      cfg.sweep.processes_per_worker = 0
    cfg.mesh.num_devices = 0
  with contextlib.nullcontext() if check_data else data_unchecked():
    plan = plan_lib.make_plan(cfg)
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


@dataclasses.dataclass
class Prediction:
  """What ``ihsweep plan`` prints: the jobs, the throughput model, the phases
  (``phased``; ``phases_reason``: where they came from) on ``n_processes`` × ``devices_per_process``
  devices, and every one-phase layout tried (``layouts``; ``layout``: the best of them)."""

  n_devices: int
  budget: str
  n_cells: int
  jobs: list
  model: Any
  phased: PhasedSchedule
  phases_reason: str
  layouts: list
  layout: Schedule
  n_processes: int = 1
  devices_per_process: int = 1
  updates_note: str = ""

  def slot(self, job) -> Slot:
    return next(s for s in self.phased.slots if s.group == job.id)

  def communication(self, slots) -> dict:
    """Of ``slots``' device-time (Σ m · t): the share spent in gradient all-reduces
    (``comm_share``, 0 where the model prices none), and how many groups have a data axis."""
    by_id = {j.id: j for j in self.jobs}
    held = comm = 0.0
    with_data_axis = 0
    for s in slots:
      job = by_id[s.group]
      t = self.model.seconds(job, s.devices)
      held += s.devices * t["total_s"]
      comm += s.devices * t.get("comm_s", 0.0)
      with_data_axis += sharding.mesh_shape(job.n_models, job.batch_size, s.devices)[1] > 1
    return {"comm_share": comm / held if held else 0.0, "groups_with_data_axis": with_data_axis}

  def checkpoints(self, job) -> dict:
    """``schedule.checkpoint_bytes`` of ``job`` over its predicted time on its slot."""
    from ihsweep import schedule

    seconds = self.model.seconds(job, self.slot(job).devices)["total_s"]
    return schedule.checkpoint_bytes(job.cfg, job.n_params, job.updates, seconds)

  def to_json(self) -> dict:
    from ihsweep import schedule

    rows = []
    phases = self.phased.phases
    for job in self.jobs:
      slot = self.slot(job)
      m = slot.devices
      times = self.model.seconds(job, m)
      row = {
        "group": job.id,
        "cells": list(job.cells),
        "n_models": job.n_models,
        "batch_size": job.batch_size,
        "context_size": job.context_size,
        "updates": job.updates,
        "cap_updates": job.cap_updates,
        "cost_flops": job.cost_flops,
        "eval_flops": job.eval_flops,
        "n_params": job.n_params,
        "phase": slot.phase,
        "devices_per_worker": phases[slot.phase].devices_per_worker,
        "devices": m,
        "mesh": list(sharding.mesh_shape(job.n_models, job.batch_size, m)),
        "seconds": times["total_s"],
        "times": times,
        "checkpoints": self.checkpoints(job),
      }
      rows.append(row)
    one = phases[0] if len(phases) == 1 else None
    return {
      "n_devices": self.n_devices,
      "n_processes": self.n_processes,
      "devices_per_process": self.devices_per_process,
      "budget": self.budget,
      "n_cells": self.n_cells,
      "n_groups": len(self.jobs),
      "throughput": self.model.to_json(),
      "updates_note": self.updates_note,
      "groups": rows,
      "checkpoints": schedule.checkpoint_totals([r["checkpoints"] for r in rows]),
      "phases_reason": self.phases_reason,
      "phases": [p.to_json() for p in phases],
      "devices_per_worker": one.devices_per_worker if one else None,
      "n_workers": one.n_workers if one else None,
      "schedule": [dataclasses.asdict(s) for s in self.phased.slots],
      "makespan_s": self.phased.makespan_s,
      "utilisation": self.phased.utilisation,
      **self.communication(self.phased.slots),
      "layouts": [
        {
          "devices_per_worker": s.devices_per_worker,
          "n_workers": s.n_workers,
          "processes_per_worker": max(1, s.devices_per_worker // self.devices_per_process),
          "makespan_s": s.makespan_s,
          "utilisation": s.utilisation,
          **self.communication(s.slots),
          "refused": s.refused,
          "best": s is self.layout,
        }
        for s in self.layouts
      ],
    }


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
  FLOPs-based (``timing.FlopsModel``, communication priced on ``network``, a ``timing.Network``,
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
  ``plan_phases`` chooses. The one-phase layouts beside them: D alone when given, else — FLOPs
  — every divisor of N up to a host and every team of several processes (``layout_schedule``),
  the best by ``choose_layout``; measured, d.

  Raises:
    LayoutError: a D that fits neither a host nor whole processes, a team some group cannot
      fill, or a ``sweep.processes_per_worker`` that does not divide P (the CLI checks its
      flags first; the config's fields are checked here).
    ConfigError, DataError, LawError: as ``plan.make_plan``.
  """
  from ihsweep import timing

  plan, jobs = make_jobs(cfg, law, check_data=flops_per_s is None)
  if flops_per_s is not None:
    host = devices_per_host or DEFAULT_DEVICES_PER_HOST
    n_processes, per_process = processes_of(n_devices, host)
    model = timing.FlopsModel(flops_per_s, network, per_process)
  else:
    import jax

    local = jax.local_devices()
    model = timing.MeasuredModel(jobs, local, log=log)
    host = len(local)
    n_processes, per_process = processes_of(n_devices, host)
  configured = int(cfg.mesh.num_devices)
  teams = int(cfg.sweep.get("processes_per_worker", 0) or 0) if "sweep" in cfg else 0
  fixed = devices_per_worker or configured
  if fixed:
    source = "--devices_per_worker" if devices_per_worker else "the config's mesh.num_devices"
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
    sizes = [fixed]
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
      phases = [_timed_phase(jobs, model, n_devices, fixed, 1, 0.0, 0)]
    reason = f"{source}: one phase of {n_devices // fixed} worker(s) × {fixed} device(s)"
  else:
    if flops_per_s is not None:
      sizes = candidate_layouts(n_devices, per_process) + [
        p * per_process for p in divisors(n_processes) if p > 1
      ]
    else:
      sizes = [per_process]
    phases = plan_phases(jobs, n_processes, per_process, teams, model=model)
    reason = (
      f"the config's sweep.processes_per_worker={teams}: one phase of teams of {teams} process(es)"
      if teams
      else f"chosen (sweep.processes_per_worker=0): at most {MAX_PHASES} phases of teams "
      f"of p processes (p dividing P = {n_processes}, ascending; p > 1 only for groups "
      f"whose mesh uses all p × {per_process} devices), the shortest makespan; within "
      f"{PHASE_TIE:.0%} of it, the fewest phases, then the smallest teams"
    )
  layouts = [layout_schedule(jobs, model, n_devices, d, per_process) for d in sizes]
  note = ""
  if plan.budget == "emergence":
    sweep = cfg.sweep
    source = law.source if law is not None else "the sweep's law (sweep.law_file or the study's)"
    note = (
      f"'emergence' budget: a group is predicted to stop at {sweep.stop_margin:g} × the "
      f"evaluation where the law ({source}) puts its transition, capped by its budget "
      f"({sweep.law_multiple:g} × the sweep's law); give --law=FILE (e.g. a law fitted to "
      f"an earlier run) to predict the stops"
    )
  return Prediction(
    n_devices=n_devices,
    budget=plan.budget,
    n_cells=len(plan.cells),
    jobs=jobs,
    model=model,
    phased=PhasedSchedule(n_devices, phases),
    phases_reason=reason,
    layouts=layouts,
    layout=choose_layout(layouts),
    n_processes=n_processes,
    devices_per_process=per_process,
    updates_note=note,
  )


def duration(seconds: float | None) -> str:
  """``42 s``, ``3.5 min``, ``2.1 h``, ``3.2 d``."""
  if seconds is None:
    return "—"
  for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
    if seconds >= size:
      return f"{seconds / size:.{1 if seconds < 100 * size else 0}f} {unit}"
  return f"{seconds:.1f} s" if 0 < seconds < 10 else f"{seconds:.0f} s"


def _percent(x: float | None) -> str:
  return "—" if x is None else f"{100 * x:.1f}%"


def group_list(ids) -> str:
  """``g000–g004, g007``: group ids with runs of consecutive numbers shortened."""
  import re

  nums = [re.fullmatch(r"g(\d+)", i) for i in ids]
  if not all(nums):
    return ", ".join(ids)
  width = len(ids[0]) - 1
  values = sorted(int(m.group(1)) for m in nums)
  runs, start = [], values[0] if values else None
  for a, b in zip(values, values[1:] + [None]):
    if b != a + 1:
      runs.append(f"g{start:0{width}d}" + (f"–g{a:0{width}d}" if a != start else ""))
      start = b
  return ", ".join(runs)


def _layout_name(devices_per_worker: int, n_workers: int, per_process: int) -> str:
  teams = devices_per_worker // per_process
  return f"{n_workers} × {devices_per_worker}" + (
    f" ({teams} processes each)" if devices_per_worker > per_process else ""
  )


def format_text(p: Prediction) -> str:
  """The plan as ``ihsweep plan`` prints it."""
  from ihsweep import schedule as schedule_lib
  from ihsweep.plan import ranges

  phased, phases, d = p.phased, p.phased.phases, p.devices_per_process
  lines = [
    f"{p.n_cells} cells in {len(p.jobs)} groups (budget '{p.budget}') on N = "
    f"{p.n_devices} devices: {p.n_processes} process(es) × {d}",
    f"throughput: {p.model.describe()}",
  ]
  if p.updates_note:
    lines.append(f"updates: {p.updates_note}")
  lines += [
    "",
    f"{'group':6} {'cells':>9} {'E':>3} {'B':>5} {'C':>5} {'updates':>10} "
    f"{'(cap)':>10} {'FLOPs':>9} {'phase':>5}  {'devices (e×d)':>13} {'time':>9}",
  ]
  for job in p.jobs:
    slot = p.slot(job)
    m = slot.devices
    e, dd = sharding.mesh_shape(job.n_models, job.batch_size, m)
    lines.append(
      f"{job.id:6} {ranges(list(job.cells)):>9} {job.n_models:>3} "
      f"{job.batch_size:>5} {job.context_size:>5} {job.updates:>10,} "
      f"{f'({job.cap_updates:,})':>10} {job.cost_flops:>9.3g} {slot.phase + 1:>5}  "
      f"{f'{m} ({e}×{dd})':>13} {duration(p.model.seconds(job, m)['total_s']):>9}"
    )
  totals = schedule_lib.checkpoint_totals([p.checkpoints(job) for job in p.jobs])
  lines += [schedule_lib.describe_checkpoint_totals(totals)]
  lines += ["", "one-phase layouts (workers × devices each):"]
  for s in p.layouts:
    name = _layout_name(s.devices_per_worker, s.n_workers, d)
    mark = "  <- best" if s is p.layout and len(p.layouts) > 1 else ""
    lines.append(
      f"  {name:<28} "
      + (
        f"refused: {s.refused}"
        if s.refused
        else f"not predicted: {s.unpredicted}"
        if s.unpredicted
        else f"makespan {duration(s.makespan_s):>9}, utilisation {_percent(s.utilisation):>6}"
        + _comm_text(p, s.slots)
        + mark
      )
    )
  lines += [
    "",
    f"phases: {p.phases_reason}",
    f"  {'phase':>5}  {'workers × devices':<28} {'groups':>6} {'start':>9} {'end':>9} "
    f"{'utilisation':>11}  groups",
  ]
  for k, ph in enumerate(phases):
    name = _layout_name(ph.devices_per_worker, ph.n_workers, d)
    lines.append(
      f"  {k + 1:>5}  {name:<28} {len(ph.groups):>6} {duration(ph.start_s):>9} "
      f"{duration(ph.end_s):>9} {_percent(ph.utilisation):>11}  "
      f"{group_list(ph.groups)}"
    )
  lines += [
    "",
    "schedule (in each phase the groups most expensive first, each to "
    "the worker free first; a phase starts when the previous one ends):",
    f"  {'phase':>5} {'worker':>6}  {'group':6} {'devices':>7} {'start':>9} {'end':>9}",
  ]
  for s in sorted(phased.slots, key=lambda s: (s.phase, s.start_s, s.worker)):
    lines.append(
      f"  {s.phase + 1:>5} {s.worker:>6}  {s.group:6} {s.devices:>7} "
      f"{duration(s.start_s):>9} {duration(s.end_s):>9}"
    )
  shape = ", then ".join(_layout_name(ph.devices_per_worker, ph.n_workers, d) for ph in phases)
  best = p.layout
  lines += [
    "",
    f"the sweep ({len(phases)} phase(s): {shape}): "
    f"makespan {duration(phased.makespan_s)}, utilisation "
    f"{_percent(phased.utilisation)}" + _comm_text(p, phased.slots),
    f"best one-phase layout, {_layout_name(best.devices_per_worker, best.n_workers, d)}"
    f": makespan {duration(best.makespan_s)}, utilisation "
    f"{_percent(best.utilisation)}" + _comm_text(p, best.slots),
  ]
  why = _why_best(p)
  if why:
    lines.append(why)
  return "\n".join(lines)


def _comm_text(p: Prediction, slots) -> str:
  """', of which all-reduces 61% (24 groups with a data axis)' where the model prices them."""
  if getattr(p.model, "network", None) is None:
    return ""
  c = p.communication(slots)
  return (
    f", of which all-reduces {_percent(c['comm_share'])} ({c['groups_with_data_axis']} "
    f"group(s) with a data axis)"
  )


def _why_best(p: Prediction) -> str:
  """Why the best one-phase layout beats the phases (which a jax.distributed job of these
  processes would run), and how to run it; '' when it does not."""
  best, phased = p.layout, p.phased
  if best.makespan_s is None or best.makespan_s >= phased.makespan_s * (1 - PHASE_TIE):
    return ""
  d, per_process = best.devices_per_worker, p.devices_per_process
  ours, theirs = p.communication(best.slots), p.communication(phased.slots)
  reasons = []
  if theirs["comm_share"] > ours["comm_share"] + 0.01:
    reasons.append(
      f"in the phases {theirs['groups_with_data_axis']} of {len(p.jobs)} groups split each "
      f"model's batch over a data axis and all-reduce its gradient every update "
      f"({_percent(theirs['comm_share'])} of their device-time), here "
      f"{ours['groups_with_data_axis']} do ({_percent(ours['comm_share'])})"
    )
  if (best.utilisation or 0) > phased.utilisation + 0.01:
    reasons.append(
      f"its devices are busy {_percent(best.utilisation)} of the time, the phases' "
      f"{_percent(phased.utilisation)} (workers of whole processes leave devices idle beside "
      f"groups that cannot use them all, or wait for the last groups)"
    )
  how = (
    f"run it as {best.n_workers} independent worker(s), one process per {d} device(s) not "
    f"joined by jax.distributed (launch/slurm_array.sbatch, launch/local_multiprocess.sh "
    f"--independent)"
    if d <= per_process
    else f"run it with sweep.processes_per_worker={d // per_process}"
  )
  return (
    f"faster: {_layout_name(d, best.n_workers, per_process)} "
    f"({phased.makespan_s / best.makespan_s:.1f}× the phases' speed): "
    + "; ".join(reasons or ["a better balance of the groups over the workers"])
    + f"; {how}"
  )
