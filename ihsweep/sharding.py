"""Device mesh for an ensemble: axes ``('ensemble', 'data')``.

Placement rule (``mesh_shape``): with n devices, E models and B sequences per update, the
``ensemble`` axis gets the largest divisor e of n that also divides E, and the ``data`` axis the
remaining d = n / e devices, which split each model's batch (so d must divide B). Models never
talk to each other, so the ensemble axis is free of communication; the data axis costs one
gradient all-reduce per step and is used only for what the ensemble axis cannot fill. If no
such split exists (e.g. E = 3, B = 6 on 4 devices) we refuse with a message rather than leave
devices idle or pad the ensemble with dummy models; use ``mesh.num_devices`` to run on fewer.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("ensemble", "data")


class MeshError(ValueError):
  """No (ensemble, data) split of the devices fits E and B."""


def mesh_shape(n_models: int, batch_size: int, n_devices: int) -> tuple[int, int]:
  """Returns ``(ensemble, data)`` axis sizes with product ``n_devices`` (rule in module doc).

  Raises:
    MeshError: if no divisor e of n_devices divides n_models with n_devices / e dividing
      batch_size.
  """
  for e in sorted((e for e in range(1, n_devices + 1) if n_devices % e == 0), reverse=True):
    if n_models % e == 0 and batch_size % (n_devices // e) == 0:
      return e, n_devices // e
  raise MeshError(
      f"cannot use all {n_devices} devices for ensemble size E = {n_models} and batch size "
      f"B = {batch_size}: need a divisor e of {n_devices} with e dividing E and {n_devices}/e "
      f"dividing B; change E or B, or set mesh.num_devices to a count that fits")


def make_mesh(n_models: int, batch_size: int, devices=None) -> Mesh:
  """A ``Mesh`` over ``devices`` (default: all) with axes ('ensemble', 'data')."""
  devices = list(jax.devices() if devices is None else devices)
  e, d = mesh_shape(n_models, batch_size, len(devices))
  return Mesh(np.asarray(devices).reshape(e, d), AXES)


def ensemble_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis E split over 'ensemble', the rest replicated (train state, hyper-parameters)."""
  return NamedSharding(mesh, P("ensemble"))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """``[E, B, ...]`` arrays: E over 'ensemble', each model's batch over 'data'."""
  return NamedSharding(mesh, P("ensemble", "data"))


def per_step_sharding(mesh: Mesh) -> NamedSharding:
  """``[K, E, ...]`` per-step outputs of a scan: E over 'ensemble'."""
  return NamedSharding(mesh, P(None, "ensemble"))


def host_batch_sharding(mesh: Mesh) -> NamedSharding:
  """A call's batches ``[E, K, B, C + 1]`` (generated or host-fed): E over 'ensemble', B over
  'data'."""
  return NamedSharding(mesh, P("ensemble", None, "data"))


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device (shared read-only data such as a corpus's token array)."""
  return NamedSharding(mesh, P())


def use_one_cpu_device_per_core(n: int | None = None) -> int:
  """Asks XLA for one CPU device per core (``--xla_force_host_platform_device_count``) unless
  XLA_FLAGS already sets a count. Call before JAX initialises its backends (first
  ``jax.devices()``); afterwards it changes nothing. Returns the count requested (0 if left).

  Why: each CPU device runs its share of the ensemble as its own program, so two cores train
  two models side by side instead of splitting every small op between them; on the 2-core
  benchmark machine this raised E = 16 throughput by 12% (reference) and 40% (tiny workload).
  """
  import os
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" in flags:
    return 0
  n = n or len(os.sched_getaffinity(0))
  os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
  return n


def to_host(tree):
  """numpy copies of a pytree of arrays. Arrays spread over several processes (a global mesh)
  are gathered from all of them (``multihost_utils.process_allgather``, a collective: every
  process must call it in the same order); single-process arrays are just copied."""
  leaves = jax.tree_util.tree_leaves(tree)
  if all(getattr(x, "is_fully_addressable", True) for x in leaves):
    return jax.tree_util.tree_map(np.asarray, tree)
  from jax.experimental import multihost_utils
  return jax.tree_util.tree_map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def any_process(flag: bool) -> bool:
  """True if ``flag`` is true in any process (a collective when there are several; every
  process must call it at the same point)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(np.asarray(multihost_utils.process_allgather(np.asarray([flag]))).any())


def barrier(name: str) -> None:
  """Waits until every process reaches this point (nothing to do in one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def initialize_distributed() -> int:
  """Joins a multi-process run through ``jax.distributed.initialize`` when launched as one:
  ``IHSWEEP_COORDINATOR`` (host:port), ``IHSWEEP_NUM_PROCESSES`` and ``IHSWEEP_PROCESS_ID``
  (set by ``launch/local_multiprocess.sh``), or ``IHSWEEP_DISTRIBUTED=1`` for JAX's own cluster
  detection (SLURM, Cloud TPU pods, Open MPI: ``launch/slurm.sbatch``, ``launch/tpu_pod.sh``).
  ``IHSWEEP_HEARTBEAT_S`` (default 100) is how long the others wait for a silent process.
  Call before anything else touches JAX's devices. Returns the process count (1 when not
  launched as several)."""
  import os
  env = os.environ
  heartbeat = int(env.get("IHSWEEP_HEARTBEAT_S", "100"))
  if env.get("IHSWEEP_COORDINATOR"):
    jax.distributed.initialize(env["IHSWEEP_COORDINATOR"], int(env["IHSWEEP_NUM_PROCESSES"]),
                               int(env["IHSWEEP_PROCESS_ID"]),
                               heartbeat_timeout_seconds=heartbeat)
  elif env.get("IHSWEEP_DISTRIBUTED", "") not in ("", "0"):
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat)
  else:
    return 1
  return jax.process_count()
