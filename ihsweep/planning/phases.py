"""Phases of one jax.distributed job (``plan_phases``, ``Phase``): in each, the processes form
teams of p consecutive processes that take that phase's groups; a phase starts when the previous
one has finished. Built on the list scheduling of ``ihsweep.planning.list_schedule``."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math

from ihsweep.base.numbers import divisors
from ihsweep.planning import timing
from ihsweep.planning.list_schedule import (
  LAYOUT_TIE,
  LayoutError,
  busy_share,
  schedule_entry,
  simulate,
  usable_device_count,
)

PHASE_TIE = 0.01  # phase plans within 1% of the best makespan count as equal (see plan_phases)
MAX_PHASES = 3
SEARCH_WORK = 3_000_000  # about the most list-scheduling steps plan_phases takes (_cut_search)


@dataclasses.dataclass
class Phase:
  """One phase of a sweep inside one jax.distributed job of P processes of d devices each.

  The processes form ``n_workers`` = P / p workers ("teams") of ``processes_per_worker`` = p
  consecutive processes: team t is processes t · p … t · p + p − 1 (process indices), and trains
  a group on a mesh over all its ``devices_per_worker`` = p · d devices (p = 1: one process's
  local devices, of which a group may use part, or with ``devices_per_worker`` D below them
  several workers of D side by side in each process; p = P: one global mesh). The teams claim
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

  def beaten_by(self, layout) -> bool:
    """Whether the one-phase ``layout`` (a ``list_schedule.Schedule``) ends sooner than these
    phases by more than ``PHASE_TIE`` (False where it is refused or not predicted)."""
    span = layout.makespan_s
    return span is not None and span < self.makespan_s * (1 - PHASE_TIE)


def fills(job, devices: int) -> bool:
  """Whether a group's mesh can use all ``devices`` (``sharding.mesh_shape`` accepts the
  count): what a team of several processes needs, as none of its processes may be left without
  devices."""
  return usable_device_count(job.n_models, job.batch_size, devices) == devices


def time_phases(
  jobs, phases, n_processes: int, devices_per_process: int, model=None, local_devices: int = 0
) -> list:
  """``[(processes_per_worker p, group ids)]`` (or ``Phase``\\ s) timed one after another with
  ``model`` (default ``timing.FlopsModel(1.0)``): each phase list-scheduled (``simulate``) on its
  P / p teams of p · d devices (p = 1: P · d / D workers of ``local_devices`` D, a divisor of d,
  several in a process; 0 = d), each group on ``usable_device_count`` of them (all of them where
  p > 1, which ``plan_phases`` ensures), starting ``model.phase_switch_s`` after the previous one.
  Returns ``Phase``\\ s with slots, start and end; a slot's ``worker`` is its team
  within the phase and ``phase`` the phase's index."""
  model = model or timing.FlopsModel(1.0)
  by_id = {j.id: j for j in jobs}
  n_devices = n_processes * devices_per_process
  out, at = [], 0.0
  for index, phase in enumerate(phases):
    p, groups = (phase.processes_per_worker, phase.groups) if isinstance(phase, Phase) else phase
    at += model.phase_switch_s if index else 0.0  # the barrier and the new teams' compiling
    size = worker_devices(p, devices_per_process, local_devices)
    out.append(timed_phase([by_id[g] for g in groups], model, n_devices, size, p, at, index))
    at = out[-1].end_s
  return out


def worker_devices(processes_per_worker: int, devices_per_process: int, local: int = 0) -> int:
  """A worker's devices in a phase of teams of p processes of d: p · d, or for p = 1 the
  ``local`` D (0 = d) of the workers a process runs side by side (``sweep.devices_per_worker``)."""
  if processes_per_worker == 1 and local:
    return local
  return processes_per_worker * devices_per_process


def timed_phase(
  jobs, model, n_devices, devices_per_worker, processes_per_worker, start_s, index
) -> Phase:
  entries = [
    schedule_entry(
      job, model, usable_device_count(job.n_models, job.batch_size, devices_per_worker)
    )
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
  jobs,
  n_processes: int,
  devices_per_process: int,
  processes_per_worker: int = 0,
  *,
  model=None,
  local_devices: int = 0,
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
    local_devices: D, the devices of each worker of a phase of p = 1 (several workers side by
      side in a process: ``sweep.devices_per_worker``); 0 = d, one worker per process.

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
    return time_phases(jobs, [(k, tuple(j.id for j in jobs))], n_processes, d, model, local_devices)
  sizes = [p for p in divisors(n_processes) if p == 1 or model.cannot_time(p * d) is None]
  runs = _cut_search(jobs, sizes, n_processes, d, model, local_devices)
  plan_index = {j.id: i for i, j in enumerate(jobs)}
  phases = [(p, tuple(sorted(ids, key=plan_index.get))) for p, ids in runs]
  return time_phases(jobs, phases, n_processes, d, model, local_devices)


def choose_local_devices(
  jobs,
  n_processes: int,
  devices_per_process: int,
  processes_per_worker: int = 0,
  *,
  model=None,
  allowed=None,
) -> tuple[int, list[Phase]]:
  """``(D, phases)``: the devices of each process-local worker (``sweep.devices_per_worker`` =
  0, auto) and the phases planned with it (``plan_phases``): every divisor D of a process's d
  devices (``allowed``: a predicate on D, e.g. that every group fits a slice of D; a D the
  model cannot time, ``cannot_time``, is skipped; d is always tried), the shortest makespan;
  makespans within ``list_schedule.LAYOUT_TIE`` of it count as
  equal, and among them, where the model prices a network, the smallest D wins, as
  ``choose_layout`` chooses among one-phase layouts (less data-axis communication than the
  model sees, more workers to take over a failed one); where it prices none
  (``timing.FlopsModel(1.0)``: CPUs, chips without a network figure) the largest: there a
  split is only worth its workers' start-ups and shared host when it packs the groups faster,
  e.g. where groups cannot use all of a process's devices (CPU devices share the host's
  cores: on a 2-core machine 2 workers of 1 device took 258 s for a demo sweep that one worker
  of 2 trained in 218 s, docs/sweeps.md)."""
  d = devices_per_process
  if processes_per_worker > 1:  # no phase of process-local workers
    return d, plan_phases(jobs, n_processes, d, processes_per_worker, model=model)
  tried = []
  for size in divisors(d):
    if size != d and allowed is not None and not allowed(size):
      continue
    if size != d and model is not None and model.cannot_time(size):
      continue  # e.g. a group the compiled plan found too large for its slice of it
    steps = plan_phases(jobs, n_processes, d, processes_per_worker, model=model, local_devices=size)
    tried.append((steps[-1].end_s if steps else 0.0, size, steps))
  best = min(span for span, _, _ in tried)
  priced = getattr(model, "network", None) is not None
  _, size, steps = min(
    (t for t in tried if t[0] <= best * (1 + LAYOUT_TIE)),
    key=lambda t: t[1] if priced else -t[1],
  )
  return size, steps


def _spans(jobs, sizes, n_processes, d, model, order, fit, cuts_at, local=0) -> dict:
  """``span[p][i, j]``: the makespan of ordered groups i … j − 1 (``order``; i, j in
  ``cuts_at``) on the P / p teams of p processes (p = 1: workers of ``local`` devices),
  list-scheduled in plan order; absent where one of them does not fill a team (``fit[p]``)."""
  n, at_cut, span = len(order), set(cuts_at), {}
  for p in sizes:
    devices = worker_devices(p, d, local)
    teams = n_processes * d // devices
    entries = [
      schedule_entry(job, model, usable_device_count(job.n_models, job.batch_size, devices))
      for job in jobs
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
  return span


def _cut_search(jobs, sizes, n_processes, d, model, local=0) -> list:
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
  span = _spans(jobs, sizes, n_processes, d, model, order, fit, cuts_at, local)
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
