"""Decoder-only transformer (GPT-2 style, pre-LayerNorm) in Flax linen.

One module serves training and analysis: ``Transformer.apply(..., return_internals=True)``
additionally returns, per layer, the attention probabilities and each head's direct write into
the residual stream, which the metrics (prefix-matching score, logit attribution) need.

Initialisation follows GPT-2 (Radford et al. 2019, §2.3; HF ``GPT2PreTrainedModel._init_weights``):
every weight matrix and embedding ~ N(0, 0.02²), biases 0, LayerNorm scale 1 and bias 0, and the
two projections that write into the residual stream (attention W_O, MLP output) ~ N(0, (0.02 /
sqrt(2 · n_layers))²) so the residual variance does not grow with depth.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from ihsweep.base import schema
from ihsweep.compute.losses import unembed_cross_entropy

POS_ENCODINGS = ("learned", "rotary")
DTYPES = ("float32", "bfloat16", "auto")
# How the train step computes attention (same numbers up to float rounding): the explicit
# [B·H, C, C] pattern (which evaluation and every metric read), or jax.nn.dot_product_attention
# with XLA's implementation or cuDNN's flash attention (GPU only: never materialises the pattern).
ATTENTIONS = ("explicit", "xla", "cudnn")
CUDNN_MAX_HEAD_DIM = 128  # jax._src.cudnn.fused_attention_stablehlo: ≤ 128 (≤ 256 from Hopper)
INIT_STD = 0.02


_MODEL = schema.defaults("model")  # the schema's defaults, ModelConfig's own


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one model; every model of an ensemble shares it. The defaults are the
  config schema's (``ihsweep.base.schema``, section ``model``; ``tests/test_schema.py`` checks).

  Attributes:
    n_layers: transformer blocks.
    n_heads: attention heads per block; must divide ``d_model``.
    d_model: residual stream width.
    d_mlp: MLP hidden width; 0 makes the model attention-only.
    vocab_size: token ids are in [0, vocab_size).
    max_context: longest sequence the model accepts (size of the learned position table).
    pos_encoding: ``learned`` (GPT-2 absolute positions) or ``rotary`` (RoPE on q and k,
      Su et al. 2021, applied to the full head dimension).
    tie_embeddings: unembedding = token embedding transposed (GPT-2) or a separate matrix.
    dtype: compute dtype of matmuls (``float32``, ``bfloat16``, or ``auto`` = bfloat16 on
      GPU/TPU and float32 on CPU). LayerNorm statistics, softmax and logits stay float32
      (``accum_dtype``). ``float64`` (with ``param_dtype`` ``float64``) computes everything in
      double precision: only with ``jax_enable_x64``, for equivalence tests whose float32 rounding
      differs between CPUs; not a config choice.
    param_dtype: storage dtype of parameters.
    rotary_base: RoPE frequency base.
    ln_eps: LayerNorm epsilon (GPT-2: 1e-5).
  """

  n_layers: int = _MODEL.n_layers
  n_heads: int = _MODEL.n_heads
  d_model: int = _MODEL.d_model
  d_mlp: int = _MODEL.d_mlp
  vocab_size: int = _MODEL.vocab_size
  max_context: int = _MODEL.max_context
  pos_encoding: str = _MODEL.pos_encoding
  tie_embeddings: bool = _MODEL.tie_embeddings
  dtype: str = _MODEL.dtype
  param_dtype: str = _MODEL.param_dtype
  rotary_base: float = schema.field("model.rotary_base").default  # optional: not in defaults
  ln_eps: float = schema.field("model.ln_eps").default

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
    """Builds from a mapping (e.g. ``config.model`` of an ml_collections config)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cfg).items() if k in names})

  @property
  def d_head(self) -> int:
    return self.d_model // self.n_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return resolve_dtype(self.dtype)

  @property
  def storage_dtype(self) -> jnp.dtype:
    return resolve_dtype(self.param_dtype)

  @property
  def accum_dtype(self) -> jnp.dtype:
    """LayerNorm, softmax, logits and the residual stream: float32 (float64 in a float64
    model)."""
    return jnp.promote_types(self.compute_dtype, jnp.float32)


def resolve_dtype(name: str) -> jnp.dtype:
  """Maps ``float32`` | ``bfloat16`` | ``auto`` (bf16 on accelerators, f32 on CPU) to a dtype."""
  if name == "auto":
    return jnp.bfloat16 if jax.default_backend() in ("gpu", "tpu") else jnp.float32
  if name == "float64" and not jax.config.jax_enable_x64:
    raise ValueError("dtype float64 needs jax_enable_x64 (otherwise JAX computes in float32)")
  return jnp.dtype(name)


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters that take part in matmuls: blocks (without LayerNorms/biases) + unembedding."""
  d = cfg.d_model
  per_layer = 4 * d * d + 2 * d * cfg.d_mlp
  return cfg.n_layers * per_layer + d * cfg.vocab_size


def flops_per_token(cfg: ModelConfig, context_size: int) -> float:
  """Training FLOPs per token (forward + backward), PaLM appendix B (Chowdhery et al. 2022).

  ``6 · N + 12 · n_layers · d_model · C`` where N = ``matmul_params`` (the embedding lookup is not
  a matmul; the unembedding is) and the second term counts the attention scores and the weighted
  sum of values (QKᵀ and AV) over the full C × C matrix, as PaLM does.
  """
  return 6.0 * matmul_params(cfg) + 12.0 * cfg.n_layers * cfg.d_model * context_size


def rotary(x_BxTxHxK: jax.Array, positions_T: jax.Array, base: float) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, eq. 34), half-split layout as in GPT-NeoX."""
  k = x_BxTxHxK.shape[-1]
  half = k // 2
  accum = jnp.promote_types(x_BxTxHxK.dtype, jnp.float32)
  inv_freq = base ** (-jnp.arange(half, dtype=accum) / half)
  angles_TxHalf = positions_T[:, None].astype(accum) * inv_freq[None, :]
  cos = jnp.cos(angles_TxHalf)[None, :, None, :]
  sin = jnp.sin(angles_TxHalf)[None, :, None, :]
  x = x_BxTxHxK.astype(accum)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxK.dtype)


def cudnn_attention_problem(cfg: ModelConfig) -> str | None:
  """Why cuDNN's flash attention cannot compute ``cfg``'s attention, or None: it takes bf16 or
  f16 inputs and a head dimension that is a multiple of 8 and at most ``CUDNN_MAX_HEAD_DIM``
  (``jax._src.cudnn.fused_attention_stablehlo.check_is_flash_attention``)."""
  if cfg.dtype not in ("bfloat16", "auto"):
    return f"model.dtype is {cfg.dtype!r} and cuDNN's flash attention takes bfloat16"
  if cfg.d_head % 8 or cfg.d_head > CUDNN_MAX_HEAD_DIM:
    return (
      f"the head dimension d_model / n_heads = {cfg.d_head} must be a multiple of 8 and at "
      f"most {CUDNN_MAX_HEAD_DIM}"
    )
  return None


class Attention(nn.Module):
  """Causal multi-head self-attention with a fused QKV projection and per-head W_O.

  ``attention`` (one of ``ATTENTIONS``) chooses how the pattern is computed when no internals
  are returned (the train step); with ``return_internals`` it is always the explicit pattern,
  whose probabilities the metrics read.
  """

  cfg: ModelConfig
  attention: str = "explicit"

  @nn.compact
  def __call__(self, x_BxTxD, return_internals: bool):
    cfg = self.cfg
    h, k, d = cfg.n_heads, cfg.d_head, cfg.d_model
    dtype, pdtype = cfg.compute_dtype, cfg.storage_dtype
    out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    qkv_BxTx3xHxK = nn.DenseGeneral(
      (3, h, k),
      kernel_init=nn.initializers.normal(INIT_STD),
      dtype=dtype,
      param_dtype=pdtype,
      name="qkv",
    )(x_BxTxD)
    t = x_BxTxD.shape[1]
    if cfg.pos_encoding == "rotary":
      pos_T = jnp.arange(t)
      qk_BxTx2xHxK = jnp.stack(
        [rotary(qkv_BxTx3xHxK[:, :, i], pos_T, cfg.rotary_base) for i in range(2)], axis=2
      )
      qkv_BxTx3xHxK = jnp.concatenate([qk_BxTx2xHxK, qkv_BxTx3xHxK[:, :, 2:]], axis=2)
    b = x_BxTxD.shape[0]
    w_o_HxKxD = self.param("w_o", nn.initializers.normal(out_std), (h, k, d), pdtype)
    b_o_D = self.param("b_o", nn.initializers.zeros, (d,), pdtype)
    w_o_HxKxD = w_o_HxKxD.astype(dtype)
    b_o_D = b_o_D.astype(dtype)
    if self.attention != "explicit" and not return_internals:
      # jax.nn.dot_product_attention: token-major [B, T, H, K] in and out, scores and softmax
      # in float32, probabilities cast to the values' dtype (as the explicit pattern below).
      z_BxTxHxK = jax.nn.dot_product_attention(
        qkv_BxTx3xHxK[:, :, 0],
        qkv_BxTx3xHxK[:, :, 1],
        qkv_BxTx3xHxK[:, :, 2],
        scale=1.0 / math.sqrt(k),
        is_causal=True,
        implementation=self.attention,
      )
      out_BxTxD = jnp.einsum("bthk,hkd->btd", z_BxTxHxK, w_o_HxKxD) + b_o_D[None, None, :]
      return out_BxTxD, None
    # Heads-major layout with (batch, head) flattened into one batch dimension, so that both
    # attention matmuls are plain batched GEMMs also under the ensemble vmap (on CPU, XLA ran
    # the token-major einsums, and dots with three batch dimensions, far below matmul peak).
    q_GxTxK, k_GxTxK, v_GxTxK = jnp.transpose(qkv_BxTx3xHxK, (2, 0, 3, 1, 4)).reshape(
      3, b * h, t, k
    )
    scores_GxTxT = jnp.einsum(
      "gqk,gsk->gqs", q_GxTxK, k_GxTxK, preferred_element_type=cfg.accum_dtype
    ) * (1.0 / math.sqrt(k))
    causal_TxT = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores_GxTxT = jnp.where(causal_TxT[None], scores_GxTxT, jnp.finfo(cfg.accum_dtype).min)
    probs_GxTxT = jax.nn.softmax(scores_GxTxT, axis=-1)
    z_GxTxK = jnp.einsum("gqs,gsk->gqk", probs_GxTxT.astype(dtype), v_GxTxK)
    z_BxTxHxK = jnp.transpose(z_GxTxK.reshape(b, h, t, k), (0, 2, 1, 3))
    probs_BxHxTxT = probs_GxTxT.reshape(b, h, t, t)
    out_BxTxD = jnp.einsum("bthk,hkd->btd", z_BxTxHxK, w_o_HxKxD) + b_o_D[None, None, :]
    if not return_internals:
      return out_BxTxD, None
    head_out_BxTxHxD = jnp.einsum("bthk,hkd->bthd", z_BxTxHxK, w_o_HxKxD)
    return out_BxTxD, {
      "attn": probs_BxHxTxT,
      "head_out": head_out_BxTxHxD.astype(cfg.accum_dtype),
      "z": z_BxTxHxK.astype(cfg.accum_dtype),
    }


class Block(nn.Module):
  """Pre-LayerNorm block: x + Attn(LN(x)), then x + MLP(LN(x)) unless d_mlp == 0."""

  cfg: ModelConfig
  attention: str = "explicit"

  @nn.compact
  def __call__(self, x_BxTxD, return_internals: bool):
    cfg = self.cfg
    dtype, pdtype = cfg.compute_dtype, cfg.storage_dtype
    ln = lambda name: nn.LayerNorm(
      epsilon=cfg.ln_eps, dtype=cfg.accum_dtype, param_dtype=pdtype, name=name
    )
    attn_out, internals = Attention(cfg, self.attention, name="attn")(
      ln("ln_1")(x_BxTxD).astype(dtype), return_internals
    )
    x_BxTxD = x_BxTxD + attn_out.astype(x_BxTxD.dtype)
    if cfg.d_mlp > 0:
      out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
      hid = nn.Dense(
        cfg.d_mlp,
        kernel_init=nn.initializers.normal(INIT_STD),
        dtype=dtype,
        param_dtype=pdtype,
        name="mlp_in",
      )(ln("ln_2")(x_BxTxD).astype(dtype))
      hid = jax.nn.gelu(hid, approximate=True)  # GPT-2's "gelu_new"
      mlp_out = nn.Dense(
        cfg.d_model,
        kernel_init=nn.initializers.normal(out_std),
        dtype=dtype,
        param_dtype=pdtype,
        name="mlp_out",
      )(hid)
      x_BxTxD = x_BxTxD + mlp_out.astype(x_BxTxD.dtype)
    return x_BxTxD, internals


class Transformer(nn.Module):
  """GPT-2-style decoder-only language model.

  Module attributes beside ``cfg`` choose how training computes, never what (same numbers up
  to float rounding): ``vocab_tile`` (vocabulary rows per tile of the training loss,
  ``losses.unembed_cross_entropy``; 0 = by shape) and ``remat`` (recompute each block's
  activations in the backward pass instead of keeping them: ``jax.checkpoint`` with
  ``nothing_saveable``, ~1/3 more compute for activation memory of one block); ``attention``
  (one of ``ATTENTIONS``) is the attention kernel of the paths that return no internals.

  ``__call__(tokens_BxT, return_internals=False, targets_BxT=None)``:
    tokens_BxT: int32 token ids in [0, vocab_size), T ≤ max_context.
    With ``targets_BxT`` (int32 next tokens) it returns only the mean next-token cross-entropy
    (float32 ``[]``, nats/token) from ``losses.unembed_cross_entropy``, never materialising the
    ``[B, T, V]`` logits in their usual layout (the training path).
    Returns float32 logits ``[B, T, vocab_size]``; with ``return_internals=True`` returns
    ``(logits, internals)`` where internals holds float32 arrays
      ``attn``      ``[n_layers, B, n_heads, T, T]`` attention probabilities (rows sum to 1,
                    zero above the diagonal),
      ``head_out``  ``[n_layers, B, T, n_heads, d_model]`` each head's output z_h W_O^h written
                    into the residual stream (without the shared output bias b_O),
      ``z``         ``[n_layers, B, T, n_heads, d_head]`` each head's attention-weighted values
                    (``head_out`` = z_h W_O^h; metrics compute it only where they need it),
      ``resid_final`` ``[B, T, d_model]`` residual stream before the final LayerNorm (for direct
                    logit attribution with the LayerNorm scale frozen).
  """

  cfg: ModelConfig
  vocab_tile: int = 0
  remat: bool = False
  attention: str = "explicit"

  @nn.compact
  def __call__(self, tokens_BxT, return_internals: bool = False, targets_BxT=None):
    cfg = self.cfg
    dtype, pdtype = cfg.compute_dtype, cfg.storage_dtype
    t = tokens_BxT.shape[1]
    embed = nn.Embed(
      cfg.vocab_size,
      cfg.d_model,
      embedding_init=nn.initializers.normal(INIT_STD),
      dtype=dtype,
      param_dtype=pdtype,
      name="embed",
    )
    x_BxTxD = embed(tokens_BxT).astype(cfg.accum_dtype)
    if cfg.pos_encoding == "learned":
      pos_CxD = self.param(
        "pos_embed", nn.initializers.normal(INIT_STD), (cfg.max_context, cfg.d_model), pdtype
      )
      x_BxTxD = x_BxTxD + pos_CxD[None, :t].astype(cfg.accum_dtype)
    per_layer = []
    block = Block
    if self.remat:  # self is argument 0: return_internals is 2
      block = nn.remat(Block, policy=jax.checkpoint_policies.nothing_saveable, static_argnums=(2,))
    for i in range(cfg.n_layers):
      x_BxTxD, internals = block(cfg, self.attention, name=f"block_{i}")(x_BxTxD, return_internals)
      per_layer.append(internals)
    resid_BxTxD = x_BxTxD
    x_BxTxD = nn.LayerNorm(
      epsilon=cfg.ln_eps, dtype=cfg.accum_dtype, param_dtype=pdtype, name="ln_f"
    )(x_BxTxD)
    if cfg.tie_embeddings:
      w_VxD = embed.embedding
    else:
      w_VxD = self.param(
        "unembed", nn.initializers.normal(INIT_STD), (cfg.vocab_size, cfg.d_model), pdtype
      )
    w_VxD = w_VxD.astype(dtype)
    if targets_BxT is not None:
      b, t, d = x_BxTxD.shape
      return unembed_cross_entropy(
        x_BxTxD.astype(dtype).reshape(b * t, d), w_VxD, targets_BxT.reshape(b * t), self.vocab_tile
      )
    logits_BxTxV = jnp.einsum("btd,vd->btv", x_BxTxD.astype(dtype), w_VxD)
    logits_BxTxV = logits_BxTxV.astype(cfg.accum_dtype)
    if not return_internals:
      return logits_BxTxV
    return logits_BxTxV, {
      "attn": jnp.stack([p["attn"] for p in per_layer]),
      "head_out": jnp.stack([p["head_out"] for p in per_layer]),
      "z": jnp.stack([p["z"] for p in per_layer]),
      "resid_final": resid_BxTxD,
    }


def unembedding_matrix(params, cfg: ModelConfig) -> jax.Array:
  """The ``[d_model, vocab_size]`` matrix that maps the final residual to logits."""
  if cfg.tie_embeddings:
    return params["embed"]["embedding"].T
  return params["unembed"].T
