"""Next-token cross-entropy fused with the unembedding, laid out for fast CPU/GPU matmuls."""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def unembed_cross_entropy(x_BTxD: jax.Array, w_VxD: jax.Array, targets_BT: jax.Array) -> jax.Array:
  """Mean cross-entropy (nats/token, float32 ``[]``) of logits ``x @ wᵀ`` against int targets.

  Equal to ``mean(logsumexp(l) - l[target])`` with ``l = x_BTxD @ w_VxD.T``, but the logits are
  kept transposed (``[V, BT]``) and the gradient is written by hand, so that every large matmul
  of the forward and backward pass (``w @ xᵀ``, ``pᵀ @ x``, ``wᵀ @ pᵀ``) takes its operands in
  row-major order. Autodiff of the plain formula made XLA physically transpose the ``[BT, V]``
  logit gradient before the weight-gradient matmul: a third of the step time of the reference
  workload on CPU (see benchmarks/throughput.py).
  """
  loss, _ = _xent_fwd(x_BTxD, w_VxD, targets_BT)
  return loss


def _accum(x: jax.Array) -> jnp.dtype:
  """float32 accumulation (float64 for a float64 model, see ``ModelConfig.dtype``)."""
  return jnp.promote_types(x.dtype, jnp.float32)


def _xent_fwd(x_BTxD, w_VxD, targets_BT):
  logits_VxBT = jnp.dot(w_VxD, x_BTxD.T, preferred_element_type=_accum(x_BTxD))
  lse_BT = jax.nn.logsumexp(logits_VxBT, axis=0)
  target_logit_BT = logits_VxBT[targets_BT, jnp.arange(targets_BT.shape[0])]
  loss = jnp.mean(lse_BT - target_logit_BT)
  return loss, (x_BTxD, w_VxD, targets_BT, logits_VxBT, lse_BT)


def _xent_bwd(res, g):
  x_BTxD, w_VxD, targets_BT, logits_VxBT, lse_BT = res
  n = x_BTxD.shape[0]
  onehot_VxBT = targets_BT[None, :] == jnp.arange(w_VxD.shape[0], dtype=targets_BT.dtype)[:, None]
  dlogits_VxBT = (jnp.exp(logits_VxBT - lse_BT[None, :]) - onehot_VxBT) * (g / n)
  dlogits_VxBT = dlogits_VxBT.astype(x_BTxD.dtype)
  dw_VxD = jnp.dot(dlogits_VxBT, x_BTxD, preferred_element_type=_accum(x_BTxD)).astype(w_VxD.dtype)
  dx_DxBT = jnp.dot(w_VxD.T, dlogits_VxBT, preferred_element_type=_accum(x_BTxD))
  return dx_DxBT.T.astype(x_BTxD.dtype), dw_VxD, None


unembed_cross_entropy.defvjp(_xent_fwd, _xent_bwd)
