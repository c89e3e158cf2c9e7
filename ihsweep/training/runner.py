"""Training one group: ``fit`` (validate, choose memory, lock the directory, run
``ihsweep.training.loop``), the group worked out once (``resolve``, ``ResolvedGroup``), and its
programs (built by ``ihsweep.training.group_build``) compiled ahead of time (``precompile``) or
against a device's memory (``resolve_memory``).

The pieces of a run live in their own modules, where callers import them from:
``ihsweep.training.resume`` (config.json, the resume check), ``ihsweep.training.startup`` (state,
checkpoints, probes), ``ihsweep.training.loop`` and ``ihsweep.training.hooks`` (the loop),
``ihsweep.training.progress``, ``ihsweep.training.stopping`` (stop requests),
``ihsweep.training.loader`` (host-fed batches) and ``ihsweep.training.evaluation`` (the online
evaluation and the stop rule).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from ihsweep.base import sharding
from ihsweep.base.errors import StorageFault, is_storage_message, storage_errno
from ihsweep.compute import schedule as schedule_lib
from ihsweep.compute import train
from ihsweep.compute.model import ModelConfig
from ihsweep.configuration import config as config_lib
from ihsweep.configuration import fields
from ihsweep.data import probes as probes_lib
from ihsweep.runs import ownership
from ihsweep.training import compiled_facts, loop, memory, resume
from ihsweep.training.evaluation import EmergenceStop
from ihsweep.training.group_build import GroupBuild, per_device_bytes
from ihsweep.training.progress import logs_above_bars

log = logging.getLogger("ihsweep")


def group_devices(cfg, devices=None, local: bool = False) -> list:
  """The devices a run's mesh uses (``config.validate`` checks the same choice): the first
  ``mesh.num_devices`` of ``devices`` if that is set; else all of them when the run is one mesh
  over every process (several processes, no ``devices``, not ``local``); else the longest prefix
  of them the ensemble can use whole (``sharding.usable_devices``: a group smaller than a
  worker runs on part of it). ``devices`` default: ``jax.local_devices()`` with ``local``, else
  ``jax.devices()``."""
  whole = devices is None and not local and jax.process_count() > 1
  if devices is None:
    devices = jax.local_devices() if local else jax.devices()
  devices = list(devices)
  if cfg.mesh.num_devices or whole:
    return devices[: cfg.mesh.num_devices or None]
  return sharding.usable_devices(cfg.ensemble.size, cfg.train.batch_size, devices)


def _candidates(devices, local: bool):
  """The devices a run may use as ``config.validate`` reads them: None for the default of a run
  that is one mesh over every process (or of one process), else a list."""
  if devices is None and not local:
    return None
  return list(jax.local_devices() if devices is None else devices)


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedGroup:
  """One group worked out once (``resolve``), by whoever places it: a sweep's worker,
  ``ihsweep train``, or ``fit`` given a bare config. ``fit`` and ``precompile`` take it as it is:
  nothing is validated, checked or resolved again, and its parts (mesh, model, data source:
  ``parts``) are built once, shared by a compile-ahead and the training.

  Attributes:
    id: the group's id in its sweep (``g003``), None for a lone run.
    cfg: the run's config, validated (``config.validate``), its automatic memory settings
      recorded (``resolve_memory``: nothing left 0 or auto that memory decides).
    devices: the devices of its mesh (``group_devices``), in order.
    local: trained by this process alone, on its own devices (a worker's process-local group).
    choice: the ``memory.Choice`` compiled against the devices' capacity; None where nothing
      was compiled (a device of unknown capacity, such as a CPU, or nothing automatic).
    name: how log lines and errors name it (``group g003``, or a lone run's directory).
  """

  id: str | None
  cfg: Any
  devices: tuple
  local: bool = False
  choice: memory.Choice | None = None
  name: str = "the run"
  _lock: Any = dataclasses.field(default_factory=threading.Lock, repr=False)
  _built: list = dataclasses.field(default_factory=list, repr=False)

  def parts(self) -> GroupBuild:
    """The group's mesh, model, data source and programs (``GroupBuild``), built at the first call
    (on whichever thread makes it: a compile-ahead's or the training's) and kept until
    ``release``."""
    with self._lock:
      if not self._built:
        self._built.append(GroupBuild(self.cfg, list(self.devices)))
      return self._built[0]

  def on(self, devices) -> ResolvedGroup:
    """This resolution bound to a worker over ``devices`` (another slice of the same layout:
    as many devices of the same kind, ``worker_layout.Resolutions``): the same config and
    memory choice on the same-length prefix of ``devices``, with parts of its own (built when
    first asked for); itself where the devices are its own."""
    devices = tuple(list(devices)[: len(self.devices)])
    if devices == self.devices:
      return self
    return dataclasses.replace(self, devices=devices, _lock=threading.Lock(), _built=[])

  def release(self) -> None:
    """Drops the built parts (a data source can hold large arrays): a worker keeps the records
    of all its groups, the parts of the one it trains and the next only."""
    with self._lock:
      self._built.clear()


def resolve(
  cfg, devices=None, local: bool = False, *, group_id=None, name=None, checked: bool = False
) -> ResolvedGroup:
  """Works a group out once: validates ``cfg`` for the devices it may use (``config.validate``),
  picks its mesh's devices (``group_devices``), refuses a group too large for any memory
  setting (``memory.check_possible``) and makes its automatic memory choices
  (``resolve_memory``: compiled against the devices' capacity where it is known).

  ``devices``, ``local``: as ``fit`` takes them. ``group_id``: the group's id in its sweep;
  ``name``: how messages name it (default ``group <id>``, else 'the run'). ``checked``: the
  caller has validated the whole config and checked that it can fit (a sweep does both for
  every group before its directory exists; ``ihsweep train`` before it claims the directory):
  only the rules that depend on these devices are applied (``config.validate_devices``).

  Raises:
    ConfigError, DataError: a bad field, or data that cannot be found.
    memory.DoesNotFit: no memory setting fits (nothing is trained or written).
  """
  candidates = _candidates(devices, local)
  if checked:
    config_lib.validate_devices(cfg, candidates)
  else:
    config_lib.validate(cfg, candidates)
  devices = group_devices(cfg, candidates, local)
  name = name or (f"group {group_id}" if group_id else "the run")
  if not checked:
    memory.check_possible(cfg, devices, name)
  cfg, choice = resolve_memory(cfg, devices, name)
  return ResolvedGroup(group_id, cfg, tuple(devices), local, choice, name)


def lower_train_program(cfg, devices: list, source=None):
  """The train program ``fit`` compiles for ``cfg``'s group (one host call of up to
  ``train.steps_per_call`` updates), at ``cfg``'s own memory setting and attention (as
  ``resolve_memory`` returns them: nothing left 0 or auto), lowered against abstract arguments
  on ``devices`` (compile-only devices too): a ``jax.stages.Lowered`` whose compiled program can
  be read (benchmarks/gpu_kernels.py)."""
  group = GroupBuild(cfg, devices, source)
  return group.train_program().lower(
    group.abstract_state(), group.abstract_hparams(), group.abstract_data()
  )


def resolve_memory(
  cfg,
  devices: list,
  name: str = "the run",
  capacity=None,
  source=None,
  platform=None,
  count_kernels: Callable[[str], int] | None = None,
  facts: compiled_facts.CompiledFacts | None = None,
):
  """``cfg`` with its automatic memory choices made for ``devices`` (``ihsweep.training.memory``):
  ``train.gradient_accumulation_steps`` 0, ``train.remat`` 'auto' and ``ensemble.vmap_chunk`` 0
  become the values ``memory.choose`` finds by compiling the group's programs against the
  devices' capacity (``memory.device_capacity``); without a known capacity (a CPU) they become
  k = 1, no remat and the usual chunk rule, without compiling anything. ``train.attention``
  'auto' becomes the kernel ``train.resolve_attention`` picks for the devices (cuDNN's flash
  attention on GPUs where it applies), and the programs are compiled with it.

  ``capacity`` (bytes per device) replaces the devices' own, ``source`` the data source the
  group would build, and ``platform`` (``gpu``, ``tpu``) the devices' own for the default vmap
  chunk (``ihsweep plan --target``: compile-only devices, no corpus; a GPU target compiled on
  CPU devices still starts from every model at once, as on the GPU). ``count_kernels``: a
  function from a compiled program's HLO text to the kernels it launches per update, recorded
  in each compiled setting (the plan's ``ihsweep.planning.kernels``, passed in: training does
  not need it). ``facts``: compiles through a ``compiled_facts.CompiledFacts`` (a plan's
  compile-only target: what an earlier compile of the same program found is read back), else
  every program is compiled.

  Returns:
    ``(cfg, choice)``: a copy of ``cfg`` with the chosen values recorded (the original if
    nothing was automatic), and the ``memory.Choice`` (None if nothing was compiled).

  Raises:
    memory.DoesNotFit: the capacity is known and no setting fits (before anything trains).
  """
  k, remat = cfg.train.get("gradient_accumulation_steps", 1), cfg.train.get("remat", "none")
  auto_k, auto_remat = k == 0, remat == "auto"
  auto_chunk = cfg.ensemble.vmap_chunk == 0
  platform = platform or getattr(devices[0], "platform", "cpu")
  chosen = cfg.train.get("attention", "explicit")
  try:
    attention = train.resolve_attention(chosen, ModelConfig.from_config(cfg.model), devices[0])
  except ValueError as e:
    raise fields.ConfigError("train.attention", chosen, f"auto, explicit or xla: {e}") from None
  capacity = capacity or memory.device_capacity(devices[0])
  if capacity is None and not (auto_k or auto_remat) and attention == chosen:
    return cfg, None
  out = copy.deepcopy(cfg)
  with out.unlocked():  # the first setting; the group is built once with it
    out.train.gradient_accumulation_steps = k or 1
    out.train.remat = "none" if auto_remat else remat
    out.train.attention = attention
  if capacity is None:
    return out, None
  facts = facts or compiled_facts.CompiledFacts("", capacity, directory=None)
  group = GroupBuild(out, devices, source)
  state, hp, data = group.abstract_state(), group.abstract_hparams(), group.abstract_data()
  n_ens, n_data = group.mesh.shape["ensemble"], group.mesh.shape["data"]
  local = group.n_models // n_ens

  def compile_train(setting: memory.Setting) -> memory.ProgramMemory:
    program = group.train_program_at(
      setting.gradient_accumulation_steps, setting.remat, setting.vmap_chunk
    )
    # kernels: launches per update, the plan's estimate of their time
    return facts.analyse(program.lower(state, hp, data), group.mesh.size, count_kernels)

  eval_mem = None
  if schedule_lib.eval_interval(out):
    evaluator = group.evaluator(None, capacity)
    eval_mem = facts.analyse(evaluator.lower(state.params), group.mesh.size)
  prefetch = per_device_bytes(data) if group.host_fed else 0
  choice = memory.choose(
    compile_train,
    batch_size=group.tcfg.batch_size,
    data_axis=n_data,
    local_models=local,
    default_chunk=cfg.ensemble.vmap_chunk
    or train.auto_vmap_chunk(local, group.tcfg, group.mcfg.vocab_size, platform),
    fixed_k=k,
    fixed_chunk=cfg.ensemble.vmap_chunk,
    remat=remat,
    capacity_bytes=capacity,
    resident_extra_bytes=prefetch,
    eval_memory=eval_mem,
    group=name,
  )
  s = choice.setting
  with out.unlocked():
    out.train.gradient_accumulation_steps = s.gradient_accumulation_steps
    out.train.remat = s.remat
    if auto_chunk:
      out.ensemble.vmap_chunk = s.vmap_chunk
  log.info(
    "%s: %s per device of %s (%s; %d setting(s) compiled)",
    name,
    memory.gib(choice.per_device_bytes),
    memory.gib(capacity),
    s.describe(),
    len(choice.tried),
  )
  return out, choice


def precompile(group, devices=None, local: bool = False) -> dict[str, float]:
  """Compiles a run's programs ahead of time, as ``fit(group, ..., devices=devices,
  local=local)`` builds them (``group``: a ``ResolvedGroup``, whose parts the training then
  reuses, or a config, resolved here as ``fit`` resolves it) — the initialisation, the train
  program (which also serves the short last call) and, with evaluation on, the evaluation —
  from their shapes alone (``jax.ShapeDtypeStruct`` inputs with the run's shardings): nothing
  is trained and no file is written; data sources are built as ``fit`` builds them (a corpus
  is read from its cache, or tokenized into it).

  Given a ``ResolvedGroup``, a later ``fit`` of it runs these very programs (the parts' jitted
  functions: their first call neither traces nor compiles again); given a config, a later
  ``fit`` of the same config on the same devices loads them from the persistent compilation
  cache where it is on (``compile_cache.enable``), else this only measures the compile time. A
  worker calls this for its next group on a background thread while it trains the current one
  (JAX compiles on any thread; the training's own dispatches go on meanwhile). In a job of
  several processes without ``local`` (one global mesh), every process must call it, as every
  process runs ``fit``.

  Returns:
    Seconds spent compiling each program: ``{"init": s, "train": s[, "eval": s[, "probes":
    s]]}`` ("probes": a generated source's sampler of held-out sequences, compiled by drawing
    them once, as a fresh ``fit`` does); a program already in the persistent cache takes the
    time to load it.

  Raises:
    ConfigError, DataError: as ``fit`` does, before anything is compiled.
  """
  if not isinstance(group, ResolvedGroup):
    group = resolve(group, devices, local)
  cfg, group = group.cfg, group.parts()
  seconds = {}

  def compile_(name: str, lowered):
    start = time.perf_counter()
    lowered.compile()
    seconds[name] = time.perf_counter() - start

  init = group.init_fn().lower(jax.ShapeDtypeStruct((group.n_models,), np.int32))
  compile_("init", init)
  state = init.out_info  # TrainState of ShapeDtypeStruct, with the ensemble sharding
  compile_(
    "train", group.train_program().lower(state, group.abstract_hparams(), group.abstract_data())
  )
  if schedule_lib.eval_interval(cfg):
    compile_("eval", group.evaluator(None).lower(state.params))
    if not group.source.has_held_out_windows:
      # A generated source's held-out sequences come from its sampler, jitted by
      # probes.held_out_sequences when a fresh run makes its probes: compiled by drawing them
      # (E · eval.n_sequences sequences, discarded).
      start = time.perf_counter()
      probes_lib.held_out_sequences(
        group.source,
        group.data_params,
        jax.tree_util.tree_map(np.asarray, group.source.arrays()),
        cfg.eval.probe_seed,
        cfg.eval.n_sequences,
        group.n_models,
      )
      seconds["probes"] = time.perf_counter() - start
  return seconds


def fit(
  group,
  workdir: str,
  *,
  progress: bool = True,
  desc: str | None = None,
  stop_rule: EmergenceStop | None = None,
  devices=None,
  local: bool = False,
  keep_bar: bool = True,
) -> loop.FitResult:
  """Trains ``cfg.ensemble.size`` models on ``cfg.data`` for ``cfg.train.num_steps`` updates,
  evaluating and checkpointing them; resumes from ``workdir``'s latest full-state checkpoint.
  ``group``: a ``ResolvedGroup`` (``resolve``: validated, checked and its memory chosen once,
  by the caller; ``devices`` and ``local`` are then its own), or a run's config, resolved here.

  Writes into ``workdir``: ``config.json``; ``train_log.jsonl`` (one row per host call:
  ``step``, ``tokens`` per model, ``updates`` in the call, per-model ``loss`` and ``grad_norm``
  averaged over them, null for a diverged model); ``metrics.jsonl`` (every
  ``schedule.eval_interval`` updates and at the end, one row per model: see
  ``Evaluator.rows``); ``probes.npz``; ``checkpoints/`` (``ihsweep.runs.checkpoint``).

  Devices (``group_devices``): ``devices`` are those the run may use, default all. The
  processes owning the mesh's devices (``sharding.Team``) train it together and the first of
  them writes the files: under several processes without ``devices`` or ``local``, every
  process on one global mesh; with ``devices`` of some processes (a worker spanning hosts),
  those processes only (collectives and barriers among them, checkpoint managers over them);
  with ``local``, this process alone on (part of) its own devices (a worker's process-local
  group: no collective or barrier with the others, ``RunCheckpoints`` over this process).

  A model whose loss turns NaN/inf is frozen (``train.train_step``) and the others go on.
  ``stop_rule`` (``EmergenceStop``) ends training early at an evaluation step. After
  ``request_stop`` (SIGTERM) the state is checkpointed and ``Interrupted`` is raised.

  Progress (``progress``): start-up — building, restoring, compiling or loading the programs,
  the first evaluation and call — is its own phase, logged with its seconds once; the bar opens
  when the first call has finished, at the updates done, and its rate, ETA and ``tok_s`` count
  the calls after it only (``Throughput``), so a resumed run shows the speed an uninterrupted
  one does. ``desc``: the bar's label (a resolved group's id prefixes this run's log lines);
  ``keep_bar``: whether the finished bar stays on screen (a sweep with its own bar over groups
  clears it). While the bar is open, log lines are written above it
  (``logs_above_bars``).

  Returns:
    A ``loop.FitResult``: the final state, the last losses, where it resumed from and stopped,
    divergence and stop-rule steps per model, throughput and ``loop.Timings``.

  Raises:
    ConfigError: before anything is compiled, if a field is invalid or the directory holds a
      run with a different config.
    DataError: data that cannot be read or built (``CheckpointError``: checkpoints present but
      none restorable).
    Interrupted: stopped on request, after the checkpoint.
  """
  started = time.perf_counter()
  if not isinstance(group, ResolvedGroup):  # before the run directory exists
    group = resolve(group, devices, local, name=workdir)
  elif devices is not None or local:
    raise TypeError("fit: a ResolvedGroup brings its own devices; pass neither devices nor local")
  team = sharding.Team.of(list(group.devices))
  # The team's lead marks and locks the directory (process 0 for one global mesh).
  here = team.leads and not team.is_everyone
  ownership.claim_workdir(workdir, "train", here)
  _quiet_failed_writes()
  try:
    with ownership.workdir_lock(workdir, here), logs_above_bars(progress):
      # a changed config is refused before anything is built
      resume.check_config(group.cfg, workdir)
      return loop.train_group(
        group.parts(),
        workdir,
        who=f"{group.id}: " if group.id else "",
        team=team,
        progress=progress,
        desc=desc,
        stop_rule=stop_rule,
        started=started,
        keep_bar=keep_bar,
      )
  except Exception as e:
    fault = StorageFault.of(e, workdir)  # a checkpoint's or a record's write
    if fault is None or fault is e:
      raise
    raise fault from e


def _quiet_failed_writes() -> None:
  """Silences orbax's error logs (with tracebacks) from its writer threads when a write failed
  for a fault of the storage, which ``StorageFault`` reports in one line (the "Event loop is
  closed" echoes of its abandoned writes: ``checkpoint.RunCheckpoints``)."""
  absl = logging.getLogger("absl")
  if any(getattr(f, "ihsweep_storage_fault", False) for f in absl.filters):
    return

  def keep(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (storage_errno(error) or is_storage_message(record.getMessage()))

  keep.ihsweep_storage_fault = True
  absl.addFilter(keep)
