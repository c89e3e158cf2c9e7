"""Built-in synthetic sources that need no files: uniform random tokens, a fixed sparse Markov
chain, and repeated random blocks (the classic induction task). All are generated inside the
jitted step from per-model PRNG keys, with no per-model values and no shared arrays but the Markov
chain's table (the ``Source`` defaults)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ihsweep.data.source import Source


@dataclasses.dataclass(frozen=True)
class UniformSource(Source):
  """I.i.d. uniform tokens: nothing to learn beyond the unigram (loss floor ln V nats)."""

  vocab_size: int
  batch_size: int
  context_size: int

  def sample(self, key: jax.Array, data_params: dict, arrays: dict) -> jax.Array:
    """Returns int32 tokens ``[B, C + 1]`` for one model."""
    del data_params, arrays
    return jax.random.randint(
      key, (self.batch_size, self.context_size + 1), 0, self.vocab_size, dtype=jnp.int32
    )

  def entropy_rate(self) -> float:
    """Best achievable next-token loss in nats/token."""
    return float(np.log(self.vocab_size))

  def describe(self) -> str:
    return f"uniform V={self.vocab_size}, generated in-graph"


@dataclasses.dataclass(frozen=True)
class RepeatedBlocksSource(Source):
  """The classic induction task: a random block repeated, at a random offset.

  Per sequence of C + 1 tokens: a block length ℓ uniform in [block_min, block_max] and an offset
  s uniform in [0, C + 1 − 2ℓ]; positions before s are uniform random tokens, and from s on the
  sequence repeats one uniform random block of ℓ tokens until its end (at least two copies).
  Both ℓ and s vary, so position alone cannot predict the copy: the next-token loss falls below
  ln V only through in-context copying, i.e. induction (with a fixed offset a positional head
  can solve it instead and the prefix-matching score stays low).
  """

  vocab_size: int
  batch_size: int
  context_size: int
  block_min: int = 4
  block_max: int = 0  # 0: (C + 1) // 2, the longest that fits twice

  @property
  def longest_block(self) -> int:
    return self.block_max or (self.context_size + 1) // 2

  def sample(self, key: jax.Array, data_params: dict, arrays: dict) -> jax.Array:
    """Returns int32 tokens ``[B, C + 1]`` for one model."""
    del data_params, arrays
    n = self.context_size + 1
    lo, hi = self.block_min, self.longest_block

    def one(key):
      k_tok, k_len, k_start = jax.random.split(key, 3)
      tokens = jax.random.randint(k_tok, (n,), 0, self.vocab_size, jnp.int32)
      length = jax.random.randint(k_len, (), lo, hi + 1)
      start = jax.random.randint(k_start, (), 0, n - 2 * length + 1)
      p = jnp.arange(n)
      # From `start` on, position p copies the block's first copy at start + (p − start) mod ℓ.
      return tokens[jnp.where(p >= start, start + (p - start) % length, p)]

    return jax.vmap(one)(jax.random.split(key, self.batch_size))

  def describe(self) -> str:
    return (
      f"repeated blocks V={self.vocab_size}, block length {self.block_min}–"
      f"{self.longest_block}, generated in-graph"
    )


@dataclasses.dataclass(frozen=True)
class MarkovChainSource(Source):
  """A fixed first-order Markov chain in which every token has ``n_successors`` successors.

  The chain is built on the host from ``seed``: token a's successors are ``n_successors`` distinct
  ids drawn uniformly, with probabilities drawn from Dirichlet(1, …, 1). The first token of each
  sequence is uniform. A model can learn the bigram table, so the loss falls from ln V towards
  the chain's entropy rate (``entropy_rate()``).
  """

  vocab_size: int
  batch_size: int
  context_size: int
  n_successors: int = 4
  seed: int = 0

  def _table(self):
    return _chain_table(self.vocab_size, self.n_successors, self.seed)

  def arrays(self) -> dict:
    """The chain, passed to the step as arguments (not baked into the program as constants):
    successor ids int32 ``[V, k]`` and the thresholds between successors float32 ``[V, k−1]``
    (a uniform draw u picks successor #(u > threshold))."""
    succ_VxR, probs_VxR = self._table()
    return {
      "successors": succ_VxR,
      "thresholds": np.cumsum(probs_VxR, axis=1)[:, :-1].astype(np.float32),
    }

  def sample(self, key: jax.Array, data_params: dict, arrays: dict) -> jax.Array:
    """Returns int32 tokens ``[B, C + 1]`` for one model."""
    del data_params
    succ_VxR, cum_VxRm1 = jnp.asarray(arrays["successors"]), jnp.asarray(arrays["thresholds"])
    k_first, k_next = jax.random.split(key)
    first_B = jax.random.randint(k_first, (self.batch_size,), 0, self.vocab_size, jnp.int32)
    u_CxB = jax.random.uniform(k_next, (self.context_size, self.batch_size))

    def step(cur_B, u_B):
      idx_B = jnp.sum(u_B[:, None] > cum_VxRm1[cur_B], axis=1)
      nxt_B = jnp.take_along_axis(succ_VxR[cur_B], idx_B[:, None], axis=1)[:, 0]
      return nxt_B, nxt_B

    _, rest_CxB = jax.lax.scan(step, first_B, u_CxB)
    return jnp.concatenate([first_B[:, None], rest_CxB.T], axis=1)

  def entropy_rate(self) -> float:
    """Σ_a π(a) H(P(·|a)) in nats/token, π by power iteration (first-token term excluded)."""
    succ, probs = self._table()
    pi = np.full(self.vocab_size, 1.0 / self.vocab_size)
    for _ in range(1000):
      new = np.zeros_like(pi)
      np.add.at(new, succ, pi[:, None] * probs)
      if np.abs(new - pi).sum() < 1e-12:
        break
      pi = new
    row_entropy = -(probs * np.log(probs)).sum(axis=1)
    return float(pi @ row_entropy)

  def describe(self) -> str:
    return (
      f"markov chain V={self.vocab_size}, {self.n_successors} successors per token, "
      f"chain seed {self.seed}, generated in-graph"
    )


@functools.lru_cache(maxsize=8)
def _chain_table(vocab_size: int, n_successors: int, seed: int):
  """Successor ids ``[V, k]`` (int32) and their probabilities ``[V, k]`` (float64)."""
  rng = np.random.default_rng(seed)
  succ = np.stack(
    [rng.choice(vocab_size, size=n_successors, replace=False) for _ in range(vocab_size)]
  )
  probs = rng.dirichlet(np.ones(n_successors), size=vocab_size)
  return succ.astype(np.int32), probs
