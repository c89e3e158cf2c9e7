"""Markov data with induction patterns injected at set rates, generated on device.

``MarkovSource`` draws sequences from a transition matrix P (``[V, V]``, rows sum to 1) — the bigram
statistics of a natural corpus (the study's semi-natural data, docs/study.md, Experiment 2), an
optimised synthetic matrix (``synthetic.py``, Experiment 3), an i.i.d. control, or a user's ``.npy``
— with two per-model knobs, ``frequency`` and ``reliability``, so a grid over them is one vmapped
ensemble.

The procedure (ihsweep's own; the study's exact one is not published, docs/study.md). A sequence
x_0 … x_C has n = C + 1 tokens (the trainer's inputs and targets); positions 1 ≤ i < m = ⌊n/2⌋
are the first half, m ≤ i ≤ C the second. Every draw "from P[a] restricted to a set S" samples
t ∈ S with probability P[a, t] / Σ_{s∈S} P[a, s] (uniform over S if that mass is 0).

* x_0 ~ ``first`` (the corpus's unigram distribution, or P's stationary distribution).
* First half, a = x_{i−1}: x_i from P[a] restricted to the tokens not in {x_0 … x_{i−2}}, and
  at i = 1 also ≠ x_0. So in the first half no token recurs after a gap (an immediate repeat
  "a a" can occur, after which a is excluded like any other earlier token).
* Second half, a = x_{i−1}. S(a) = {x_{k} : k ≤ i − 1, x_{k−1} = a} \\ {a}, the tokens that
  followed earlier occurrences of a. Two coins: copy ~ Bernoulli(reliability), recur ~
  Bernoulli(frequency / (1 + reliability)).
    - S(a) ≠ ∅ and copy: x_i from P[a] restricted to S(a)  — an induction step "A B … A → B";
    - else if recur and R ≠ ∅, R = {x_0 … x_{i−1}} \\ ({a} ∪ S(a)): x_i from P[a] restricted
      to R — an earlier token recurs, making a new "A";
    - else: x_i from P[a] restricted to the tokens not yet in the sequence.
  x_i ≠ a always holds in the second half.

Where the second half begins (``data.induction_start``): 'half' puts m at ⌊n/2⌋ in every
sequence, so a recurrence or copy never sits before ⌊n/2⌋ and a model can learn to copy only
there (the demo's heads trained this way fire only when the later occurrence is past C/2,
docs/results.md). 'anywhere' draws m per sequence uniformly from {1, …, n − 1}
(``induction_start_of``) and applies the rules above with that m: the later occurrence of a pattern
can sit at any position from 2 on and the earlier one anywhere before it (a copy's source is
spread over the first part, which ends anywhere), while the share of positions in the second
part stays ~1/2 on average, as with 'half'.

What the knobs mean on generated data (``measure``): over second-half positions whose previous
token has S(a) ≠ ∅, P(x_i ∈ S(a)) = reliability exactly, since the recur and new branches
exclude S(a). The share of second-half tokens that recur (appeared earlier) is, position by
position, s_i·r + (1 − s_i·r)·q·ρ_i with s_i = [S(x_{i−1}) ≠ ∅], ρ_i = [R ≠ ∅], r the
reliability and q = frequency / (1 + reliability): ``measure`` returns this ``implied_frequency``
beside ``measured_frequency``. When s_i tracks whether x_{i−1} itself recurred and ρ_i = 1, the
stationary share p solves p = p·r + (1 − p·r)·q, i.e. p = f / (1 − r² + r·f) with f the
frequency: p = f at r = 0, and the division by 1 + r keeps p near f for mid-range r (p = f
at f = 0.5, r = 0.5).

Cost: one ``lax.scan`` over the C + 1 positions, vectorised over every sequence of the call
(the trainer generates all U updates' batches of a host call at once); per position O(C) work per
sequence
plus, for the "new token" draw, a bisection over V on the precomputed row CDFs (O(C log V)),
so nothing per position is O(V).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ihsweep.data.corpus import bigram_counts, unigram_counts
from ihsweep.data.errors import DataError
from ihsweep.data.source import Source

KNOBS = ("frequency", "reliability")
INDUCTION_STARTS = ("half", "anywhere")  # data.induction_start


class MarkovError(DataError):
  """A transition matrix, knob or synthetic target that cannot be used."""


def check_transition_matrix(p, name: str = "transition matrix", atol: float = 1e-4) -> np.ndarray:
  """Returns ``p`` as float64 ``[V, V]`` after checking it is a square, finite, non-negative
  matrix whose rows sum to 1 (within ``atol``); rows are renormalised exactly.

  Raises:
    MarkovError: wrong shape, NaN/inf, a negative entry or a row sum off by more than atol
      (the message names the first bad row and its value).
  """
  if not isinstance(p, np.ndarray) or p.dtype.kind not in "biuf":
    kind = type(p).__name__ if not isinstance(p, np.ndarray) else f"{p.dtype} array"
    raise MarkovError(f"{name}: a {kind}; a real-valued [V, V] array is needed")
  p = np.asarray(p, np.float64)
  if p.ndim != 2 or p.shape[0] != p.shape[1] or p.shape[0] < 2:
    raise MarkovError(f"{name}: shape {p.shape}; a square [V, V] matrix with V >= 2 is needed")
  if not np.all(np.isfinite(p)):
    raise MarkovError(f"{name}: has NaN or infinite entries")
  if (p < 0).any():
    a, b = np.argwhere(p < 0)[0]
    raise MarkovError(
      f"{name}: entry [{a}, {b}] = {p[a, b]:.3g} is negative; transition probabilities must be >= 0"
    )
  sums = p.sum(axis=1)
  bad = np.flatnonzero(np.abs(sums - 1) > atol)
  if bad.size:
    raise MarkovError(
      f"{name}: row {bad[0]} sums to {sums[bad[0]]:.6g} ({bad.size} rows off); "
      f"every row must sum to 1 (±{atol})"
    )
  return p / sums[:, None]


def check_knob(name: str, value, field: str) -> float:
  """A frequency or reliability value: a finite number in [0, 1]."""
  ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
  if not ok or not math.isfinite(value) or not 0.0 <= value <= 1.0:
    raise MarkovError(
      f"config.{field} = {value!r} is not allowed: {name} is a probability in [0, 1]", field
    )
  return float(value)


def stationary_distribution(
  p: np.ndarray, iterations: int = 10000, tol: float = 1e-12
) -> np.ndarray:
  """π with π P = π (float64 ``[V]``), by power iteration from uniform on the lazy chain
  (I + P) / 2, which has the same stationary distributions as P and is aperiodic, so periodic
  chains converge too. For a reducible chain the result depends on the uniform start."""
  pi = np.full(p.shape[0], 1.0 / p.shape[0])
  for _ in range(iterations):
    new = 0.5 * (pi + pi @ p)
    if np.abs(new - pi).sum() < tol:
      return new / new.sum()
    pi = new
  return pi / pi.sum()


def transition_arrays(p: np.ndarray, first: np.ndarray) -> dict:
  """Device arrays for ``sample``: ``probs`` float32 ``[V, V]``, ``cdf`` float32 ``[V, V]``
  (row cumulative sums, last column exactly 1), ``first_cdf`` float32 ``[V]``."""
  cdf = np.cumsum(p, axis=1)
  cdf /= cdf[:, -1:]
  first_cdf = np.cumsum(first / first.sum())
  first_cdf /= first_cdf[-1]
  return {
    "probs": p.astype(np.float32),
    "cdf": cdf.astype(np.float32),
    "first_cdf": first_cdf.astype(np.float32),
  }


def _draw_positions(u, weights_Cp1, cand_Cp1):
  """Index of a candidate position drawn ∝ weight (uniform over candidates if all weights are 0).
  Returns (index int32, any candidate bool)."""
  w = jnp.where(cand_Cp1, weights_Cp1, 0.0)
  w = jnp.where(w.sum() > 0, w, cand_Cp1.astype(w.dtype))
  cum = jnp.cumsum(w)
  idx = jnp.sum(cum <= u * cum[-1]).astype(jnp.int32)
  last = jnp.max(jnp.where(cand_Cp1, jnp.arange(w.shape[0], dtype=jnp.int32), 0))
  return jnp.minimum(idx, last), cand_Cp1.any()


def _draw_excluding(u, cdf_row, probs_row, tokens_Cp1, excluded_Cp1, vocab: int):
  """t ~ P[a] restricted to the tokens not in {tokens_Cp1[j] : excluded_Cp1[j]} (distinct tokens),
  by bisection on F(t) = CDF[a, t] − Σ_j excluded_j · P[a, tok_j] · [tok_j ≤ t]: O(C log V).
  Uniform over the allowed tokens if their mass is below 1e-4 (the procedure's weights are then
  beyond float32's resolution). Float rounding can land on an excluded token (probability
  ~1e-7); such draws are redone, finally with the uniform draw."""
  w_prob_Cp1 = jnp.where(excluded_Cp1, probs_row[tokens_Cp1], 0.0)
  # Below ~1e-4 of allowed mass, float32 CDF differences are too coarse to keep the excluded
  # tokens out reliably: draw uniformly over the allowed tokens instead (CDF (t + 1) / V).
  tiny_mass = 1.0 - w_prob_Cp1.sum() <= 1e-4

  def mass_through(t, uniform):
    w_Cp1 = jnp.where(uniform, excluded_Cp1 / vocab, w_prob_Cp1)
    cdf_t = jnp.where(uniform, (t + 1) / vocab, cdf_row[t])
    return cdf_t - jnp.sum(jnp.where(tokens_Cp1 <= t, w_Cp1, 0.0))

  steps = max(1, math.ceil(math.log2(vocab)) + 1)

  def search(u, uniform):
    target = u * mass_through(vocab - 1, uniform)

    def bisect(_, lo_hi):
      lo, hi = lo_hi  # the answer lies in [lo, hi]
      mid = (lo + hi) // 2
      go_left = mass_through(mid, uniform) > target
      return jnp.where(go_left, lo, mid + 1), jnp.where(go_left, mid, hi)

    lo, _ = jax.lax.fori_loop(0, steps, bisect, (jnp.int32(0), jnp.int32(vocab - 1)))
    return jnp.minimum(lo, vocab - 1)

  def excluded(t):
    return jnp.any(excluded_Cp1 & (tokens_Cp1 == t))

  def redo(c):  # rare: another uniform; after 4 misses, the uniform draw (exact steps 1/V)
    n, _ = c
    return n + 1, search(jnp.mod(u + 0.6180339887 * n, 1.0), tiny_mass | (n >= 4))

  _, t = jax.lax.while_loop(lambda c: excluded(c[1]) & (c[0] < 12), redo, (1, search(u, tiny_mass)))
  return t


def generate_sequence(
  key: jax.Array, frequency, reliability, arrays: dict, length: int, induction_start: str = "half"
) -> jax.Array:
  """One sequence of ``length`` = C + 1 int32 tokens by the procedure in the module docstring.

  ``frequency``, ``reliability``: float32 scalars in [0, 1] (traced; per model).
  ``arrays``: ``transition_arrays(...)``. ``induction_start``: 'half' (the second part's rules
  from m = ⌊n/2⌋) or 'anywhere' (m drawn per sequence, ``induction_start_of``). Jit/vmap-safe.
  """
  probs, cdf, first_cdf = arrays["probs"], arrays["cdf"], arrays["first_cdf"]
  vocab = probs.shape[0]
  if induction_start == "anywhere":
    key, half = induction_start_of(key, length)
  else:
    half = length // 2
  q = frequency / (1.0 + reliability)
  k0, k1 = jax.random.split(key)
  x0 = jnp.minimum(
    jnp.searchsorted(first_cdf, jax.random.uniform(k0), side="right"), vocab - 1
  ).astype(jnp.int32)
  u_Cp1x5 = jax.random.uniform(k1, (length, 5))
  pos_Cp1 = jnp.arange(length, dtype=jnp.int32)
  x_Cp1 = jnp.zeros((length,), jnp.int32).at[0].set(x0)
  first_Cp1 = jnp.zeros((length,), bool).at[0].set(True)  # x_j is the token's first occurrence
  # stamp_V[t] = i·(n + 1) + (n − k) at step i for t ∈ S(a), k its first position in S(a)'s
  # list: membership and de-duplication in O(C) without clearing a V-sized array per step.
  stamp_V = jnp.zeros((vocab,), jnp.int32)
  span = length + 1

  def step(carry, i):
    x_Cp1, first_Cp1, stamp_V = carry
    u = u_Cp1x5[i]
    a = x_Cp1[i - 1]
    cdf_row, probs_row = cdf[a], probs[a]
    before = pos_Cp1 < i  # positions 0 … i−1 are filled
    distinct = first_Cp1 & before
    # S(a): positions k ≤ i − 1 that follow an occurrence of a and are not a themselves.
    succ_Cp1 = before & (pos_Cp1 >= 1) & (jnp.roll(x_Cp1, 1) == a) & (x_Cp1 != a)
    code_Cp1 = i * span + (length - pos_Cp1)
    stamp_V = stamp_V.at[jnp.where(succ_Cp1, x_Cp1, vocab)].max(code_Cp1, mode="drop")
    stamp_at_Cp1 = stamp_V[x_Cp1]
    in_s_Cp1 = stamp_at_Cp1 // span == i
    succ_unique_Cp1 = succ_Cp1 & (stamp_at_Cp1 == code_Cp1)
    weights_Cp1 = probs_row[x_Cp1]
    k_copy, has_s = _draw_positions(u[2], weights_Cp1, succ_unique_Cp1)
    k_recur, has_r = _draw_positions(u[3], weights_Cp1, distinct & (x_Cp1 != a) & ~in_s_Cp1)
    # First half: exclude tokens at positions ≤ i − 2 (and x_0 at i = 1); second: all seen.
    excl_first = distinct & ((pos_Cp1 <= i - 2) | (pos_Cp1 == 0))
    t_new = _draw_excluding(
      u[4], cdf_row, probs_row, x_Cp1, jnp.where(i < half, excl_first, distinct), vocab
    )
    copy = has_s & (u[0] < reliability)
    recur = ~copy & has_r & (u[1] < q)
    t_second = jnp.where(copy, x_Cp1[k_copy], jnp.where(recur, x_Cp1[k_recur], t_new))
    t = jnp.where(i < half, t_new, t_second)
    is_first = ~jnp.any(before & (x_Cp1 == t))
    return (x_Cp1.at[i].set(t), first_Cp1.at[i].set(is_first), stamp_V), None

  (x_Cp1, _, _), _ = jax.lax.scan(
    step, (x_Cp1, first_Cp1, stamp_V), jnp.arange(1, length, dtype=jnp.int32)
  )
  return x_Cp1


def induction_start_of(key: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
  """A sequence's key → (the key its tokens are drawn with, its boundary m with
  ``data.induction_start = 'anywhere'``: int32, uniform on {1, …, length − 1}, so a copy and its
  source can sit anywhere). ``generate_sequence`` and ``MarkovSource.boundaries`` both draw m
  here."""
  key, k_start = jax.random.split(key)
  return key, jax.random.randint(k_start, (), 1, length, dtype=jnp.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class MarkovSource(Source):
  """Sequences from a transition matrix with injected induction patterns (module docstring).

  ``transitions``: float64 ``[V, V]`` rows summing to 1; ``first``: the first token's
  distribution ``[V]``; ``frequencies`` / ``reliabilities``: one value per model (length E).
  ``info``: how the matrix was made and its measured properties (for the run log).
  ``induction_start``: 'half' or 'anywhere' (``INDUCTION_STARTS``, ``generate_sequence``).
  """

  transitions: np.ndarray
  first: np.ndarray
  batch_size: int
  context_size: int
  frequencies: tuple[float, ...]
  reliabilities: tuple[float, ...]
  info: dict = dataclasses.field(default_factory=dict)
  induction_start: str = "half"

  @property
  def vocab_size(self) -> int:
    return int(self.transitions.shape[0])

  def data_params(self, n_models: int) -> dict:
    """Per-model knobs, float32 ``[E]`` each."""
    f, r = list(self.frequencies), list(self.reliabilities)
    if len(f) == 1:
      f = f * n_models
    if len(r) == 1:
      r = r * n_models
    if len(f) != n_models or len(r) != n_models:
      raise MarkovError(
        f"{len(f)} frequencies and {len(r)} reliabilities for {n_models} "
        f"models: give one value or one per model",
        "data.frequencies",
      )
    return {"frequency": jnp.asarray(f, jnp.float32), "reliability": jnp.asarray(r, jnp.float32)}

  def arrays(self) -> dict:
    return transition_arrays(self.transitions, self.first)

  def sample(self, key: jax.Array, data_params: dict, arrays: dict) -> jax.Array:
    """int32 tokens ``[B, C + 1]`` for one model with knobs ``data_params`` (scalars)."""
    keys = jax.random.split(key, self.batch_size)
    arrays = jax.tree_util.tree_map(jnp.asarray, arrays)
    one = functools.partial(
      generate_sequence, length=self.context_size + 1, induction_start=self.induction_start
    )
    return jax.vmap(one, in_axes=(0, None, None, None))(
      keys, data_params["frequency"], data_params["reliability"], arrays
    )

  def boundaries(self, key: jax.Array) -> np.ndarray:
    """int32 ``[B]``: where the second part begins (m) in each sequence ``sample(key, …)``
    draws — ⌊(C + 1)/2⌋ with 'half', ``induction_start_of``'s draw with 'anywhere'."""
    length = self.context_size + 1
    if self.induction_start != "anywhere":
      return np.full(self.batch_size, length // 2, np.int32)
    keys = jax.random.split(key, self.batch_size)
    first = jax.vmap(lambda k: induction_start_of(k, length)[1])
    return np.asarray(first(keys), np.int32)

  def describe(self) -> str:
    items = ", ".join(f"{k} {v}" for k, v in self.info.items())
    return (
      f"markov V={self.vocab_size}, frequency {list(self.frequencies)}, reliability "
      f"{list(self.reliabilities)}, induction patterns from {self.induction_start!r}; {items}; "
      f"generated in-graph"
    )


def measure(
  tokens: np.ndarray,
  frequency: float | None = None,
  reliability: float | None = None,
  starts: np.ndarray | None = None,
) -> dict:
  """Induction statistics of generated sequences ``[S, C + 1]`` (numpy, any int dtype).

  Over second-half positions m ≤ i ≤ C (m = ⌊(C + 1)/2⌋, or ``starts[s]`` for sequence s: int
  ``[S]``, the boundaries 'anywhere' drew), with a = x_{i−1} and S(a) as in the module
  docstring:
    measured_frequency: share of x_i that appeared earlier in the sequence;
    measured_reliability: share of x_i ∈ S(a) among positions with S(a) ≠ ∅;
    first_half_gap_repeats: count of first-half x_i (1 ≤ i < m) equal to some x_j, j ≤ i − 2
      (0 by construction);
  and, if both knobs are given, implied_frequency: the mean over the same positions of
  s_i·r + (1 − s_i·r)·q·ρ_i (module docstring), the expectation of measured_frequency.
  """
  tokens = np.asarray(tokens)
  n, length = tokens.shape
  half = length // 2
  recurs = s_count = copied = implied = total = gap_repeats = 0
  q = None if frequency is None else frequency / (1.0 + reliability)
  if starts is None:
    starts = np.full(n, half)
  elif np.shape(starts) != (n,):
    raise ValueError(f"starts: one boundary per sequence, shape ({n},); got {np.shape(starts)}")
  for row, half in zip(tokens.tolist(), np.asarray(starts).tolist()):
    for i in range(1, half):
      gap_repeats += row[i] in row[: max(i - 1, 0)]
    for i in range(half, length):
      a, earlier = row[i - 1], row[:i]
      succ = {row[k] for k in range(1, i) if row[k - 1] == a} - {a}
      recur_set = set(earlier) - {a} - succ
      total += 1
      recurs += row[i] in earlier
      if succ:
        s_count += 1
        copied += row[i] in succ
      if q is not None:
        s = 1.0 if succ else 0.0
        implied += s * reliability + (1 - s * reliability) * q * (1.0 if recur_set else 0.0)
  out = {
    "measured_frequency": recurs / total,
    "measured_reliability": copied / s_count if s_count else float("nan"),
    "positions": total,
    "positions_with_successors": s_count,
    "first_half_gap_repeats": gap_repeats,
  }
  if q is not None:
    out["implied_frequency"] = implied / total
  return out


def bigram_transitions(
  corpus, vocab_size: int, smoothing: float = 1e-6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The study's semi-natural transitions (docs/study.md, the released code: bigram
  probabilities of 100M CC100 tokens over a 10k vocabulary, smoothed by 1e-6).

  The ``vocab_size`` most frequent types of the tokenized corpus's training split
  (``<|endoftext|>`` excluded) become ids 0 … V − 1 in order of frequency; P[a, b] = count(a b) /
  count(a ·) over adjacent pairs of kept types, plus ``smoothing``, rows renormalised (a type
  never followed by a kept type gets a uniform row). Returns (P float64 ``[V, V]``, the kept
  types' unigram distribution ``[V]`` (first-token distribution), the kept types' tokenizer ids
  int64 ``[V]``).

  Raises:
    MarkovError: the corpus has fewer than ``vocab_size`` types that occur.
  """
  tok_vocab = int(corpus.tokenizer.get_vocab_size())
  unigram = unigram_counts(corpus.train, max(tok_vocab, corpus.vocab_size))
  unigram[corpus.eot_id] = 0
  order = np.argsort(-unigram, kind="stable")
  occurring = int((unigram > 0).sum())
  if occurring < vocab_size:
    raise MarkovError(
      f"config.model.vocab_size = {vocab_size}: the corpus has only "
      f"{occurring} token types that occur (tokenizer vocabulary {tok_vocab}); "
      f"use a smaller model.vocab_size or a larger data.tokenizer_vocab",
      "model.vocab_size",
    )
  kept = order[:vocab_size]
  new_id = np.full(unigram.shape[0], -1, np.int64)
  new_id[kept] = np.arange(vocab_size)
  counts = bigram_counts(corpus.train, unigram.shape[0]).tocoo()
  a, b = new_id[counts.row], new_id[counts.col]
  keep = (a >= 0) & (b >= 0)
  dense = np.zeros((vocab_size, vocab_size), np.float64)
  np.add.at(dense, (a[keep], b[keep]), counts.data[keep])
  rows = dense.sum(axis=1, keepdims=True)
  p = np.where(rows > 0, dense / np.maximum(rows, 1), 1.0 / vocab_size) + smoothing
  p /= p.sum(axis=1, keepdims=True)
  first = unigram[kept].astype(np.float64)
  return p, first / first.sum(), kept.astype(np.int64)


def mutual_information(p: np.ndarray, pi: np.ndarray | None = None) -> float:
  """I(X_t; X_{t+1}) in nats for a stationary chain: H(π) − Σ_a π_a H(P[a]) (0 = i.i.d.)."""
  pi = stationary_distribution(p) if pi is None else pi
  return float(_entropy(pi) - entropy_rate(p, pi))


def entropy_rate(p: np.ndarray, pi: np.ndarray | None = None) -> float:
  """Σ_a π_a H(P[a]) in nats/token (Cover & Thomas, Thm 4.2.4)."""
  pi = stationary_distribution(p) if pi is None else pi
  with np.errstate(divide="ignore", invalid="ignore"):
    row_h = -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
  return float(pi @ row_h)


def _entropy(q: np.ndarray) -> float:
  q = q[q > 0]
  return float(-(q * np.log(q)).sum())


def describe_matrix(p: np.ndarray) -> dict[str, Any]:
  """Measured properties of a transition matrix in nats: entropy of the stationary
  distribution, entropy rate and mutual information I(X_t; X_{t+1})."""
  pi = stationary_distribution(p)
  h_rate = entropy_rate(p, pi)
  return {
    "marginal_entropy_nats": _entropy(pi),
    "entropy_rate_nats": h_rate,
    "mutual_information_nats": _entropy(pi) - h_rate,
  }
