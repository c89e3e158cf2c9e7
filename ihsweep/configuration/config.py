"""Validation of run configs, done before anything is compiled.

Every check raises ``ConfigError`` naming the field, the value it got and what is allowed, so a bad
override on the command line costs a second, not a compilation.
"""

from __future__ import annotations

import math
import os

import jax
import numpy as np

from ihsweep.base import numbers, schema
from ihsweep.base.law import Law, LawError
from ihsweep.base.sharding import MeshError, mesh_shape, usable_devices
from ihsweep.compute import metric_registry
from ihsweep.compute.model import ModelConfig, cudnn_attention_problem
from ihsweep.configuration import data_rules
from ihsweep.configuration.fields import (
  INT32_MAX,
  ConfigError,
  check,
  check_choice,
  check_int,
  check_known_fields,
  check_real,
)


def _validate_checkpoint(cfg) -> None:
  for name in (
    "params_schedule",
    "points_per_octave",
    "law_points_per_octave",
    "law_window",
    "state_every_steps",
    "state_every_minutes",
    "keep_state",
    "async_save",
  ):
    check(cfg, f"checkpoint.{name}")
  if cfg.checkpoint.law_file:
    try:
      Law.from_json(os.path.expanduser(cfg.checkpoint.law_file)).updates(
        cfg.train.batch_size, cfg.train.context_size
      )
    except LawError as e:
      raise ConfigError("checkpoint.law_file", cfg.checkpoint.law_file, str(e)) from None


def _validate_log(cfg) -> None:
  """The optional ``log`` section: flags, and the package each chosen writer needs."""
  import importlib.util

  if "log" not in cfg:
    return
  for name, package in (("tensorboard", "tensorboardX"), ("wandb", "wandb")):
    value = check(cfg, f"log.{name}", cfg.log.get(name, schema.field(f"log.{name}").default))
    if value and importlib.util.find_spec(package) is None:
      raise ConfigError(
        f"log.{name}",
        value,
        f"False, or True with {package} installed "
        f"(pip install {package}, or pip install 'ihsweep[logging]')",
      )
  project = cfg.log.get("wandb_project", schema.field("log.wandb_project").default)
  if not isinstance(project, str) or not project:
    raise ConfigError("log.wandb_project", project, "a non-empty string (the W&B project)")
  check(cfg, "log.wandb_mode", cfg.log.get("wandb_mode", schema.field("log.wandb_mode").default))


def _validate_memory_choices(cfg, batch: int, n_data: int) -> None:
  """``train.gradient_accumulation_steps`` (0 = chosen by device memory, else k dividing B with
  B/k split evenly over the mesh's 'data' axis), ``train.remat`` and ``train.attention``; a
  config written before they existed has none (k = 1, no remat, the explicit pattern)."""
  field = "train.gradient_accumulation_steps"
  k = check(
    cfg,
    field,
    cfg.train.get("gradient_accumulation_steps", 1),
    hi=batch,
    hint=f" (0 = chosen by device memory; at most train.batch_size = {batch})",
  )
  if k and batch % k:
    raise ConfigError(
      field,
      k,
      f"0 (chosen by device memory) or a divisor of train.batch_size = {batch}: one of "
      f"{numbers.some(numbers.divisors(batch), k)}",
    )
  if k and (batch // k) % n_data:
    good = [d for d in numbers.divisors(batch) if (batch // d) % n_data == 0]
    raise ConfigError(
      field,
      k,
      f"0 or one of {numbers.some(good, k)}: each microbatch of B/k = {batch // k} "
      f"sequences is split over the mesh's 'data' axis of {n_data} devices",
    )
  remat = cfg.train.get("remat", "none")
  if remat not in schema.choices("train.remat"):
    raise ConfigError("train.remat", remat, f"one of {', '.join(schema.choices('train.remat'))}")
  attention = cfg.train.get("attention", "explicit")
  if attention not in schema.choices("train.attention"):
    raise ConfigError(
      "train.attention", attention, f"one of {', '.join(schema.choices('train.attention'))}"
    )
  why = attention == "cudnn" and cudnn_attention_problem(ModelConfig.from_config(cfg.model))
  if why:
    raise ConfigError("train.attention", attention, f"auto, explicit or xla: {why}")


def _validate_model(cfg) -> int:
  """The ``model`` section; returns model.vocab_size."""
  check(cfg, "model.n_layers")
  n_heads = check(cfg, "model.n_heads")
  d_model = check(cfg, "model.d_model")
  if d_model % n_heads:
    raise ConfigError(
      "model.n_heads",
      n_heads,
      f"a divisor of model.d_model = {d_model}: one of "
      f"{numbers.some(numbers.divisors(d_model), n_heads)}",
    )
  check(cfg, "model.d_mlp")
  vocab = check(cfg, "model.vocab_size")
  check(cfg, "model.max_context")
  if check(cfg, "model.pos_encoding") == "rotary" and (d_model // n_heads) % 2:
    raise ConfigError(
      "model.n_heads",
      n_heads,
      f"rotary needs an even head size; d_model / n_heads = {d_model // n_heads}",
    )
  for name in ("dtype", "param_dtype", "tie_embeddings"):
    check(cfg, f"model.{name}")
  return vocab


# The learning rates allowed. An AdamW update moves a weight by about lr (|m̂/√v̂| <~ 1). A rule
# from the initial scale 0.02 (lr under its float32 half-spacing, 9.3e-10, leaves such a weight
# unchanged) would refuse lrs that move some weights: the model's biases start at 0 and a normal
# draw has weights arbitrarily close to 0, which move by any normal float32 lr. So the only lr
# that moves no parameter is one below the smallest normal float32 (F32_TINY ~ 1.2e-38): it is
# itself subnormal, flushed to 0 on accelerators. Above LR_MAX one update moves every weight more
# than 500 times its initial scale; at 10 the tiny config already ends thousands of nats above
# a uniform guess (train/run name such a model: evaluation.not_learning).
# The optimizer's state is float32; an accelerator flushes subnormal numbers to 0.
F32_TINY, F32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
LR_MIN, LR_MAX = F32_TINY, 10.0
# the float32 half-spacing at the initial weight scale INIT_STD = 0.02, for the refusal's words
_HALF_SPACING_002 = float(np.spacing(np.float32(0.02))) / 2


def check_lr(field: str, lr) -> float:
  """A peak learning rate (``train.lr``, ``ensemble.peak_lrs[i]``, a grid's values), in
  [LR_MIN, LR_MAX].

  Raises:
    ConfigError: naming ``field``, ``lr`` and the range, with why.
  """
  check_real(field, lr, 0.0, math.inf, True, True)
  if not LR_MIN <= lr <= LR_MAX:
    raise ConfigError(
      field,
      lr,
      f"a learning rate in [{LR_MIN:.3g}, {LR_MAX:g}]: an AdamW update moves each weight by "
      f"about lr, so below {LR_MIN:.3g}, the smallest normal float32 (a smaller lr is "
      f"subnormal, flushed to 0 on accelerators), no float32 parameter changes (above it the "
      f"zero-initialized biases and the smallest initial weights do; a weight of the initial "
      f"scale 0.02 needs lr > {_HALF_SPACING_002:.2g}, half its float32 spacing), and above "
      f"{LR_MAX:g} one update moves every weight over 500 times its initial scale 0.02, far "
      f"past where a model learns",
    )
  return float(lr)


def _check_adam_float32(cfg) -> None:
  """``train.b1``, ``train.b2`` and ``train.eps`` as the float32 the optimizer computes with: a β
  that rounds to 1 makes the bias correction 1 - β^t = 0 and every update 0/0 = NaN; an ε that
  is 0 (or subnormal, flushed to 0 on accelerators) divides a zero gradient's 0 by 0, and an
  infinite one makes every update 0.

  Raises:
    ConfigError: naming the field, the value and what float32 allows.
  """
  below_one = float(np.nextafter(np.float32(1), np.float32(0)))
  for name in ("b1", "b2"):
    b = cfg.train[name]
    if np.float32(b) >= 1:
      raise ConfigError(
        f"train.{name}",
        b,
        f"a number in [0, {below_one:.8f}]: the optimizer computes in float32, where "
        f"{b!r} is 1.0, so its bias correction 1 - {name}^t is 0 and every update NaN",
      )
  eps = cfg.train.eps
  if not F32_TINY <= eps <= F32_MAX:
    what = (
      "infinite (every update 0)"
      if eps > F32_MAX
      else "0 or subnormal (flushed to 0 on accelerators), and a zero gradient gives 0/0 = NaN"
    )
    raise ConfigError(
      "train.eps",
      eps,
      f"a number in [{F32_TINY:.3g}, {F32_MAX:.3g}], the normal float32 range: the optimizer "
      f"computes in float32, where {eps!r} is {what}",
    )


def _validate_train(cfg) -> int:
  """The ``train`` section but its memory choices; returns train.batch_size."""
  batch = check(cfg, "train.batch_size")
  max_context = cfg.model.max_context
  hint = f" (at most model.max_context = {max_context})"
  context = check(cfg, "train.context_size", hi=max_context, hint=hint)
  if batch * context > INT32_MAX:
    raise ConfigError(
      "train.batch_size",
      batch,
      f"at most {INT32_MAX // context:,} at train.context_size = {context}: an update's tokens "
      f"per model, B·C, are counted in int32 (the loss's mean), so B·C <= {INT32_MAX:,}",
    )
  for name in (
    "num_steps",
    "steps_per_call",
    "lr",
    "schedule",
    "warmup_frac",
    "b1",
    "b2",
    "eps",
    "weight_decay",
    "grad_clip",
  ):
    check(cfg, f"train.{name}")
  check_lr("train.lr", cfg.train.lr)
  _check_adam_float32(cfg)
  horizon = cfg.train.get("schedule_steps", 0)  # a config written before it: 0
  check(cfg, "train.schedule_steps", horizon)
  if horizon and horizon < cfg.train.num_steps:
    raise ConfigError(
      "train.schedule_steps",
      horizon,
      f"0 (= train.num_steps) or at least train.num_steps = {cfg.train.num_steps:,}: a "
      f"schedule that ended before training would train on at a learning rate of 0",
    )
  return batch


def _validate_ensemble(cfg) -> int:
  """The ``ensemble`` section's per-model values and the top-level seed; returns
  ensemble.size."""
  size = check(cfg, "ensemble.size")
  peak_lrs = cfg.ensemble.peak_lrs
  if peak_lrs:
    if len(peak_lrs) != size:
      raise ConfigError(
        "ensemble.peak_lrs",
        peak_lrs,
        f"empty (all models use train.lr) or one value per model (ensemble.size = {size})",
      )
    for i, lr in enumerate(peak_lrs):
      check_real(f"ensemble.peak_lrs[{i}]", lr, 0.0, math.inf, True, True)
      check_lr(f"ensemble.peak_lrs[{i}]", lr)
  for name in ("seeds", "cell_ids"):
    values = cfg.ensemble.get(name, ())
    if values and len(values) != size:
      raise ConfigError(
        f"ensemble.{name}", values, f"empty or one value per model (ensemble.size = {size})"
      )
    for i, v in enumerate(values):
      check_int(
        f"ensemble.{name}[{i}]",
        v,
        0,
        INT32_MAX if name == "seeds" else None,
        " (seeds are int32)" if name == "seeds" else "",
      )
    if name == "cell_ids" and len(set(values)) != len(values):
      raise ConfigError("ensemble.cell_ids", values, "distinct ids")
  seed = check(cfg, "seed")
  if not cfg.ensemble.get("seeds") and seed + size - 1 > INT32_MAX:
    raise ConfigError(
      "seed",
      seed,
      f"an integer in [0, {INT32_MAX - size + 1}]: the models use "
      f"seeds seed … seed + ensemble.size - 1 = {seed + size - 1}, and seeds are "
      f"int32, at most 2^31 - 1 = {INT32_MAX}",
    )
  return size


def _validate_devices(cfg, size: int, batch: int, devices) -> None:
  """``mesh.num_devices`` against the devices (see ``validate``), then the choices that depend
  on the mesh: memory, and ``ensemble.vmap_chunk``."""
  whole = devices is None and jax.process_count() > 1  # one global mesh
  devices = jax.devices() if devices is None else devices
  n_avail = len(devices)
  hint = f" (0 = as many of the {n_avail} available devices as the ensemble can use)"
  n_dev = check(cfg, "mesh.num_devices", hi=n_avail, hint=hint)
  if not n_dev and not whole:  # a small ensemble runs on part of the devices
    n_dev = len(usable_devices(size, batch, devices))
  try:
    n_ens, _ = mesh_shape(size, batch, n_dev or n_avail)
  except MeshError as e:
    raise ConfigError("mesh.num_devices", n_dev, str(e)) from None
  _validate_memory_choices(cfg, batch, (n_dev or n_avail) // n_ens)
  chunk = check(cfg, "ensemble.vmap_chunk")
  local = size // n_ens
  if chunk and local % chunk:
    raise ConfigError(
      "ensemble.vmap_chunk",
      chunk,
      f"0 (auto) or a divisor of the {local} models per device "
      f"(E = {size} over an ensemble mesh axis of {n_ens})",
    )


def validate_devices(cfg, devices=None) -> None:
  """``validate``'s rules that depend on the devices alone (``mesh.num_devices``, the mesh's
  shape, the memory choices and ``ensemble.vmap_chunk`` on it), for a config validated as a
  whole against other devices: a sweep's group, validated when the sweep was planned, on the
  devices of the worker that trains it.

  Raises:
    ConfigError: naming the field, the value and what these devices allow.
  """
  _validate_devices(cfg, int(cfg.ensemble.size), int(cfg.train.batch_size), devices)


def validate(cfg, devices=None) -> None:
  """Checks a whole run config (``configs/*.py`` layout); raises ``ConfigError`` on the first
  bad field (``DataError`` for data that cannot be found or whose targets cannot be reached).
  Each field's kind, range or choices come from ``ihsweep.base.schema``; the rules between
  fields are the code below. Does not touch devices beyond counting them: ``devices`` are those the
  run may use (default ``jax.devices()``; a sweep's worker passes its local devices). With
  ``mesh.num_devices`` = 0 and one process (or given ``devices``), an ensemble that cannot use
  them all runs on as many as it can (``sharding.usable_devices``); several processes on one
  global mesh must use all."""
  size, batch = _validate_settings(cfg)
  _validate_devices(cfg, size, batch, devices)


def validate_settings(cfg) -> None:
  """``validate``'s rules that do not depend on the devices: every rule but those of
  ``validate_devices`` (a sweep's plan, ``grid.make_plan``, before it knows which devices a
  group's worker has).

  Raises:
    ConfigError: naming the field, the value and what is allowed.
    DataError: data that cannot be found, as ``validate``.
  """
  _validate_settings(cfg)


def _validate_settings(cfg) -> tuple[int, int]:
  """``validate_settings``; returns ``(ensemble.size, train.batch_size)`` as validated."""
  for section in ("model", "train", "ensemble", "data", "mesh", "eval", "checkpoint"):
    if section not in cfg:
      raise ConfigError(section, None, f"a section '{section}' (see configs/default.py)")
  check_known_fields(cfg)
  vocab = _validate_model(cfg)
  batch = _validate_train(cfg)
  size = _validate_ensemble(cfg)
  source = data_rules.validate_data(cfg, vocab, size)
  data_rules.validate_eval(cfg, vocab, source)
  _validate_checkpoint(cfg)
  _validate_log(cfg)
  return size, batch


def _validate_budget(cfg) -> None:
  """``sweep.budget`` and the fields it reads."""
  budget = check(cfg, "sweep.budget")
  horizon = check(cfg, "sweep.schedule_horizon", cfg.sweep.get("schedule_horizon", "budget"))
  if budget == "tokens" or horizon == "tokens":
    if horizon == "tokens" and not cfg.sweep.tokens:
      raise ConfigError(
        "sweep.tokens",
        cfg.sweep.tokens,
        ">= 1 with sweep.schedule_horizon = 'tokens' (the tokens per model the schedule spans)",
      )
    check(cfg, "sweep.tokens")
  if budget in ("law", "emergence"):
    check(cfg, "sweep.law_multiple")
    if cfg.sweep.law_file:
      try:
        Law.from_json(os.path.expanduser(cfg.sweep.law_file))
      except LawError as e:
        raise ConfigError("sweep.law_file", cfg.sweep.law_file, str(e)) from None
  if budget == "emergence":
    # The metrics that may stop a group, and their thresholds: ihsweep.compute.metric_registry.
    metric = check_choice("sweep.stop_metric", cfg.sweep.stop_metric, metric_registry.stop_names())
    rule = metric_registry.get(metric).stop
    threshold = cfg.sweep.stop_threshold
    check_real("sweep.stop_threshold", threshold, rule.lo, rule.hi, rule.lo_open, rule.hi_open)
    check(cfg, "sweep.stop_margin")
    if not cfg.eval.every_steps and not cfg.eval.every_tokens:
      raise ConfigError(
        "eval.every_steps",
        cfg.eval.every_steps,
        "> 0 for sweep.budget = 'emergence' (the stop rule reads the online metrics)",
      )


def validate_sweep(cfg, n_devices: int | None = None) -> None:
  """The ``sweep`` section of a sweep's config, and the fields a sweep fills per group, before
  anything is planned (``grid.make_plan``). ``n_devices``: the devices of the process the sweep
  is planned for, against which ``sweep.devices_per_worker`` is checked
  (``check_devices_per_worker``); None: not checked here (``grid.make_plan``: the check is
  ``worker_fit.check_sweep``'s, for the devices of a run or of a plan).

  Raises:
    ConfigError: naming the field, the value and what is allowed.
  """
  n_seeds = check(cfg, "sweep.seeds") or check(cfg, "ensemble.size")
  # The cells' seeds are seed, seed + 1, ...: named by the field the user gave, not by the
  # ensemble.seeds the planner fills from it.
  seed = check(cfg, "seed")
  if seed + n_seeds - 1 > INT32_MAX:
    raise ConfigError(
      "seed",
      seed,
      f"an integer in [0, {INT32_MAX - n_seeds + 1}]: a sweep's cells use seeds seed … seed + "
      f"{n_seeds - 1} (sweep.seeds or ensemble.size = {n_seeds}), and seeds are int32, at most "
      f"2^31 - 1 = {INT32_MAX}",
    )
  _validate_budget(cfg)
  for field in (
    "ensemble.peak_lrs",
    "ensemble.seeds",
    "ensemble.cell_ids",
    "data.frequencies",
    "data.reliabilities",
  ):
    section, name = field.split(".")
    value = cfg[section].get(name, ())
    if value:
      raise ConfigError(
        field,
        value,
        "empty in a sweep: the planner fills it per group (vary "
        "learning rates and data knobs with sweep.grid, seeds with sweep.seeds)",
      )
  check(cfg, "sweep.placement")
  check(cfg, "sweep.wait_to_take_over")
  check(cfg, "sweep.processes_per_worker", hi=jax.process_count())
  if n_devices is not None:
    check_devices_per_worker(cfg, n_devices)


def process_devices(cfg, devices=None) -> list:
  """The devices of a process that a sweep's workers share: the first ``mesh.num_devices`` of
  ``devices`` (default this process's, ``jax.local_devices()``; a plan passes those of the
  process it plans) where that is set, else all of them."""
  devices = jax.local_devices() if devices is None else devices
  return list(devices[: int(cfg.mesh.num_devices) or None])


def worker_slices(cfg, size: int | None = None, devices=None) -> list[list]:
  """``process_devices`` (of ``devices``, default this process's) in slices of ``size``
  consecutive ones (default ``sweep.devices_per_worker``), or one slice of all of them (0, auto:
  the widest worker the layout may choose, what a group is checked against before
  ``worker_layout.phases`` chooses)."""
  devices = process_devices(cfg, devices)
  if size is None:
    size = int(cfg.get("sweep", {}).get("devices_per_worker", 0))
  d = int(size) or len(devices)
  return [devices[i : i + d] for i in range(0, len(devices), d)]


def check_devices_per_worker(cfg, n_devices: int) -> None:
  """``sweep.devices_per_worker`` against a process of ``n_devices`` devices: 0 (auto), or a
  divisor of the process's devices (its first ``mesh.num_devices`` where set, which then fixes a
  worker's devices: 0 or all of them).

  Raises:
    ConfigError: ``sweep.devices_per_worker``, its value and the divisors allowed.
  """
  m = check_int("mesh.num_devices", cfg.mesh.num_devices, 0)  # it sets the process's share
  n = min(m, n_devices) if m else n_devices
  allowed = (
    f"0 (auto: the plan's fastest layout) or a divisor of this process's {n} devices: "
    f"{', '.join(str(k) for k in range(1, n + 1) if n % k == 0)} ({n}: one worker over all)"
  )
  value = cfg.get("sweep", {}).get("devices_per_worker", 0)  # no sweep section: one worker
  d = check(cfg, "sweep.devices_per_worker", value, lo=0, hi=n, hint=f" ({allowed})")
  if not d:
    return
  if n % d:
    raise ConfigError("sweep.devices_per_worker", d, allowed)
  if m and d != n:
    raise ConfigError(
      "sweep.devices_per_worker",
      d,
      f"0 or {n} with mesh.num_devices = {m}: a group's mesh takes that "
      f"many devices, a whole worker (set mesh.num_devices = 0 to split the process's devices)",
    )
