"""How long a group takes on m devices: the throughput models of ``ihsweep plan``
(``ihsweep.planning.placement`` schedules with them).

* ``FlopsModel(F)``: t = cost / (m · F), cost = E · updates · B · C · training FLOPs per token
  (``model.flops_per_token``), F the sustained FLOP/s of one device (e.g. an H100 at 40% MFU in
  bf16 ≈ 4e14): perfect data-parallel scaling inside a worker, no start-up, no communication.
* ``MeasuredModel``: measured on this machine with the trainer's own programs
  (``measure_group``: the pieces ``runner.fit`` runs), for a representative subset of the
  groups; t = start-up + Σ_calls (a + b · k) + evaluations · e + checkpoints · s over the
  group's real call, evaluation and checkpoint schedule (``schedule.RunSchedule``).

A model has ``seconds(job, m)`` (a breakdown: ``FlopsSeconds`` or ``MeasuredSeconds``, each with
``total_s``, ``hidden_s`` and ``comm_s``), ``cannot_time(m)`` (why a
mesh of m devices cannot be timed, or None), ``describe()`` (one paragraph for the output) and
``to_json()``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from typing import Callable

from ihsweep.base import sharding
from ihsweep.compute import model as model_lib
from ihsweep.compute import schedule as schedule_lib
from ihsweep.compute import train
from ihsweep.data import probes as probes_lib
from ihsweep.data.probes import eval_layout
from ihsweep.data.source import host_batch_array
from ihsweep.planning import chips
from ihsweep.runs import checkpoint
from ihsweep.training.group_build import GroupBuild

GRAD_BYTES = 4  # per parameter: gradients are float32 (parameters are kept in float32)


@dataclasses.dataclass(frozen=True)
class FlopsSeconds:
  """``FlopsModel.seconds``: one group's seconds on m devices. ``total_s`` = ``train_s``
  (FLOPs / (m · F)) + ``comm_s`` (its updates' gradient all-reduces) + ``eval_s`` (its online
  evaluations' forward FLOPs); ``startup_s`` 0 (compilation is not modelled). All float
  seconds; ``to_json`` gives these keys in this order (``plan --json``'s ``times``)."""

  total_s: float
  startup_s: float
  train_s: float
  comm_s: float
  eval_s: float
  hidden_s = 0.0  # no compile to hide behind training

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MeasuredSeconds:
  """``MeasuredModel.seconds``: one group's seconds on m devices of this machine. ``total_s`` =
  ``startup_s`` + ``train_s`` (``calls`` host calls, a + b · k each, k ``steps_per_call``) +
  ``eval_s`` (``evaluations`` of them) + ``checkpoint_s`` (``checkpoints`` writes);
  ``hidden_s``: the part of ``startup_s`` compiled ahead behind the previous group's training
  (0 on a CPU). ``measured``: timed itself, else scaled from group ``scaled_from``. Seconds are
  floats; ``to_json`` gives these keys in this order (``plan --json``'s ``times``)."""

  total_s: float
  startup_s: float
  hidden_s: float
  train_s: float
  eval_s: float
  checkpoint_s: float
  calls: int
  evaluations: int
  checkpoints: int
  measured: bool
  scaled_from: str | None
  steps_per_call: int
  comm_s = 0.0  # measured on one machine: all-reduces are inside train_s

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


class FlopsModel:
  """t = (cost + evaluation FLOPs) / (m · F) + updates · all-reduce: ``flops_per_s`` F
  sustained per device, perfect data-parallel scaling of the compute inside a worker (the
  evaluations: ``eval_s``), no start-up; with a ``network``, each
  update of a group whose mesh has a data axis of n > 1 devices also all-reduces its gradient
  (the models of one device: E / ensemble axis × parameters × 4 bytes) over them
  (``chips.Network.all_reduce_s``; the data axis is the mesh's inner one, so a ring stays inside a
  host when n divides ``devices_per_host``, else it crosses hosts), not overlapped with compute;
  and each phase switch costs ``network.phase_switch_s``. Without one: no communication
  (relative FLOPs, or the model before communication was priced)."""

  def __init__(
    self,
    flops_per_s: float,
    network: chips.Network | None = None,
    devices_per_host: int = 8,
    compiled: dict | None = None,
    compiled_note: str = "",
    compiled_jobs=(),
    planned_devices: int = 0,
  ):
    self.flops_per_s = float(flops_per_s)
    self.network, self.devices_per_host = network, int(devices_per_host)
    self.phase_switch_s = network.phase_switch_s if network else 0.0
    # {group id: compiled_times.GroupTimes} pricing every group (compiled_for), else None;
    # compiled_jobs: those groups (their E and B give the devices each uses on a worker)
    self.compiled, self.compiled_note = compiled, compiled_note
    self.compiled_jobs = list(compiled_jobs) if compiled else []
    self.planned_devices = planned_devices  # a plan's N (describe's --target example), or 0

  def compiled_for(self, jobs, store=None) -> FlopsModel:
    """This model with the compiled times of ``jobs`` on its network's chip
    (``compiled_times.CompiledTimes``; ``store`` one, default the chip's in the default
    directory) where every group has them; else itself, noting why not (``describe``). No
    network (relative FLOPs): itself."""
    from ihsweep.planning import compiled_times

    if self.network is None:
      return self
    store = store or compiled_times.CompiledTimes(self.network.name)
    jobs = list(jobs)
    found, note = store.for_jobs(jobs)
    return FlopsModel(
      self.flops_per_s, self.network, self.devices_per_host, found, note, jobs, self.planned_devices
    )

  def cannot_time(self, n_devices: int) -> str | None:
    """Why workers of ``n_devices`` cannot be priced: with compiled times, a group whose
    programs a compiled plan found too large for the devices it would use there."""
    from ihsweep.planning.list_schedule import usable_device_count

    for job in self.compiled_jobs:
      m = usable_device_count(job.n_models, job.batch_size, n_devices)
      if self.compiled[job.id].does_not_fit(m):
        return f"group {job.id} does not fit {m} device(s) (the compiled plan's memory)"
    return None

  def all_reduce_s(self, job, devices: int) -> float:
    """One update's gradient all-reduce on ``devices`` devices (0 without a data axis)."""
    if self.network is None:
      return 0.0
    n_ens, n_data = sharding.mesh_shape(job.n_models, job.batch_size, devices)
    grad_bytes = job.n_models // n_ens * job.n_params * GRAD_BYTES
    # The data axis is the mesh's inner one: each ring is n_data consecutive devices, inside a
    # host only if it is no longer than a host and a host holds whole rings.
    h = self.devices_per_host
    across = n_data > h or h % n_data != 0
    return self.network.all_reduce_s(grad_bytes, n_data, across)

  def seconds(self, job, devices: int) -> FlopsSeconds:
    """With compiled times: updates × the compiled seconds per update on ``devices``
    (``GroupTimes.seconds_per_update``) + the all-reduces; evaluations are not counted, as
    the compiled plan counts none. Else FLOPs / (m · F) + the all-reduces + the evaluations'
    forward FLOPs."""
    comm_s = job.updates * self.all_reduce_s(job, devices)
    if self.compiled:
      train_s = job.updates * self.compiled[job.id].seconds_per_update(devices)
      return FlopsSeconds(train_s + comm_s, 0.0, train_s, comm_s, 0.0)
    train_s = job.cost_flops / (devices * self.flops_per_s)
    eval_s = self.eval_s(job, devices)
    return FlopsSeconds(train_s + comm_s + eval_s, 0.0, train_s, comm_s, eval_s)

  def eval_s(self, job, devices: int) -> float:
    """The group's online evaluations on ``devices``: the probes and the sequences each split
    over the mesh's data axis when it divides their count (``evaluation.Evaluator``), else
    repeated on each of its devices (the ensemble axis splits the models either way)."""
    parts = getattr(job, "eval_parts", ())
    if not parts:
      return 0.0
    n_ens, n_data = sharding.mesh_shape(job.n_models, job.batch_size, devices)
    return sum(
      flops / (n_ens * (n_data if items % n_data == 0 else 1) * self.flops_per_s)
      for flops, items in parts
    )

  def describe(self) -> str:
    if self.network is None:
      return (
        f"{self.flops_per_s:.3g} FLOP/s per device (--flops_per_s); a group on m devices "
        f"takes (cost + its evaluations' forward FLOPs) / (m · F): perfect data-parallel "
        f"scaling inside a worker, no start-up (compilation), no communication "
        f"(--network=none)"
      )
    comm = (
      f"updates × its gradient all-reduce over the mesh's data axis (a ring, float32 "
      f"gradients, not overlapped with compute; across hosts unless the axis divides a host's "
      f"{self.devices_per_host} devices) on --network={self.network.describe()}; no start-up "
      f"(compilation) but the phase switches"
    )
    if self.compiled:
      return (
        f"the compiled plan's times ({self.compiled_note}): a group on m devices takes updates "
        f"× its compiled roofline seconds per update (FLOPs and memory traffic; scaled as "
        f"m0 / m from the m0 devices it was compiled on) + {comm}; evaluations not counted, "
        f"as in the compiled plan; --flops_per_s unused"
      )
    target = target_example(self.network, self.planned_devices)
    return (
      f"{self.flops_per_s:.3g} FLOP/s per device (--flops_per_s); a group on m devices takes "
      f"(cost + its evaluations' forward FLOPs) / (m · F) + {comm}. FLOPs cannot see memory "
      f"traffic: a group bound by it (small B × C) takes longer than this says, and the "
      f"layout may not be the fastest; `ihsweep plan --target={target}` "
      f"compiles every group, and this plan (and `ihsweep run`'s auto layout on that chip) then "
      f"prices them by its times" + (f" ({self.compiled_note})" if self.compiled_note else "")
    )

  def to_json(self) -> dict:
    out = {
      "model": "compiled" if self.compiled else "flops",
      "flops_per_s": self.flops_per_s,
      "assumes": "perfect data-parallel scaling inside a worker; no start-up; "
      + ("no communication" if self.network is None else "communication: the network below"),
      "compiled_times": self.compiled_note or None,
    }
    out["network"] = None
    if self.network is not None:
      out["network"] = {
        **dataclasses.asdict(self.network),
        "devices_per_host": self.devices_per_host,
      }
    return out


def target_example(network: chips.Network, n_devices: int = 0) -> str:
  """The ``--target`` value whose compiled plan writes the times of ``network``'s chip for
  ``n_devices`` devices (0: not known): a GPU's 'h100-80gb --devices=8', a TPU generation's
  slice of that many devices ('v5e:2x4'; 'v5e:SHAPE' where no slice sold has that many)."""
  for name, chip in chips.TPU_CHIPS.items():
    if chip.network == network.name:
      return f"{name}:{chips.tpu_slice(name, n_devices // chip.cores_per_chip) or 'SHAPE'}"
  for name, chip in chips.GPUS.items():
    if chip.network == network.name:
      return f"{name} --devices={n_devices or 'N'}"
  return "NAME"


# Chips whose FLOP/s and network a jax.distributed job prices its phases with, by the words in
# JAX's device_kind: (peak dense bf16 FLOP/s per device, network: also the name its compiled
# times are kept under, compiled_times).
_RUNTIME_CHIPS = (  # (words of its device_kind, peak FLOP/s, chips.NETWORKS entry): chips.CHIPS
  ("H100", 989e12, "h100"),
  ("H200", 989e12, "h200"),
  ("A100", 312e12, "a100"),
  ("L40S", 362e12, "l40s"),
  ("TPU v4", 275e12, "v4"),
  ("v5 lite", 197e12, "v5e"),
  ("v5e", 197e12, "v5e"),
  ("v5p", 459e12, "v5p"),
  ("v6 lite", 918e12, "v6e"),
  ("v6e", 918e12, "v6e"),
)
RUNTIME_MFU = 0.4  # the sustained share of peak the runtime assumes (ihsweep plan's example)


def runtime_model(devices) -> FlopsModel:
  """The model a jax.distributed job chooses its phases with (``phases.plan_phases``; every
  process computes it from the same devices, so all agree): on a chip named in
  ``_RUNTIME_CHIPS`` (by ``device_kind``), ``RUNTIME_MFU`` of its peak and its ``chips.NETWORKS``
  entry, with this process's devices as a host's (what ``ihsweep plan --flops_per_s=F
  --network=NAME --devices_per_host=H`` prices); elsewhere (CPUs, other chips) relative FLOPs,
  no communication priced (``FlopsModel(1.0)``). Its callers bind their groups' compiled times
  (``FlopsModel.compiled_for``), so that where ``ihsweep plan --target`` compiled them the run
  prices them as both plans do."""
  devices = list(devices)
  kind = getattr(devices[0], "device_kind", "") if devices else ""
  for words, peak, net in _RUNTIME_CHIPS:
    if devices[0].platform != "cpu" and words.lower() in kind.lower():
      per_host = sum(1 for d in devices if d.process_index == devices[0].process_index)
      return FlopsModel(RUNTIME_MFU * peak, chips.NETWORKS[net], per_host)
  return FlopsModel(1.0)


@dataclasses.dataclass
class Measured:
  """Seconds of one group's pieces on ``devices`` devices of this machine (``measure_group``).

  startup_s: build the data source, initialise, make the probes, compile the training and
  evaluation programs; compile_s: the part of it compiling the training and evaluation
  programs (what a worker compiles ahead for its next group); call_s: a, the fixed cost of one
  host call (sampling its K batches, dispatch, the sync); update_s: b, each update in a call;
  eval_s: one evaluation; params_save_s / state_save_s: one checkpoint (write included)."""

  group: str
  devices: int
  startup_s: float
  compile_s: float
  call_s: float
  update_s: float
  eval_s: float
  params_save_s: float
  state_save_s: float


def _eval_work(job) -> float:
  """Tokens an evaluation runs (probes and held-out sequences) × FLOPs per token: the scale of
  ``Measured.eval_s`` between groups."""
  cfg = job.cfg
  _, length = eval_layout(cfg.eval, job.context_size)
  tokens = job.n_models * (
    cfg.eval.n_probes * length + cfg.eval.n_sequences * (job.context_size + 1)
  )
  return tokens * model_lib.flops_per_token(
    model_lib.ModelConfig.from_config(cfg.model), job.context_size
  )


def _median(xs) -> float:
  xs = sorted(xs)
  n = len(xs)
  return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def measure_group(cfg, devices, repeats: int = 3) -> dict:
  """Times one group's pieces on ``devices`` with the trainer's own programs (the code path
  of ``runner.fit``): start-up (source, init, probes, AOT compilation of the training and
  evaluation programs), ``repeats`` calls of K updates and of 1 update after a warm-up call
  (a and b from their medians), evaluations, and params and full-state checkpoints (orbax,
  in a temporary directory, written to the end). Returns the fields of ``Measured`` but
  ``group``."""
  import jax

  state, hp, data, k, exe, evaluator, compile_s, startup_s = _compiled_group(cfg, devices)

  def timed(fn):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t

  def call(n_active):
    nonlocal state
    state, metrics = exe(state, hp, data, n_active)
    return metrics

  timed(lambda: call(k))  # warm-up
  full = [timed(lambda: call(k)) for _ in range(repeats)]
  one = [timed(lambda: call(1)) for _ in range(repeats)]
  update_s = max(0.0, (_median(full) - _median(one)) / (k - 1)) if k > 1 else 0.0
  call_s = max(0.0, _median(one) - update_s)
  eval_s = (
    _median([timed(lambda: evaluator(state.params)) for _ in range(repeats)])
    if evaluator is not None
    else 0.0
  )
  params_save_s, state_save_s = _checkpoint_seconds(cfg, state, repeats)
  return dict(
    devices=len(devices),
    startup_s=startup_s,
    compile_s=compile_s,
    call_s=call_s,
    update_s=update_s,
    eval_s=eval_s,
    params_save_s=params_save_s,
    state_save_s=state_save_s,
  )


def _compiled_group(cfg, devices) -> tuple:
  """``measure_group``'s start-up, as ``runner.fit`` does it (the group built by
  ``group_build.GroupBuild``, as training builds it): ``(state, hparams, one call's data, K,
  the compiled training program, the evaluator or None, compile seconds, start-up seconds)``."""
  import jax
  import numpy as np

  t0 = time.perf_counter()
  group = GroupBuild(cfg, list(devices))
  tcfg, mesh, source = group.tcfg, group.mesh, group.source
  hp = jax.device_put(group.hparams(), sharding.ensemble_sharding(mesh))
  state = group.init_fn()(np.asarray(train.model_seeds(cfg), np.int32))
  k = min(tcfg.steps_per_call, tcfg.num_steps)
  host_arrays = None if group.host_fed else jax.tree_util.tree_map(np.asarray, source.arrays())
  if group.host_fed:  # one call's batches, reused: the loader's gathering overlaps training
    keys = sharding.to_host(state.data_key)
    data = host_batch_array(source, keys, 0, k, sharding.host_batch_sharding(mesh))
  else:
    data = jax.device_put(host_arrays, sharding.replicated(mesh))
  evaluator = None
  if schedule_lib.eval_interval(cfg):
    probes = probes_lib.make_probes(
      source, group.data_params, host_arrays, cfg.eval, group.n_models, tcfg.context_size
    )
    evaluator = group.evaluator(probes)
  t = time.perf_counter()
  exe = group.train_program().compile(state, hp, data)
  if evaluator is not None:
    jax.block_until_ready(evaluator(state.params))
  compile_s = time.perf_counter() - t
  startup_s = time.perf_counter() - t0
  return state, hp, data, k, exe, evaluator, compile_s, startup_s


def _checkpoint_seconds(cfg, state, repeats: int) -> tuple[float, float]:
  """``(seconds per params checkpoint, seconds of a full-state checkpoint)``, written to the
  end with orbax in a temporary directory."""
  import tempfile

  with tempfile.TemporaryDirectory(prefix="ihsweep-plan-") as tmp:
    ckpts = checkpoint.RunCheckpoints(
      tmp,
      {},
      keep_state=cfg.checkpoint.keep_state,
      async_save=cfg.checkpoint.async_save,
      read_only=False,
    )
    t = time.perf_counter()
    for step in range(1, repeats + 1):
      ckpts.save_params(step, state.params)
    ckpts.wait()
    params_save_s = (time.perf_counter() - t) / repeats
    t = time.perf_counter()
    ckpts.save_state(1, state)
    ckpts.wait()
    state_save_s = time.perf_counter() - t
    ckpts.close()
  return params_save_s, state_save_s


def representative(jobs: list, limit: int = 3) -> list:
  """The jobs to measure: the largest, median and smallest FLOPs per update (all when there are
  at most ``limit``), in plan order."""
  if len(jobs) <= limit:
    return list(jobs)
  by_work = sorted(jobs, key=lambda j: j.flops_per_update)
  picks = {by_work[-1].id, by_work[len(by_work) // 2].id, by_work[0].id}
  return [j for j in jobs if j.id in picks]


class MeasuredModel:
  """Times measured on this machine (``measure_group``) for a representative subset of the
  groups (``representative``), at each device count a layout gives them; any other group is
  scaled from the measured one nearest in FLOPs per update: b by FLOPs per update, a by tokens
  per call (E · K · B · C: sampling), evaluations by their work (``_eval_work``), checkpoints by
  parameter count, start-up the same. A group's time follows its real schedule: host calls of
  at most K updates ending at every evaluation and checkpoint step
  (``schedule.RunSchedule``), the evaluation at update 0 included; start-up is on its worker's
  critical path (nothing overlaps it).

  Args:
    jobs: every job (plan order); devices: this machine's devices (``jax.local_devices()``);
    measure: ``measure_group`` (replaceable in tests); log: progress lines (``print``-like).
  """

  def __init__(
    self,
    jobs: list,
    devices,
    measure: Callable = measure_group,
    log: Callable = lambda line: None,
    subset: list | None = None,
  ):
    self.jobs = jobs
    self.devices = list(devices)
    self.subset = subset if subset is not None else representative(jobs)
    self._measure, self._log = measure, log
    self.measured: dict[tuple[str, int], Measured] = {}
    self.measure_s = 0.0  # wall seconds spent measuring
    self.cpu_s = 0.0  # this process's CPU seconds meanwhile
    self.phase_switch_s = 0.0  # measured times are one process's: no teams, no switches

  @property
  def hides_compile(self) -> bool:
    """Whether a worker's later groups compile behind training (an accelerator; not a CPU)."""
    return bool(self.devices) and self.devices[0].platform != "cpu"

  def cannot_time(self, n_devices: int) -> str | None:
    if n_devices > len(self.devices):
      return (
        f"a mesh of {n_devices} devices spans more than this machine's "
        f"{len(self.devices)}, on which times are measured (give --flops_per_s)"
      )
    return None

  def _ensure(self, devices: int) -> None:
    for job in self.subset:
      if (job.id, devices) in self.measured:
        continue
      try:
        sharding.mesh_shape(job.n_models, job.batch_size, devices)
      except sharding.MeshError:
        continue  # this group never runs on that many devices
      self._log(
        f"measuring group {job.id} (E = {job.n_models}, B = {job.batch_size}, C = "
        f"{job.context_size}) on {devices} device(s) ..."
      )
      t, cpu = time.perf_counter(), time.process_time()
      fields = self._measure(job.cfg, self.devices[:devices])
      self.measure_s += time.perf_counter() - t
      self.cpu_s += time.process_time() - cpu
      self.measured[(job.id, devices)] = Measured(group=job.id, **fields)

  def reference(self, job, devices: int) -> tuple:
    """The measured group nearest to ``job`` in FLOPs per update on ``devices`` devices."""
    self._ensure(devices)
    done = [j for j in self.subset if (j.id, devices) in self.measured]
    if not done:  # no measured group fits this count: measure this one
      self.subset = self.subset + [job]
      self._ensure(devices)
      done = [job]
    ref = min(
      done, key=lambda j: (abs(math.log(j.flops_per_update / job.flops_per_update)), j.id != job.id)
    )
    return ref, self.measured[(ref.id, devices)]

  def seconds(self, job, devices: int) -> MeasuredSeconds:
    ref, m = self.reference(job, devices)
    k = min(int(job.cfg.train.steps_per_call), job.cap_updates or job.updates)
    update_s = m.update_s * job.flops_per_update / ref.flops_per_update
    call_s = (
      m.call_s
      * (job.n_models * job.batch_size * job.context_size)
      / (ref.n_models * ref.batch_size * ref.context_size)
    )
    eval_s = m.eval_s * (_eval_work(job) / _eval_work(ref) if m.eval_s else 1.0)
    size = job.n_params / ref.n_params if ref.n_params else 1.0
    cfg = copy.deepcopy(job.cfg)
    with cfg.unlocked():  # the schedule the runner builds: from the budget (the cap)
      cfg.train.num_steps = job.cap_updates or job.updates
    run = schedule_lib.RunSchedule.from_config(cfg)
    lengths, done = [], 0
    for n in run.calls():
      if done >= job.updates:
        break
      lengths.append(n)
      done += n
    ends = list(itertools.accumulate(lengths))
    n_evals = 1 + sum(run.eval_due(s) or s == job.updates for s in ends) if run.eval_every else 0
    n_params = sum(1 for s in run.params if s <= job.updates) + (job.updates not in run.params)
    n_states = sum(run.state_due(s) or s == job.updates for s in ends)
    train_s = len(lengths) * call_s + job.updates * update_s
    eval_total = n_evals * eval_s
    save_s = size * (n_params * m.params_save_s + n_states * m.state_save_s)
    total = m.startup_s + train_s + eval_total + save_s
    # On an accelerator a worker compiles its next group's programs on the host while the
    # devices train (sweep: compile ahead): only its first group waits for them. On a CPU the
    # compiler takes the cores the training uses: nothing is hidden.
    hidden = m.compile_s if self.hides_compile else 0.0
    return MeasuredSeconds(
      total_s=total,
      startup_s=m.startup_s,
      hidden_s=hidden,
      train_s=train_s,
      eval_s=eval_total,
      checkpoint_s=save_s,
      calls=len(lengths),
      evaluations=n_evals,
      checkpoints=n_params + n_states,
      measured=ref.id == job.id,
      scaled_from=None if ref.id == job.id else ref.id,
      steps_per_call=k,
    )

  def cpu_share(self) -> float | None:
    """The share of this machine's cores this process used while measuring (process CPU
    time / (wall time × cores)): well below what training alone takes, other load was running
    and the measured times are inflated by it."""
    import os

    cores = len(os.sched_getaffinity(0))
    return self.cpu_s / (self.measure_s * cores) if self.measure_s > 0 else None

  def describe(self) -> str:
    ids = ", ".join(j.id for j in self.subset)
    if len(self.subset) == len(self.jobs):
      which = f"every group ({ids})"
    else:
      which = (
        f"groups {ids} (the largest, median and smallest FLOPs per update; the others "
        f"scaled from the nearest of them: updates by FLOPs per update, calls by tokens "
        f"per call, evaluations by their work)"
      )
    overlap = (
      "compiled ahead behind the previous group's training, so only a worker's first "
      "group waits for its compilation"
      if self.hides_compile
      else "on the critical path: a worker compiles its next group while it trains, but on "
      "a CPU the compiler takes the cores the training uses"
    )
    share = self.cpu_share()
    load = (
      f"; while measuring, this process used {share:.0%} of the machine's cores (other "
      f"load on the machine slows the measured times and a run alike)"
      if share is not None
      else ""
    )
    return (
      f"measured on this machine ({len(self.devices)} "
      f"{self.devices[0].platform if self.devices else ''} device(s)) with the trainer's "
      f"programs: {which}; "
      f"a group's time = start-up (source, init, probes, compiling the training and "
      f"evaluation programs; {overlap}) + its host calls (a + b · k each) + "
      f"evaluations + checkpoints, one group at a time on this machine (workers sharing "
      f"its cores slow each other: not modelled){load}"
    )

  def to_json(self) -> dict:
    return {
      "model": "measured",
      "devices": len(self.devices),
      "platform": self.devices[0].platform if self.devices else None,
      "measured_groups": [j.id for j in self.subset],
      "measure_s": self.measure_s,
      "cpu_share": self.cpu_share(),
      "measurements": [dataclasses.asdict(m) for m in self.measured.values()],
      "assumes": "start-up on the critical path; one group at a time per machine",
    }
