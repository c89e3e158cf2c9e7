"""Induction-head metrics on models with known answers, probes, and the emergence law."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.base.law import Law, LawError
from ihsweep.compute import metric_registry, metrics
from ihsweep.compute.model import ModelConfig, Transformer
from ihsweep.data import corpus as corpus_lib
from ihsweep.data import probes

V, C, D = 32, 32, 128
TOK, POS, PREV, OUT = 0, 32, 64, 96  # residual subspaces of the hand-built model
CFG = ModelConfig(
  n_layers=2, n_heads=2, d_model=D, d_mlp=0, vocab_size=V, max_context=C, tie_embeddings=False
)
L = probes.block_length(C)


def _zero_params():
  params = Transformer(CFG).init(jax.random.PRNGKey(0), jnp.zeros((1, C), jnp.int32))["params"]
  params = jax.tree_util.tree_map(np.zeros_like, params)
  for name in ("block_0", "block_1"):
    params[name]["ln_1"]["scale"][:] = 1.0
  params["ln_f"]["scale"][:] = 1.0
  return params


def induction_circuit(beta=5.0, gain=10.0):
  """2-layer attention-only model: layer 0 head 0 is a previous-token head (query = position
  p, key = position p − 1 ... written as key j answering query j + 1), copying the previous
  token into the PREV subspace; layer 1 head 0 is an induction head (query = current token,
  key = PREV token), copying the attended token into the OUT subspace that the unembedding
  reads. Heads 1 of both layers are zero (uniform attention, no output)."""
  p = _zero_params()
  t = np.arange(V)
  p["embed"]["embedding"][t, TOK + t] = 1.0
  p["pos_embed"][np.arange(C), POS + np.arange(C)] = 1.0
  p["unembed"][t, OUT + t] = 1.0
  k0 = p["block_0"]["attn"]["qkv"]["kernel"]  # [D, 3 (q, k, v), H, d_head]
  k0[POS + np.arange(C), 0, 0, np.arange(C)] = beta
  k0[POS + np.arange(C - 1), 1, 0, np.arange(1, C)] = beta
  k0[TOK + t, 2, 0, t] = 1.0
  p["block_0"]["attn"]["w_o"][0, t, PREV + t] = 1.0
  k1 = p["block_1"]["attn"]["qkv"]["kernel"]
  k1[TOK + t, 0, 0, t] = beta
  k1[PREV + t, 1, 0, t] = beta
  k1[TOK + t, 2, 0, t] = 1.0
  p["block_1"]["attn"]["w_o"][0, t, OUT + t] = gain
  return jax.tree_util.tree_map(jnp.asarray, p)


def _probes(n=20):
  return probes.repeated_token_probes(0, n, L, probes.probe_candidates(V))


def _evaluate(params, n=20, cfg=CFG, reps=None, block_len=L):
  reps = jnp.asarray(_probes(n) if reps is None else reps)
  seqs = jnp.concatenate([reps, reps[:, :1]], axis=1)  # [N, T + 1]: a sequence per probe
  recall = jnp.asarray(probes.recall_positions(np.asarray(seqs)))
  return metrics.evaluate(
    params,
    reps,
    seqs,
    recall,
    cfg=cfg,
    block_len=block_len,
    icl_early=3,
    icl_late=reps.shape[1] - 1,
    probe_batch=5,
    sequence_batch=4,
  )


def test_hand_built_induction_head_scores_known_answers():
  out = jax.tree_util.tree_map(np.asarray, _evaluate(induction_circuit()))
  assert out["ps"][1, 0] > 0.9, out["ps"]
  # ~1 at every scored position, the last included (the induction head attends to L there and
  # copies tokens[L] = tokens[0], the target); at i = L it splits between 0 and 1 (PS 0.5 there).
  assert out["la"][1, 0] > 0.95, out["la"]
  others = [(0, 0), (0, 1), (1, 1)]
  assert all(out["ps"][h] < 0.1 for h in others), out["ps"]
  assert all(out["la"][h] < 0.05 for h in others), out["la"]
  assert out["ar_acc"] > 0.9 and out["ar_rank"] < 0.5
  assert out["ar_data_acc"] > 0.9 and out["ar_data_n"] >= 20 * (L - 1)
  assert out["dla"][1, 0] > 1.0 and np.abs(out["dla"][0]).max() < 1e-5
  assert out["ps_max"] == out["ps"][1, 0] and list(out["ps_argmax"]) == [1, 0]
  assert list(out["la_argmax"]) == [1, 0]
  # Layer 0 head 0 attends to the previous token (~1 with beta 5); the induction head, whose key
  # is the previous token, and the zero heads (uniform) do not.
  assert out["pt"][0, 0] > 0.9, out["pt"]
  assert all(out["pt"][h] < 0.2 for h in [(0, 1), (1, 0), (1, 1)]), out["pt"]
  assert out["pt_max"] == out["pt"][0, 0] and list(out["pt_argmax"]) == [0, 0]
  # The second copy is predicted, the first is not: in-context learning lowers late loss.
  assert out["icl_score"] < -1.0


def _reference_probe_metrics(params, cfg, tokens_NxT, positions, block_len=L):
  """AR rank, LA and DLA by the study's definitions, one position at a time in numpy: at
  second-block position i the correct next token is tokens[i − L + 1] (the block's first token
  at the last position); the block's L ids are those before the second block."""
  L = block_len
  model = Transformer(cfg)
  logits = np.asarray(model.apply({"params": params}, tokens_NxT))
  _, internals = model.apply({"params": params}, tokens_NxT, return_internals=True)
  t = tokens_NxT.shape[1]
  heads = np.asarray(metrics.head_outputs(params, cfg, internals["z"], jnp.arange(t)))
  resid = np.asarray(internals["resid_final"])
  w_DxV = np.asarray(params["unembed"]).T
  gamma = np.asarray(params["ln_f"]["scale"])
  toks = np.asarray(tokens_NxT)
  rank, la, dla = [], [], []
  for i in positions:
    for n in range(len(toks)):
      target = toks[n, i - L + 1]
      rank.append((logits[n, i] > logits[n, i, target]).sum())
      block = toks[n, t - 2 * L : t - L]
      proj = heads[n, i] @ w_DxV[:, block]  # [layers, H, L]
      above = np.maximum(proj - proj.mean(-1, keepdims=True), 0)
      la.append(above[..., list(block).index(target)] / above.sum(-1))
      direction = (
        (w_DxV[:, target] - w_DxV.mean(1)) * gamma / np.sqrt(resid[n, i].var() + cfg.ln_eps)
      )
      h = heads[n, i] - heads[n, i].mean(-1, keepdims=True)
      dla.append(h @ direction)
  return np.mean(rank), np.mean(la, axis=0), np.mean(dla, axis=0)


def test_probe_metrics_average_all_L_positions_with_the_block_first_token_last():
  """LA, DLA and AR over i = L … 2L − 1 (docs/study.md, "Scores"), the last position's target
  being tokens[0]; dropping that position, or scoring it against any other token, moves them."""
  cfg = ModelConfig(
    n_layers=2, n_heads=2, d_model=64, d_mlp=128, vocab_size=V, max_context=C, tie_embeddings=False
  )
  params = Transformer(cfg).init(jax.random.PRNGKey(3), jnp.zeros((1, C), jnp.int32))["params"]
  reps = jnp.asarray(_probes())
  out = _evaluate(params, cfg=cfg)
  rank, la, dla = _reference_probe_metrics(params, cfg, reps, range(L, 2 * L))
  np.testing.assert_allclose(out["ar_rank"], rank, rtol=1e-6)
  np.testing.assert_allclose(out["la"], la, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(out["dla"], dla, rtol=1e-4, atol=1e-6)
  # The test can fail: L − 1 positions (the last dropped) give clearly different values.
  rank_m, la_m, dla_m = _reference_probe_metrics(params, cfg, reps, range(L, 2 * L - 1))
  assert abs(rank_m - rank) > 0.05 and np.abs(la_m - la).max() > 1e-3
  assert np.abs(dla_m - dla).max() > 1e-3 * np.abs(dla).max()


L_END = 5  # a fixed block at the end of C = 32 positions: 22 filler ids first


def _end_probes(n=20):
  return probes.repeated_token_probes(0, n, L_END, probes.probe_candidates(V), length=C)


def _evaluate_end(params, n=20, cfg=CFG):
  return _evaluate(params, n, cfg, reps=_end_probes(n), block_len=L_END)


def test_end_position_probes_hold_the_same_blocks_after_filler_outside_them():
  start = probes.repeated_token_probes(0, 20, L_END, probes.probe_candidates(V))
  end = _end_probes()
  assert end.shape == (20, C) and end.dtype == np.int32
  np.testing.assert_array_equal(end[:, C - 2 * L_END :], start)  # blocks independent of T
  filler = end[:, : C - 2 * L_END]
  assert all(not set(f) & set(b) for f, b in zip(filler, start[:, :L_END]))
  assert len(np.unique(filler)) > 10  # drawn, not one id repeated
  assert probes.probe_layout(64, 8, "end") == (8, 64)
  assert probes.probe_layout(64, 8, "middle") == (8, 40)  # the second block at 32 … 39
  assert probes.probe_layout(64, 0, "middle") == (32, 64)  # L = C/2: no filler
  assert probes.probe_layout(64, 8) == (8, 16) and probes.probe_layout(64) == (32, 64)
  assert probes.block_start(64, 8) == 48
  with pytest.raises(ValueError, match="needs at least one id outside the block"):
    probes.repeated_token_probes(0, 1, 5, np.arange(5), length=12)
  with pytest.raises(ValueError, match="eval.probe_position = 'centre'"):
    probes.probe_layout(64, 8, "centre")


def test_end_position_probes_score_the_second_block_at_the_end_of_the_context():
  """The hand-built induction head scores ~1 on blocks at positions 22–31; on a random model
  every metric equals the study's definitions at those positions (reference in numpy); scoring
  the filler positions instead (the first 2L, as 'start' probes would) gives other values."""
  out = jax.tree_util.tree_map(np.asarray, _evaluate_end(induction_circuit()))
  assert out["ps"][1, 0] > 0.9 and out["la"][1, 0] > 0.95, (out["ps"], out["la"])
  assert out["ar_acc"] > 0.9 and all(out["ps"][h] < 0.1 for h in [(0, 0), (0, 1), (1, 1)])
  cfg = ModelConfig(
    n_layers=2, n_heads=2, d_model=64, d_mlp=128, vocab_size=V, max_context=C, tie_embeddings=False
  )
  params = Transformer(cfg).init(jax.random.PRNGKey(3), jnp.zeros((1, C), jnp.int32))["params"]
  reps = jnp.asarray(_end_probes())
  out = _evaluate_end(params, cfg=cfg)
  second = range(C - L_END, C)
  rank, la, dla = _reference_probe_metrics(params, cfg, reps, second, block_len=L_END)
  np.testing.assert_allclose(out["ar_rank"], rank, rtol=1e-6)
  np.testing.assert_allclose(out["la"], la, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(out["dla"], dla, rtol=1e-4, atol=1e-6)
  _, internals = Transformer(cfg).apply({"params": params}, reps, return_internals=True)
  attn = np.asarray(internals["attn"])  # [layers, N, H, T, T]
  i = np.arange(C - L_END, C)
  ps = attn[..., i, i - L_END + 1].mean(axis=(1, 3))
  np.testing.assert_allclose(out["ps"], ps, rtol=1e-5)
  early = attn[..., np.arange(L_END, 2 * L_END), np.arange(1, L_END + 1)].mean(axis=(1, 3))
  assert np.abs(early - ps).max() > 1e-3  # the test can fail: other positions, other scores


def test_last_position_target_is_the_block_first_token():
  """A head that writes exactly the unembedding vector of tokens[i − L + 1] at each of the L
  positions has LA = 1; writing anything else at the last position lowers LA and DLA there."""
  tokens = jnp.asarray(_probes(4))
  w_DxV = jnp.eye(D, V)  # token t's unembedding vector: unit vector t
  targets = np.asarray(tokens[:, 1 : L + 1])  # tokens[i − L + 1] for i = L … 2L − 1
  assert (targets[:, -1] == np.asarray(tokens[:, 0])).all()
  head = w_DxV.T[targets][:, :, None, None, :]  # [N, L, 1 layer, 1 head, D]
  la = metrics.logit_attribution(head, w_DxV, tokens, L)
  np.testing.assert_allclose(la, [[1.0]], rtol=1e-6)
  resid = jnp.ones((4, L, D)) + head[:, :, 0, 0]
  dla = metrics.direct_logit_attribution(head, resid, jnp.ones(D), w_DxV, tokens, L, 1e-5)
  wrong = head.at[:, -1].set(w_DxV.T[np.asarray(tokens[:, 1])][:, None, None, :])
  assert float(metrics.logit_attribution(wrong, w_DxV, tokens, L)[0, 0]) == pytest.approx(
    (L - 1) / L, rel=1e-6
  )
  assert (
    float(metrics.direct_logit_attribution(wrong, resid, jnp.ones(D), w_DxV, tokens, L, 1e-5)[0, 0])
    < float(dla[0, 0]) - 0.01
  )


def test_diverged_model_reads_nan_not_perfect_recall():
  import configs.default
  from ihsweep.training.evaluation import Evaluator

  nan = jax.tree_util.tree_map(lambda x: x * jnp.nan, induction_circuit())
  out = jax.tree_util.tree_map(np.asarray, _evaluate(nan))
  for key in (
    "ps_max",
    "la_max",
    "dla_max",
    "ar_acc",
    "ar_rank",
    "ar_data_acc",
    "ar_data_rank",
    "val_loss",
  ):
    assert np.isnan(out[key]), (key, out[key])
  # One NaN or inf in the unembedding of one token: no rank is defined anywhere.
  for bad in (np.nan, np.inf):
    params = induction_circuit()
    params["unembed"] = params["unembed"].at[5, OUT + 5].set(bad)
    out = _evaluate(params)
    assert np.isnan(out["ar_acc"]) and np.isnan(out["ar_data_acc"]), bad
  ranks = metrics.recall_ranks(
    jnp.array([[[0.0, 1.0, jnp.nan], [2.0, 1.0, 0.0], [0.0, jnp.inf, 1.0]]]), jnp.array([[1, 0, 1]])
  )
  np.testing.assert_array_equal(ranks, [[np.nan, 0, np.nan]])
  # metrics.jsonl rows (NaN → null): a diverged model never reads as a perfect one.
  host = {k: np.asarray(v)[None] for k, v in _evaluate(nan).items()}
  cfg = configs.default.get_config()
  cfg.ensemble.size = 1
  row = Evaluator.rows(host, 10, 64, cfg, None)[0]
  assert row["ar_acc"] is None and row["ps_max"] is None and row["la_max"] is None


def test_probe_blocks_shorter_than_three_are_refused(tiny):
  from ihsweep.configuration.config import validate
  from ihsweep.configuration.fields import ConfigError

  for overrides, field, words in [
    (
      {"train.context_size": 5},
      "train.context_size",
      ["= 5", ">= 6 when evaluating", "previous token"],
    ),
    ({"eval.probe_len": 2}, "eval.probe_len", ["= 2", "or >= 3", "previous token"]),
  ]:
    with pytest.raises(ConfigError) as err:
      validate(tiny(**{"eval.every_steps": 10, **overrides}))
    assert err.value.field == field and all(w in str(err.value) for w in words), str(err.value)
  with pytest.raises(ConfigError, match="eval.probe_len = 2"):  # even with evaluation off
    validate(tiny(**{"eval.probe_len": 2}))
  validate(tiny(**{"train.context_size": 4}))  # no evaluation: a small C still trains
  validate(tiny(**{"eval.every_steps": 10, "train.context_size": 6}))  # L = 3
  with pytest.raises(ConfigError, match="eval.probe_position = 'centre'.*'start', 'middle'"):
    validate(tiny(**{"eval.probe_position": "centre"}))
  middle = {"eval.every_steps": 10, "eval.probe_position": "middle", "eval.probe_len": 4}
  with pytest.raises(ConfigError, match=r"probe_top_k = 4.*\[5, 64\].*'middle'"):
    validate(tiny(**middle, **{"eval.probe_top_k": 4}))
  # Filler before a block at the end of C needs an id outside the block: K = L is too few.
  end = {"eval.every_steps": 10, "eval.probe_position": "end", "eval.probe_len": 4}
  with pytest.raises(ConfigError, match=r"eval.probe_top_k = 4.*\[5, 64\].*one filler id"):
    validate(tiny(**end, **{"eval.probe_top_k": 4}))
  validate(tiny(**end, **{"eval.probe_top_k": 5}))
  validate(tiny(**{**end, "eval.probe_len": 16, "eval.probe_top_k": 16}))  # 2L = C: no filler
  # Every other path (probes made for a run or its analysis; the metrics themselves, e.g. on
  # an older run's saved probes): L < 3 is refused with the same reason.
  for args in ((5,), (64, 2)):
    with pytest.raises(ValueError, match="L = 2 .*previous token"):
      probes.block_length(*args)
  with pytest.raises(ValueError, match="block_len = 2"):
    metrics.evaluate(
      induction_circuit(),
      jnp.zeros((1, 4), jnp.int32),
      jnp.zeros((1, 5), jnp.int32),
      jnp.zeros((1, 4), bool),
      cfg=CFG,
      block_len=2,
      icl_early=1,
      icl_late=3,
      probe_batch=1,
      sequence_batch=1,
    )


def test_microbatch_refuses_empty_items():
  assert metrics.microbatch(12, 8, 100, budget_bytes=4 * 8 * 100 * 5) == 4
  with pytest.raises(ValueError, match="tokens_per_item = 0"):
    metrics.microbatch(12, 0, 100)


def test_special_tokens_of_a_user_tokenizer_never_appear_in_probes(tiny, tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers

  from ihsweep.data import natural

  words = ["<|endoftext|>", "the", "head", "copies", "a", "token", "after", "its", "prefix"]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="the"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(["<|endoftext|>", "<pad>", "<bos>"])  # ids 0, 9, 10
  tok.add_tokens(["induction"])  # id 11: an added token that is text
  rng = np.random.default_rng(0)
  train = rng.integers(1, 12, 5000).astype(np.uint16)
  corpus = corpus_lib.TokenizedCorpus(
    train=train,
    val=train[:500],
    tokenizer=tok,
    eot_id=0,
    vocab_size=16,
    path="",
    cache_hit=False,
    meta={},
  )
  source = natural.NaturalTextSource(corpus, batch_size=8, context_size=32, on_device=False)
  special = [tok.token_to_id(t) for t in ("<|endoftext|>", "<pad>", "<bos>")]
  assert probes.special_token_ids(source) == tuple(special) == (0, 9, 10)
  cfg = tiny(**{"eval.probe_len": 12, "eval.n_sequences": 4})  # 13 usable ids of 16
  p = probes.make_probes(source, {}, None, cfg.eval, 1, 32)
  assert not set(special) & set(np.unique(p.repeated).tolist())
  assert {11, 15} <= set(np.unique(p.repeated).tolist())  # text and ids beyond the tokenizer's
  assert "3 special id(s) excluded (0, 9, 10)" in p.candidates
  with pytest.raises(ValueError, match="13 candidate ids cannot fill a block of 14"):
    probes.make_probes(source, {}, None, tiny(**{"eval.probe_len": 14}).eval, 1, 32)


def test_uniform_attention_scores_mean_inverse_position():
  params = induction_circuit()
  for name in ("block_0", "block_1"):  # zero queries and keys: every score 0, attention uniform
    params[name]["attn"]["qkv"]["kernel"] = params[name]["attn"]["qkv"]["kernel"].at[:, :2].set(0)
  out = _evaluate(params)
  expected = np.mean(1.0 / (np.arange(L, 2 * L) + 1))
  np.testing.assert_allclose(out["ps"], np.full((2, 2), expected), rtol=1e-5)
  assert metric_registry.uniform_ps(L) == pytest.approx(expected, rel=1e-12)
  # Blocks at the end of C: uniform attention is spread over C − L … C − 1 earlier positions.
  end = np.mean(1.0 / (np.arange(C - L_END, C) + 1))
  np.testing.assert_allclose(_evaluate_end(params)["ps"], np.full((2, 2), end), rtol=1e-5)
  assert metric_registry.uniform_ps(L_END, C) == pytest.approx(end, rel=1e-12)
  assert metric_registry.uniform_ps(L_END) > 3 * end
  prev = np.mean(1.0 / (np.arange(1, 2 * L) + 1))  # every position but the first
  np.testing.assert_allclose(out["pt"], np.full((2, 2), prev), rtol=1e-5)
  assert out["pt_max"] == pytest.approx(prev, rel=1e-5)
  assert metric_registry.uniform_pt(L) == pytest.approx(prev, rel=1e-12)
  end = np.mean(1.0 / (np.arange(C - 2 * L_END + 1, C) + 1))
  np.testing.assert_allclose(_evaluate_end(params)["pt"], np.full((2, 2), end), rtol=1e-5)
  assert metric_registry.uniform_pt(L_END, C) == pytest.approx(end, rel=1e-12)


def test_fresh_model_scores_low_and_vmap_equals_one_by_one():
  cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_mlp=256, vocab_size=V, max_context=C)
  params = [
    Transformer(cfg).init(jax.random.PRNGKey(s), jnp.zeros((1, C), jnp.int32))["params"]
    for s in (1, 2)
  ]
  one = [_evaluate(p, cfg=cfg) for p in params]
  assert all(float(o["ps_max"]) < 0.1 for o in one)
  reps = jnp.asarray(_probes())
  seqs = jnp.stack([jnp.concatenate([reps, reps[:, :1]], axis=1)] * 2)
  recall = jnp.asarray(np.stack([probes.recall_positions(np.asarray(s)) for s in seqs]))
  fn = metrics.make_eval_fn(
    cfg, block_len=L, icl_early=3, icl_late=2 * L - 1, probe_batch=20, sequence_batch=20
  )
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *params)
  ens = fn(stacked, reps, seqs, recall)
  for i in range(2):
    for key in ("ps", "la", "dla", "ar_rank", "val_loss", "icl_score", "ar_data_acc"):
      np.testing.assert_allclose(ens[key][i], one[i][key], rtol=2e-5, atol=1e-6, err_msg=key)


def test_repeated_token_probes_and_candidates():
  ids = probes.probe_candidates(
    10, special_ids=(0,), top_k=4, counts=np.array([99, 1, 5, 5, 7, 0, 3, 8, 2, 0])
  )
  assert list(ids) == [2, 3, 4, 7]  # most frequent, the special id 0 excluded, tie by id
  reps = probes.repeated_token_probes(3, 50, 6, np.arange(1, 40))
  assert reps.shape == (50, 12) and reps.dtype == np.int32
  np.testing.assert_array_equal(reps[:, :6], reps[:, 6:])
  assert all(len(set(r[:6])) == 6 for r in reps) and reps.min() >= 1
  np.testing.assert_array_equal(reps, probes.repeated_token_probes(3, 50, 6, np.arange(1, 40)))
  assert probes.block_length(128) == 50 and probes.block_length(64) == 32
  with pytest.raises(ValueError, match="cannot fill"):
    probes.repeated_token_probes(0, 1, 6, np.arange(5))


def test_recall_positions():
  #            A  B  x  A  B  A  C  A
  seq = np.array([[1, 2, 9, 1, 2, 1, 3, 1, 3]])
  mask = probes.recall_positions(seq)
  # i=3 (A, earlier A at 0, next 2 == B): yes; i=5 (A, last A at 3, next 3 != 2): no;
  # i=7 (A, last A at 5 whose successor is 3, next 3): yes; i=4 (B, earlier at 1, next 1 != 9).
  assert list(np.flatnonzero(mask[0])) == [3, 7]
  assert not probes.recall_positions(np.array([[5, 5, 5]])).any()  # A A: j + 1 == i excluded


def test_law_predicts_the_study_numbers(tmp_path):
  law = Law()
  assert law.updates(8, 1024) == pytest.approx(3617, rel=1e-3)
  assert law.tokens(8, 1024) == pytest.approx(29.6e6, rel=1e-3)
  f = tmp_path / "law.json"
  f.write_text(json.dumps({"log_T": 10.0, "alpha": 0.5, "beta": 0.5, "r": 0.9}))
  fitted = Law.from_json(str(f))
  assert fitted.updates(4, 16) == pytest.approx(np.exp(10.0) / 8)
  f.write_text(json.dumps({"T": 1000.0, "alpha": 0.0, "beta": 0.0}))
  assert Law.from_json(str(f)).updates(3, 3) == pytest.approx(1000.0)
  f.write_text(json.dumps({"alpha": 0.3}))
  with pytest.raises(LawError, match="missing field 'log_T' \\(or 'T'\\)"):
    Law.from_json(str(f))
  f.write_text(json.dumps({"T": 1000.0, "log_T": 13.26, "alpha": 0.3, "beta": 0.6}))
  with pytest.raises(LawError, match="disagree"):
    Law.from_json(str(f))
  with pytest.raises(LawError, match="context_size"):
    law.updates(8, -1)


def test_evaluation_split_over_the_data_axis_equals_one_device():
  """E = 2 models on a 2 × 2 mesh (4 CPU devices): each data-axis device evaluates half the
  probes and half the sequences, the probe means are averaged and the sequence sums added over
  the axis (``make_eval_fn(mesh=...)``); the metrics equal the unsplit evaluation's. The only
  float32 difference is the order of the additions over 20 items (relative ~20 · 6e-8), so
  rtol 2e-5, as for vmapped against one by one; the counts and argmaxes are exact."""
  from ihsweep.base import sharding

  cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_mlp=256, vocab_size=V, max_context=C)
  params = [
    Transformer(cfg).init(jax.random.PRNGKey(s), jnp.zeros((1, C), jnp.int32))["params"]
    for s in (1, 2)
  ]
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *params)
  reps = jnp.asarray(_probes())
  seqs = (
    jnp.stack([jnp.concatenate([reps, reps[:, :1]], axis=1)] * 2)
    .at[1]
    .set(jnp.concatenate([jnp.roll(reps, 3, 0), reps[:, :1]], axis=1))
  )
  recall = jnp.asarray(np.stack([probes.recall_positions(np.asarray(s)) for s in seqs]))
  common = dict(block_len=L, icl_early=3, icl_late=2 * L - 1, probe_batch=5, sequence_batch=5)
  whole = metrics.make_eval_fn(cfg, **common)(stacked, reps, seqs, recall)
  mesh = sharding.make_mesh(2, 4, jax.devices()[:4])
  assert dict(mesh.shape) == {"ensemble": 2, "data": 2}
  for probes_too, sequences_too in ((True, True), (True, False), (False, True)):
    split = metrics.make_eval_fn(
      cfg,
      mesh=mesh,
      out_sharding=sharding.ensemble_sharding(mesh),
      split_probes=probes_too,
      split_sequences=sequences_too,
      **common,
    )(stacked, reps, seqs, recall)
    assert split["ps"].sharding == sharding.ensemble_sharding(mesh)
    for key in ("ps", "la", "dla", "ar_acc", "ar_rank", "val_loss", "icl_score", "ar_data_acc"):
      np.testing.assert_allclose(split[key], whole[key], rtol=2e-5, atol=1e-6, err_msg=key)
    for key in ("ar_data_n", "ps_argmax", "la_argmax", "dla_argmax"):
      np.testing.assert_array_equal(split[key], whole[key], err_msg=key)


def test_evaluation_micro_batches_follow_the_device_memory(monkeypatch):
  """An eighth of the usable memory for one micro-batch's float32 logits: at study scale (C
  1024, V 50,257) on a v5e core (15.75 GiB) 8 of 32 held-out sequences at once (the old fixed
  16 MiB: one); 16 MiB where the memory is unknown (a CPU)."""
  from ihsweep.base import sharding
  from ihsweep.training import evaluation, memory

  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  monkeypatch.delenv(memory.CAPACITY_ENV, raising=False)
  assert evaluation.eval_budget_bytes(mesh) == 16 << 20  # CPU: no bytes_limit
  v5e = int(15.75 * (1 << 30))
  budget = evaluation.eval_budget_bytes(mesh, v5e)
  assert budget == int(v5e * 0.9 / 8)
  assert metrics.microbatch(32, 1024, 50_257, budget) == 8
  assert metrics.microbatch(32, 1024, 50_257) == 1
  monkeypatch.setenv(memory.CAPACITY_ENV, str(1 << 30))
  assert evaluation.eval_budget_bytes(mesh) == int((1 << 30) * 0.9 / 8)
