"""Host side of training one ensemble: validate, build, dispatch, log.

The loop dispatches host call i+1 before it reads call i's metrics (as nanodo does), so the
device never waits on Python; all per-step values come back as ``[K, E]`` arrays once per call.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from ihsweep import checkpoint, memory, rundir, sharding, sinks, train
from ihsweep import config as config_lib
from ihsweep import schedule as schedule_lib
from ihsweep.data import make_source
from ihsweep.data import probes as probes_lib
from ihsweep.data.source import host_batch_array
from ihsweep.errors import IhsweepError

# EmergenceStop and Evaluator are also read from here (runner.EmergenceStop); their home is
# ihsweep.evaluation.
from ihsweep.evaluation import EmergenceStop, Evaluator, json_value, replay

log = logging.getLogger("ihsweep")


def _jsonable(cfg) -> dict:
  return json.loads(cfg.to_json_best_effort()) if hasattr(cfg, "to_json_best_effort") else cfg


def write_resolved_config(cfg, workdir: str) -> str:
  """Writes ``workdir/config.json`` (every field, after command-line overrides)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  rundir.atomic_write_json(path, _jsonable(cfg), sort_keys=True)
  return path


RESUME_FREE_FIELDS = (*config_lib.EXECUTION_FIELDS, "checkpoint.")
"""Fields a resumed run may change (a trailing dot: a whole section): they move work between
devices, calls and workers, or choose what is saved, not the numbers (a run directory made
before such a field existed resumes under any value of it). Everything else — including
``train.num_steps``, which sets the learning-rate schedule — must match."""


def _flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_resumable(cfg, workdir: str) -> None:
  """Refuses to resume a run directory under a config that changes its numbers.

  Raises:
    ConfigError: naming the first field whose value differs from the stored ``config.json``
      (fields in ``RESUME_FREE_FIELDS`` may differ); ``WorkdirError`` if that file is missing
      or unreadable.
  """
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      old = _flatten(json.load(f))
  except (OSError, ValueError) as e:
    raise config_lib.WorkdirError(
      workdir,
      f"a run directory whose config.json can be read to check the resumed "
      f"config ({e}); its checkpoints cannot be verified: use a new --workdir",
    ) from None
  new = _flatten(_jsonable(cfg))
  for field in sorted(set(old) | set(new)):
    free = any(field == f or (f.endswith(".") and field.startswith(f)) for f in RESUME_FREE_FIELDS)
    if free or old.get(field) == new.get(field):
      continue
    if field not in old and new.get(field) == _added_field_default(field):
      continue  # a field added after the run was made, at its default: the run's behaviour
    if field in old:
      was = f"{old[field]!r}, as in the run being resumed in {workdir}"
    else:
      default = _added_field_default(field)
      was = f"absent from the run being resumed in {workdir} (made before the field existed" + (
        f"; its default {default!r} reproduces that run)" if default is not _MISSING else ")"
      )
    raise config_lib.ConfigError(
      field,
      new.get(field, "(absent)"),
      f"{was} (it has checkpoints); use a new --workdir to train with a different value",
    )


_MISSING = object()


def _added_field_default(field: str):
  """The default of a ``data``/``eval`` field (``data.default_config``,
  ``config.default_eval``), or a sentinel equal to nothing. Such a field added to ihsweep
  defaults to what runs did before it existed (e.g. ``data.induction_start`` 'half',
  ``eval.probe_position`` 'start'), so a run directory made before it resumes at that value."""
  from ihsweep import data

  section, _, rest = field.partition(".")
  defaults = {"data": data.default_config, "eval": config_lib.default_eval}.get(section)
  node = defaults() if defaults else None
  for key in rest.split("."):
    if node is None or not hasattr(node, "keys") or key not in node:
      return _MISSING
    node = node[key]
  return tuple(node) if isinstance(node, list) else node


def _rewrite_jsonl(path: str, rows: list[dict]) -> None:
  with rundir.atomic_file(path) as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def _short(values, limit: int = 8) -> str:
  """Per-model values for a log line: up to ``limit`` of them, 2 decimals."""
  v = [f"{x:.2f}" for x in np.asarray(values)[:limit]]
  return "[" + " ".join(v) + (" …]" if len(values) > limit else "]")


def cell_metadata(cfg, mcfg, tcfg, source, n_params: int) -> dict:
  """What every checkpoint of this run records about its models (``custom_metadata``)."""
  lrs, seeds, ids = train.peak_lrs(cfg), train.model_seeds(cfg), train.cell_ids(cfg)
  knobs = {k: np.asarray(v) for k, v in source.data_params(cfg.ensemble.size).items()}
  cells = []
  for i in range(cfg.ensemble.size):
    cell = {"cell": ids[i], "seed": seeds[i], "peak_lr": float(lrs[i])}
    cell.update({k: float(v[i]) for k, v in knobs.items()})
    cells.append(cell)
  return {
    "cells": cells,
    "model": dataclasses.asdict(mcfg),
    "n_params": n_params,
    "batch_size": tcfg.batch_size,
    "context_size": tcfg.context_size,
    "tokens_per_update": train.tokens_per_update(tcfg),
    "num_steps": tcfg.num_steps,
    "data_source": cfg.data.source,
  }


def _clock() -> float:
  """Seconds on a monotonic clock: the time between full-state checkpoints (a test replaces it)."""
  return time.monotonic()


def _progress_clock() -> float:
  """Seconds on a monotonic clock: the training speed the progress shows (a test replaces it)."""
  return time.monotonic()


@dataclasses.dataclass
class Throughput:
  """Training speed after start-up, as the progress bar shows it: the updates and tokens (all
  E models) of the host calls after the first, over the seconds (``_progress_clock``) since
  the first call had finished running. Start-up — building, restoring, compiling, the first
  evaluation and the first call — is outside it; the evaluations and checkpoints between calls
  are in it.

  ``add`` is called once a call's values are read, which waits for the call, so the time
  counted always covers the calls counted: a read that comes late (the host was saving a
  checkpoint while the devices ran on) delays the origin of no rate and cannot inflate one.
  A resumed run therefore shows the speed an uninterrupted one does.

  total: the run's updates (``train.num_steps``); start: the clock when the first call had
  finished (None before); step: the last update read; updates, tokens: counted since start;
  elapsed_s: seconds from start to the last read.
  """

  total: int
  start: float | None = None
  step: int = 0
  updates: int = 0
  tokens: int = 0
  elapsed_s: float = 0.0

  def begin(self, step: int) -> None:
    """The first call (ending at update ``step``) has finished: the clock starts now."""
    self.start, self.step = _progress_clock(), step

  def add(self, step: int, updates: int, tokens: int) -> None:
    """A later call's values were read: ``updates`` more, ending at update ``step``."""
    self.step = step
    self.updates += updates
    self.tokens += tokens
    self.elapsed_s = _progress_clock() - self.start

  @property
  def updates_per_s(self) -> float:
    """Updates per second (NaN before a second call was read)."""
    return self.updates / self.elapsed_s if self.updates and self.elapsed_s > 0 else math.nan

  @property
  def tokens_per_s(self) -> float:
    """Tokens per second, all models together (NaN before a second call was read)."""
    return self.tokens / self.elapsed_s if self.tokens and self.elapsed_s > 0 else math.nan

  @property
  def eta_s(self) -> float:
    """Seconds left to update ``total`` at ``updates_per_s`` (NaN while that is unknown)."""
    return (self.total - self.step) / self.updates_per_s if self.updates else math.nan

  def snapshot(self) -> dict:
    """``{"step", "updates_per_s", "tokens_per_s", "eta_s", "elapsed_s"}`` now."""
    return {
      "step": self.step,
      "updates_per_s": self.updates_per_s,
      "tokens_per_s": self.tokens_per_s,
      "eta_s": self.eta_s,
      "elapsed_s": self.elapsed_s,
    }


class _AboveBars:
  """A console stream that writes through ``tqdm.write``: each write clears the open bars,
  writes the text, and draws them again."""

  def __init__(self, stream):
    self.stream = stream

  def write(self, text: str) -> None:
    tqdm.write(text, file=self.stream, end="")

  def flush(self) -> None:
    self.stream.flush()


@contextlib.contextmanager
def logs_above_bars(on: bool = True):
  """While progress bars are drawn, the log lines that the root logger's console handlers (a
  ``StreamHandler`` on stderr or stdout, absl's included) print go through ``tqdm.write``,
  so that a line never runs into a bar's text; their format, level and filters are kept, and
  restored on exit. Handlers that write elsewhere (files, pytest's capture) are untouched;
  nothing is added where there is none. Nested uses and ``on=False`` change nothing."""
  handlers = []
  if on:
    for h in logging.getLogger().handlers:
      for handler in (h, getattr(h, "python_handler", None)):  # absl's ABSLHandler wraps one
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream in (sys.stderr, sys.stdout):
          handlers.append((handler, stream))
          handler.setStream(_AboveBars(stream))
  try:
    yield
  finally:
    for handler, stream in handlers:
      if isinstance(handler.stream, _AboveBars):
        handler.setStream(stream)


def _fault_injection(step: int, workdir: str, fault: str) -> None:
  """Test hook around the full-state save at update s: ``IHSWEEP_FAULT_DISK_FULL_AT_STEP=s``
  (``fault`` "DISK_FULL", before the save) fails it as orbax does on a full disk (the
  ``ValueError`` its tensorstore writes raise); ``IHSWEEP_FAULT_KILL_AT_STEP=s`` ("KILL", after)
  SIGKILLs this process right after it has started (its asynchronous write possibly
  unfinished). ``IHSWEEP_FAULT_PROCESS=p`` limits either to process p of a multi-process run,
  ``IHSWEEP_FAULT_GROUP=g`` to the run directory named g (a sweep's group)."""
  env = os.environ
  at = env.get(f"IHSWEEP_FAULT_{fault}_AT_STEP")
  only, group = env.get("IHSWEEP_FAULT_PROCESS"), env.get("IHSWEEP_FAULT_GROUP")
  if not (
    at
    and int(at) == step
    and (not only or int(only) == jax.process_index())
    and (not group or os.path.basename(os.path.normpath(workdir)) == group)
  ):
    return
  if fault == "KILL":
    os.kill(os.getpid(), signal.SIGKILL)
  tmp = os.path.join(workdir, "checkpoints", "state", f"{step}.orbax-checkpoint-tmp")
  raise ValueError(
    f'RESOURCE_EXHAUSTED: Error writing local file "{tmp}/_sharding": Failed '
    f'writing: "{tmp}/_sharding.__lock": Failed to write 6231 bytes to file 7: '
    f"No space left on device [os_error_code='28'] (IHSWEEP_FAULT_DISK_FULL)"
  )


_STOP_REQUESTED = threading.Event()
_STOP_SIGNALS = [0]  # stop requests so far (signals and calls)


def request_stop(signum=None, frame=None) -> None:
  """Asks a running ``fit`` to checkpoint and stop after its current host call (the SIGTERM and
  SIGINT handler the CLI installs: preemption, Ctrl-C). A second request only says that the
  checkpoint is being saved (it never interrupts a save); a third exits at once with status
  128 + the signal's number (130 for SIGINT), losing the updates since the last complete
  full-state checkpoint (a rerun resumes from it)."""
  del frame
  name = signal.Signals(signum).name if signum else "request_stop"
  _STOP_SIGNALS[0] += 1
  if _STOP_SIGNALS[0] == 1:
    log.warning("stop requested (%s): checkpointing after the current call", name)
  elif _STOP_SIGNALS[0] == 2:
    log.warning(
      "already stopping: saving a checkpoint (%s once more exits at once, losing the "
      "updates since the last complete checkpoint)",
      name,
    )
  elif signum:
    print(
      f"ihsweep: forced exit on a third stop request ({name}): the updates since the last "
      f"complete full-state checkpoint are lost; rerun the same command to resume from it",
      file=sys.stderr,
      flush=True,
    )
    os._exit(128 + signum)
  _STOP_REQUESTED.set()


def stop_requested() -> bool:
  """Whether ``request_stop`` was called in this process (it stays set)."""
  return _STOP_REQUESTED.is_set()


def install_stop_handlers() -> None:
  """SIGTERM and SIGINT → ``request_stop`` (main thread only)."""
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, request_stop)


class Interrupted(IhsweepError):
  """Training stopped on request (SIGTERM) after writing a full-state checkpoint."""

  def __init__(self, workdir: str, step: int):
    self.workdir, self.step = workdir, step
    super().__init__(
      f"stopped at update {step} on request; state saved in {workdir}; rerun "
      f"the same command to resume"
    )


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


def _validate(cfg, devices, local: bool):
  """``config.validate`` for the devices the run may use; returns them (None: the default of
  a run that is one mesh over every process, or of one process)."""
  if devices is None and not local:
    config_lib.validate(cfg)
    return None
  devices = list(jax.local_devices() if devices is None else devices)
  config_lib.validate(cfg, devices)
  return devices


class _Group:
  """What ``fit`` and ``precompile`` build alike from a run's config on its devices, before any
  run directory: the mesh, model and data source, the hyper-parameters, and the programs —
  built once here so that a program ``precompile`` compiled is the one ``fit`` runs."""

  def __init__(self, cfg, devices: list, source=None):
    self.cfg = cfg
    self.mcfg, self.tcfg = train.model_and_train_config(cfg)
    self.n_models = cfg.ensemble.size
    self.mesh = sharding.make_mesh(self.n_models, self.tcfg.batch_size, devices)
    self.model = train.training_model(self.mcfg, self.tcfg)
    self.source = source or make_source(
      cfg.data, self.mcfg.vocab_size, self.tcfg.batch_size, self.tcfg.context_size
    )
    self.host_fed = not self.source.on_device
    self.data_params = jax.tree_util.tree_map(np.asarray, self.source.data_params(self.n_models))

  def hparams(self) -> train.HParams:
    """Per-model peak learning rates and data knobs (numpy, leading axis E)."""
    return train.HParams(
      peak_lr=np.asarray(train.peak_lrs(self.cfg), np.float32), data=self.data_params
    )

  def init_fn(self):
    """``init(seeds int32 [E]) -> TrainState`` on the mesh (``train.make_init_fn``)."""
    return train.make_init_fn(self.model, self.tcfg, self.mesh)

  def train_program(self):
    """The ensemble's train program (``train.make_ensemble_train_fn``): one compilation serves
    every call length up to ``train.steps_per_call``, the short last call included."""
    tcfg = self.tcfg
    return train.make_ensemble_train_fn(
      self.model,
      tcfg,
      None if self.host_fed else self.source.sample,
      self.mesh,
      min(tcfg.steps_per_call, tcfg.num_steps),
      self.cfg.ensemble.vmap_chunk,
    )

  def abstract_data(self):
    """The train program's ``data`` argument as ``jax.ShapeDtypeStruct``: the source's shared
    arrays replicated, or a call's host-fed batches ``[E, K, B, C + 1]``."""
    tcfg = self.tcfg
    if self.host_fed:  # one tiny gather for the corpus's dtype
      keys = np.zeros((self.n_models, 2), np.uint32)
      dtype = np.asarray(self.source.host_batches(keys, 0, 1)).dtype
      shape = (
        self.n_models,
        min(tcfg.steps_per_call, tcfg.num_steps),
        tcfg.batch_size,
        tcfg.context_size + 1,
      )
      return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.host_batch_sharding(self.mesh))
    return _abstract(self.source.arrays(), sharding.replicated(self.mesh))


def _abstract(tree, where):
  """``jax.ShapeDtypeStruct`` of each numpy leaf of ``tree`` as ``jax.device_put(tree, where)``
  would place it (the dtype JAX gives it: float64 becomes float32 without x64)."""
  return jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(
      np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype), sharding=where
    ),
    tree,
  )


def _per_device_bytes(tree) -> int:
  """Bytes of one device's shards of the ``jax.ShapeDtypeStruct`` leaves of ``tree``."""
  total = 0
  for x in jax.tree_util.tree_leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
  return total


def resolve_memory(
  cfg, devices: list, name: str = "the run", capacity=None, source=None, platform=None
):
  """``cfg`` with its automatic memory choices made for ``devices`` (``ihsweep.memory``):
  ``train.gradient_accumulation_steps`` 0, ``train.remat`` 'auto' and ``ensemble.vmap_chunk`` 0
  become the values ``memory.choose`` finds by compiling the group's programs against the
  devices' capacity (``memory.device_capacity``); without a known capacity (a CPU) they become
  k = 1, no remat and the usual chunk rule, without compiling anything.

  ``capacity`` (bytes per device) replaces the devices' own, ``source`` the data source the
  group would build, and ``platform`` (``gpu``, ``tpu``) the devices' own for the default vmap
  chunk (``ihsweep plan --target``: compile-only devices, no corpus; a GPU target compiled on
  CPU devices still starts from every model at once, as on the GPU).

  Returns:
    ``(cfg, choice)``: a copy of ``cfg`` with the chosen values recorded (the original if
    nothing was automatic), and the ``memory.Choice`` (None if nothing was compiled).

  Raises:
    memory.DoesNotFit: the capacity is known and no setting fits (before anything trains).
  """
  k, remat = cfg.train.get("gradient_accumulation_steps", 1), cfg.train.get("remat", "none")
  auto_k, auto_remat = k == 0, remat == "auto"
  auto_chunk = cfg.ensemble.vmap_chunk == 0
  capacity = capacity or memory.device_capacity(devices[0])
  if capacity is None and not (auto_k or auto_remat):
    return cfg, None
  out = copy.deepcopy(cfg)
  with out.unlocked():  # the first setting; the group is built once with it
    out.train.gradient_accumulation_steps = k or 1
    out.train.remat = "none" if auto_remat else remat
  if capacity is None:
    return out, None
  group = _Group(out, devices, source)
  ens_sh = sharding.ensemble_sharding(group.mesh)
  state = group.init_fn().lower(jax.ShapeDtypeStruct((group.n_models,), np.int32)).out_info
  hp, data = _abstract(group.hparams(), ens_sh), group.abstract_data()
  n_ens, n_data = group.mesh.shape["ensemble"], group.mesh.shape["data"]
  local = group.n_models // n_ens
  n_steps = min(group.tcfg.steps_per_call, group.tcfg.num_steps)

  def compile_train(setting: memory.Setting) -> memory.ProgramMemory:
    tcfg = dataclasses.replace(
      group.tcfg,
      gradient_accumulation_steps=setting.gradient_accumulation_steps,
      remat=setting.remat,
    )
    program = train.make_ensemble_train_fn(
      train.training_model(group.mcfg, tcfg),
      tcfg,
      None if group.host_fed else group.source.sample,
      group.mesh,
      n_steps,
      setting.vmap_chunk,
    )
    try:
      return memory.analyse(program.compile(state, hp, data))
    except Exception as e:  # the compiler's own refusal (a TPU's RESOURCE_EXHAUSTED)
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      return memory.ProgramMemory(0, 0, 0, memory.exhausted_bytes(str(e), capacity), 0)

  eval_mem = None
  if schedule_lib.eval_interval(out):
    evaluator = Evaluator(out, group.mcfg, None, group.mesh, capacity)
    eval_mem = memory.analyse(evaluator.lower(state.params).compile())
  prefetch = _per_device_bytes(data) if group.host_fed else 0
  platform = platform or getattr(devices[0], "platform", "cpu")
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


def precompile(cfg, devices=None, local: bool = False) -> dict[str, float]:
  """Compiles a run's programs ahead of time, as ``fit(cfg, ..., devices=devices,
  local=local)`` builds them — the initialisation, the train program (which also serves the
  short last call) and, with evaluation on, the evaluation — from their shapes alone
  (``jax.ShapeDtypeStruct`` inputs with the run's shardings): nothing is trained and no file
  is written; data sources are built as ``fit`` builds them (a corpus is read from its cache,
  or tokenized into it).

  With the persistent compilation cache on (``compile_cache.enable``), a later ``fit`` of the
  same config on the same devices loads these programs from it instead of compiling them: a
  worker calls this for its next group on a background thread while it trains the current one
  (JAX compiles on any thread; the training's own dispatches go on meanwhile). Without the
  cache it only measures the compile time. In a job of several processes without ``local``
  (one global mesh), every process must call it, as every process runs ``fit``.

  Returns:
    Seconds spent compiling each program: ``{"init": s, "train": s[, "eval": s[, "probes":
    s]]}`` ("probes": a generated source's sampler of held-out sequences, compiled by drawing
    them once, as a fresh ``fit`` does); a program already in the persistent cache takes the
    time to load it.

  Raises:
    ConfigError, DataError: as ``fit`` does, before anything is compiled.
  """
  devices = group_devices(cfg, _validate(cfg, devices, local), local)
  cfg, _ = resolve_memory(cfg, devices)
  group = _Group(cfg, devices)
  ens_sh = sharding.ensemble_sharding(group.mesh)
  seconds = {}

  def compile_(name: str, lowered):
    start = time.perf_counter()
    lowered.compile()
    seconds[name] = time.perf_counter() - start

  init = group.init_fn().lower(jax.ShapeDtypeStruct((group.n_models,), np.int32))
  compile_("init", init)
  state = init.out_info  # TrainState of ShapeDtypeStruct, with the ensemble sharding
  compile_(
    "train",
    group.train_program().lower(state, _abstract(group.hparams(), ens_sh), group.abstract_data()),
  )
  if schedule_lib.eval_interval(cfg):
    compile_("eval", Evaluator(cfg, group.mcfg, None, group.mesh).lower(state.params))
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
  cfg,
  workdir: str,
  *,
  progress: bool = True,
  desc: str | None = None,
  stop_rule: EmergenceStop | None = None,
  devices=None,
  local: bool = False,
  keep_bar: bool = True,
) -> dict[str, Any]:
  """Trains ``cfg.ensemble.size`` models on ``cfg.data`` for ``cfg.train.num_steps`` updates,
  evaluating and checkpointing them; resumes from ``workdir``'s latest full-state checkpoint.

  Writes into ``workdir``: ``config.json``; ``train_log.jsonl`` (one row per host call:
  ``step``, ``tokens`` per model, ``updates`` in the call, per-model ``loss`` and ``grad_norm``
  averaged over them, null for a diverged model); ``metrics.jsonl`` (every
  ``schedule.eval_interval`` updates and at the end, one row per model: see
  ``Evaluator.rows``); ``probes.npz``; ``checkpoints/`` (``ihsweep.checkpoint``).

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
  one does. ``desc``: the bar's label (its first word, e.g. a sweep's group id, prefixes this
  run's log lines); ``keep_bar``: whether the finished bar stays on screen (a sweep with its
  own bar over groups clears it). While the bar is open, log lines are written above it
  (``logs_above_bars``).

  Returns ``{"state": final TrainState (leading axis E), "losses": [E] losses of the last call
  (None if nothing was left to train), "tokens_per_s" and "updates_per_s": throughput after
  start-up (all models' tokens; ``Throughput``; NaN when only one call was trained), "resumed_from":
  update count restored or None, "step": updates done,
  "stopped_early": bool, "diverged_at": [E] update counts at divergence (-1: none),
  "crossed": the stop rule's first evaluation step at or above its threshold per model (None
  without a stop rule), "timings": wall seconds {"setup_s": from entry until the first
  training call is dispatched (validating, building, restoring, compiling; the whole call if
  nothing was left to train), "train_s": the rest (training calls, evaluations, checkpoints,
  waiting for the last writes), "total_s": both[, "compile_s": the first training call's
  dispatch, which compiles the train program or loads it from the persistent cache (part of
  setup_s)]}}``.

  Raises:
    ConfigError: before anything is compiled, if a field is invalid or the directory holds a
      run with a different config.
    DataError: data that cannot be read or built (``CheckpointError``: checkpoints present but
      none restorable).
    Interrupted: stopped on request, after the checkpoint.
  """
  started = time.perf_counter()
  devices = group_devices(cfg, _validate(cfg, devices, local), local)
  cfg, _ = resolve_memory(cfg, devices, f"group {desc.split()[0]}" if desc else workdir)
  team = sharding.Team.of(devices)
  # The team's lead marks and locks the directory (process 0 for one global mesh).
  here = team.leads and not team.is_everyone
  rundir.claim_workdir(workdir, "train", here)
  _quiet_failed_writes()
  try:
    with rundir.workdir_lock(workdir, here), logs_above_bars(progress):
      return _Training(
        cfg,
        workdir,
        progress=progress,
        desc=desc,
        stop_rule=stop_rule,
        devices=devices,
        team=team,
        started=started,
        keep_bar=keep_bar,
      ).run()
  except Exception as e:
    if isinstance(e, checkpoint.DiskFull) or checkpoint.disk_full_cause(e) is None:
      raise
    raise checkpoint.DiskFull(workdir) from e


def _quiet_failed_writes() -> None:
  """Silences orbax's error logs (with tracebacks) from its writer threads when a write failed
  for want of space, which ``DiskFull`` reports in one line (the "Event loop is closed" echoes
  of its abandoned writes: ``checkpoint.RunCheckpoints``)."""
  absl = logging.getLogger("absl")
  if any(getattr(f, "ihsweep_disk_full", False) for f in absl.filters):
    return

  def keep(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (
      checkpoint.disk_full_cause(error)
      or any(m in record.getMessage() for m in checkpoint.NO_SPACE_MESSAGES)
    )

  keep.ihsweep_disk_full = True
  absl.addFilter(keep)


class _Training:
  """One call of ``fit``: what it builds from the config (mesh, programs, schedules, probes),
  the files it writes, and the state of its loop, as attributes. ``run`` reads top to bottom:
  build and restore, line the logs up with the restored step, then one host call after another,
  each followed by the evaluations and checkpoints due at its last update. Logging trails the
  devices by one call: call i's metrics are read (``_drain``) after call i + 1 is dispatched."""

  def __init__(
    self,
    cfg,
    workdir: str,
    *,
    progress: bool,
    desc: str | None,
    stop_rule: EmergenceStop | None,
    devices: list,
    team: sharding.Team,
    started: float,
    keep_bar: bool = True,
  ):
    self.cfg, self.workdir, self.stop_rule = cfg, workdir, stop_rule
    self.started, self.first_call_t = started, None  # perf_counter at fit's entry, first call
    self.compile_s = None  # the first call's dispatch: compiling or loading the train program
    self.progress, self.desc, self.keep_bar = progress, desc, keep_bar
    # A sweep's group id (the label's first word) before this run's log lines.
    self.who = f"{desc.split()[0]}: " if desc else ""
    self.devices, self.team = devices, team
    self.mcfg, self.tcfg = train.model_and_train_config(cfg)
    self.n_models = cfg.ensemble.size
    # Writes the logs: every process of the team computes, its lead writes.
    self.lead = team.leads
    self.tokens_per_step = train.tokens_per_update(self.tcfg)
    self.metrics_path = os.path.join(workdir, "metrics.jsonl")
    self.log_path = os.path.join(workdir, "train_log.jsonl")
    self.probes_path = os.path.join(workdir, "probes.npz")
    # The loop's state.
    self.evaluator: Evaluator | None = None
    self.evaluated = False  # the resumed step's evaluation rows were logged before
    self.loss_sum, self.loss_updates = np.zeros(self.n_models), 0  # since the last evaluation
    self.rate = Throughput(self.tcfg.num_steps)
    self.first_read, self.last_loss = True, None  # the first call's values not yet read
    self.stopped_early = False
    self.saved: dict[str, set] = {"params": set(), "state": set()}  # by this call of fit
    # checkpoint.state_every_minutes: seconds between full-state saves (0: none by time), and
    # the clock at the last one (or the loop's start)
    self.state_every_s = 60.0 * self.cfg.checkpoint.state_every_minutes
    self.state_saved_t = None
    self.loader = self.bar = self.mfile = self.lfile = None
    self.writers = sinks.Writers()  # live metric writers (config's log section), lead only

  def run(self) -> dict[str, Any]:
    self._build()
    self._restore()
    self._make_evaluator()
    self._line_up_logs()
    tcfg = self.tcfg
    self.loader = (
      HostLoader(self.source, self.state, self.mesh, tcfg.steps_per_call) if self.host_fed else None
    )
    self.mfile = open(self.metrics_path, "a") if self.lead else None
    self.lfile = open(self.log_path, "a") if self.lead else None
    try:
      self.writers = sinks.open_writers(self.cfg, self.workdir, self.lead, self.start)
      self._train()
    finally:
      self.writers.close()
      if self.bar is not None:
        self.bar.close()
      for f in (self.mfile, self.lfile):
        if f:
          f.close()
      if self.loader:
        self.loader.close()
      self.ckpts.close()  # waits for asynchronous writes
    if self.stopped_early:
      log.info(
        "%severy model past its transition by the margin: stopped at update %d of %d",
        self.who,
        self.done,
        tcfg.num_steps,
      )
    return self._result()

  # ------------------------------------------------------------------------------------------
  # Before the first call.

  def _build(self) -> None:
    """Mesh, model, data source, hyper-parameters, config.json, initial state."""
    cfg, tcfg = self.cfg, self.tcfg
    self.ckpt_dir = os.path.join(self.workdir, "checkpoints")
    if any(
      os.path.isdir(os.path.join(self.ckpt_dir, kind))
      and os.listdir(os.path.join(self.ckpt_dir, kind))
      for kind in ("params", "state")
    ):
      check_resumable(cfg, self.workdir)  # also params-only: saved steps are never overwritten
    self.group = group = _Group(cfg, self.devices)
    self.mesh, self.model, self.source = group.mesh, group.model, group.source
    self.host_fed, self.data_params = group.host_fed, group.data_params
    log.info("%sdata: %s", self.who, self.source.describe())
    self.hp = jax.device_put(group.hparams(), sharding.ensemble_sharding(self.mesh))
    if self.lead:
      write_resolved_config(cfg, self.workdir)
    where = ""
    if jax.process_count() > 1:
      where = (
        f" of process {jax.process_index()} (process-local)"
        if self.team.alone
        else f" in {jax.process_count()} processes"
        if self.team.is_everyone
        else f" in processes {', '.join(map(str, self.team.processes))}"
      )
    log.info(
      "%smesh %s over %d %s device(s)%s; E=%d B=%d C=%d",
      self.who,
      dict(self.mesh.shape),
      len(self.devices),
      jax.default_backend(),
      where,
      self.n_models,
      tcfg.batch_size,
      tcfg.context_size,
    )
    self.state = group.init_fn()(np.asarray(train.model_seeds(cfg), np.int32))

  def _restore(self) -> None:
    """Opens the checkpoints and resumes from the latest full state, if any; the schedule of
    the calls from there."""
    cfg, tcfg = self.cfg, self.tcfg
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(self.state.params)) // self.n_models
    self.ckpts = checkpoint.RunCheckpoints(
      self.ckpt_dir,
      cell_metadata(cfg, self.mcfg, tcfg, self.source, n_params),
      keep_state=cfg.checkpoint.keep_state,
      async_save=cfg.checkpoint.async_save,
      read_only=False,
      processes=self.team.processes,
    )
    self.start, self.state = self.ckpts.restore_latest_state(self.state)
    if self.start is not None:
      log.info("%sresuming from the full-state checkpoint at update %d", self.who, self.start)
    self.done = self.start or 0
    self.host_arrays = (
      None if self.host_fed else jax.tree_util.tree_map(np.asarray, self.source.arrays())
    )
    self.arrays = (
      None if self.host_fed else jax.device_put(self.host_arrays, sharding.replicated(self.mesh))
    )
    # Evaluation and checkpoint schedules; every one of their steps ends a host call.
    self.schedule = schedule_lib.RunSchedule.from_config(cfg)
    self.calls = self.schedule.calls(self.done)

  def _make_evaluator(self) -> None:
    """The probes (reloaded on resume, else made and saved) and the evaluation program."""
    every = self.schedule.eval_every
    if not every:
      return
    probes = None
    if self.start is not None and os.path.exists(self.probes_path):
      try:
        probes = probes_lib.Probes.load(self.probes_path)
      except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        log.warning(
          "%s is unreadable (%s): making the probes again from eval.probe_seed", self.probes_path, e
        )
    if probes is None:  # from host values, so that every process computes the same probes
      probes = probes_lib.make_probes(
        self.source,
        self.data_params,
        self.host_arrays,
        self.cfg.eval,
        self.n_models,
        self.tcfg.context_size,
      )
      if self.lead:
        probes.save(self.probes_path)
    log.info(
      "%seval every %d updates: %d repeated-token probes (L = %d; %s), %d held-out "
      "sequences per model (%d associative-recall prompts in model 0's)",
      self.who,
      every,
      len(probes.repeated),
      probes.block_len,
      probes.candidates,
      probes.sequences.shape[1],
      int(probes.recall[0].sum()),
    )
    self.evaluator = Evaluator(self.cfg, self.mcfg, probes, self.mesh)

  def _line_up_logs(self) -> None:
    """Starts the logs afresh, or cuts them back to the restored step (what was logged after
    it will be logged again, identically); the training loss since the last evaluation and the
    stop rule's record are recovered from them."""
    done, every = self.done, self.schedule.eval_every
    if self.start is None:
      train_rows = []
      sharding.barrier("ihsweep-fit-fresh", self.team)  # nobody still reads the old files
      if self.lead:
        for path in (self.metrics_path, self.log_path):
          if os.path.exists(path):
            log.warning("replacing %s: no checkpoint to resume from in %s", path, self.workdir)
            os.remove(path)
    else:
      train_rows = [r for r in rundir.read_jsonl(self.log_path, warn=True) if r["step"] <= done]
      rows = [r for r in rundir.read_jsonl(self.metrics_path, warn=True) if r["step"] <= done]
      # The resumed step's evaluation rows, if all were logged before the kill.
      self.evaluated = sum(r["step"] == done for r in rows) == self.n_models
      if not self.evaluated:
        rows = [r for r in rows if r["step"] < done]
      if self.stop_rule is not None:
        replay(self.stop_rule, rows, self.stop_rule.metric)
      sharding.barrier("ihsweep-fit-read", self.team)  # all have read before the rewrite
      if self.lead:
        _rewrite_jsonl(self.log_path, train_rows)
        _rewrite_jsonl(self.metrics_path, rows)
    last_eval = 0  # the last evaluation logged: at `done` if its rows were, else the one before
    if every and done:
      last_eval = (
        done if self.evaluated and self.schedule.eval_due(done) else self.schedule.last_eval(done)
      )
    for r in train_rows:
      if r["step"] > last_eval:
        self.loss_sum += np.asarray(r["loss"], float) * r["updates"]  # null (diverged) -> NaN
        self.loss_updates += r["updates"]
    if self.stop_rule is not None and self.stop_rule.done(done):
      self.calls = []  # stopped here before (emergence budget)

  # ------------------------------------------------------------------------------------------
  # The loop.

  def _train(self) -> None:
    tcfg = self.tcfg
    pending: list = []  # dispatched, not yet read: ("train" | "eval", step, device values, k)
    if self.start is None:
      self._after_step(0, pending, [])
    elif self.schedule.eval_due(self.done) and not self.evaluated:  # killed before its rows
      pending.append(self._evaluation(self.done))
    elif self.evaluator is not None and self.calls:
      # Compiled in start-up, as a fresh run's evaluation at update 0 is (values discarded):
      # its first compilation would otherwise count as training time (Throughput).
      self.evaluator(self.state.params)
    if self.loader:
      self.loader.prefetch(self.done, self.calls)
    program = self.group.train_program()
    self.state_saved_t = _clock()
    for k in self.calls:
      data = self.loader.next() if self.loader else self.arrays
      first = self.first_call_t is None
      if first:
        log.info(
          "%scompiling the train program (or loading it from the compilation cache) …", self.who
        )
        dispatched = time.perf_counter()
      self.state, metrics = program(self.state, self.hp, data, k)  # runs while we log the last
      self.done += k
      if first:
        self._end_startup(metrics, dispatched)
      new = [("train", self.done, metrics, k)]
      self._after_step(self.done, new, pending)
      if self.stop_rule is not None and self.schedule.eval_due(self.done):
        for item in pending + new:  # decide now, before the next call
          self._drain(item)
        new = []
        self.stopped_early = self.done < tcfg.num_steps and self.stop_rule.done(self.done)
      else:
        for item in pending:
          self._drain(item)
      pending = new
      # One collective decides both for every process of the team (their clocks differ).
      interrupted, clock_due = sharding.any_process_each(
        (stop_requested(), self._clock_due()), self.team
      )
      if self.stopped_early or interrupted:
        self._after_step(self.done, pending, [], final=True)
        pending = []
        if interrupted and self.done < tcfg.num_steps:
          raise Interrupted(self.workdir, self.done)  # after the checkpoint (closed by run)
        break
      if clock_due and self.done not in self.saved["state"]:
        self._save_state(self.done, pending)
        pending = []
    for item in pending:
      self._drain(item)

  def _end_startup(self, metrics, dispatched: float) -> None:
    """After the first call's dispatch (which compiled or loaded the train program): waits for
    the call to finish — the origin of the training speed (``Throughput``), once per run — logs
    the start-up's seconds and opens the progress bar at the updates done, so that neither
    compilation nor the first call enters its rate or ETA."""
    self.first_call_t = time.perf_counter()
    self.compile_s = self.first_call_t - dispatched
    jax.block_until_ready(metrics)
    self.rate.begin(self.done)
    log.info(
      "%sstart-up took %.1f s up to the end of the first call, %.1f s of it compiling (or "
      "loading) the train program; training from update %d of %d",
      self.who,
      time.perf_counter() - self.started,
      self.compile_s,
      self.done,
      self.tcfg.num_steps,
    )
    self.bar = tqdm(
      total=self.tcfg.num_steps,
      initial=self.done,
      disable=not self.progress,
      unit="upd",
      dynamic_ncols=True,
      desc=self.desc,
      smoothing=0,  # the average since start-up: the rate and ETA Throughput reports
      leave=self.keep_bar,
    )

  def _evaluation(self, step: int) -> tuple:
    # diverged_at copied: the state is donated to the next call before this is drained.
    return ("eval", step, (self.evaluator(self.state.params), jnp.copy(self.state.diverged_at)), 0)

  def _after_step(self, step: int, pending: list, earlier: list, final: bool = False) -> None:
    """Evaluation and checkpoints due at ``step`` (evaluation results join ``pending``).
    Before a full-state checkpoint, everything logged up to ``step`` (``earlier`` and
    ``pending``) is written, so a resume from it never lacks rows. ``final``: the last step
    (an early stop or a requested one): params and state are saved whatever the schedule.
    Before a params checkpoint, the dispatched calls are read too: the save waits for the last
    one anyway, and a read after it would time the save as training (``Throughput``)."""
    if self.schedule.eval_due(step) and not final:
      pending.append(self._evaluation(step))
    extra = {"tokens": step * self.tokens_per_step}
    if (self.schedule.params_due(step) or (final and self.stopped_early)) and (
      step not in self.saved["params"]
    ):
      if any(item[0] == "train" for item in earlier + pending):
        for item in earlier + pending:
          self._drain(item)
        earlier.clear()
        pending.clear()
      self.ckpts.save_params(step, self.state.params, extra)
      self.saved["params"].add(step)
    if (self.schedule.state_due(step) or final) and step not in self.saved["state"]:
      self._save_state(step, earlier + pending)
      earlier.clear()
      pending.clear()

  def _clock_due(self) -> bool:
    """Whether ``checkpoint.state_every_minutes`` have passed since the last full-state save."""
    return bool(self.state_every_s) and _clock() - self.state_saved_t >= self.state_every_s

  def _save_state(self, step: int, unread: list) -> None:
    """A full-state checkpoint at ``step``, after everything logged up to it (``unread``, the
    dispatched calls and evaluations not yet read) is written: a resume from it never lacks
    rows. Restarts the clock of ``checkpoint.state_every_minutes``."""
    for item in unread:
      self._drain(item)
    _fault_injection(step, self.workdir, "DISK_FULL")
    self.ckpts.save_state(step, self.state, {"tokens": step * self.tokens_per_step})
    self.saved["state"].add(step)
    self.state_saved_t = _clock()
    _fault_injection(step, self.workdir, "KILL")

  def _drain(self, item) -> None:
    """Reads one dispatched call's or evaluation's values (the only host syncs) and logs them."""
    kind, step, values, k = item
    host = sharding.to_host(values)
    if kind == "eval":
      self._log_evaluation(step, *host)
    else:
      self._log_call(step, host, k)

  def _log_evaluation(self, step: int, host: dict, diverged_at: np.ndarray) -> None:
    train_loss = self.loss_sum / self.loss_updates if self.loss_updates else None
    rows = self.evaluator.rows(host, step, self.tokens_per_step, self.cfg, train_loss, diverged_at)
    if self.stop_rule is not None:
      self.stop_rule.observe(step, [r[self.stop_rule.metric] for r in rows], diverged_at >= 0)
    if self.lead:
      self.mfile.writelines(json.dumps(r) + "\n" for r in rows)
      self.mfile.flush()
      self.writers.write_scalars(step, sinks.metric_scalars(rows))
    log.info(
      "%seval at update %d (%s tokens per model): ps_max %s, ar_acc %s, val_loss %s%s",
      self.who,
      step,
      f"{step * self.tokens_per_step:,}",
      _short(host["ps_max"]),
      _short(host["ar_acc"]),
      _short(host["val_loss"]),
      f"; diverged: {int((diverged_at >= 0).sum())}" if (diverged_at >= 0).any() else "",
    )
    self.loss_sum, self.loss_updates = np.zeros(self.n_models), 0

  def _log_call(self, step: int, host: dict, k: int) -> None:
    if self.first_read:  # the first call is start-up's (Throughput): not timed
      self.first_read = False
    else:
      self.rate.add(step, k, k * self.n_models * self.tokens_per_step)
    self.last_loss = host["loss"][:k].mean(axis=0)
    row = {
      "step": step,
      "tokens": step * self.tokens_per_step,
      "updates": k,
      "loss": json_value(self.last_loss),
      "grad_norm": json_value(host["grad_norm"][:k].mean(axis=0)),
    }
    if self.lead:
      self.lfile.write(json.dumps(row) + "\n")
      self.lfile.flush()
      self.writers.write_scalars(step, sinks.train_scalars(row, train.cell_ids(self.cfg)))
    self.loss_sum += self.last_loss * k
    self.loss_updates += k
    if self.bar is None:
      return
    if step > self.bar.n:  # the first call is in the bar's initial count
      self.bar.update(step - self.bar.n)
    finite = self.last_loss[np.isfinite(self.last_loss)]
    tok_s = self.rate.tokens_per_s
    self.bar.set_postfix(
      loss=f"{finite.mean():.4f}" if finite.size else "nan",
      tok_s="-" if math.isnan(tok_s) else f"{tok_s:,.0f}",
    )
    if step == self.tcfg.num_steps:  # its last line at the last read, not after the last save
      self.bar.close()

  def _result(self) -> dict[str, Any]:
    num_steps, stop_rule = self.tcfg.num_steps, self.stop_rule
    end = time.perf_counter()
    first = self.first_call_t or end
    return {
      "state": self.state,
      "losses": self.last_loss,
      "resumed_from": self.start,
      "step": self.done,
      "stopped_early": self.stopped_early or (stop_rule is not None and self.done < num_steps),
      "diverged_at": np.asarray(sharding.to_host(self.state.diverged_at)),
      "crossed": list(stop_rule.crossed) if stop_rule is not None else None,
      "tokens_per_s": self.rate.tokens_per_s,
      "updates_per_s": self.rate.updates_per_s,
      "timings": {
        "setup_s": first - self.started,
        "train_s": end - first,
        "total_s": end - self.started,
        **({"compile_s": self.compile_s} if self.compile_s is not None else {}),
      },
    }


class HostLoader:
  """Feeds host-gathered batches ``[E, K, B, C + 1]`` for a source whose tokens stay in host
  memory, one call ahead: while the devices train on call i, a worker thread gathers call
  i + 1's windows from the memory-mapped corpus and copies them to the devices. The windows are
  those the in-graph path would draw (same per-model keys and steps). Each process reads only
  the rows of its own devices (``host_batch_array``); the thread issues no collective."""

  def __init__(self, source, state: train.TrainState, mesh, steps_per_call: int):
    import concurrent.futures

    self._source = source
    self._k = steps_per_call
    self._keys = sharding.to_host(state.data_key)  # [E, 2], fixed for the run
    self._sharding = sharding.host_batch_sharding(mesh)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ihsweep-loader")
    self._queue: list = []
    self._plan: list[tuple[int, int]] = []
    self._pads: dict = {}

  def prefetch(self, first_step: int, schedule: list[int]) -> None:
    """Plans the calls (their scan lengths, starting at update ``first_step``) and starts the
    first gather."""
    step = first_step
    for k in schedule:
      self._plan.append((step, k))
      step += k
    self._submit()

  def _submit(self) -> None:
    if self._plan:
      first, k = self._plan.pop(0)
      self._queue.append(self._pool.submit(self._load, first, k))

  def _load(self, first_step: int, k: int):
    batch = host_batch_array(self._source, self._keys, first_step, k, self._sharding)
    if k < self._k:  # a short call: only its k rows cross to the devices, padded there
      batch = self._padder(k)(batch)  # to the program's K-row shape (rows past k unused)
    return batch

  def _padder(self, k: int):
    """A program that pads ``[E, k, B, C + 1]`` batches to K rows on the devices (one per k)."""
    if k not in self._pads:
      widths = ((0, 0), (0, self._k - k), (0, 0), (0, 0))
      self._pads[k] = jax.jit(lambda b: jnp.pad(b, widths), out_shardings=self._sharding)
    return self._pads[k]

  def next(self):
    """The next call's batches (on device), starting the gather of the one after."""
    future = self._queue.pop(0)
    self._submit()
    return future.result()

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
