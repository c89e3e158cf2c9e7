"""Next-token cross-entropy fused with the unembedding, laid out for fast CPU/GPU matmuls."""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def unembed_cross_entropy(x_NxD: jax.Array, w_VxD: jax.Array, targets_N: jax.Array) -> jax.Array:
  """Mean cross-entropy (nats/token, float32 ``[]``) of logits ``x @ wᵀ`` against int targets.

  Equal to ``mean(logsumexp(l) - l[target])`` with ``l = x_NxD @ w_VxD.T``, but the logits are
  kept transposed (``[V, N]``) and the gradient is written by hand, so that every large matmul
  of the forward and backward pass (``w @ xᵀ``, ``pᵀ @ x``, ``wᵀ @ pᵀ``) takes its operands in
  row-major order. Autodiff of the plain formula made XLA physically transpose the ``[N, V]``
  logit gradient before the weight-gradient matmul: a third of the step time of the reference
  workload on CPU (see benchmarks/throughput.py).
  """
  loss, _ = _xent_fwd(x_NxD, w_VxD, targets_N)
  return loss


def _accum(x: jax.Array) -> jnp.dtype:
  """float32 accumulation (float64 for a float64 model, see ``ModelConfig.dtype``)."""
  return jnp.promote_types(x.dtype, jnp.float32)


def _xent_fwd(x_NxD, w_VxD, targets_N):
  logits_VxN = jnp.dot(w_VxD, x_NxD.T, preferred_element_type=_accum(x_NxD))
  lse_N = jax.nn.logsumexp(logits_VxN, axis=0)
  target_logit_N = logits_VxN[targets_N, jnp.arange(targets_N.shape[0])]
  loss = jnp.mean(lse_N - target_logit_N)
  return loss, (x_NxD, w_VxD, targets_N, logits_VxN, lse_N)


def _xent_bwd(res, g):
  x_NxD, w_VxD, targets_N, logits_VxN, lse_N = res
  n = x_NxD.shape[0]
  onehot_VxN = targets_N[None, :] == jnp.arange(w_VxD.shape[0], dtype=targets_N.dtype)[:, None]
  dlogits_VxN = (jnp.exp(logits_VxN - lse_N[None, :]) - onehot_VxN) * (g / n)
  dlogits_VxN = dlogits_VxN.astype(x_NxD.dtype)
  dw_VxD = jnp.dot(dlogits_VxN, x_NxD, preferred_element_type=_accum(x_NxD)).astype(w_VxD.dtype)
  dx_DxN = jnp.dot(w_VxD.T, dlogits_VxN, preferred_element_type=_accum(x_NxD))
  return dx_DxN.T.astype(x_NxD.dtype), dw_VxD, None


unembed_cross_entropy.defvjp(_xent_fwd, _xent_bwd)
