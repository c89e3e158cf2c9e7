"""Host side of training one ensemble: validate, build, dispatch, log.

The loop dispatches host call i+1 before it reads call i's metrics (as nanodo does), so the
device never waits on Python; all per-step values come back as ``[K, E]`` arrays once per call.
"""

from __future__ import annotations

import dataclasses
import itertools
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

from ihsweep import checkpoint, rundir, sharding, train
from ihsweep import config as config_lib
from ihsweep import metrics as metrics_lib
from ihsweep.data import make_source
from ihsweep.data import probes as probes_lib
from ihsweep.law import Law
from ihsweep.model import Transformer

log = logging.getLogger("ihsweep")


def _jsonable(cfg) -> dict:
  return json.loads(cfg.to_json_best_effort()) if hasattr(cfg, "to_json_best_effort") else cfg


def write_resolved_config(cfg, workdir: str) -> str:
  """Writes ``workdir/config.json`` (every field, after command-line overrides)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(_jsonable(cfg), f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path


RESUME_FREE_FIELDS = ("mesh.num_devices", "ensemble.vmap_chunk", "train.steps_per_call",
                      "data.loader", "data.device_budget_mb", "data.cache_dir", "checkpoint.")
"""Fields a resumed run may change (a trailing dot: a whole section): they move work between
devices and calls, or choose what is saved, not the numbers. Everything else — including
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
        workdir, f"a run directory whose config.json can be read to check the resumed "
        f"config ({e}); its checkpoints cannot be verified: use a new --workdir") from None
  new = _flatten(_jsonable(cfg))
  for field in sorted(set(old) | set(new)):
    free = any(field == f or (f.endswith(".") and field.startswith(f))
               for f in RESUME_FREE_FIELDS)
    if free or old.get(field) == new.get(field):
      continue
    raise config_lib.ConfigError(
        field, new.get(field, "(missing)"),
        f"{old.get(field, '(missing)')!r}, as in the run being resumed in {workdir} (it has "
        f"checkpoints); use a new --workdir to train with a different value")


def eval_interval(cfg) -> int:
  """Updates between evaluations: ``eval.every_tokens`` converted (rounded up) if set, else
  ``eval.every_steps``; 0 = no online evaluation."""
  tokens = cfg.eval.every_tokens
  if tokens:
    return max(1, math.ceil(tokens / (cfg.train.batch_size * cfg.train.context_size)))
  return cfg.eval.every_steps


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except ValueError:  # a line cut by a kill (or damaged): skipped, the rest kept
        log.warning("skipping an unreadable line in %s", path)
  return rows


def _rewrite_jsonl(path: str, rows: list[dict]) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  os.replace(tmp, path)


def _plain(x):
  """numpy values to JSON values (NaN -> null)."""
  x = np.asarray(x)
  if x.ndim:
    return [_plain(v) for v in x]
  v = x.item()
  return None if isinstance(v, float) and not math.isfinite(v) else v


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
  return {"cells": cells, "model": dataclasses.asdict(mcfg), "n_params": n_params,
          "batch_size": tcfg.batch_size, "context_size": tcfg.context_size,
          "tokens_per_update": train.tokens_per_update(tcfg), "num_steps": tcfg.num_steps,
          "data_source": cfg.data.source}


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
  if not (at and int(at) == step and (not only or int(only) == jax.process_index())
          and (not group or os.path.basename(os.path.normpath(workdir)) == group)):
    return
  if fault == "KILL":
    os.kill(os.getpid(), signal.SIGKILL)
  tmp = os.path.join(workdir, "checkpoints", "state", f"{step}.orbax-checkpoint-tmp")
  raise ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{tmp}/_sharding": Failed '
                   f'writing: "{tmp}/_sharding.__lock": Failed to write 6231 bytes to file 7: '
                   f"No space left on device [os_error_code='28'] (IHSWEEP_FAULT_DISK_FULL)")


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
    log.warning("already stopping: saving a checkpoint (%s once more exits at once, losing the "
                "updates since the last complete checkpoint)", name)
  elif signum:
    print(f"ihsweep: forced exit on a third stop request ({name}): the updates since the last "
          f"complete full-state checkpoint are lost; rerun the same command to resume from it",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)
  _STOP_REQUESTED.set()


def stop_requested() -> bool:
  """Whether ``request_stop`` was called in this process (it stays set)."""
  return _STOP_REQUESTED.is_set()


def install_stop_handlers() -> None:
  """SIGTERM and SIGINT → ``request_stop`` (main thread only)."""
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, request_stop)


class Interrupted(Exception):
  """Training stopped on request (SIGTERM) after writing a full-state checkpoint."""

  def __init__(self, workdir: str, step: int):
    self.workdir, self.step = workdir, step
    super().__init__(f"stopped at update {step} on request; state saved in {workdir}; rerun "
                     f"the same command to resume")


class EmergenceStop:
  """The 'until emergence + margin' budget: a model is done once its online ``metric`` has
  reached ``threshold`` at some evaluation step s and training has reached ``margin · s``
  updates; a diverged model is done. ``done(step)`` is true when every model is.

  A model counts as reaching the threshold only after an evaluation has seen it below: one
  already at or above it at its first evaluation (update 0, untrained) says nothing about
  emergence, and a warning names ``sweep.stop_threshold`` and the measured baseline (that
  model then trains to its cap unless it drops below and rises again).

  Args:
    metric: a per-model ``metrics.jsonl`` field (e.g. ``ps_max``); threshold: its emergence
      level; margin: factor (>= 1) on the first step at which it was reached; n_models: E.
  """

  def __init__(self, metric: str, threshold: float, margin: float, n_models: int):
    self.metric, self.threshold, self.margin = metric, threshold, margin
    self.crossed: list[int | None] = [None] * n_models
    self.below = np.zeros(n_models, bool)  # seen below the threshold at some evaluation
    self.first = True
    self.diverged = np.zeros(n_models, bool)

  def observe(self, step: int, values, diverged) -> None:
    """One evaluation: ``values`` [E] of the metric (NaN/None ignored), ``diverged`` [E] bool."""
    self.diverged |= np.asarray(diverged, bool)
    finite = [v is not None and math.isfinite(v) for v in values]
    above = [i for i, v in enumerate(values) if finite[i] and v >= self.threshold]
    if self.first and above:
      log.warning(
          "sweep.stop_threshold = %g is already reached before emergence: %s at update %d is "
          "%s for model(s) %s; those crossings are not counted (a model must first be seen "
          "below the threshold); raise sweep.stop_threshold above this baseline", self.threshold,
          self.metric, step, ", ".join(f"{values[i]:.4f}" for i in above),
          ", ".join(map(str, above)))
    self.first = False
    for i, v in enumerate(values):
      if not finite[i]:
        continue
      if v < self.threshold:
        self.below[i] = True
      elif self.crossed[i] is None and self.below[i]:
        self.crossed[i] = step

  def done(self, step: int) -> bool:
    return all(d or (c is not None and step >= self.margin * c)
               for c, d in zip(self.crossed, self.diverged))


def fit(cfg, workdir: str, *, progress: bool = True, desc: str | None = None,
        stop_rule: EmergenceStop | None = None) -> dict[str, Any]:
  """Trains ``cfg.ensemble.size`` models on ``cfg.data`` for ``cfg.train.num_steps`` updates,
  evaluating and checkpointing them; resumes from ``workdir``'s latest full-state checkpoint.

  Writes into ``workdir``: ``config.json``; ``train_log.jsonl`` (one row per host call:
  ``step``, ``tokens`` per model, ``updates`` in the call, per-model ``loss`` and ``grad_norm``
  averaged over them, null for a diverged model); ``metrics.jsonl`` (every ``eval_interval``
  updates and at the end, one row per model: see ``Evaluator.rows``); ``probes.npz``;
  ``checkpoints/`` (``ihsweep.checkpoint``). Under several processes (one global mesh) every
  process runs this together and process 0 writes the files.

  A model whose loss turns NaN/inf is frozen (``train.train_step``) and the others go on.
  ``stop_rule`` (``EmergenceStop``) ends training early at an evaluation step. After
  ``request_stop`` (SIGTERM) the state is checkpointed and ``Interrupted`` is raised.

  Returns ``{"state": final TrainState (leading axis E), "losses": [E] losses of the last call
  (None if nothing was left to train), "tokens_per_s": aggregate throughput after the first
  (compiling) call, "resumed_from": update count restored or None, "step": updates done,
  "stopped_early": bool, "diverged_at": [E] update counts at divergence (-1: none),
  "crossed": the stop rule's first evaluation step at or above its threshold per model (None
  without a stop rule)}``.

  Raises:
    ConfigError: before anything is compiled, if a field is invalid or the directory holds a
      run with a different config.
    DataError: data that cannot be read or built (``CheckpointError``: checkpoints present but
      none restorable).
    Interrupted: stopped on request, after the checkpoint.
  """
  config_lib.validate(cfg)
  rundir.claim_workdir(workdir, "train")
  _quiet_failed_writes()
  try:
    with rundir.workdir_lock(workdir):
      return _fit(cfg, workdir, progress=progress, desc=desc, stop_rule=stop_rule)
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
    return not (checkpoint.disk_full_cause(error) or
                any(m in record.getMessage() for m in checkpoint._NO_SPACE))

  keep.ihsweep_disk_full = True
  absl.addFilter(keep)


def _fit(cfg, workdir: str, *, progress: bool, desc: str | None,
         stop_rule: EmergenceStop | None) -> dict[str, Any]:
  mcfg, tcfg = train.model_and_train_config(cfg)
  n_models = cfg.ensemble.size
  lead = jax.process_index() == 0  # writes the logs; every process computes
  devices = jax.devices()[:cfg.mesh.num_devices or None]
  mesh = sharding.make_mesh(n_models, tcfg.batch_size, devices)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if any(os.path.isdir(os.path.join(ckpt_dir, kind)) and os.listdir(os.path.join(ckpt_dir, kind))
         for kind in ("params", "state")):
    check_resumable(cfg, workdir)  # also params-only: saved steps are never overwritten
  model = Transformer(mcfg)
  source = make_source(cfg.data, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  host_fed = not getattr(source, "on_device", True)
  if hasattr(source, "describe"):
    log.info("data: %s", source.describe())
  data_params = jax.tree_util.tree_map(np.asarray, source.data_params(n_models))
  hp = train.HParams(peak_lr=np.asarray(train.peak_lrs(cfg), np.float32), data=data_params)
  ens_sh, repl = sharding.ensemble_sharding(mesh), sharding.replicated(mesh)
  hp = jax.device_put(hp, ens_sh)
  if lead:
    write_resolved_config(cfg, workdir)
  log.info("mesh %s over %d %s device(s)%s; E=%d B=%d C=%d", dict(mesh.shape), len(devices),
           jax.default_backend(),
           f" in {jax.process_count()} processes" if jax.process_count() > 1 else "",
           n_models, tcfg.batch_size, tcfg.context_size)

  seeds = np.asarray(train.model_seeds(cfg), np.int32)
  state = train.make_init_fn(model, tcfg, mesh)(seeds)
  n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params)) // n_models
  ckpts = checkpoint.RunCheckpoints(ckpt_dir, cell_metadata(cfg, mcfg, tcfg, source, n_params),
                                    keep_state=cfg.checkpoint.keep_state,
                                    async_save=cfg.checkpoint.async_save, read_only=False)
  start, state = ckpts.restore_latest_state(state)
  if start is not None:
    log.info("resuming from the full-state checkpoint at update %d", start)
  done = start or 0
  host_arrays = None if host_fed else jax.tree_util.tree_map(np.asarray, source.arrays())
  arrays = None if host_fed else jax.device_put(host_arrays, repl)

  # Evaluation and checkpoint schedules; every one of their steps ends a host call.
  every, state_every = eval_interval(cfg), cfg.checkpoint.state_every_steps

  def eval_due(step: int) -> bool:  # every `every` updates and at the end (0: never)
    return bool(every) and (step % every == 0 or step == tcfg.num_steps)

  law_file = os.path.expanduser(cfg.checkpoint.law_file)
  law = Law.from_json(law_file) if law_file else Law()
  tokens_per_step = train.tokens_per_update(tcfg)
  param_steps = set(checkpoint.params_steps(
      tcfg.num_steps, tokens_per_step, schedule=cfg.checkpoint.params_schedule,
      points_per_octave=cfg.checkpoint.points_per_octave,
      law_updates=law.updates(tcfg.batch_size, tcfg.context_size),
      law_window=cfg.checkpoint.law_window,
      law_points_per_octave=cfg.checkpoint.law_points_per_octave))
  # Evaluation and full-state steps after `done` (as lazy ranges: an interval of a few updates
  # in a long run lists no steps beyond those the calls end at).
  later = [range(done // n * n + n, tcfg.num_steps, n) for n in (every, state_every) if n]
  schedule = train.calls(tcfg.num_steps, tcfg.steps_per_call, done,
                         stops=itertools.chain(param_steps, *later))

  probes_path = os.path.join(workdir, "probes.npz")
  evaluator, evaluated = None, False
  if every:
    probes = None
    if start is not None and os.path.exists(probes_path):
      try:
        probes = probes_lib.Probes.load(probes_path)
      except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        log.warning("%s is unreadable (%s): making the probes again from eval.probe_seed",
                    probes_path, e)
    if probes is None:  # from host values, so that every process computes the same probes
      probes = probes_lib.make_probes(source, data_params, host_arrays,
                                      cfg.eval, n_models, tcfg.context_size)
      if lead:
        probes.save(probes_path)
    log.info("eval every %d updates: %d repeated-token probes (L = %d; %s), %d held-out "
             "sequences per model (%d associative-recall prompts in model 0's)",
             every, len(probes.repeated), probes.block_len, probes.candidates,
             probes.sequences.shape[1], int(probes.recall[0].sum()))
    evaluator = Evaluator(cfg, mcfg, probes, mesh)

  metrics_path = os.path.join(workdir, "metrics.jsonl")
  log_path = os.path.join(workdir, "train_log.jsonl")
  if start is None:
    train_rows = []
    sharding.barrier("ihsweep-fit-fresh")  # nobody still reads the files being replaced
    if lead:
      for path in (metrics_path, log_path):
        if os.path.exists(path):
          log.warning("replacing %s: no checkpoint to resume from in %s", path, workdir)
          os.remove(path)
  else:  # drop what was logged after the checkpoint; it will be recomputed identically
    train_rows = [r for r in _read_jsonl(log_path) if r["step"] <= done]
    rows = [r for r in _read_jsonl(metrics_path) if r["step"] <= done]
    evaluated = sum(r["step"] == done for r in rows) == n_models  # the resumed step's rows
    if not evaluated:
      rows = [r for r in rows if r["step"] < done]
    if stop_rule is not None:
      _replay(stop_rule, rows, stop_rule.metric)
    sharding.barrier("ihsweep-fit-read")  # every process has read before process 0 rewrites
    if lead:
      _rewrite_jsonl(log_path, train_rows)
      _rewrite_jsonl(metrics_path, rows)
  last_eval = 0  # the last evaluation logged: at `done` if its rows were, else the one before
  if every and done:
    last_eval = done if evaluated and eval_due(done) else (done - 1) // every * every
  loss_sum, loss_updates = np.zeros(n_models), 0  # training loss since the last evaluation
  for r in train_rows:
    if r["step"] > last_eval:
      loss_sum += np.asarray(r["loss"], float) * r["updates"]  # null (diverged) -> NaN
      loss_updates += r["updates"]
  if stop_rule is not None and stop_rule.done(done):
    schedule = []  # stopped here before (emergence budget)

  loader = HostLoader(source, state, mesh, tcfg.steps_per_call) if host_fed else None
  tokens_per_call_step = n_models * tokens_per_step
  bar = tqdm(total=tcfg.num_steps, initial=done, disable=not progress, unit="upd",
             dynamic_ncols=True, desc=desc)
  first_drain_t, tokens_since_first, last_loss = None, 0, None
  stopped_early = False
  mfile = open(metrics_path, "a") if lead else None
  lfile = open(log_path, "a") if lead else None
  try:

    def drain(item) -> None:
      nonlocal first_drain_t, tokens_since_first, last_loss, loss_sum, loss_updates
      kind, step, values, k = item
      host = sharding.to_host(values)  # the only host syncs
      if kind == "eval":
        host, diverged_at = host
        train_loss = loss_sum / loss_updates if loss_updates else None
        rows = evaluator.rows(host, step, tokens_per_step, cfg, train_loss, diverged_at)
        if stop_rule is not None:
          stop_rule.observe(step, [r[stop_rule.metric] for r in rows], diverged_at >= 0)
        if lead:
          mfile.writelines(json.dumps(r) + "\n" for r in rows)
          mfile.flush()
        log.info("eval at update %d (%s tokens per model): ps_max %s, ar_acc %s, val_loss %s%s",
                 step, f"{step * tokens_per_step:,}", _short(host["ps_max"]),
                 _short(host["ar_acc"]), _short(host["val_loss"]),
                 f"; diverged: {int((diverged_at >= 0).sum())}" if (diverged_at >= 0).any() else "")
        loss_sum, loss_updates = np.zeros(n_models), 0
        return
      now = time.perf_counter()
      if first_drain_t is None:  # the first call includes compilation: not timed
        first_drain_t = now
      else:
        tokens_since_first += k * tokens_per_call_step
      last_loss = host["loss"][:k].mean(axis=0)
      row = {"step": step, "tokens": step * tokens_per_step, "updates": k,
             "loss": _plain(last_loss), "grad_norm": _plain(host["grad_norm"][:k].mean(axis=0))}
      if lead:
        lfile.write(json.dumps(row) + "\n")
        lfile.flush()
      loss_sum += last_loss * k
      loss_updates += k
      bar.update(k)
      elapsed = now - first_drain_t
      finite = last_loss[np.isfinite(last_loss)]
      bar.set_postfix(loss=f"{finite.mean():.4f}" if finite.size else "nan",
                      tok_s=f"{tokens_since_first / elapsed:,.0f}" if elapsed else "-")

    def evaluation(step: int) -> tuple:
      # diverged_at copied: the state is donated to the next call before this is drained.
      return ("eval", step, (evaluator(state.params), jnp.copy(state.diverged_at)), 0)

    def after_step(step: int, pending: list, earlier: list, final: bool = False) -> None:
      """Evaluation and checkpoints due at ``step`` (evaluation results join ``pending``).
      Before a full-state checkpoint, everything logged up to ``step`` (``earlier`` and
      ``pending``) is written, so a resume from it never lacks rows. ``final``: the last step
      (an early stop or a requested one): params and state are saved whatever the schedule."""
      if eval_due(step) and not final:
        pending.append(evaluation(step))
      extra = {"tokens": step * tokens_per_step}
      if (step in param_steps or (final and stopped_early)) and step not in saved["params"]:
        ckpts.save_params(step, state.params, extra)
        saved["params"].add(step)
      if (checkpoint.is_state_step(step, tcfg.num_steps, state_every) or final) and (
          step not in saved["state"]):
        for item in earlier + pending:
          drain(item)
        earlier.clear()
        pending.clear()
        _fault_injection(step, workdir, "DISK_FULL")
        ckpts.save_state(step, state, extra)
        saved["state"].add(step)
        _fault_injection(step, workdir, "KILL")

    pending: list = []
    saved: dict[str, set] = {"params": set(), "state": set()}  # by this call of fit
    if start is None:
      after_step(0, pending, [])
    elif eval_due(done) and not evaluated:  # killed before its rows were written
      pending.append(evaluation(done))
    if loader:
      loader.prefetch(done, schedule)
    program = train.make_ensemble_train_fn(
        model, tcfg, None if host_fed else source.sample, mesh,
        min(tcfg.steps_per_call, tcfg.num_steps), cfg.ensemble.vmap_chunk)
    for k in schedule:
      data = loader.next() if loader else arrays
      state, metrics = program(state, hp, data, k)  # runs while we log the last call
      done += k
      new = [("train", done, metrics, k)]
      after_step(done, new, pending)
      if stop_rule is not None and eval_due(done):  # decide now, before the next call
        for item in pending + new:
          drain(item)
        new = []
        stopped_early = done < tcfg.num_steps and stop_rule.done(done)
      else:
        for item in pending:
          drain(item)
      pending = new
      interrupted = sharding.any_process(stop_requested())
      if stopped_early or interrupted:
        after_step(done, pending, [], final=True)
        pending = []
        if interrupted and done < tcfg.num_steps:
          raise Interrupted(workdir, done)  # after the checkpoint (closed in finally)
        break
    for item in pending:
      drain(item)
  finally:
    bar.close()
    for f in (mfile, lfile):
      if f:
        f.close()
    if loader:
      loader.close()
    ckpts.close()  # waits for asynchronous writes
  if stopped_early:
    log.info("every model past its transition by the margin: stopped at update %d of %d",
             done, tcfg.num_steps)
  elapsed = time.perf_counter() - first_drain_t if first_drain_t else 0.0
  return {"state": state, "losses": last_loss, "resumed_from": start, "step": done,
          "stopped_early": stopped_early or (stop_rule is not None and done < tcfg.num_steps),
          "diverged_at": np.asarray(sharding.to_host(state.diverged_at)),
          "crossed": list(stop_rule.crossed) if stop_rule is not None else None,
          "tokens_per_s": tokens_since_first / elapsed if tokens_since_first else float("nan")}


def _replay(stop_rule: EmergenceStop, rows: list[dict], metric: str) -> None:
  """Feeds a resumed run's logged evaluations to its stop rule, in step order."""
  by_step: dict[int, list[dict]] = {}
  for r in rows:
    by_step.setdefault(r["step"], []).append(r)
  for step in sorted(by_step):
    group = by_step[step]
    stop_rule.observe(step, [r.get(metric) for r in group],
                      [bool(r.get("diverged")) for r in group])


class Evaluator:
  """The compiled ensemble evaluation (``metrics.make_eval_fn``) with the run's probes on the
  mesh; ``rows`` turns one result into ``metrics.jsonl`` rows."""

  def __init__(self, cfg, mcfg, probes: probes_lib.Probes, mesh):
    ens_sh, repl = sharding.ensemble_sharding(mesh), sharding.replicated(mesh)
    n, t = probes.repeated.shape
    s, cp1 = probes.sequences.shape[1:]
    context = cp1 - 1
    early, late = metrics_lib.icl_positions(context, cfg.eval.icl_early, cfg.eval.icl_late)
    self.fn = metrics_lib.make_eval_fn(
        mcfg, block_len=probes.block_len, icl_early=early, icl_late=late,
        probe_batch=metrics_lib.microbatch(n, t, mcfg.vocab_size),
        sequence_batch=metrics_lib.microbatch(s, context, mcfg.vocab_size), out_sharding=ens_sh)
    self.inputs = probes_lib.as_device_arrays(probes, ens_sh, repl)

  def __call__(self, params) -> dict:
    return self.fn(params, *self.inputs)

  @staticmethod
  def rows(host: dict, step: int, tokens_per_step: int, cfg, train_loss,
           diverged_at=None) -> list[dict]:
    """One ``metrics.jsonl`` row per model: ``cell`` (its id: ``ensemble.cell_ids``, default
    the index in the ensemble), ``seed``, ``step``, ``tokens``, ``train_loss`` (mean over the
    updates since the previous evaluation; null at step 0), ``val_loss``, ``ps``/``la``/``dla``
    ``[n_layers][n_heads]``, their ``*_max`` and ``*_argmax`` ([layer, head]), ``ar_acc``,
    ``ar_rank``, ``ar_data_acc``, ``ar_data_rank``, ``ar_data_n``, ``icl_score``, ``diverged``
    (bool). A diverged model's row has ``diverged_step`` (updates done when its loss first
    turned NaN/inf) and null metrics. NaN is written as null."""
    n_models = len(host["ps_max"])
    ids, seeds = train.cell_ids(cfg), train.model_seeds(cfg)
    diverged_at = np.full(n_models, -1) if diverged_at is None else np.asarray(diverged_at)
    out = []
    for i in range(n_models):
      row = {"cell": ids[i], "seed": seeds[i], "step": step, "tokens": step * tokens_per_step,
             "train_loss": None if train_loss is None else _plain(train_loss[i])}
      bad = diverged_at[i] >= 0
      row.update({k: None if bad else _plain(v[i]) for k, v in sorted(host.items())})
      row["diverged"] = bool(bad)
      if bad:
        row["diverged_step"] = int(diverged_at[i])
      out.append(row)
    return out


class HostLoader:
  """Feeds host-gathered batches ``[E, K, B, C + 1]`` for a source whose tokens stay in host
  memory, one call ahead: while the devices train on call i, a worker thread gathers call
  i + 1's windows from the memory-mapped corpus and copies them to the devices. The windows are
  those the in-graph path would draw (same per-model keys and steps)."""

  def __init__(self, source, state: train.TrainState, mesh, steps_per_call: int):
    import concurrent.futures
    self._source = source
    self._k = steps_per_call
    self._keys = sharding.to_host(state.data_key)  # [E, 2], fixed for the run
    self._sharding = sharding.host_batch_sharding(mesh)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ihsweep-loader")
    self._queue: list = []
    self._plan: list[tuple[int, int]] = []

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
    batch = self._source.host_batches(self._keys, first_step, k)
    if k < self._k:  # a short call: the program's K-row shape, rows past k unused
      batch = np.pad(batch, ((0, 0), (0, self._k - k), (0, 0), (0, 0)))
    return jax.device_put(batch, self._sharding)

  def next(self):
    """The next call's batches (on device), starting the gather of the one after."""
    future = self._queue.pop(0)
    self._submit()
    return future.result()

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
