"""Which workers a process runs (``sweep``): the phases (``phases``; one in a one-process run),
and in each this process's workers (``phase_workers``): one spanning
``sweep.processes_per_worker`` processes of a jax.distributed job, or several side by side over
slices of its devices (``sweep.devices_per_worker``, or the auto layout). A ``Worker`` is where
one trains: its devices, the processes owning them and the groups it may take."""

from __future__ import annotations

import dataclasses
import threading

from ihsweep.base import sharding
from ihsweep.base.numbers import divisors
from ihsweep.configuration import config as config_lib
from ihsweep.configuration.fields import ConfigError
from ihsweep.configuration.grid import Plan
from ihsweep.planning import list_schedule, placement, timing
from ihsweep.planning import phases as phases_lib
from ihsweep.training import memory, runner


class Resolutions:
  """Each group's resolution (``runner.resolve``: validated for the devices, its memory chosen,
  compiled against their capacity where it is known) made once per device layout in a process
  and shared by its workers: workers side by side over equal slices of the process's devices
  (one layout: as many devices of one kind, process-local or not) make one resolution per group
  between them, whichever asks first (the others wait for it), then each binds it to its own
  devices (``ResolvedGroup.on``). A resolution, once made, is never written again; the plan's
  ``Group.cfg`` is never written. Thread-safe."""

  def __init__(self):
    self._lock = threading.Lock()
    self._making: dict = {}  # layout key -> threading.Lock, held while one is made
    self._made: dict = {}  # layout key -> runner.ResolvedGroup

  def get(self, group, devices: list, local: bool) -> runner.ResolvedGroup:
    """``group`` resolved for a worker over ``devices`` (``local``: process-local in a job)."""
    first = devices[0]
    key = (group.id, len(devices), first.platform, getattr(first, "device_kind", ""), local)
    with self._lock:
      making = self._making.setdefault(key, threading.Lock())
    with making:
      if key not in self._made:
        self._made[key] = runner.resolve(group.cfg, devices, local, group_id=group.id, checked=True)
    return self._made[key].on(devices)


@dataclasses.dataclass
class Worker:
  """Where a worker trains: its devices and the processes owning them (``sharding.Team``:
  this process alone for independent processes and process-local groups; several processes of
  a jax.distributed job for a worker spanning hosts), and the groups it may take; the
  resolutions it shares with the other workers of its process (``Resolutions``)."""

  devices: list
  team: object  # sharding.Team
  groups: list
  local: bool  # a process-local worker inside a jax.distributed job
  shared: Resolutions = dataclasses.field(default_factory=Resolutions)
  resolved: dict = dataclasses.field(default_factory=dict)  # group id -> runner.ResolvedGroup

  def resolve(self, group) -> runner.ResolvedGroup:
    """The group as resolved for this worker's devices (``Resolutions``: once per layout in the
    process), bound to them; the same object for every call of this worker, whose built parts
    it releases after training the group."""
    if group.id not in self.resolved:
      self.resolved[group.id] = self.shared.get(group, self.devices, self.local)
    return self.resolved[group.id]


def phases(cfg, plan: Plan) -> list:
  """The phases of a sweep (``phases.plan_phases``: in each, workers of
  ``processes_per_worker`` consecutive processes take that phase's groups; every process of a
  jax.distributed job computes the same list; one process: one phase), with the devices of a
  phase's process-local workers: ``sweep.devices_per_worker`` D, or where it is 0 (auto) the D
  ``phases.choose_local_devices`` chooses with ``timing.runtime_model`` (with the groups'
  compiled times where ``ihsweep plan --target`` left them: ``compiled_times``) among the
  divisors of a process's devices whose slices every group fits in every process
  (``_fits_everywhere``).

  Raises:
    ConfigError: ``sweep.processes_per_worker`` that does not divide the process count, or
      with a group that cannot use all of a worker's devices; ``mesh.num_devices`` below a
      process's device count when a phase has workers spanning processes.
  """
  import jax

  n = jax.process_count()
  k = int(cfg.sweep.processes_per_worker)
  if k and n % k:
    raise ConfigError(
      "sweep.processes_per_worker", k, f"0 (chosen) or a divisor of the {n} processes of this job"
    )
  local = len(jax.local_devices())
  devices = config_lib.process_devices(cfg)
  per_process = len(devices)
  # mesh.num_devices fixes a group's mesh, hence a whole worker (config validates the field)
  fixed = int(cfg.sweep.get("devices_per_worker", 0)) or (
    per_process if int(cfg.mesh.num_devices) else 0
  )
  jobs = placement.jobs_from_plan(cfg, plan)
  model = timing.runtime_model(jax.devices()).compiled_for(jobs)
  try:
    if fixed:
      steps = phases_lib.plan_phases(jobs, n, per_process, k, model=model, local_devices=fixed)
    else:
      fits = _fits_everywhere(plan, devices, n > 1)
      _, steps = phases_lib.choose_local_devices(
        jobs, n, per_process, k, model=model, allowed=fits.get
      )
  except list_schedule.LayoutError as e:
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


def _fits_everywhere(plan: Plan, devices: list, local: bool) -> dict[int, bool]:
  """``{D: whether every group fits a slice of D of ``devices``}`` for each divisor D of their
  count (``_fits``); in a jax.distributed job (``local``) D fits only where it fits in every
  process (one collective), so that all of them choose the same phases even where their
  memory differs (CPU hosts of unequal RAM)."""
  sizes = divisors(len(devices))
  fits = [_fits(plan, devices[:d], local) for d in sizes]
  if local:
    refused = sharding.any_process_each([not f for f in fits])
    fits = [not r for r in refused]
  return dict(zip(sizes, fits))


def _fits(plan: Plan, devices: list, local: bool) -> bool:
  """Whether every group of ``plan`` can fit a worker over ``devices`` at some memory setting
  (``memory.shortfall``: arithmetic, no compile)."""
  return not any(
    memory.shortfall(g.cfg, runner.group_devices(g.cfg, devices, local), n_params=g.n_params)
    for g in plan.groups
  )


def phase_workers(cfg, plan: Plan, phase, shared: Resolutions | None = None) -> list[Worker]:
  """This process's workers in ``phase``: for workers of one process, one per slice of
  ``phase.devices_per_worker`` of its devices (several side by side where that is below them);
  else the one team of ``processes_per_worker`` consecutive processes it belongs to, over their
  devices. Each holds the phase's groups and ``shared`` (the process's ``Resolutions``, made
  once per sweep; a new one if None)."""
  shared = shared or Resolutions()
  import jax

  k = int(phase.processes_per_worker)
  wanted = set(phase.groups)
  groups = [g for g in plan.groups if g.id in wanted]
  if k == 1:
    team = sharding.Team((jax.process_index(),))
    return [
      Worker(devices, team, groups, local=jax.process_count() > 1, shared=shared)
      for devices in config_lib.worker_slices(cfg, phase.devices_per_worker)
    ]
  first = jax.process_index() // k * k
  team = sharding.Team(tuple(range(first, first + k)))
  per_process = len(config_lib.process_devices(cfg))
  devices = []
  for p in team.processes:
    devices += [d for d in jax.devices() if d.process_index == p][:per_process]
  return [Worker(devices, team, groups, local=False, shared=shared)]
