"""List scheduling of a sweep's groups on workers of D devices (``simulate``): the jobs
(``Job``), their slots (``Slot``) and schedules (``Schedule``), how many of a worker's devices a
group uses (``usable_device_count``), and the one-phase layouts tried and chosen
(``candidate_layouts``, ``choose_layout``). The rule it simulates:
``ihsweep.planning.placement``."""

from __future__ import annotations

import dataclasses
import functools
import heapq
from typing import Any

from ihsweep.base import sharding
from ihsweep.base.errors import IhsweepError


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
  # Ties go to the lowest index, so only the first len(entries) workers can ever start a group:
  # the simulation's cost does not grow with the device count.
  n_workers = min(n_devices // devices_per_worker, len(entries))
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


def schedule_entry(job, model, devices: int) -> tuple:
  """``(id, m, seconds, first_s)`` of a job on m devices: compile time a model says is hidden
  behind the previous group's training (``hidden_s``) is charged only to a worker's first."""
  t = model.seconds(job, devices)
  return job.id, devices, t.total_s - t.hidden_s, t.hidden_s


@functools.lru_cache(maxsize=4096)
def usable_device_count(n_models: int, batch_size: int, devices_per_worker: int) -> int:
  """m: how many of a worker's D devices a group of E models with batch size B trains on (the
  longest prefix ``sharding.usable_devices`` accepts; at most E · B)."""
  return sharding.usable_count(n_models, batch_size, devices_per_worker)


def worker_schedule(jobs, model, n_devices: int, devices_per_worker: int) -> Schedule:
  """W = N / D workers, each group on m = ``usable_device_count`` of its worker."""
  entries = [
    schedule_entry(
      job, model, usable_device_count(job.n_models, job.batch_size, devices_per_worker)
    )
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
