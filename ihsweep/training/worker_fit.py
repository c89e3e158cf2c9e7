"""Whether a sweep's groups fit the workers that would train them: the one decision that
``ihsweep run`` makes for its process's devices before its run directory exists
(``workers.sweep.run``) and ``ihsweep plan`` makes for the devices it plans, which its machine
need not have (``commands.plan``), so that the two refuse the same groups.

A process's devices are shared by workers of ``sweep.devices_per_worker`` D of them (its first
``mesh.num_devices`` where that is set); with D = 0 (auto) a group is checked against the widest
worker the layout may choose, all of them. On that worker's devices a group must pass
``config.validate`` (its mesh, ``train.gradient_accumulation_steps`` and ``ensemble.vmap_chunk``
on the mesh's devices, ...) and fit at some memory setting (``memory.check_possible``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ihsweep.configuration import config as config_lib
from ihsweep.configuration import grid as grid_lib
from ihsweep.training import memory, runner


class PlannedDevice:
  """A device of a machine a plan is for and this one lacks (``ihsweep plan --flops_per_s``):
  counted, of unknown memory (``memory.device_capacity`` reads only ``$IHSWEEP_DEVICE_MEMORY``
  for it; without that variable no group is refused for its memory)."""

  platform = "planned"

  def __init__(self, index: int):
    self.id = index

  def memory_stats(self):
    return None

  def __repr__(self) -> str:
    return f"PlannedDevice({self.id})"


class _Repeated(Sequence):
  """``n`` devices like ``device``, without a list of ``n`` (a plan may span 10⁹ devices):
  what ``memory.check_possible`` reads of a job's devices (the first one, and how many)."""

  def __init__(self, device, n: int):
    self.device, self.n = device, n

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i):
    if isinstance(i, slice):
      return _Repeated(self.device, len(range(self.n)[i]))
    if not -self.n <= i < self.n:
      raise IndexError(i)
    return self.device


def check_group(
  cfg, plan, group, worker: list, *, capacity: int | None = None, job_devices: int = 0
) -> None:
  """Refuses a planned group that a worker over ``worker`` could not train: the group's run
  config validated on those devices (``grid.validate_group``: errors under the sweep field
  where the grid sets it), then refused where too large for them at any memory setting
  (``memory.check_possible`` on the devices its mesh uses, ``runner.group_devices``).

  Args:
    cfg: the sweep's config (its ``sweep`` section names the axes).
    plan: ``grid.make_plan(cfg)``; ``group``: one of its groups.
    worker: the worker's devices, in order (stand-ins such as ``PlannedDevice`` are counted,
      and the first one's memory read).
    capacity: bytes per device where the caller knows them (a ``--target``'s), else the
      devices' own (``memory.device_capacity``).
    job_devices: the devices of a jax.distributed job of several processes, whose phases may
      place a group on all of them (the widest placement, the least memory per device): the
      memory check counts them instead of the worker's; 0: one process.

  Raises:
    ConfigError: naming the field, the value and what the worker's devices allow.
    memory.TooLarge: the group's train state and tokens alone exceed a device.
    DataError: as ``config.validate``.
  """
  grid_lib.validate_group(group, plan.axes, cfg, worker)
  if job_devices:
    devices = _Repeated(worker[0], int(group.cfg.mesh.num_devices) or job_devices)
  else:
    devices = runner.group_devices(group.cfg, worker, local=True)
  memory.check_possible(group.cfg, devices, f"group {group.id}", capacity, group.n_params)


def check_sweep(cfg, plan, devices, *, capacity: int | None = None, job_devices: int = 0) -> list:
  """Checks ``sweep.devices_per_worker`` against a process of ``devices`` and every group of
  ``plan`` against that process's first worker (``check_group``; all of its workers are
  alike), plan order (most expensive first). ``ihsweep run`` passes ``jax.local_devices()``;
  ``ihsweep plan`` the devices of one process of the machine it plans.

  Args:
    cfg: the sweep's config; ``plan``: ``grid.make_plan(cfg)``.
    devices: the process's devices, in order (a list; stand-ins as ``check_group`` takes them).
    capacity, job_devices: as ``check_group``.

  Returns:
    The first worker's devices: the first D of the process's (D = ``sweep.devices_per_worker``;
    0: all of them).

  Raises:
    ConfigError: ``sweep.devices_per_worker`` that does not divide the process's devices, or
      the first group refused (``check_group``).
    memory.TooLarge, DataError: as ``check_group``.
  """
  config_lib.check_devices_per_worker(cfg, len(devices))
  worker = config_lib.worker_slices(cfg, devices=devices)[0]
  for group in plan.groups:
    check_group(cfg, plan, group, worker, capacity=capacity, job_devices=job_devices)
  return worker
