"""ihsweep/compute/losses.py: the vocabulary-tiled cross-entropy equals the whole-vocabulary one
and a plain autodiff reference (float64, so the comparison does not depend on the CPU's
rounding)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.compute import losses

# float64 sums of a few hundred terms differ from another order by ~1e-15 relative; 1e-9
# leaves six decades for that while a wrong gradient (a dropped tile, a mis-masked padded row,
# a scale off by a tile's share) is off by ~1e-2 or more (test_a_wrong_tile_gradient_fails).
RTOL = 1e-9


def _reference(x_NxD, w_VxD, targets_N):
  logits_NxV = x_NxD @ w_VxD.T
  return jnp.mean(
    jax.nn.logsumexp(logits_NxV, -1) - logits_NxV[jnp.arange(len(targets_N)), targets_N]
  )


def _case(v, n=37, d=16, seed=0):
  kx, kw, kt = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(kx, (n, d), jnp.float64)
  w = 2.0 * jax.random.normal(kw, (v, d), jnp.float64)  # logits of O(10): lse needs its max
  targets = jax.random.randint(kt, (n,), 0, v)
  return x, w, targets


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


@pytest.mark.parametrize("v,tile", [(50, 7), (50, 16), (64, 64), (101, 100), (257, 128), (3, 1)])
def test_tiled_loss_and_gradients_equal_the_whole_vocabulary(x64, v, tile):
  x, w, targets = _case(v)
  ref_loss, ref_grads = jax.value_and_grad(_reference, argnums=(0, 1))(x, w, targets)
  for t in (v, tile):  # whole (t = V) and tiled; tiles that do not divide V are padded
    f = lambda x, w, t=t: losses.unembed_cross_entropy(x, w, targets, vocab_tile=t)
    loss, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(loss, ref_loss, rtol=RTOL)
    for got, want in zip(grads, ref_grads):
      np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-15)
    assert grads[1].shape == (v, x.shape[1])


def test_tiled_loss_under_vmap_and_scaled_cotangent(x64):
  """As the ensemble uses it: vmapped over models, and a cotangent other than 1."""
  cases = [_case(50, seed=s) for s in range(3)]
  x, w, targets = (jnp.stack(a) for a in zip(*cases))

  def total(fn, x, w):
    return 3.0 * jnp.sum(jax.vmap(fn)(x, w, targets))

  tiled = lambda x, w, t: losses.unembed_cross_entropy(x, w, t, vocab_tile=9)
  want = jax.grad(lambda x, w: total(_reference, x, w), argnums=(0, 1))(x, w)
  got = jax.jit(jax.grad(lambda x, w: total(tiled, x, w), argnums=(0, 1)))(x, w)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-15)


def test_a_wrong_tile_gradient_fails(x64, monkeypatch):
  """The tolerance catches a real error: the last tile's padded rows (V = 50 in tiles of 16:
  14 zero rows) left unmasked add 14 · exp(0) to each token's partition function."""
  x, w, targets = _case(50)
  want_loss, want = jax.value_and_grad(_reference, argnums=1)(x, w, targets)

  def unmasked(w_txD, x_DxBT, first, tile, v):
    return jnp.dot(w_txD, x_DxBT), first + jnp.arange(tile)

  monkeypatch.setattr(losses, "_tile_logits", unmasked)
  f = lambda w: losses.unembed_cross_entropy(x, w, targets, vocab_tile=16)
  loss, got = jax.value_and_grad(f)(w)
  assert abs(float(loss - want_loss)) / float(want_loss) > 1e3 * RTOL
  with pytest.raises(AssertionError):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-15)


def test_auto_vocab_tile():
  assert losses.auto_vocab_tile(4096, 2048) == 4096  # the reference workload: untiled (32 MiB)
  assert losses.auto_vocab_tile(50_257, 512) == 50_257  # exp1's smallest cell, 103 MB
  tile = losses.auto_vocab_tile(50_257, 128 * 1024)  # exp1's largest cell: 26 GB whole
  assert tile % 128 == 0 and tile * 128 * 1024 * 4 <= losses.WHOLE_LOGITS_BYTES
  assert losses.auto_vocab_tile(50_257, 10**9) == 128  # never below one lane-wide tile
