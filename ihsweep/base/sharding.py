"""Device mesh for an ensemble: axes ``('ensemble', 'data')``.

Placement rule (``mesh_shape``): with n devices, E models and B sequences per update, the
``ensemble`` axis gets the largest divisor e of n that also divides E, and the ``data`` axis the
remaining d = n / e devices, which split each model's batch (so d must divide B). Models never
talk to each other, so the ensemble axis is free of communication; the data axis costs one
gradient all-reduce per step and is used only for what the ensemble axis cannot fill. If no
such split of n exists (e.g. E = 3, B = 6 on 4 devices), ``mesh_shape`` refuses rather than pad
the ensemble with dummy models; a run that may use fewer devices takes the longest prefix of
them that splits (``usable_devices``: 3 here), one that must use all of them (one global mesh
over several processes) is refused; ``mesh.num_devices`` sets the count.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import dataclasses
import math
import os
import sys
import threading
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ihsweep.base import environment, runtime_abort
from ihsweep.base.errors import IhsweepError
from ihsweep.base.numbers import divisors

AXES = ("ensemble", "data")


class MeshError(IhsweepError, ValueError):
  """No (ensemble, data) split of the devices fits E and B."""


def mesh_shape(n_models: int, batch_size: int, n_devices: int) -> tuple[int, int]:
  """Returns ``(ensemble, data)`` axis sizes with product ``n_devices`` (rule in module doc).

  Raises:
    MeshError: if no divisor e of n_devices divides n_models with n_devices / e dividing
      batch_size.
  """
  for e in reversed(divisors(n_devices)):
    if n_models % e == 0 and batch_size % (n_devices // e) == 0:
      return e, n_devices // e
  raise MeshError(
    f"cannot use all {n_devices} devices for ensemble size E = {n_models} and batch size "
    f"B = {batch_size}: need a divisor e of {n_devices} with e dividing E and {n_devices}/e "
    f"dividing B; change E or B, or set mesh.num_devices to a count that fits"
  )


def usable_devices(n_models: int, batch_size: int, devices) -> list:
  """The longest prefix of ``devices`` that an ensemble of E = ``n_models`` with batch size B =
  ``batch_size`` can use whole (``mesh_shape`` accepts its count; at most E · B): a group smaller
  than a worker runs on part of the worker's devices instead of being refused."""
  devices = list(devices)
  return devices[: usable_count(n_models, batch_size, len(devices))]


def usable_count(n_models: int, batch_size: int, n_devices: int) -> int:
  """How many of ``n_devices`` an ensemble of E = ``n_models`` with batch size B can use whole
  (``usable_devices``): the largest n <= N with n = e · d, e dividing E and d dividing B, found
  from the divisors (time independent of the device count)."""
  data = divisors(batch_size)
  best = 1
  for e in divisors(n_models):
    if e > n_devices:
      break
    d = data[bisect.bisect_right(data, n_devices // e) - 1]
    best = max(best, e * d)
  return best


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
  two models side by side instead of splitting every small op between them (measured gain:
  docs/benchmarks.md, "What makes it fast on CPU").
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" in flags:
    return 0
  n = n or len(os.sched_getaffinity(0))
  os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
  return n


@dataclasses.dataclass(frozen=True)
class Team:
  """The processes of a ``jax.distributed`` job that train one group together: those owning
  the devices of its mesh (``Team.of``). One process of several: a process-local group (no
  collective or barrier with the others); all of them: one global mesh; a subset (a worker
  spanning several hosts): collectives and barriers among the subset only. The team's first
  process (its ``lead``) writes the group's files. In a one-process job every team is that
  process."""

  processes: tuple[int, ...]

  @classmethod
  def of(cls, devices) -> "Team":
    """The processes owning ``devices``."""
    return cls(tuple(sorted({d.process_index for d in devices})))

  @classmethod
  def everyone(cls) -> "Team":
    return cls(tuple(range(jax.process_count())))

  @property
  def lead(self) -> int:
    return self.processes[0]

  @property
  def leads(self) -> bool:
    """Whether this process is the team's lead (writes its files, holds its locks)."""
    return jax.process_index() == self.lead

  @property
  def is_everyone(self) -> bool:
    return len(self.processes) == jax.process_count()

  @property
  def alone(self) -> bool:
    """One process of several: a process-local group."""
    return len(self.processes) == 1 and jax.process_count() > 1

  def devices(self) -> list:
    """One device per process of the team (its first local one): where team collectives
    run."""
    first = {}
    for d in jax.devices():
      if d.process_index in self.processes and d.process_index not in first:
        first[d.process_index] = d
    return [first[p] for p in self.processes]


def _team(team) -> Team:
  return Team.everyone() if team is None else team


def _team_reduce(values: np.ndarray, team: Team, op) -> np.ndarray:
  """``op`` (e.g. ``jnp.max``) over the team's processes of each process's ``values`` (int32
  vector): a collective on one device per team process; every process of the team must call
  it at the same point, the others never."""
  key = (op, team.processes)
  if key not in _TEAM_REDUCERS:  # one compiled program per team and op (called every host call)
    mesh = Mesh(np.array(team.devices()), ("p",))
    _TEAM_REDUCERS[key] = (
      mesh,
      jax.jit(lambda x: op(x, axis=0), out_shardings=NamedSharding(mesh, P())),
    )
  mesh, reduce = _TEAM_REDUCERS[key]
  values = np.asarray(values, np.int32)[None]
  mine = mesh.devices[team.processes.index(jax.process_index())]  # this process's device
  rows = jax.make_array_from_single_device_arrays(
    (len(team.processes), values.shape[1]),
    NamedSharding(mesh, P("p")),
    [jax.device_put(values, mine)],
  )
  return np.asarray(reduce(rows).addressable_data(0))


_TEAM_REDUCERS: dict = {}
_REPLICATORS: dict = {}


def to_host(tree):
  """numpy copies of a pytree of arrays. Arrays spread over several processes are gathered:
  over every process with ``multihost_utils.process_allgather``; over a team of some of them
  (a worker spanning hosts) by replicating them on their own mesh. Either is a collective:
  every process holding a part must call it in the same order. Arrays on this process's
  devices alone (one process, or a process-local group in a multi-process job) are just
  copied."""
  leaves = jax.tree_util.tree_leaves(tree)
  if all(getattr(x, "is_fully_addressable", True) for x in leaves):
    return jax.tree_util.tree_map(np.asarray, tree)
  spread = [x for x in leaves if not getattr(x, "is_fully_addressable", True)]
  if all(Team.of(x.sharding.device_set).is_everyone for x in spread):
    from jax.experimental import multihost_utils

    return jax.tree_util.tree_map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
  mesh = spread[0].sharding.mesh
  if mesh not in _REPLICATORS:  # one program per team mesh (jit caches it per tree structure)
    _REPLICATORS[mesh] = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, P()))
  whole = _REPLICATORS[mesh](tree)
  return jax.tree_util.tree_map(
    lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else np.asarray(x),
    whole,
  )


def any_process(flag: bool, team: Team | None = None) -> bool:
  """True if ``flag`` is true in any process of ``team`` (default: every process): a
  collective when the team has several processes (each must call it at the same point); a
  team of this process alone: ``flag`` itself."""
  return any_process_each((flag,), team)[0]


def any_process_each(flags, team: Team | None = None) -> tuple[bool, ...]:
  """``any_process`` of several flags in one collective: element i is true if ``flags[i]`` is
  true in any process of ``team``."""
  team = _team(team)
  flags = np.asarray([int(bool(f)) for f in flags])
  if len(team.processes) == 1:
    return tuple(bool(f) for f in flags)
  if team.is_everyone:
    from jax.experimental import multihost_utils

    return tuple(bool(f) for f in np.asarray(multihost_utils.process_allgather(flags)).any(0))
  import jax.numpy as jnp

  return tuple(bool(f) for f in _team_reduce(flags, team, jnp.max))


def lead_value(value: int, team: Team | None = None) -> int:
  """The team lead's ``value`` (an int >= -1), received by every process of the team (a
  collective over the team; a team of one returns ``value``)."""
  team = _team(team)
  if len(team.processes) == 1:
    return int(value)
  import jax.numpy as jnp

  if value < -1:
    raise ValueError(f"lead_value sends ints >= -1, got {value}")
  return int(_team_reduce(np.asarray([value if team.leads else -2]), team, jnp.max)[0])


def barrier(name: str, team: Team | None = None) -> None:
  """Waits until every process of ``team`` (default: every process) reaches this point
  (nothing to wait for in a team of one: a process-local group)."""
  team = _team(team)
  if len(team.processes) == 1:
    return
  if team.is_everyone:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
  else:
    any_process(False, team)  # a collective over the team returns once all have joined


def initialize_distributed() -> int:
  """Joins a multi-process run through ``jax.distributed.initialize`` when launched as one:
  ``IHSWEEP_COORDINATOR`` (host:port), ``IHSWEEP_NUM_PROCESSES`` and ``IHSWEEP_PROCESS_ID``
  (set by ``launch/local_multiprocess.sh``), or ``IHSWEEP_DISTRIBUTED=1`` for JAX's own cluster
  detection (SLURM, Cloud TPU pods, Open MPI: ``launch/slurm.sbatch``, ``launch/tpu_pod.sh``).
  ``IHSWEEP_HEARTBEAT_S`` (default 100) is how long the others wait for a silent process (one
  stopped, hung or unreachable): then each of them prints one line, runs the ``when_peer_lost``
  actions and exits with status 1 (``_Watchdog``). Call before anything else touches JAX's
  devices. Returns the process count (1 when not launched as several).

  Raises:
    EnvironmentVariableError: a variable's value is not allowed (``ihsweep.base.environment``), or
      ``IHSWEEP_DISTRIBUTED=1`` where JAX detects no cluster.
  """
  env = os.environ
  if environment.get("IHSWEEP_COORDINATOR"):
    args = (
      environment.get("IHSWEEP_COORDINATOR"),
      environment.get("IHSWEEP_NUM_PROCESSES"),
      environment.get("IHSWEEP_PROCESS_ID"),
    )
  elif environment.get("IHSWEEP_DISTRIBUTED"):
    environment.distributed_cluster()
    args = ()
  else:
    return 1
  kwargs = {}
  if not args:  # JAX's detection: on SLURM, the GPUs this task may use (jax-ml/jax #28194)
    ids, why = slurm_local_device_ids(env)
    if ids is not None:
      kwargs["local_device_ids"] = ids
    if why:
      print(f"ihsweep: SLURM task {env.get('SLURM_PROCID')}: {why}", file=sys.stderr, flush=True)
  heartbeat = environment.get("IHSWEEP_HEARTBEAT_S")
  if args:  # JAX waits silently for the others (up to its initialization timeout, 300 s)
    print(
      f"ihsweep: process {args[2]} of {args[1]}: joining the job at {args[0]} (JAX waits up to "
      f"300 s for every process, then aborts)",
      file=sys.stderr,
      flush=True,
    )
  # JAX's own detection is the backstop: when it fires it aborts the process with a C++ stack
  # trace (its missed-heartbeat callback cannot be set from Python: jaxlib 0.10 fails to pass
  # the status to it), so it is given twice our bound and 30 s more, for a watchdog thread
  # starved of CPU on a loaded machine; should it still come first, the stack trace is one line
  # in the log (runtime_abort).
  runtime_abort.start(f"process {args[2]}" if args else "this process")
  jax.distributed.initialize(
    *args, heartbeat_timeout_seconds=min(math.ceil(2 * heartbeat + 30), 2**31 - 1), **kwargs
  )
  if jax.process_count() > 1:
    _Watchdog(heartbeat).start()
  return jax.process_count()


def _tasks_on_this_node(env) -> int | None:
  """Tasks of this SLURM step (or job) on this node: ``SLURM_STEP_TASKS_PER_NODE`` /
  ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"``: 2 on each of the first 3 nodes, 1 on the next),
  indexed by ``SLURM_NODEID``; else ``SLURM_NTASKS_PER_NODE``; None if none is set."""
  try:  # a value SLURM would not write reads as unknown
    node = int(env.get("SLURM_NODEID", "0") or 0)
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
      if env.get(name):
        counts = []
        for part in env[name].split(","):
          count, paren, times = part.partition("(x")
          if paren and not times.endswith(")"):
            return None
          counts += [int(count)] * int(times[:-1] if paren else 1)
        return counts[min(node, len(counts) - 1)]
    raw = env.get("SLURM_NTASKS_PER_NODE")
    return int(raw) if raw else None
  except ValueError:
    return None


def _gpus_on_this_node(env) -> int | None:
  """GPUs SLURM gave this job on this node: ``SLURM_GPUS_ON_NODE``, else the length of
  ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS`` (comma-separated ids); None if none is set."""
  if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
    return int(env["SLURM_GPUS_ON_NODE"])
  for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
    if env.get(name):
      return len(env[name].split(","))
  return None


def slurm_local_device_ids(env=os.environ) -> tuple[list[int] | None, str]:
  """The ``local_device_ids`` a SLURM task passes to ``jax.distributed.initialize``, and why.

  JAX's own SLURM detection gives every task ``[SLURM_LOCALID]``: right only when each task sees
  every GPU of its node and uses one. Where SLURM binds GPUs to tasks (``--gpus-per-task``,
  ``--gpu-bind``) the task's GPUs are renumbered from 0, so task 1's id 1 is "invalid device
  ordinal" (jax-ml/jax #28194, #23452); one task per node would see GPU 0 only (#16788). Rules,
  first that applies:

  1. ``IHSWEEP_LOCAL_DEVICE_IDS`` = ``"0,1,…"``: those ids.
  2. Not a SLURM task (no ``SLURM_PROCID``), or ``JAX_PLATFORMS`` without ``cuda``/``gpu``
     (TPU: JAX never restricts; CPU): ``None``, JAX's choice.
  3. ``CUDA_VISIBLE_DEVICES`` lists n GPUs bound to this task (fewer than the node's, or the
     task is alone on its node): all of them, ``[0 … n-1]`` (the process renumbers them).
  4. The node's g GPUs, seen by each of its t tasks (``CUDA_VISIBLE_DEVICES`` lists all g, or
     is unset and ``SLURM_GPUS_ON_NODE`` = g), t dividing g: task ``SLURM_LOCALID`` = l takes
     ``[l·g/t … (l+1)·g/t - 1]``.
  5. Otherwise ``None``: JAX's ``[SLURM_LOCALID]``, said in the reason.

  Returns:
    ``(ids or None, reason)``: the reason is one line for the log, "" outside SLURM.

  Raises:
    EnvironmentVariableError: ``IHSWEEP_LOCAL_DEVICE_IDS`` not a list of distinct ids >= 0.
  """
  raw = env.get("IHSWEEP_LOCAL_DEVICE_IDS", "").strip()
  if raw:
    var = environment.VARIABLES["IHSWEEP_LOCAL_DEVICE_IDS"]
    try:
      ids = var.parse(raw)
    except ValueError:
      raise environment.EnvironmentVariableError(var.name, raw, var.allowed) from None
    return ids, f"local device ids {ids} (IHSWEEP_LOCAL_DEVICE_IDS)"
  if "SLURM_PROCID" not in env:
    return None, ""
  platforms = env.get("JAX_PLATFORMS", "").lower()
  if platforms and not any(p in platforms for p in ("cuda", "gpu", "rocm")):
    return None, f"JAX_PLATFORMS={platforms}: JAX chooses the devices"
  tasks, gpus = _tasks_on_this_node(env), _gpus_on_this_node(env)
  raw_local = env.get("SLURM_LOCALID", "0").strip() or "0"
  local = int(raw_local) if raw_local.isdigit() else None
  if local is None or (tasks and local >= tasks):
    return None, (
      f"JAX's default: SLURM_LOCALID={raw_local!r} is no task of the {tasks or '?'} on this node; "
      "set IHSWEEP_LOCAL_DEVICE_IDS to choose"
    )
  visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
  if visible and visible[0] not in ("NoDevFiles", "-1"):
    n = len(visible)
    visible = ",".join(visible)
    if not (tasks and tasks > 1 and n > 1 and n == gpus):  # bound to this task (or its only one)
      return list(range(n)), (
        f"local device ids {_ids(range(n))}: the {n} GPU(s) visible to this task "
        f"(CUDA_VISIBLE_DEVICES={visible})"
      )
    where = f"the node's {n} GPUs, visible to each of its {tasks} tasks"
  elif gpus:
    n, where = gpus, f"the node's {gpus} GPUs (SLURM_GPUS_ON_NODE), {tasks or '?'} task(s) on it"
  else:
    n = None
    where = "no GPUs in SLURM's environment" if gpus == 0 else "no GPU count in SLURM's environment"
  if n and tasks and n % tasks == 0:
    share = n // tasks
    ids = list(range(local * share, (local + 1) * share))
    return ids, f"local device ids {_ids(ids)}: task {local} (SLURM_LOCALID)'s share of {where}"
  return None, (
    f"JAX's default, GPU {local} only (SLURM_LOCALID): no even split ({where}); set "
    "IHSWEEP_LOCAL_DEVICE_IDS to choose"
  )


def _ids(ids) -> str:
  ids = list(ids)
  return f"[{ids[0]}]" if len(ids) == 1 else f"[{ids[0]}…{ids[-1]}]"


def slurm_count(env, name: str, typed: bool = False) -> int:
  """A count SLURM writes into ``env[name]`` (0 when unset or empty); ``typed``: the
  ``[type:]count`` form of GPU options (``a100:2``, ``gpu:a100:2``).

  Raises:
    EnvironmentVariableError: a value SLURM would not write.
  """
  raw = env.get(name, "").strip()
  text = raw.rsplit(":", 1)[-1] if typed else raw
  if not raw:
    return 0
  if not text.isdigit():
    allowed = "[type:]count, e.g. 2 or a100:2" if typed else "a whole number >= 0 (SLURM sets it)"
    raise environment.EnvironmentVariableError(name, raw, allowed)
  return int(text)


def describe_slurm_tasks(env=os.environ) -> list[str]:
  """One line per task of this node, as ``launch/slurm.sbatch --dry-run`` prints them: the
  ``local_device_ids`` each task of the step would pass (``slurm_local_device_ids``), where srun
  binds ``SLURM_GPUS_PER_TASK`` GPUs to each task if that is set (``--gpus-per-task``) and every
  task sees the batch shell's ``CUDA_VISIBLE_DEVICES`` otherwise."""
  if "SLURM_JOB_ID" not in env:
    return ["device ids: not inside a SLURM allocation; each task logs its own when it starts"]
  tasks = _tasks_on_this_node(env) or 1
  per_task = slurm_count(env, "SLURM_GPUS_PER_TASK", typed=True)
  node = slurm_count(env, "SLURM_NODEID")
  lines = []
  for local in range(tasks):
    task_env = {**env, "SLURM_LOCALID": str(local), "SLURM_PROCID": str(node * tasks + local)}
    if per_task:
      task_env["CUDA_VISIBLE_DEVICES"] = ",".join(
        str(i) for i in range(local * per_task, (local + 1) * per_task)
      )
    ids, why = slurm_local_device_ids(task_env)
    lines.append(f"task {local} of {tasks} on node {node}: {why or 'JAX chooses the devices'}")
  return lines


_PEER_LOST_ACTIONS = []


@contextlib.contextmanager
def when_peer_lost(action):
  """Inside the block, ``action(reason: str)`` runs if this process is about to end because
  another process of the run stopped answering (``initialize_distributed``), e.g. a sweep marks
  its running group failed. It runs on a watchdog thread while the main thread may be blocked
  in a collective, so it should only write files."""
  _PEER_LOST_ACTIONS.append(action)
  try:
    yield
  finally:
    _PEER_LOST_ACTIONS.remove(action)


class _Watchdog:
  """Heartbeats through the coordination service's key-value store. Every process sets
  ``ihsweep/alive/<process>`` to a fresh count every ``interval`` seconds and reads the others';
  a process whose count stays the same for ``heartbeat`` seconds (stopped, hung), or a
  coordinator that does not answer for as long, ends this process: one line on stderr, the
  ``when_peer_lost`` actions, exit status 1. A process that exits normally says so first
  (``exited``), so that the others do not wait for it."""

  PREFIX = "ihsweep/alive/"

  def __init__(self, heartbeat: float):
    from jax._src import distributed  # the runtime client (orbax uses it the same way)

    self.client = distributed.global_state.client
    self.heartbeat = heartbeat
    self.interval = max(0.2, min(heartbeat / 5, 5.0))
    self.me, self.n = jax.process_index(), jax.process_count()
    self.stop = threading.Event()
    now = time.monotonic()
    self.contact = now  # last answer from the coordinator
    self.seen = {k: (None, now) for k in range(self.n) if k != self.me}  # count, when it changed

  def start(self) -> None:
    threading.Thread(target=self._beat, name="ihsweep-heartbeat", daemon=True).start()
    threading.Thread(target=self._watch, name="ihsweep-watchdog", daemon=True).start()
    atexit.register(self._exit)  # runs before JAX's own shutdown (registered earlier)

  def _exit(self) -> None:
    self.stop.set()
    try:
      self.client.key_value_set(f"{self.PREFIX}{self.me}", "exited", allow_overwrite=True)
    except Exception:  # noqa: BLE001 — the coordinator may be gone already
      pass

  def _beat(self) -> None:
    count = 0
    while not self.stop.is_set():
      count += 1
      try:
        self.client.key_value_set(f"{self.PREFIX}{self.me}", str(count), allow_overwrite=True)
        values = dict(self.client.key_value_dir_get(self.PREFIX))
      except Exception:  # noqa: BLE001 — no answer: _watch counts the silence
        values = None
      now = time.monotonic()
      if values is not None:
        self.contact = now
        for k, (last, _) in list(self.seen.items()):
          value = values.get(f"{self.PREFIX}{k}")
          if value == "exited":
            del self.seen[k]
          elif value != last:
            self.seen[k] = (value, now)
      self.stop.wait(self.interval)

  def _watch(self) -> None:
    while not self.stop.wait(min(self.interval, 1.0)):
      now = time.monotonic()
      silent = sorted(k for k, (_, t) in list(self.seen.items()) if now - t > self.heartbeat)
      if silent:
        self._lost(f"process {', '.join(map(str, silent))} of {self.n} stopped answering")
      elif now - self.contact > self.heartbeat:
        self._lost("the coordinator (process 0) stopped answering")

  def _lost(self, who: str) -> None:
    if self.stop.is_set():  # exiting normally
      return
    reason = (
      f"{who}: no heartbeat for IHSWEEP_HEARTBEAT_S = {self.heartbeat:g} s (stopped, "
      f"hung or unreachable)"
    )
    for action in list(_PEER_LOST_ACTIONS):
      try:
        action(reason)
      except Exception as e:  # noqa: BLE001 — the exit below must happen
        print(f"ihsweep: could not record the failure: {type(e).__name__}: {e}", file=sys.stderr)
    print(
      f"ihsweep: process {self.me} ends: {reason}; rerun the command to resume from the "
      f"last checkpoint",
      file=sys.stderr,
      flush=True,
    )
    sys.stdout.flush()
    os._exit(1)  # the main thread may be blocked in a collective with the silent process


if __name__ == "__main__":  # launch/slurm.sbatch --dry-run: each task's device ids
  try:
    print("\n".join(describe_slurm_tasks()))
  except environment.EnvironmentVariableError as e:
    print(f"ihsweep: {e}", file=sys.stderr)
    sys.exit(2)
