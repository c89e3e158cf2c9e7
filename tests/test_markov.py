"""Markov data with injected induction patterns (markov.py) and synthetic matrices
(synthetic.py)."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.configuration import config as config_lib
from ihsweep.configuration import fields
from ihsweep.data import corpus as corpus_lib
from ihsweep.data import make_source, markov, synthetic
from ihsweep.training.runner import fit


def random_chain(vocab=200, concentration=0.1, seed=0):
  rng = np.random.default_rng(seed)
  return rng.dirichlet(np.full(vocab, concentration), size=vocab)


def source_for(p, batch=300, context=64, freqs=(0.5,), rels=(0.5,)):
  return markov.MarkovSource(
    p, markov.stationary_distribution(p), batch, context, tuple(freqs), tuple(rels)
  )


GRID = [(f, r) for r in (0.2, 0.5, 0.9) for f in (0.2, 0.5, 0.8)]


@pytest.fixture(scope="module")
def grid_sequences():
  """One vmapped call: 9 models (a 3 × 3 frequency × reliability grid), 300 sequences each."""
  src = source_for(random_chain(), freqs=[f for f, _ in GRID], rels=[r for _, r in GRID])
  params = src.data_params(len(GRID))
  keys = jax.random.split(jax.random.PRNGKey(0), len(GRID))
  arrays = jax.tree_util.tree_map(jnp.asarray, src.arrays())
  out = jax.jit(jax.vmap(src.sample, in_axes=(0, 0, None)))(keys, params, arrays)
  return src, params, keys, arrays, np.asarray(out)


def test_knobs_match_the_documented_procedure(grid_sequences):
  """reliability: P(x_i ∈ S(a) | S(a) ≠ ∅) = r exactly; frequency: the share of recurring
  tokens equals its implied value Σ_i [s_i r + (1 − s_i r) q ρ_i] / n (module docstring)."""
  *_, tokens = grid_sequences
  assert tokens.shape == (9, 300, 65)
  for (f, r), seqs in zip(GRID, tokens):
    m = markov.measure(seqs, f, r)
    assert m["first_half_gap_repeats"] == 0
    assert abs(m["measured_reliability"] - r) < 0.03, (f, r, m)
    assert abs(m["measured_frequency"] - m["implied_frequency"]) < 0.03, (f, r, m)
  # The knobs move the statistics the right way.
  freq = {fr: markov.measure(s)["measured_frequency"] for fr, s in zip(GRID, tokens)}
  assert freq[(0.2, 0.5)] < freq[(0.5, 0.5)] < freq[(0.8, 0.5)]
  assert abs(freq[(0.5, 0.5)] - 0.5) < 0.05  # p = f / (1 − r² + r f) = f at f = r = 0.5


def test_second_half_never_repeats_the_previous_token(grid_sequences):
  *_, tokens = grid_sequences
  half = tokens.shape[-1] // 2
  assert not np.any(tokens[..., half:] == tokens[..., half - 1 : -1])


def test_vmapped_generation_equals_one_model_at_a_time(grid_sequences):
  src, params, keys, arrays, tokens = grid_sequences
  for e in (0, 4, 8):
    one = {k: v[e] for k, v in params.items()}
    np.testing.assert_array_equal(np.asarray(src.sample(keys[e], one, arrays)), tokens[e])


def test_repeats_placed_anywhere():
  """data.induction_start = 'anywhere': each sequence's boundary m is uniform on {1, …, C}
  (``boundaries`` gives it); before m no token recurs after a gap, after it the knobs hold as with
  'half' (reliability exactly, frequency its implied value); so recurrences sit before C/2 too,
  where 'half' has none."""
  p = random_chain()
  f, r = 0.5, 0.5
  src = dataclasses.replace(source_for(p, batch=400), induction_start="anywhere")
  key = jax.random.PRNGKey(7)
  knobs = {"frequency": f, "reliability": r}
  tokens = np.asarray(jax.jit(src.sample)(key, knobs, src.arrays()))
  starts = src.boundaries(key)
  assert starts.min() >= 1 and starts.max() <= 64 and len(np.unique(starts)) > 40
  m = markov.measure(tokens, f, r, starts=starts)
  assert m["first_half_gap_repeats"] == 0
  assert abs(m["measured_reliability"] - r) < 0.03, m
  assert abs(m["measured_frequency"] - m["implied_frequency"]) < 0.03, m
  # A gap repeat (x_i = x_j, j <= i - 2) before C/2: common here, never with 'half'.
  half = dataclasses.replace(src, induction_start="half")
  early = {}
  for name, s in (("anywhere", src), ("half", half)):
    seqs = np.asarray(jax.jit(s.sample)(key, knobs, s.arrays()))[:, :32]
    early[name] = np.mean([any(row[i] in row[: i - 1] for i in range(2, 32)) for row in seqs])
  assert early["half"] == 0 and early["anywhere"] > 0.3, early
  # With 'half' the boundary is ⌊(C + 1)/2⌋ and the measure's default.
  assert set(half.boundaries(key)) == {32}
  with pytest.raises(ValueError, match=r"one boundary per sequence, shape \(400,\); got \(399,\)"):
    markov.measure(tokens, starts=starts[:-1])


def test_draws_follow_the_bigram_rows():
  """With both knobs 0 every token is drawn from P[a] restricted to unseen tokens: early in
  the first half (few exclusions) successor frequencies match P."""
  p = random_chain(vocab=20, concentration=0.5, seed=3)
  src = source_for(p, batch=4000, context=4, freqs=(0.0,), rels=(0.0,))
  tokens = np.asarray(
    jax.jit(src.sample)(jax.random.PRNGKey(1), {"frequency": 0.0, "reliability": 0.0}, src.arrays())
  )
  a, b = tokens[:, 0], tokens[:, 1]  # x_1 ~ P[x_0] without x_0
  for tok in np.unique(a)[:5]:
    nxt = b[a == tok]
    want = p[tok].copy()
    want[tok] = 0
    want /= want.sum()
    got = np.bincount(nxt, minlength=20) / len(nxt)
    assert np.abs(got - want).max() < 4 * np.sqrt(0.25 / len(nxt)), tok


def test_transition_matrix_checks():
  with pytest.raises(markov.MarkovError, match=r"entry \[0, 1\] = -0.1 is negative"):
    markov.check_transition_matrix(np.array([[1.1, -0.1], [0.5, 0.5]]))
  with pytest.raises(markov.MarkovError, match="row 1 sums to 0.9"):
    markov.check_transition_matrix(np.array([[0.5, 0.5], [0.5, 0.4]]))
  with pytest.raises(markov.MarkovError, match="square"):
    markov.check_transition_matrix(np.ones((2, 3)) / 3)


def test_bigram_transitions_from_a_corpus(tmp_path):
  text_dir = tmp_path / "t"
  text_dir.mkdir()
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "epsilon"]
  (text_dir / "a.txt").write_text(" ".join(rng.choice(words, 3000)))
  data_cfg = _data_cfg(tmp_path, transitions="bigram", files=str(text_dir / "*.txt"))
  corpus = corpus_lib.prepare_corpus(data_cfg, 270)
  p, first, kept = markov.bigram_transitions(corpus, 5, smoothing=1e-6)
  np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
  ids = np.asarray(corpus.train)
  counts = collections.Counter(ids.tolist())
  assert [counts[k] for k in kept] == sorted((counts[k] for k in kept), reverse=True)
  assert corpus.eot_id not in kept.tolist()
  # Row of the most frequent type: direct count ratios (+ smoothing, renormalised).
  a = kept[0]
  follows = collections.Counter(b for x, b in zip(ids[:-1], ids[1:]) if x == a and b in kept)
  total = sum(follows.values())
  direct = np.array([follows[k] / total for k in kept]) + 1e-6
  np.testing.assert_allclose(p[0], direct / direct.sum(), rtol=1e-9)
  np.testing.assert_allclose(first.sum(), 1.0)


def _data_cfg(tmp_path, **fields):
  from ihsweep.data import default_config

  cfg = default_config()
  cfg.update(source="markov", cache_dir=str(tmp_path / "cache"), **fields)
  return cfg


@pytest.mark.parametrize("marginal", synthetic.MARGINALS)
@pytest.mark.parametrize("categoriality", ["high", "low"])
def test_synthetic_matrices_reach_their_targets(marginal, categoriality):
  # V = 200 keeps each case at ~4 s here (V = 500 took ~18 s; its results are in the README).
  spec = synthetic.SyntheticSpec(
    vocab_size=200,
    marginal=marginal,
    categoriality=categoriality,
    n_groups=10,
    entropy_rate_bits=5.0,
    iterations=1500,
  )
  p, report = synthetic.optimise_matrix(spec)  # raises if a target is missed
  got = report["achieved"]
  assert got["marginal_kl"] < 0.02
  assert abs(got["entropy_rate_bits"] - 5.0) < 0.1
  assert abs(got["within"] - spec.within_target) < 0.03 and abs(got["across"] - 0.1) < 0.03
  np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
  # The measured mutual information agrees with H(π) − H_rate from the target marginal.
  target = synthetic.target_marginal(marginal, 200)
  h_marginal = -(target * np.log(target)).sum()
  assert abs(got["mutual_information_nats"] - (h_marginal - 5.0 * np.log(2))) < 0.1


def test_iid_control_has_no_mutual_information(tmp_path):
  for marginal in synthetic.MARGINALS:
    spec = synthetic.SyntheticSpec(
      vocab_size=500, marginal=marginal, categoriality="none", entropy_rate_bits=0.0
    )
    p, report = synthetic.optimise_matrix(spec)
    assert report["achieved"]["mutual_information_nats"] < 1e-6
    assert report["achieved"]["marginal_kl"] < 1e-9


def test_unreachable_targets_are_refused_with_achieved_vs_asked():
  spec = synthetic.SyntheticSpec(
    vocab_size=100, marginal="zipf", n_groups=10, entropy_rate_bits=7.0
  )
  with pytest.raises(
    markov.MarkovError, match=r"asked 7.0 bits.*at most H\(marginal\) = 5\.310 bits"
  ):
    synthetic.check_spec(spec)
  spec = synthetic.SyntheticSpec(
    vocab_size=100,
    marginal="uniform",
    n_groups=10,
    entropy_rate_bits=3.0,
    within_high=0.95,
    across=0.0,
    iterations=100,
  )
  with pytest.raises(
    markov.MarkovError,
    match=r"did not reach its targets after 100 "
    r"iterations: .*achieved \d\.\d+.*, asked ",
  ):
    synthetic.optimise_matrix(spec)


def test_synthetic_matrix_cache_round_trip(tmp_path):
  spec = synthetic.SyntheticSpec(
    vocab_size=60, marginal="zipf", n_groups=6, entropy_rate_bits=3.0, iterations=800
  )
  p1, r1 = synthetic.cached_matrix(spec, str(tmp_path))
  p2, r2 = synthetic.cached_matrix(spec, str(tmp_path))
  assert r1["cache"] == "built" and r2["cache"] == "hit"
  np.testing.assert_allclose(p2, p1, atol=1e-6)


@pytest.mark.parametrize(
  "overrides,message",
  [
    ({"data.frequency": 1.5}, "data.frequency"),
    ({"data.reliabilities": (0.5, -0.1)}, r"data.reliabilities\[1\]"),
    ({"data.frequencies": (0.1, 0.2, 0.3)}, "one value per model"),
    ({"data.transitions": "file", "data.matrix_file": "/nonexistent.npy"}, "data.matrix_file"),
    ({"data.transitions": "file", "data.matrix_file": "NEGATIVE"}, "is negative"),
    ({"data.transitions": "file", "data.matrix_file": "ROWSUM"}, "sums to"),
    (
      {
        "data.transitions": "synthetic",
        "data.synthetic.entropy_rate_bits": 9.0,
        "data.synthetic.n_groups": 8,
      },
      "at most H",
    ),
    ({"data.transitions": "synthetic", "data.synthetic.marginal": "cauchy"}, "marginal"),
    (
      {"data.transitions": "iid", "data.induction_start": "end"},
      r"data.induction_start = 'end' is not allowed: one of 'half', 'anywhere'",
    ),
    (
      {
        "data.transitions": "synthetic",
        "data.synthetic.n_groups": 64,
        "data.synthetic.entropy_rate_bits": 3.0,
      },
      r"n_groups = 64: groups of one id .* at most model.vocab_size / 2 = 32",
    ),
  ],
)
def test_bad_markov_inputs_fail_before_compiling(tiny, tmp_path, no_compile, overrides, message):
  p = random_chain(vocab=64, seed=1)
  bad = {"NEGATIVE": p.copy(), "ROWSUM": p * 0.9}
  bad["NEGATIVE"][3, 4] = -0.01
  for name, matrix in bad.items():
    np.save(tmp_path / f"{name}.npy", matrix)
  overrides = {k: str(tmp_path / f"{v}.npy") if v in bad else v for k, v in overrides.items()}
  cfg = tiny(
    **{
      "data.source": "markov",
      "data.transitions": "iid",
      "data.cache_dir": str(tmp_path / "cache"),
      **overrides,
    }
  )
  with pytest.raises((fields.ConfigError, markov.MarkovError), match=message):
    fit(cfg, str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_training_on_a_user_matrix_with_per_model_knobs(tiny, tmp_path):
  p = random_chain(vocab=64, concentration=0.05, seed=2)
  np.save(tmp_path / "p.npy", p)
  cfg = tiny(
    **{
      "data.source": "markov",
      "data.transitions": "file",
      "data.matrix_file": str(tmp_path / "p.npy"),
      "data.frequencies": (0.2, 0.8),
      "data.reliabilities": (1.0, 0.5),
      "train.num_steps": 40,
      "train.lr": 1e-2,
    }
  )
  out = fit(cfg, str(tmp_path / "run"), progress=False)
  assert np.all(out.losses < np.log(64) - 0.5)
  src = make_source(cfg.data, 64, 8, 32)
  assert src.describe().startswith("markov V=64, frequency [0.2, 0.8], reliability [1.0, 0.5]")


def test_near_deterministic_rows_keep_the_exclusion_rules():
  """Rows with almost all mass on one token leave the allowed mass below float32's resolution;
  the draw must still never return an excluded token."""
  vocab = 300
  rng = np.random.default_rng(0)
  p = np.full((vocab, vocab), 1.5e-6 / (vocab - 1))
  p[np.arange(vocab), rng.integers(0, vocab, vocab)] = 0.0
  p[np.arange(vocab), rng.integers(0, vocab, vocab)] += 1 - p.sum(axis=1)
  src = source_for(markov.check_transition_matrix(p), batch=60, context=64)
  tokens = np.asarray(
    jax.jit(src.sample)(jax.random.PRNGKey(0), {"frequency": 0.5, "reliability": 0.5}, src.arrays())
  )
  m = markov.measure(tokens, 0.5, 0.5)
  assert m["first_half_gap_repeats"] == 0
  assert abs(m["measured_frequency"] - m["implied_frequency"]) < 0.05


def test_stationary_distribution_of_a_periodic_chain():
  p = np.roll(np.eye(3), 1, axis=1)  # 0 → 1 → 2 → 0, period 3
  np.testing.assert_allclose(markov.stationary_distribution(p), [1 / 3] * 3, atol=1e-9)


def test_non_numeric_and_diverged_matrices_are_refused(tmp_path):
  with pytest.raises(markov.MarkovError, match="real-valued"):
    markov.check_transition_matrix(np.array([["a", "b"], ["c", "d"]]))
  spec = synthetic.SyntheticSpec(
    vocab_size=60, n_groups=6, entropy_rate_bits=3.0, weight_entropy=float("nan")
  )
  with pytest.raises(markov.MarkovError, match="weight_entropy"):
    synthetic.check_spec(spec)
  spec = synthetic.SyntheticSpec(
    vocab_size=60, n_groups=6, entropy_rate_bits=3.0, tol_similarity=float("nan"), iterations=2
  )
  with pytest.raises(markov.MarkovError, match="tol_similarity"):
    synthetic.optimise_matrix(spec)


def test_vocabulary_must_hold_a_sequence_of_distinct_tokens(tiny):
  cfg = tiny(**{"data.source": "markov", "data.transitions": "iid", "model.vocab_size": 16})
  with pytest.raises(fields.ConfigError, match="train.context_size"):
    config_lib.validate(cfg)
