"""Which workers a process runs (``sweep``): in a jax.distributed job, the phases of workers of
``sweep.processes_per_worker`` processes (``phases``, ``phase_worker``); in one process, one
worker over its devices or, with ``sweep.devices_per_worker``, several over slices of them
(``config.worker_slices``). A ``Worker`` is where one trains: its devices, the processes owning them
and the groups it may take."""

from __future__ import annotations

import dataclasses

from ihsweep.base import sharding
from ihsweep.configuration import config as config_lib
from ihsweep.configuration.fields import ConfigError
from ihsweep.configuration.grid import Plan
from ihsweep.planning import list_schedule, placement, timing
from ihsweep.planning import phases as phases_lib
from ihsweep.training import runner


@dataclasses.dataclass
class Worker:
  """Where a worker trains: its devices and the processes owning them (``sharding.Team``:
  this process alone for independent processes and process-local groups; several processes of
  a jax.distributed job for a worker spanning hosts), and the groups it may take."""

  devices: list
  team: object  # sharding.Team
  groups: list
  local: bool  # a process-local worker inside a jax.distributed job
  resolved: dict = dataclasses.field(default_factory=dict)  # group id -> runner.ResolvedGroup

  def resolve(self, group) -> runner.ResolvedGroup:
    """The group as this worker resolved it (``_fit_memory``), resolved now if it was not (a
    group that read as done then)."""
    if group.id not in self.resolved:
      resolved = runner.resolve(
        group.cfg, self.devices, self.local, group_id=group.id, checked=True
      )
      group.cfg = resolved.cfg
      self.resolved[group.id] = resolved
    return self.resolved[group.id]


def phases(cfg, plan: Plan) -> list:
  """The phases of a sweep inside a jax.distributed job of several processes
  (``phases.plan_phases``: in each, workers of ``processes_per_worker`` consecutive
  processes take that phase's groups; every process computes the same list). One phase of
  process-local workers holding every group when the job has one process.

  Raises:
    ConfigError: ``sweep.processes_per_worker`` that does not divide the process count, or
      with a group that cannot use all of a worker's devices; ``mesh.num_devices`` below a
      process's device count when a phase has workers spanning processes.
  """
  import jax

  n = jax.process_count()
  k = int(cfg.sweep.processes_per_worker)
  if n == 1:
    return [phases_lib.Phase(1, tuple(g.id for g in plan.groups))]
  if k and n % k:
    raise ConfigError(
      "sweep.processes_per_worker", k, f"0 (chosen) or a divisor of the {n} processes of this job"
    )
  local = len(jax.local_devices())
  per_process = len(config_lib.process_devices(cfg))
  try:
    steps = phases_lib.plan_phases(
      placement.jobs_from_plan(cfg, plan),
      n,
      per_process,
      k,
      model=timing.runtime_model(jax.devices()),
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


def phase_worker(cfg, plan: Plan, phase) -> Worker:
  """This process's worker in ``phase``: the team of ``processes_per_worker`` consecutive
  processes it belongs to, their devices, and the phase's groups."""
  import jax

  k = int(phase.processes_per_worker)
  wanted = set(phase.groups)
  groups = [g for g in plan.groups if g.id in wanted]
  if k == 1:
    devices = config_lib.process_devices(cfg)
    return Worker(
      devices, sharding.Team((jax.process_index(),)), groups, local=jax.process_count() > 1
    )
  first = jax.process_index() // k * k
  team = sharding.Team(tuple(range(first, first + k)))
  per_process = len(config_lib.process_devices(cfg))
  devices = []
  for p in team.processes:
    devices += [d for d in jax.devices() if d.process_index == p][:per_process]
  return Worker(devices, team, groups, local=False)
