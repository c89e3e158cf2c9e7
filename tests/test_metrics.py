"""Induction-head metrics on models with known answers, probes, and the emergence law."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep import metrics
from ihsweep.data import probes
from ihsweep.law import Law, LawError
from ihsweep.model import ModelConfig, Transformer

V, C, D = 32, 32, 128
TOK, POS, PREV, OUT = 0, 32, 64, 96  # residual subspaces of the hand-built model
CFG = ModelConfig(n_layers=2, n_heads=2, d_model=D, d_mlp=0, vocab_size=V, max_context=C,
                  tie_embeddings=False)
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


def _evaluate(params, n=20, cfg=CFG):
  reps = jnp.asarray(_probes(n))
  seqs = jnp.concatenate([reps, reps[:, :1]], axis=1)  # [N, 2L + 1]: a sequence per probe
  recall = jnp.asarray(probes.recall_positions(np.asarray(seqs)))
  return metrics.evaluate(params, reps, seqs, recall, cfg=cfg, block_len=L, icl_early=3,
                          icl_late=2 * L - 1, probe_batch=5, sequence_batch=4)


def test_hand_built_induction_head_scores_known_answers():
  out = jax.tree_util.tree_map(np.asarray, _evaluate(induction_circuit()))
  assert out["ps"][1, 0] > 0.9, out["ps"]
  assert out["la"][1, 0] > 0.5, out["la"]
  others = [(0, 0), (0, 1), (1, 1)]
  assert all(out["ps"][h] < 0.1 for h in others), out["ps"]
  assert all(out["la"][h] < 0.05 for h in others), out["la"]
  assert out["ar_acc"] > 0.9 and out["ar_rank"] < 0.5
  assert out["ar_data_acc"] > 0.9 and out["ar_data_n"] >= 20 * (L - 1)
  assert out["dla"][1, 0] > 1.0 and np.abs(out["dla"][0]).max() < 1e-5
  assert out["ps_max"] == out["ps"][1, 0] and list(out["ps_argmax"]) == [1, 0]
  assert list(out["la_argmax"]) == [1, 0]
  # The second copy is predicted, the first is not: in-context learning lowers late loss.
  assert out["icl_score"] < -1.0


def test_uniform_attention_scores_mean_inverse_position():
  params = induction_circuit()
  for name in ("block_0", "block_1"):  # zero queries and keys: every score 0, attention uniform
    params[name]["attn"]["qkv"]["kernel"] = params[name]["attn"]["qkv"]["kernel"].at[:, :2].set(0)
  out = _evaluate(params)
  expected = np.mean(1.0 / (np.arange(L, 2 * L) + 1))
  np.testing.assert_allclose(out["ps"], np.full((2, 2), expected), rtol=1e-5)


def test_fresh_model_scores_low_and_vmap_equals_one_by_one():
  cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_mlp=256, vocab_size=V, max_context=C)
  params = [Transformer(cfg).init(jax.random.PRNGKey(s), jnp.zeros((1, C), jnp.int32))["params"]
            for s in (1, 2)]
  one = [_evaluate(p, cfg=cfg) for p in params]
  assert all(float(o["ps_max"]) < 0.1 for o in one)
  reps = jnp.asarray(_probes())
  seqs = jnp.stack([jnp.concatenate([reps, reps[:, :1]], axis=1)] * 2)
  recall = jnp.asarray(np.stack([probes.recall_positions(np.asarray(s)) for s in seqs]))
  fn = metrics.make_eval_fn(cfg, block_len=L, icl_early=3, icl_late=2 * L - 1, probe_batch=20,
                            sequence_batch=20)
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *params)
  ens = fn(stacked, reps, seqs, recall)
  for i in range(2):
    for key in ("ps", "la", "dla", "ar_rank", "val_loss", "icl_score", "ar_data_acc"):
      np.testing.assert_allclose(ens[key][i], one[i][key], rtol=2e-5, atol=1e-6, err_msg=key)


def test_repeated_token_probes_and_candidates():
  ids = probes.probe_candidates(10, special_ids=(0,), top_k=4,
                                counts=np.array([99, 1, 5, 5, 7, 0, 3, 8, 2, 0]))
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
