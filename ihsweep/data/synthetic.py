"""Synthetic Markov transition matrices with chosen properties, optimised with optax.

The study's Experiment 3 (docs/study.md, "The released code's choices"): logits M ∈ R^{V×V},
P = row-softmax(M), stationary distribution π by power iteration, Adam (lr 0.1, 5,000
iterations) on a weighted sum of

* marginal shape: KL(target_sorted ‖ π_sorted), both sorted in decreasing order, so only the
  shape counts, not which ids are frequent. Targets: uniform; Gaussian with mean V/2 and sd V/8
  (density at ids 0 … V − 1, normalised); Zipf ∝ 1/rank;
* local dependency: (H_rate − target)², H_rate = Σ_a π_a H(P[a]) the entropy rate (study: 6.2
  bits at V = 10,000). Lower H_rate at a fixed marginal = more mutual information
  I(X_t; X_{t+1}) = H(π) − H_rate;
* peakedness: the mean row maximum (keeps rows from collapsing onto one successor);
* categoriality: the mean cosine similarity of rows within each of K groups of V/K consecutive
  ids and across groups, each pushed to its target (study: K = 50 groups of 200; within 0.4
  for high, 0.1 for low categoriality; across 0.1). Computed in O(V²) from group sums of the
  unit rows (Σ_{i≠j} u_i·u_j = ‖Σ u_i‖² − Σ ‖u_i‖²), never the V×V×V pairwise table.

The i.i.d. control (no local dependency) has every row equal to the target marginal, so π is the
target and I(X_t; X_{t+1}) = 0.

π is carried between iterations (stop-gradient) and refined by a few differentiable power
iterations each step, so a step costs O(power_iterations · V²).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import socket

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ihsweep.data.markov import (
  MarkovError,
  check_transition_matrix,
  describe_matrix,
  stationary_distribution,
)

log = logging.getLogger("ihsweep")

MARGINALS = ("uniform", "gaussian", "zipf")
CATEGORIALITY = ("high", "low", "none")


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
  """What to optimise for (defaults: the study's, except V, which comes from model.vocab_size).

  entropy_rate_bits: target H_rate in bits/token; 0 = the i.i.d. control (rows = marginal).
  categoriality: 'high' (within-group target ``within_high``), 'low' (``within_low``) or
  'none' (the term is off). Tolerances decide when a target counts as reached.
  """

  vocab_size: int
  marginal: str = "zipf"
  categoriality: str = "high"
  n_groups: int = 50
  entropy_rate_bits: float = 6.2
  within_high: float = 0.4
  within_low: float = 0.1
  across: float = 0.1
  weight_marginal: float = 10.0
  weight_entropy: float = 1.0
  weight_row_max: float = 0.1
  weight_categoriality: float = 100.0
  lr: float = 0.1
  iterations: int = 5000
  power_iterations: int = 10
  seed: int = 0
  tol_marginal_kl: float = 0.02
  tol_entropy_bits: float = 0.1
  tol_similarity: float = 0.03

  @classmethod
  def from_config(cls, cfg, vocab_size: int) -> "SyntheticSpec":
    names = {f.name for f in dataclasses.fields(cls)} - {"vocab_size"}
    return cls(vocab_size=vocab_size, **{k: v for k, v in dict(cfg).items() if k in names})

  @property
  def iid(self) -> bool:
    return self.entropy_rate_bits == 0

  @property
  def within_target(self) -> float | None:
    return {"high": self.within_high, "low": self.within_low}.get(self.categoriality)


def target_marginal(shape: str, vocab_size: int) -> np.ndarray:
  """The target stationary distribution, sorted in decreasing order, float64 ``[V]``."""
  ranks = np.arange(vocab_size, dtype=np.float64)
  if shape == "uniform":
    p = np.ones(vocab_size)
  elif shape == "gaussian":
    p = np.exp(-0.5 * ((ranks - vocab_size / 2) / (vocab_size / 8)) ** 2)
  elif shape == "zipf":
    p = 1.0 / (ranks + 1)
  else:
    raise MarkovError(
      f"config.data.synthetic.marginal = {shape!r} is not allowed: one of "
      f"{', '.join(map(repr, MARGINALS))}",
      "data.synthetic.marginal",
    )
  p = np.sort(p / p.sum())[::-1]
  return p


def check_spec(spec: SyntheticSpec) -> None:
  """Refuses targets that no matrix can reach, before optimising.

  Raises:
    MarkovError: unknown marginal/categoriality; V not divisible into groups of >= 2 ids; an entropy
      rate above the marginal's entropy (mutual information would be negative) or below 0;
      similarity targets outside [0, 1].
  """
  for f in dataclasses.fields(spec):
    value = getattr(spec, f.name)
    if f.name.startswith(("weight_", "tol_")) or f.name == "lr":
      if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise MarkovError(
          f"config.data.synthetic.{f.name} = {value!r} is not allowed: a finite number >= 0",
          f"data.synthetic.{f.name}",
        )
  if spec.categoriality not in CATEGORIALITY:
    raise MarkovError(
      f"config.data.synthetic.categoriality = {spec.categoriality!r} is not "
      f"allowed: one of {', '.join(map(repr, CATEGORIALITY))}",
      "data.synthetic.categoriality",
    )
  target = target_marginal(spec.marginal, spec.vocab_size)
  h_max = float(-(target * np.log2(target)).sum())
  if not 0 <= spec.entropy_rate_bits <= h_max:
    raise MarkovError(
      f"config.data.synthetic.entropy_rate_bits = {spec.entropy_rate_bits} cannot be reached: "
      f"asked {spec.entropy_rate_bits} bits/token, but a chain whose marginal is "
      f"{spec.marginal} over V = {spec.vocab_size} has at most H(marginal) = {h_max:.3f} bits "
      f"(0 = the i.i.d. control)",
      "data.synthetic.entropy_rate_bits",
    )
  if spec.categoriality != "none":
    if spec.n_groups < 2 or spec.vocab_size % spec.n_groups:
      raise MarkovError(
        f"config.data.synthetic.n_groups = {spec.n_groups}: needs >= 2 groups "
        f"of equal size dividing model.vocab_size = {spec.vocab_size}",
        "data.synthetic.n_groups",
      )
    if spec.vocab_size // spec.n_groups < 2:
      raise MarkovError(
        f"config.data.synthetic.n_groups = {spec.n_groups}: groups of one id "
        f"have no pair of rows, so within-group similarity (categoriality) is "
        f"undefined; use at most model.vocab_size / 2 = {spec.vocab_size // 2} "
        f"groups (a divisor of {spec.vocab_size}), or categoriality 'none'",
        "data.synthetic.n_groups",
      )
    for name, value in (("within", spec.within_target), ("across", spec.across)):
      if not 0.0 <= value <= 1.0:
        raise MarkovError(
          f"config.data.synthetic {name}-group similarity target {value} cannot "
          f"be reached: cosine similarity of non-negative rows lies in [0, 1]",
          "data.synthetic.within_high",
        )


def group_similarity(p, n_groups: int):
  """Mean cosine similarity of distinct rows within each group of V/K consecutive ids, and
  across groups (pairs in different groups). Works on numpy or JAX arrays; O(V²)."""
  xp = jnp if isinstance(p, jax.Array) else np
  v = p.shape[0]
  n = v // n_groups
  unit = p / xp.linalg.norm(p, axis=1, keepdims=True)
  group_sums = unit.reshape(n_groups, n, v).sum(axis=1)  # [K, V]
  within_pairs_sum = (group_sums**2).sum() - v  # Σ_g ‖G_g‖² − Σ_i ‖u_i‖²
  total = unit.sum(axis=0)
  across_pairs_sum = (total**2).sum() - (group_sums**2).sum()
  within = within_pairs_sum / (n_groups * n * (n - 1))
  across = across_pairs_sum / (v * v - n_groups * n * n)
  return within, across


def _entropy_rate_nats(p, pi):
  return -jnp.sum(pi * jnp.sum(p * jnp.log(jnp.maximum(p, 1e-30)), axis=1))


def _loss_terms(logits, pi_prev, target_sorted, spec: SyntheticSpec):
  p = jax.nn.softmax(logits, axis=1)
  pi = jax.lax.stop_gradient(pi_prev)
  for _ in range(spec.power_iterations):
    pi = pi @ p
  pi = pi / pi.sum()
  pi_sorted = -jnp.sort(-pi)
  kl = jnp.sum(target_sorted * (jnp.log(target_sorted) - jnp.log(jnp.maximum(pi_sorted, 1e-30))))
  h_bits = _entropy_rate_nats(p, pi) / math.log(2)
  terms = {"marginal_kl": kl, "entropy_rate_bits": h_bits, "row_max": jnp.mean(jnp.max(p, axis=1))}
  if spec.categoriality != "none":
    terms["within"], terms["across"] = group_similarity(p, spec.n_groups)
  return terms, pi


def _total_loss(terms, spec: SyntheticSpec):
  loss = (
    spec.weight_marginal * terms["marginal_kl"]
    + spec.weight_entropy * (terms["entropy_rate_bits"] - spec.entropy_rate_bits) ** 2
    + spec.weight_row_max * terms["row_max"]
  )
  if spec.categoriality != "none":
    loss += spec.weight_categoriality * (
      (terms["within"] - spec.within_target) ** 2 + (terms["across"] - spec.across) ** 2
    )
  return loss


@functools.partial(jax.jit, static_argnums=(2, 3))
def _optimise(logits, target_sorted, spec: SyntheticSpec, n_iterations: int):
  opt = optax.adam(spec.lr)

  def step(carry, _):
    logits, opt_state, pi = carry

    def loss_fn(m):
      terms, pi_new = _loss_terms(m, pi, target_sorted, spec)
      return _total_loss(terms, spec), pi_new

    (loss, pi_new), grads = jax.value_and_grad(loss_fn, has_aux=True)(logits)
    updates, opt_state = opt.update(grads, opt_state)
    return (optax.apply_updates(logits, updates), opt_state, pi_new), loss

  pi0 = jnp.full((logits.shape[0],), 1.0 / logits.shape[0], logits.dtype)
  (logits, _, _), losses = jax.lax.scan(
    step, (logits, opt.init(logits), pi0), None, length=n_iterations
  )
  return logits, losses


def measure_matrix(p: np.ndarray, spec: SyntheticSpec) -> dict:
  """Achieved properties of ``p`` against the spec's targets (exact π by power iteration):
  marginal KL, entropy rate (bits), mutual information (nats), row max, within/across
  similarity."""
  pi = stationary_distribution(p)
  target = target_marginal(spec.marginal, spec.vocab_size)
  pi_sorted = np.sort(pi)[::-1]
  props = describe_matrix(p)
  out = {
    "marginal_kl": float(np.sum(target * (np.log(target) - np.log(np.maximum(pi_sorted, 1e-300))))),
    "entropy_rate_bits": props["entropy_rate_nats"] / math.log(2),
    "mutual_information_nats": props["mutual_information_nats"],
    "row_max": float(p.max(axis=1).mean()),
  }
  if spec.categoriality != "none" or (
    2 <= spec.n_groups <= spec.vocab_size // 2 and spec.vocab_size % spec.n_groups == 0
  ):
    within, across = group_similarity(p, spec.n_groups)
    out["within"], out["across"] = float(within), float(across)
  return out


def unmet_targets(achieved: dict, spec: SyntheticSpec) -> list[str]:
  """Targets missed by more than their tolerance, as 'name: achieved X, asked Y' strings."""
  missed = []  # comparisons written so that NaN counts as missed
  if not achieved["marginal_kl"] <= spec.tol_marginal_kl:
    missed.append(
      f"marginal {spec.marginal}: KL {achieved['marginal_kl']:.4f} nats, asked "
      f"<= {spec.tol_marginal_kl}"
    )
  if (
    not spec.iid
    and not abs(achieved["entropy_rate_bits"] - spec.entropy_rate_bits) <= spec.tol_entropy_bits
  ):
    missed.append(
      f"entropy rate: achieved {achieved['entropy_rate_bits']:.3f} bits, asked "
      f"{spec.entropy_rate_bits} ± {spec.tol_entropy_bits}"
    )
  if spec.within_target is not None:
    for name, want in (("within", spec.within_target), ("across", spec.across)):
      if not abs(achieved[name] - want) <= spec.tol_similarity:
        missed.append(
          f"{name}-group similarity: achieved {achieved[name]:.3f}, asked {want} ± "
          f"{spec.tol_similarity}"
        )
  return missed


def iid_matrix(spec: SyntheticSpec) -> np.ndarray:
  """The no-local-dependency control: every row equals the target marginal (ids in decreasing
  order of probability)."""
  target = target_marginal(spec.marginal, spec.vocab_size)
  return np.tile(target, (spec.vocab_size, 1))


def optimise_matrix(spec: SyntheticSpec) -> tuple[np.ndarray, dict]:
  """Optimises (or builds, for the i.i.d. control) a transition matrix for ``spec``.

  Returns (P float64 ``[V, V]``, report: achieved properties, targets, final loss, seconds).

  Raises:
    MarkovError: an unreachable target, before optimising (``check_spec``) or after it
      (achieved vs asked, for every target missed by more than its tolerance).
  """
  import time

  check_spec(spec)
  t0 = time.perf_counter()
  if spec.iid:
    p = iid_matrix(spec)
    final_loss = 0.0
  else:
    key = jax.random.PRNGKey(spec.seed)
    logits = jax.random.normal(key, (spec.vocab_size, spec.vocab_size), jnp.float32)
    target = jnp.asarray(target_marginal(spec.marginal, spec.vocab_size), jnp.float32)
    logits, losses = _optimise(logits, target, spec, spec.iterations)
    p = np.asarray(jax.nn.softmax(logits.astype(jnp.float32), axis=1), np.float64)
    if not np.all(np.isfinite(p)):
      raise MarkovError(
        f"the synthetic matrix optimisation diverged (NaN after "
        f"{spec.iterations} iterations at lr {spec.lr}); lower "
        f"data.synthetic.lr or the weights",
        "data.synthetic.lr",
      )
    p /= p.sum(axis=1, keepdims=True)
    final_loss = float(losses[-1])
  achieved = measure_matrix(p, spec)
  report = {
    "achieved": achieved,
    "final_loss": final_loss,
    "seconds": round(time.perf_counter() - t0, 2),
    "targets": {
      "marginal": spec.marginal,
      "entropy_rate_bits": spec.entropy_rate_bits,
      "within": spec.within_target,
      "across": spec.across if spec.within_target is not None else None,
    },
  }
  missed = unmet_targets(achieved, spec)
  if missed:
    raise MarkovError(
      "the synthetic matrix optimisation did not reach its targets after "
      f"{spec.iterations} iterations: "
      + "; ".join(missed)
      + " (change the targets, or raise data.synthetic.iterations)",
      "data.synthetic",
    )
  return p, report


def cached_matrix(spec: SyntheticSpec, cache_dir: str) -> tuple[np.ndarray, dict]:
  """``optimise_matrix`` with the result stored under ``cache_dir/markov/`` keyed by the spec,
  so every cell and rerun with the same spec reuses it."""
  key = hashlib.sha256(json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
  path = os.path.join(
    cache_dir,
    "markov",
    f"synthetic-{spec.marginal}-{spec.categoriality}-V{spec.vocab_size}-{key.hexdigest()[:16]}",
  )
  if os.path.isfile(path + ".json"):
    try:
      with open(path + ".json") as f:
        report = json.load(f)
      p = check_transition_matrix(np.load(path + ".npy"), f"cached matrix {path}.npy")
      if p.shape[0] != spec.vocab_size or "achieved" not in report:
        raise ValueError("shape or report does not match the spec")
      return p, {**report, "cache": "hit"}
    except (OSError, ValueError, EOFError) as e:  # MarkovError is a ValueError
      log.warning("synthetic matrix cache %s is damaged (%s); building it again", path, e)
  if not spec.iid:
    log.info(
      "optimising a synthetic %s/%s matrix, V=%d, %d iterations",
      spec.marginal,
      spec.categoriality,
      spec.vocab_size,
      spec.iterations,
    )
  p, report = optimise_matrix(spec)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{socket.gethostname()}-{os.getpid()}.tmp"  # one per writer: no rename race
  np.save(tmp + ".npy", p.astype(np.float32))
  os.replace(tmp + ".npy", path + ".npy")
  with open(tmp + ".json", "w") as f:
    json.dump(report, f, indent=2)
  os.replace(tmp + ".json", path + ".json")  # written last: marks the entry complete
  return p, {**report, "cache": "built"}
