"""Next-token cross-entropy fused with the unembedding, whole or over vocabulary tiles.

Two forms of one function, equal up to float rounding (float64: 1e-12, tests/test_losses.py):
  * whole vocabulary: the logits ``[V, BT]`` are the residual of the backward pass (fastest for
    small ``V · BT``: one large matmul each way);
  * vocabulary tiles of ``t`` rows: the forward pass runs an online log-sum-exp over the tiles
    and keeps only ``lse [BT]``; the backward pass recomputes each tile's logits (blockwise
    cross-entropy as in levanter's ``fused_cross_entropy_loss_and_logsumexp_penalty`` and
    maxtext's vocabulary tiling), so memory is ``t · BT`` floats instead of ``V · BT`` twice.
``auto_vocab_tile`` picks between them from the shape.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Largest float32 logit block (bytes) kept whole; above it the vocabulary is tiled so that one
# tile's logits stay under it. 256 MiB: every CPU workload of this repository (reference: V 4096
# × BT 2048 = 32 MiB) stays untiled, at its measured speed; the study's largest cell (V 50,257 ×
# BT 131,072 = 26 GB) is tiled.
WHOLE_LOGITS_BYTES = 256 << 20
# On a GPU the host launches the tile loop's kernels once per tile: the study's largest cell (BT
# 131,072 per model) took 99 tiles of 512 rows and 2,161 kernels per update at 256 MiB, 25 tiles
# and 681 kernels at 1 GiB, for 2.7 GiB more temporaries (XLA:GPU for an H100,
# benchmarks/gpu_kernels.py; docs/planning.md). TPUs run their loops on the chip: 256 MiB there.
GPU_LOGITS_BYTES = 1 << 30
TILE_MULTIPLE = 128  # TPU lane width; tiles are multiples of it


def logits_budget(platform: str) -> int:
  """``auto_vocab_tile``'s budget on devices of ``platform`` (``cpu``, ``gpu``, ``tpu``)."""
  return GPU_LOGITS_BYTES if platform == "gpu" else WHOLE_LOGITS_BYTES


def auto_vocab_tile(vocab_size: int, n_tokens: int, budget_bytes: int = WHOLE_LOGITS_BYTES) -> int:
  """Vocabulary rows per tile for ``n_tokens`` rows of targets: ``vocab_size`` (untiled) when
  the float32 logits ``[V, n_tokens]`` fit in ``budget_bytes``, else the largest multiple of 128
  rows whose logits fit (at least 128)."""
  if vocab_size * n_tokens * 4 <= budget_bytes:
    return vocab_size
  rows = budget_bytes // (4 * max(n_tokens, 1))
  return int(min(vocab_size, max(TILE_MULTIPLE, rows // TILE_MULTIPLE * TILE_MULTIPLE)))


def unembed_cross_entropy(
  x_BTxD: jax.Array, w_VxD: jax.Array, targets_BT: jax.Array, vocab_tile: int = 0
) -> jax.Array:
  """Mean cross-entropy (nats/token, float32 ``[]``) of logits ``x @ wᵀ`` against int targets.

  Equal to ``mean(logsumexp(l) - l[target])`` with ``l = x_BTxD @ w_VxD.T``.

  Args:
    x_BTxD: final residual after LayerNorm, compute dtype, ``[BT, D]``.
    w_VxD: unembedding, compute dtype, ``[V, D]``.
    targets_BT: int next-token ids in ``[0, V)``, ``[BT]``.
    vocab_tile: vocabulary rows per tile; 0 = ``auto_vocab_tile``; ``>= V`` = untiled. A tile
      need not divide V (the last one is padded and masked).
  """
  v = w_VxD.shape[0]
  tile = vocab_tile or auto_vocab_tile(v, x_BTxD.shape[0])
  if tile >= v:
    return _whole(x_BTxD, w_VxD, targets_BT)
  return _tiled(x_BTxD, w_VxD, targets_BT, int(tile))


def _accum(x: jax.Array) -> jnp.dtype:
  """float32 accumulation (float64 for a float64 model, see ``ModelConfig.dtype``)."""
  return jnp.promote_types(x.dtype, jnp.float32)


# -- whole vocabulary -------------------------------------------------------------------------
# The logits are kept transposed ([V, BT]) and the gradient is written by hand, so that every
# large matmul of the forward and backward pass (w @ xᵀ, pᵀ @ x, wᵀ @ pᵀ) takes its operands in
# row-major order. Autodiff of the plain formula made XLA physically transpose the [BT, V]
# logit gradient before the weight-gradient matmul: a third of the step time of the reference
# workload on CPU (benchmarks/throughput.py).


@jax.custom_vjp
def _whole(x_BTxD, w_VxD, targets_BT):
  loss, _ = _whole_fwd(x_BTxD, w_VxD, targets_BT)
  return loss


def _whole_fwd(x_BTxD, w_VxD, targets_BT):
  logits_VxBT = jnp.dot(w_VxD, x_BTxD.T, preferred_element_type=_accum(x_BTxD))
  lse_BT = jax.nn.logsumexp(logits_VxBT, axis=0)
  target_logit_BT = logits_VxBT[targets_BT, jnp.arange(targets_BT.shape[0])]
  loss = jnp.mean(lse_BT - target_logit_BT)
  return loss, (x_BTxD, w_VxD, targets_BT, logits_VxBT, lse_BT)


def _whole_bwd(res, g):
  x_BTxD, w_VxD, targets_BT, logits_VxBT, lse_BT = res
  dlogits_VxBT = _dlogits(logits_VxBT, lse_BT, targets_BT, jnp.arange(w_VxD.shape[0]), g, x_BTxD)
  dw_VxD = jnp.dot(dlogits_VxBT, x_BTxD, preferred_element_type=_accum(x_BTxD)).astype(w_VxD.dtype)
  dx_DxBT = jnp.dot(w_VxD.T, dlogits_VxBT, preferred_element_type=_accum(x_BTxD))
  return dx_DxBT.T.astype(x_BTxD.dtype), dw_VxD, None


def _dlogits(logits_VxBT, lse_BT, targets_BT, ids_V, g, x_BTxD):
  """d loss / d logits = (softmax − onehot) · g / BT, in the compute dtype."""
  onehot_VxBT = targets_BT[None, :] == ids_V.astype(targets_BT.dtype)[:, None]
  scale = g / targets_BT.shape[0]
  return ((jnp.exp(logits_VxBT - lse_BT[None, :]) - onehot_VxBT) * scale).astype(x_BTxD.dtype)


_whole.defvjp(_whole_fwd, _whole_bwd)


# -- vocabulary tiles -------------------------------------------------------------------------


def _tiles(w_VxD, tile: int):
  """``w`` zero-padded to whole tiles: ``[n_tiles, tile, D]``, and each tile's first id."""
  v, d = w_VxD.shape
  n_tiles = -(-v // tile)
  w_pad = jnp.pad(w_VxD, ((0, n_tiles * tile - v), (0, 0)))
  return w_pad.reshape(n_tiles, tile, d), jnp.arange(n_tiles) * tile


def _tile_logits(w_txD, x_DxBT, first, tile: int, v: int):
  """One tile's logits ``[tile, BT]`` (padded rows −inf) and its ids ``[tile]``."""
  ids_t = first + jnp.arange(tile)
  logits_txBT = jnp.dot(w_txD, x_DxBT, preferred_element_type=_accum(x_DxBT))
  return jnp.where((ids_t < v)[:, None], logits_txBT, -jnp.inf), ids_t


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tiled(x_BTxD, w_VxD, targets_BT, tile):
  loss, _ = _tiled_fwd(x_BTxD, w_VxD, targets_BT, tile)
  return loss


def _tiled_fwd(x_BTxD, w_VxD, targets_BT, tile):
  v, n = w_VxD.shape[0], x_BTxD.shape[0]
  acc = _accum(x_BTxD)
  w_tiles, firsts = _tiles(w_VxD, tile)
  x_DxBT = x_BTxD.T

  def one_tile(carry, tile_in):
    # Online log-sum-exp (Milakov & Gimelshein 2018): running max m and sum s of exp(l − m).
    m_BT, s_BT, target_BT = carry
    w_txD, first = tile_in
    logits_txBT, ids_t = _tile_logits(w_txD, x_DxBT, first, tile, v)
    m_new = jnp.maximum(m_BT, jnp.max(logits_txBT, axis=0))
    s_BT = s_BT * jnp.exp(m_BT - m_new) + jnp.sum(jnp.exp(logits_txBT - m_new[None]), axis=0)
    hit = ids_t[:, None] == targets_BT[None, :].astype(ids_t.dtype)
    target_BT = target_BT + jnp.sum(jnp.where(hit, logits_txBT, 0.0), axis=0)
    return (m_new, s_BT, target_BT), None

  init = (jnp.full((n,), -jnp.inf, acc), jnp.zeros((n,), acc), jnp.zeros((n,), acc))
  (m_BT, s_BT, target_BT), _ = jax.lax.scan(one_tile, init, (w_tiles, firsts))
  lse_BT = m_BT + jnp.log(s_BT)
  return jnp.mean(lse_BT - target_BT), (x_BTxD, w_VxD, targets_BT, lse_BT)


def _tiled_bwd(tile, res, g):
  x_BTxD, w_VxD, targets_BT, lse_BT = res
  v, d = w_VxD.shape
  acc = _accum(x_BTxD)
  w_tiles, firsts = _tiles(w_VxD, tile)
  x_DxBT = x_BTxD.T

  def one_tile(dx_DxBT, tile_in):
    w_txD, first = tile_in
    logits_txBT, ids_t = _tile_logits(w_txD, x_DxBT, first, tile, v)
    dlogits_txBT = _dlogits(logits_txBT, lse_BT, targets_BT, ids_t, g, x_BTxD)
    dw_txD = jnp.dot(dlogits_txBT, x_BTxD, preferred_element_type=acc).astype(w_VxD.dtype)
    dx_DxBT = dx_DxBT + jnp.dot(w_txD.T, dlogits_txBT, preferred_element_type=acc)
    return dx_DxBT, dw_txD

  zeros = jnp.zeros((d, x_BTxD.shape[0]), acc)
  dx_DxBT, dw_tiles = jax.lax.scan(one_tile, zeros, (w_tiles, firsts))
  dw_VxD = dw_tiles.reshape(-1, d)[:v]
  return dx_DxBT.T.astype(x_BTxD.dtype), dw_VxD, None


_tiled.defvjp(_tiled_fwd, _tiled_bwd)
