"""Training of one model, and of an ensemble as ``jax.vmap`` of the one-model step.

``train_step`` knows nothing about the ensemble. ``make_ensemble_train_fn`` builds the only
ensemble-aware program: per host call it samples each model's batches for U updates in-graph
from its own key (or takes host-fed batches), then loops over U steps that each vmap
``train_step`` over the leading axis E of (state, hyper-parameters, batch), under ``jax.jit``
with the state donated and sharded over a mesh.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from ihsweep.base import schema, sharding
from ihsweep.compute import losses
from ihsweep.compute.model import ATTENTIONS, ModelConfig, Transformer, cudnn_attention_problem
from ihsweep.data.keys import step_keys

_TRAIN = schema.defaults("train")  # the schema's defaults, TrainConfig's own


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation settings shared by every model of an ensemble.

  The defaults are the config schema's (``ihsweep.base.schema``, section ``train``: one place
  for them; ``tests/test_schema.py`` checks): AdamW with β = (0.9, 0.999), eps 1e-8, weight
  decay 0, warmup over 1% of the updates then cosine decay to 0, gradients clipped to global
  norm 1.0 (HF Trainer's default), and the memory choices and attention left to ``auto``.
  """

  batch_size: int = _TRAIN.batch_size  # B, sequences per update
  context_size: int = _TRAIN.context_size  # C, tokens per sequence
  num_steps: int = _TRAIN.num_steps  # updates trained
  schedule_steps: int = _TRAIN.schedule_steps  # the lr schedule's horizon; 0 = num_steps
  steps_per_call: int = _TRAIN.steps_per_call  # U, most updates per host call (one device loop)
  lr: float = _TRAIN.lr  # peak learning rate (per model: HParams.peak_lr)
  schedule: str = _TRAIN.schedule  # cosine | constant | inverse_sqrt
  warmup_frac: float = _TRAIN.warmup_frac  # linear warmup over this fraction of num_steps
  b1: float = _TRAIN.b1
  b2: float = _TRAIN.b2
  eps: float = _TRAIN.eps
  weight_decay: float = _TRAIN.weight_decay  # decoupled, on matrices only
  grad_clip: float = _TRAIN.grad_clip  # global-norm clip; 0 disables
  # Memory choices (same numbers up to float rounding; ihsweep.training.memory picks them when
  # 0/auto):
  # k microbatches of B/k sequences per update; 0 = auto
  gradient_accumulation_steps: int = _TRAIN.gradient_accumulation_steps
  remat: str = _TRAIN.remat  # none | blocks (recompute blocks in the backward) | auto
  attention: str = _TRAIN.attention  # explicit | xla | cudnn (model.ATTENTIONS) | auto

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "TrainConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cfg).items() if k in names})

  @property
  def horizon(self) -> int:
    """Updates the learning-rate schedule spans: ``schedule_steps``, or ``num_steps`` if 0 (an
    early stop ends training before it, without changing the schedule)."""
    return int(self.schedule_steps) or int(self.num_steps)

  @property
  def warmup_steps(self) -> int:
    return int(round(self.warmup_frac * self.horizon))

  @property
  def microbatches(self) -> int:
    """k of ``gradient_accumulation_steps``, 1 while it is still 0 (auto, unresolved)."""
    return max(1, int(self.gradient_accumulation_steps))


REMAT = ("auto", "none", "blocks")
UPDATE_LOOP_SCOPE = "ihsweep_updates"  # in the op_name of the update loop's HLO while
ATTENTION = ("auto", *ATTENTIONS)


def cudnn_available() -> bool:
  """Whether JAX finds a cuDNN library (the CUDA plugin's ``cudnn_get_version``; on a GPU
  machine ``jax[cuda12]`` installs it, for compile-only devices ``make install`` puts it in
  ``build/jax-cuda``)."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo

    return bool(fused_attention_stablehlo.check_cudnn_version())
  except Exception:  # noqa: BLE001 — no plugin, no library: the same answer
    return False


CUDNN_MIN_CAPABILITY = (8, 0)  # cuDNN's fused flash attention: Ampere (sm80) or later


def resolve_attention(choice: str, mcfg: ModelConfig, device) -> str:
  """The train step's attention (one of ``model.ATTENTIONS``) on devices like ``device`` (a
  ``jax.Device``, compile-only ones too; or a platform name, ``cpu``/``gpu``/``tpu``).
  ``auto`` is what the compilers were measured to need least memory for (docs/planning.md,
  "Attention"): cuDNN's flash attention on a GPU of compute capability 8.0 or later (cuDNN's
  fused attention needs Ampere) where it can compute the model's attention
  (``model.cudnn_attention_problem``) and cuDNN is installed; on TPUs XLA's implementation of
  jax.nn.dot_product_attention (exp1's B 32 × C 1024 on a v5e core: 8.79 GiB against the
  explicit pattern's 11.39); elsewhere the explicit pattern (on GPUs XLA's implementation
  compiles to the same bytes; on CPUs the explicit pattern's heads-major layout is the one
  measured fast, docs/benchmarks.md).

  Raises:
    ValueError: ``cudnn`` where it cannot run: another platform, an older GPU, shapes it does
      not take, no cuDNN library (the message says which).
  """
  platform = getattr(device, "platform", device)
  capability = getattr(device, "compute_capability", None)
  problem = cudnn_attention_problem(mcfg)
  if problem is None and platform != "gpu":
    problem = f"cuDNN runs on GPUs and these devices are {platform}"
  if problem is None and capability:
    if tuple(int(x) for x in str(capability).split(".")[:2]) < CUDNN_MIN_CAPABILITY:
      problem = (
        f"cuDNN's flash attention needs compute capability 8.0 and these GPUs have {capability}"
      )
  if choice == "auto":
    if platform == "tpu":
      return "xla"
    return "cudnn" if problem is None and cudnn_available() else "explicit"
  if choice == "cudnn":
    if problem:
      raise ValueError(problem)
    if not cudnn_available():
      raise ValueError("JAX finds no cuDNN library (jax[cuda12] installs it)")
  return choice


def training_model(mcfg: ModelConfig, tcfg: TrainConfig, device=None) -> Transformer:
  """The module the train program differentiates: ``mcfg``'s architecture with ``tcfg``'s
  choices of how to compute it (block rematerialisation, the attention kernel — ``auto``
  resolved for ``device``, the program's devices, JAX's first device if None; the loss's
  vocabulary tiles follow the microbatch's shape and the devices,
  ``make_ensemble_train_fn``)."""
  attention = tcfg.attention
  if attention == "auto":  # resolve_memory resolves and records it; here: the same rule
    attention = resolve_attention(attention, mcfg, device or jax.devices()[0])
  return Transformer(mcfg, remat=tcfg.remat == "blocks", attention=attention)


@flax.struct.dataclass
class TrainState:
  """One model's training state (a pytree; the ensemble stacks it along a leading axis E).

  step: int32 ``[]`` updates done. params / opt_state: Flax params and optax state.
  data_key: uint32 ``[2]`` root key of this model's data stream; step t uses
  ``fold_in(data_key, t)``, so a resumed run draws the same batches.
  diverged_at: int32 ``[]``, -1 while the model is healthy, else the update count at which its
  loss or gradient was first NaN/inf; from then on its params and optimizer state are frozen.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  data_key: jax.Array
  diverged_at: jax.Array


@flax.struct.dataclass
class HParams:
  """Per-model values vmapped with the state: peak learning rate (float32 ``[]``) and the data
  source's per-model parameters (a pytree, possibly empty)."""

  peak_lr: jax.Array
  data: Any


def schedule_shape(tcfg: TrainConfig) -> optax.Schedule:
  """Learning-rate multiplier in [0, 1] per update: linear warmup, then cosine decay to 0 at
  ``tcfg.horizon`` (``schedule_steps``, else ``num_steps``; optax.warmup_cosine_decay_schedule),
  constant, or inverse square root (Vaswani et al. 2017, eq. 3: ``sqrt(warmup / step)`` after
  warmup). Warmup is ``warmup_frac`` of the horizon."""
  warmup, horizon = tcfg.warmup_steps, tcfg.horizon
  if tcfg.schedule == "cosine":
    if warmup == 0:  # optax logs a warning for a zero-length warmup
      return optax.cosine_decay_schedule(1.0, max(horizon, 1), alpha=0.0)
    return optax.warmup_cosine_decay_schedule(
      0.0, 1.0, warmup_steps=warmup, decay_steps=max(horizon, warmup + 1), end_value=0.0
    )
  if tcfg.schedule == "constant":
    if warmup == 0:
      return optax.constant_schedule(1.0)
    return optax.join_schedules(
      [optax.linear_schedule(0.0, 1.0, warmup), optax.constant_schedule(1.0)], [warmup]
    )
  if tcfg.schedule == "inverse_sqrt":
    w = max(warmup, 1)
    return lambda step: jnp.minimum(step / w, jnp.sqrt(w / jnp.maximum(step, 1)))
  raise ValueError(f"train.schedule = {tcfg.schedule!r}: allowed: cosine, constant, inverse_sqrt")


def _decay_mask(params):
  return jax.tree_util.tree_map_with_path(
    lambda path, p: p.ndim >= 2 and "embed" not in jax.tree_util.keystr(path), params
  )


def make_optimizer(tcfg: TrainConfig, peak_lr) -> optax.GradientTransformation:
  """AdamW (optax.adamw) with ``peak_lr · schedule_shape(step)`` and optional global-norm
  clipping. ``peak_lr`` may be a traced per-model value: the optimizer state's structure does
  not depend on it, so one state layout serves every learning rate of the ensemble."""
  shape = schedule_shape(tcfg)
  adamw = optax.adamw(
    lambda step: peak_lr * shape(step),
    b1=tcfg.b1,
    b2=tcfg.b2,
    eps=tcfg.eps,
    weight_decay=tcfg.weight_decay,
    mask=_decay_mask,
  )
  if tcfg.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(tcfg.grad_clip), adamw)
  return adamw


def init_state(seed, model: Transformer, tcfg: TrainConfig) -> TrainState:
  """One model's initial state from an int seed (traceable, so ``vmap`` over seeds gives E).

  The seed's key is split with ``fold_in``: 0 → parameter init, 1 → data stream. (Probes come
  from ``eval.probe_seed``, shared by every model: ``ihsweep.data.probes``.)"""
  root = jax.random.PRNGKey(seed)
  dummy_1xC = jnp.zeros((1, tcfg.context_size), jnp.int32)
  params = model.init(jax.random.fold_in(root, 0), dummy_1xC)["params"]
  opt_state = make_optimizer(tcfg, 1.0).init(params)
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=opt_state,
    data_key=jax.random.fold_in(root, 1),
    diverged_at=jnp.full((), -1, jnp.int32),
  )


def next_token_loss(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy in nats/token (float32 ``[]``)."""
  logz_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  # A one-hot product, not a gather: its gradient is an elementwise fusion rather than a scatter.
  onehot_BxTxV = jax.nn.one_hot(targets_BxT, logits_BxTxV.shape[-1], dtype=logits_BxTxV.dtype)
  target_logit_BxT = jnp.sum(logits_BxTxV * onehot_BxTxV, axis=-1)
  return jnp.mean(logz_BxT - target_logit_BxT)


def accumulated_value_and_grad(
  loss_fn: Callable, params: Any, tokens_BxCp1: jax.Array, k: int
) -> tuple[jax.Array, Any]:
  """``jax.value_and_grad(loss_fn)(params, tokens_BxCp1)`` computed over ``k`` microbatches
  of B/k sequences (gradient accumulation, as HF Trainer's ``gradient_accumulation_steps``).

  ``loss_fn(params, tokens_bxCp1)`` is a mean over the microbatch's tokens; every microbatch
  has the same number of tokens, so the batch's mean loss and its gradient are the plain means
  of the k microbatches' (accumulated in float32, or float64 for float64 params). Microbatch
  j holds rows j, j + k, j + 2k, …: with B sharded in contiguous blocks over the mesh's 'data'
  axis, each microbatch keeps B/(k · devices) rows on every device. Activations are those of
  one microbatch (``lax.scan`` over them).

  Raises:
    ValueError: k does not divide B.
  """
  b = tokens_BxCp1.shape[0]
  if k == 1:
    return jax.value_and_grad(loss_fn)(params, tokens_BxCp1)
  if b % k:
    raise ValueError(f"train.gradient_accumulation_steps = {k} must divide B = {b}")
  micro_kxbxCp1 = jnp.swapaxes(tokens_BxCp1.reshape((b // k, k) + tokens_BxCp1.shape[1:]), 0, 1)
  acc = lambda p: jnp.promote_types(p.dtype, jnp.float32)
  tree_map = jax.tree_util.tree_map

  def one_microbatch(carry, tokens_bxCp1):
    loss_sum, grad_sum = carry
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens_bxCp1)
    grad_sum = tree_map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)
    return (loss_sum + loss, grad_sum), None

  zeros = tree_map(lambda p: jnp.zeros(p.shape, acc(p)), params)
  loss0 = jnp.zeros((), acc(jax.tree_util.tree_leaves(params)[0]))
  (loss_sum, grad_sum), _ = jax.lax.scan(one_microbatch, (loss0, zeros), micro_kxbxCp1)
  grads = tree_map(lambda s, p: (s / k).astype(p.dtype), grad_sum, params)
  return loss_sum / k, grads


def train_step(
  state: TrainState, hp: HParams, tokens_BxCp1: jax.Array, *, model: Transformer, tcfg: TrainConfig
) -> tuple[TrainState, dict]:
  """One AdamW update of ONE model on int32 tokens ``[B, C + 1]``, its gradient accumulated
  over ``tcfg.microbatches`` microbatches (``accumulated_value_and_grad``).

  Returns the new state and float32 scalars ``loss`` (nats/token, before the update) and
  ``grad_norm`` (global L2 norm before clipping). A model whose loss or gradient norm is NaN/inf
  is frozen (``TrainState.diverged_at``): its params and optimizer state stay as they were
  before that update, and its ``loss``/``grad_norm`` are reported as NaN from then on. Freezing
  is per model, so the other models of an ensemble train exactly as they would without it.
  """

  def loss_fn(params, tokens_bxCp1):
    inputs_bxC, targets_bxC = tokens_bxCp1[:, :-1], tokens_bxCp1[:, 1:]
    return model.apply({"params": params}, inputs_bxC, targets_BxT=targets_bxC)

  loss, grads = accumulated_value_and_grad(loss_fn, state.params, tokens_BxCp1, tcfg.microbatches)
  tx = make_optimizer(tcfg, hp.peak_lr)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  grad_norm = optax.tree.norm(grads)
  healthy = state.diverged_at < 0
  ok = healthy & jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)
  new_state = state.replace(
    step=state.step + 1,
    params=keep(params, state.params),
    opt_state=keep(opt_state, state.opt_state),
    diverged_at=jnp.where(healthy & ~ok, state.step, state.diverged_at),
  )
  return new_state, {
    "loss": jnp.where(ok, loss, jnp.nan),
    "grad_norm": jnp.where(ok, grad_norm, jnp.nan),
  }


def sample_ensemble_batches(
  sample: Callable, state: TrainState, hp: HParams, arrays: Any, n_steps: int
) -> jax.Array:
  """Each model's batches for its next ``n_steps`` updates, from its own key: int32
  ``[E, n_steps, B, C + 1]``; update t of model e uses ``fold_in(data_key_e, t)``, so a resumed
  run or a different ``steps_per_call`` draws the same batches (``data.keys.step_keys``).
  ``arrays`` (the source's shared device arrays, e.g. a token array) is not vmapped."""

  def one_model(data_key, step, data_params):
    keys_Ux2 = step_keys(data_key, step, n_steps)
    return jax.vmap(sample, in_axes=(0, None, None))(keys_Ux2, data_params, arrays)

  return jax.vmap(one_model)(state.data_key, state.step, hp.data)


def make_init_fn(model: Transformer, tcfg: TrainConfig, mesh: Mesh) -> Callable:
  """``init(seeds_E int32) -> TrainState`` with leading axis E, sharded over the mesh."""
  return jax.jit(
    jax.vmap(functools.partial(init_state, model=model, tcfg=tcfg)),
    out_shardings=sharding.ensemble_sharding(mesh),
  )


def auto_vmap_chunk(
  local_models: int, tcfg: TrainConfig, vocab_size: int, backend: str | None = None
) -> int:
  """How many models one vmapped step trains at once on each device (``ensemble.vmap_chunk``
  = 0). Accelerators: all of them. CPU: the largest divisor of ``local_models`` whose logits
  (c · B · C · V float32) fit in 2 MiB, at least 1 — on CPU the step is bound by cache misses
  on the logit-sized arrays, and a vmap over more models than the cache holds ran slower per
  model than one model alone (benchmarks/throughput.py; numbers in docs/benchmarks.md)."""
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return local_models
  per_model = tcfg.batch_size * tcfg.context_size * vocab_size * 4
  fits = max(1, (2 << 20) // per_model)
  return max(c for c in range(1, local_models + 1) if local_models % c == 0 and c <= fits)


def make_ensemble_train_fn(
  model: Transformer,
  tcfg: TrainConfig,
  sample: Callable | None,
  mesh: Mesh,
  n_steps: int,
  vmap_chunk: int = 0,
) -> "TrainProgram":
  """The compiled ensemble program: ``fn(state, hp, data, n_active=None) -> (state, metrics)``.

  Runs ``n_active`` (default and at most ``n_steps``) updates of every model in one device loop
  (no host sync inside); one compilation serves every ``n_active``. ``state`` is donated.
  ``metrics`` holds float32 (``ModelConfig.accum_dtype``) ``[n_steps, E]`` arrays ``loss`` and
  ``grad_norm``, zero after the first ``n_active`` rows.

  Data, two ways:
    * in-graph (``sample`` given): ``sample(key, data_params, arrays) -> [B, C + 1]`` is called
      inside the step and ``data`` is the source's shared arrays (a pytree replicated on every
      device, e.g. a corpus's tokens; ``{}`` for generated data);
    * host-fed (``sample=None``): ``data`` is the batches themselves, integer
      ``[E, n_steps, B, C + 1]`` (rows past ``n_active`` unused; sharded over 'ensemble' and
      'data'), for corpora too large for device memory.

  ``vmap_chunk`` c (0 = ``auto_vmap_chunk``): each device vmaps ``train_step`` over c of its
  models at a time and loops (``lax.map``, inside the same program) over its E_local / c chunks,
  each chunk running all ``n_steps`` updates while its working set is hot. Models are
  independent, so the result does not depend on c. c must divide E_local = E / (ensemble axis).
  """
  # The rules of the devices compiled for (compile-only GPUs planned from a CPU included).
  platform = mesh.devices.flat[0].platform
  if not model.vocab_tile:  # the loss's vocabulary tiles for one microbatch of B/k sequences
    tokens = tcfg.batch_size // tcfg.microbatches * tcfg.context_size
    tile = losses.auto_vocab_tile(model.cfg.vocab_size, tokens, losses.logits_budget(platform))
    model = model.clone(vocab_tile=tile)
  step_one = functools.partial(train_step, model=model, tcfg=tcfg)
  batch_sh = sharding.batch_sharding(mesh)
  host_sh = sharding.host_batch_sharding(mesh)
  n_dev_e = mesh.shape["ensemble"]
  host_fed = sample is None

  def k_updates(state, hp, batches, n_active):
    # A loop with a traced trip count: one program serves every call length up to n_steps
    # (calls end early at evaluation and checkpoint steps), unused batches are skipped.
    n_models = batches.shape[0]
    batches_UxE = jnp.swapaxes(batches, 0, 1)  # each update reads one contiguous [E, B, C + 1]

    def one_update(t, carry):
      state, loss_UxE, gnorm_UxE = carry
      batch_ExBxCp1 = jax.lax.dynamic_index_in_dim(batches_UxE, t, axis=0, keepdims=False)
      tokens_ExBxCp1 = jax.lax.with_sharding_constraint(batch_ExBxCp1.astype(jnp.int32), batch_sh)
      state, m = jax.vmap(step_one)(state, hp, tokens_ExBxCp1)
      return state, loss_UxE.at[t].set(m["loss"]), gnorm_UxE.at[t].set(m["grad_norm"])

    zeros = jnp.zeros((n_steps, n_models), model.cfg.accum_dtype)
    # The scope names the update loop in the compiled program (planning.kernels reads it).
    with jax.named_scope(UPDATE_LOOP_SCOPE):
      state, loss, gnorm = jax.lax.fori_loop(0, n_active, one_update, (state, zeros, zeros))
    return state, {"loss": loss, "grad_norm": gnorm}

  def train_call(state, hp, data, n_active):  # named for the compile logs: jit(train_call)
    if not host_fed:
      # Every local model's batches for all U updates at once, before the chunk loop: a
      # sequential sampler (a Markov chain's scan over positions) then runs once per call over
      # E_local·U·B sequences instead of once per update and chunk.
      data = sample_ensemble_batches(sample, state, hp, data, n_steps)
    batches = jax.lax.with_sharding_constraint(data, host_sh)  # [E, U, B, C + 1]
    n_models = hp.peak_lr.shape[0]
    local = n_models // n_dev_e
    c = vmap_chunk or auto_vmap_chunk(local, tcfg, model.cfg.vocab_size, platform)
    if local % c:
      raise ValueError(f"ensemble.vmap_chunk = {c} must divide the models per device ({local})")
    n_chunks = local // c
    if n_chunks == 1:
      return k_updates(state, hp, batches, n_active)

    # [E] = [devices, chunks, c] -> [chunks, devices * c]: the loop runs over chunks while
    # every chunk keeps one slice per device (its sharding over 'ensemble' is unchanged).
    def split(x):
      x = x.reshape((n_dev_e, n_chunks, c) + x.shape[1:]).swapaxes(0, 1)
      return x.reshape((n_chunks, n_dev_e * c) + x.shape[3:])

    def merge(x):  # [chunks, devices * c, ...] -> [E, ...]
      x = x.reshape((n_chunks, n_dev_e, c) + x.shape[2:]).swapaxes(0, 1)
      return x.reshape((n_models,) + x.shape[3:])

    tree_map = jax.tree_util.tree_map
    per_model = tree_map(split, (state, hp, batches))
    states, metrics = jax.lax.map(lambda a: k_updates(*a, n_active), per_model)
    metrics = tree_map(lambda m: jax.vmap(merge, in_axes=1)(m), metrics)  # [U, E]
    return tree_map(merge, states), metrics

  ens_sh = sharding.ensemble_sharding(mesh)
  data_sh = host_sh if host_fed else sharding.replicated(mesh)
  compiled = jax.jit(
    train_call,
    in_shardings=(ens_sh, ens_sh, data_sh, sharding.replicated(mesh)),
    out_shardings=(ens_sh, sharding.per_step_sharding(mesh)),
    donate_argnums=0,
  )

  return TrainProgram(compiled, n_steps, sharding.replicated(mesh))


class TrainProgram:
  """The ensemble train program of ``make_ensemble_train_fn``:
  ``program(state, hp, data, n_active=None) -> (state, metrics)``.

  ``program.compile(state, hp, data)`` compiles it ahead of time from arrays or
  ``jax.ShapeDtypeStruct`` (runner.precompile, ihsweep.training.memory, benchmarks) and returns a
  callable with the same signature whose ``executable`` (a ``jax.stages.Compiled``) has
  ``memory_analysis()`` and ``cost_analysis()``; ``program.lower(...)`` stops before compiling.
  """

  def __init__(self, jitted, n_steps: int, replicated):
    self.jitted, self.n_steps, self._repl = jitted, n_steps, replicated
    self._full = None  # made at the first call, once (not at all on compile-only devices)

  def _count(self, n: int) -> jax.Array:
    """The call's number of updates as its replicated int32 scalar. On a mesh of this process's
    devices, an explicit transfer; on a multi-process mesh jit replicates a plain scalar
    (``device_put`` there would compare the value across processes on every call)."""
    if self._repl.is_fully_addressable:
      return jax.device_put(np.int32(n), self._repl)
    return jnp.int32(n)

  def _n(self, n_active: int | None) -> jax.Array:
    if n_active is None or n_active == self.n_steps:
      if self._full is None:  # a full call then moves nothing between host and device
        self._full = self._count(self.n_steps)
      return self._full
    return self._count(n_active)

  def __call__(self, state, hp, data, n_active: int | None = None):
    return self.jitted(state, hp, data, self._n(n_active))

  def lower(self, state, hp, data) -> jax.stages.Lowered:
    # The count as a call passes it (``_count``), so that a call after ``lower(...).compile()``
    # of the same program finds its trace and executable in jit's caches.
    where = self._repl if self._repl.is_fully_addressable else None
    return self.jitted.lower(state, hp, data, jax.ShapeDtypeStruct((), np.int32, sharding=where))

  def compile(self, state, hp, data) -> "CompiledTrainProgram":
    return CompiledTrainProgram(self.lower(state, hp, data).compile(), self)


class CompiledTrainProgram:
  """A ``TrainProgram`` compiled for one set of argument shapes (``TrainProgram.compile``)."""

  def __init__(self, executable: jax.stages.Compiled, program: TrainProgram):
    self.executable, self._program = executable, program

  def __call__(self, state, hp, data, n_active: int | None = None):
    return self.executable(state, hp, data, self._program._n(n_active))


def model_and_train_config(cfg) -> tuple[ModelConfig, TrainConfig]:
  """Typed views of ``config.model`` and ``config.train``."""
  return ModelConfig.from_config(cfg.model), TrainConfig.from_config(cfg.train)


def peak_lrs(cfg) -> list[float]:
  """Per-model peak learning rates: ``ensemble.peak_lrs`` if given, else ``train.lr`` for all."""
  return list(cfg.ensemble.peak_lrs) or [cfg.train.lr] * cfg.ensemble.size


def model_seeds(cfg) -> list[int]:
  """Per-model init/data seeds: ``ensemble.seeds`` if given, else ``seed + i``."""
  return list(cfg.ensemble.get("seeds", ())) or [cfg.seed + i for i in range(cfg.ensemble.size)]


def cell_ids(cfg) -> list[int]:
  """Per-model cell ids written to logs and checkpoints: ``ensemble.cell_ids`` if given (a
  sweep's global ids), else ``0 … E − 1``."""
  return list(cfg.ensemble.get("cell_ids", ())) or list(range(cfg.ensemble.size))


def tokens_per_update(tcfg: TrainConfig) -> int:
  """Tokens one model consumes per update: B · C (targets, not counting the +1 input token)."""
  return tcfg.batch_size * tcfg.context_size
