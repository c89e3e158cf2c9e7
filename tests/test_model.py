import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.compute.model import (
  Attention,
  ModelConfig,
  Transformer,
  flops_per_token,
  matmul_params,
)
from ihsweep.compute.train import next_token_loss

CFG = ModelConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, vocab_size=50, max_context=16)


def _init(cfg, t=12, seed=0):
  model = Transformer(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (3, t), 0, cfg.vocab_size)
  params = model.init(jax.random.PRNGKey(seed), tokens)["params"]
  return model, params, tokens


@pytest.mark.parametrize("pos", ["learned", "rotary"])
def test_attention_is_causal_and_normalised(pos):
  cfg = ModelConfig(**{**CFG.__dict__, "pos_encoding": pos})
  model, params, tokens = _init(cfg)
  logits, internals = model.apply({"params": params}, tokens, return_internals=True)
  attn = np.asarray(internals["attn"])  # [L, B, H, T, T]
  assert attn.shape == (2, 3, 4, 12, 12)
  np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
  upper = np.triu(np.ones((12, 12), bool), k=1)
  assert np.all(attn[..., upper] == 0.0)
  # Internals do not change the logits.
  np.testing.assert_allclose(logits, model.apply({"params": params}, tokens), atol=1e-6)


def test_head_outputs_sum_to_attention_output():
  model, params, tokens = _init(CFG)
  x = jax.random.normal(jax.random.PRNGKey(3), (3, 12, CFG.d_model))
  attn_params = params["block_0"]["attn"]
  out, internals = Attention(CFG).apply({"params": attn_params}, x, True)
  head_out = internals["head_out"]  # [B, T, H, D]
  assert head_out.shape == (3, 12, 4, CFG.d_model)
  np.testing.assert_allclose(head_out.sum(2) + attn_params["b_o"][None, None, :], out, atol=1e-5)
  # The model-level internals are the same quantity for layer 0.
  _, full = model.apply({"params": params}, tokens, return_internals=True)
  assert full["head_out"].shape == (2, 3, 12, 4, CFG.d_model)
  assert full["resid_final"].shape == (3, 12, CFG.d_model)


@pytest.mark.parametrize("tie", [True, False])
def test_fused_loss_and_gradient_match_plain_cross_entropy(tie):
  cfg = ModelConfig(**{**CFG.__dict__, "tie_embeddings": tie})
  model, params, tokens = _init(cfg)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]

  def plain(p):
    return next_token_loss(model.apply({"params": p}, inputs), targets)

  def fused(p):
    return model.apply({"params": p}, inputs, targets_BxT=targets)

  l1, g1 = jax.value_and_grad(plain)(params)
  l2, g2 = jax.value_and_grad(fused)(params)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  assert float(l1) == pytest.approx(np.log(cfg.vocab_size), abs=0.1)  # near-uniform at init
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_gpt2_initialisation():
  cfg = ModelConfig(n_layers=4, n_heads=4, d_model=256, d_mlp=1024, vocab_size=2048, max_context=64)
  _, params, _ = _init(cfg)
  assert np.std(params["embed"]["embedding"]) == pytest.approx(0.02, rel=0.05)
  assert np.std(params["block_0"]["attn"]["qkv"]["kernel"]) == pytest.approx(0.02, rel=0.05)
  resid_std = 0.02 / np.sqrt(2 * cfg.n_layers)
  assert np.std(params["block_0"]["attn"]["w_o"]) == pytest.approx(resid_std, rel=0.05)
  assert np.std(params["block_3"]["mlp_out"]["kernel"]) == pytest.approx(resid_std, rel=0.05)
  assert np.all(params["block_0"]["attn"]["b_o"] == 0)
  assert np.all(params["ln_f"]["scale"] == 1)


def test_attention_only_model_has_no_mlp():
  cfg = ModelConfig(**{**CFG.__dict__, "d_mlp": 0})
  _, params, _ = _init(cfg)
  assert "mlp_in" not in params["block_0"] and "ln_2" not in params["block_0"]


def test_bfloat16_compute_keeps_float32_logits():
  cfg = ModelConfig(**{**CFG.__dict__, "dtype": "bfloat16"})
  model, params, tokens = _init(cfg)
  logits = model.apply({"params": params}, tokens)
  assert logits.dtype == jnp.float32
  assert params["embed"]["embedding"].dtype == jnp.float32


def test_flops_formula_reference_workload():
  cfg = ModelConfig(n_layers=2, n_heads=4, d_model=128, d_mlp=512, vocab_size=4096, max_context=128)
  assert matmul_params(cfg) == 2 * (4 * 128**2 + 2 * 128 * 512) + 128 * 4096
  assert flops_per_token(cfg, 128) == 6 * 917504 + 12 * 2 * 128 * 128


def _loss_and_grads(model, params, inputs, targets):
  """Mean next-token loss and its gradients, vmapped over an ensemble of models (the train
  step's path: ``targets_BxT`` given, no internals)."""

  def one(p, x, y):
    return jax.value_and_grad(lambda q: model.apply({"params": q}, x, targets_BxT=y))(p)

  return jax.jit(jax.vmap(one))(params, inputs, targets)


def _relative_error(got, want) -> float:
  got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
  diff = sum(
    float(np.sum((np.asarray(g, np.float64) - np.asarray(w)) ** 2)) for g, w in zip(got, want)
  )
  return np.sqrt(diff / sum(float(np.sum(np.asarray(w) ** 2)) for w in want))


@pytest.mark.parametrize("pos", ["learned", "rotary"])
def test_fused_attention_train_step_equals_explicit_pattern(pos, monkeypatch):
  """jax.nn.dot_product_attention (the XLA implementation on CPU; cuDNN's is the same call on a
  GPU) gives the train step's loss and gradients of the explicit pattern. Tolerance, derived:
  both float32 paths round the same function differently, so each is compared with the float64
  explicit model (the truth up to ~1e-16), and the fused path must be as close to it as the
  explicit float32 path is, within a factor 4 (two orders of summation) above a floor of 16
  float32 ulps; a real difference (a dropped 1/sqrt(d_head), a mask off by one) is ~1e-2."""
  cfg = ModelConfig(**{**CFG.__dict__, "pos_encoding": pos})
  n_models, t = 2, 16
  keys = jax.random.split(jax.random.PRNGKey(7), n_models)
  tokens = jax.random.randint(jax.random.PRNGKey(8), (n_models, 3, t + 1), 0, cfg.vocab_size)
  inputs, targets = tokens[:, :, :-1], tokens[:, :, 1:]
  params = jax.vmap(lambda k: Transformer(cfg).init(k, inputs[0])["params"])(keys)
  explicit = _loss_and_grads(Transformer(cfg), params, inputs, targets)
  fused = _loss_and_grads(Transformer(cfg, attention="xla"), params, inputs, targets)
  with jax.enable_x64(True):
    cfg64 = ModelConfig(**{**cfg.__dict__, "dtype": "float64", "param_dtype": "float64"})
    params64 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), params)
    truth = jax.device_get(_loss_and_grads(Transformer(cfg64), params64, inputs, targets))
  floor = 16 * np.finfo(np.float32).eps
  for got, want, name in ((fused[0], truth[0], "loss"), (fused[1], truth[1], "gradients")):
    reference = _relative_error(explicit[0] if name == "loss" else explicit[1], want)
    assert _relative_error(got, want) <= 4 * reference + floor, name
  # The check can fail: the same call seeing the future (no causal mask) is far outside it.
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(
    jax.nn, "dot_product_attention", lambda *a, **k: real(*a, **{**k, "is_causal": False})
  )
  leaky = _loss_and_grads(Transformer(cfg, attention="xla"), params, inputs, targets)
  assert _relative_error(leaky[1], truth[1]) > 100 * (
    4 * _relative_error(explicit[1], truth[1]) + floor
  )
