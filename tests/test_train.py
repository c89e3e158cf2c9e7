import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.base import sharding
from ihsweep.compute import schedule, train
from ihsweep.compute.model import Transformer
from ihsweep.data import make_source
from ihsweep.training.runner import fit

# Equivalence tests run in float64 (jax_enable_x64, ModelConfig dtype float64). The claims —
# vmapped == one model at a time, sharded == one device, chunked == whole — are about program
# structure: each pair computes the same sums in a different order or blocking, so the results
# differ only by rounding. In float32 that rounding (~6e-8 per operation) differs between CPUs
# (AVX-512 or not changes XLA's reduction blocking) and Adam amplifies it over 20 updates to
# 1e-5..1e-4 relative, which made a float32 tolerance pass on one machine and fail on another.
# In float64 the same amplification leaves ~1e-14 (measured on the params: ≤ 1e-14 relative for
# all three equivalences, AMD EPYC), so RTOL = 1e-9 has five decades of margin above rounding on
# any CPU, while a real difference — another seed, or one model's learning rate changed by one
# part in 10^6 — moves the params by ~1e-6 and ~1 relative (checked in
# test_equivalence_tolerance_catches_real_differences).
RTOL = 1e-9


def _setup(cfg, devices):
  mcfg, tcfg = train.model_and_train_config(cfg)
  mcfg = dataclasses.replace(mcfg, dtype="float64", param_dtype="float64")
  model = train.training_model(mcfg, tcfg)
  source = make_source(cfg.data, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  mesh = sharding.make_mesh(cfg.ensemble.size, tcfg.batch_size, devices)
  return model, tcfg, source, mesh


def _train_ensemble(cfg, devices, seeds, lrs, vmap_chunk=0, metric="loss"):
  model, tcfg, source, mesh = _setup(cfg, devices)
  state = train.make_init_fn(model, tcfg, mesh)(jnp.asarray(seeds, jnp.int32))
  hp = train.HParams(peak_lr=jnp.asarray(lrs, jnp.float64), data=source.data_params(len(seeds)))
  metrics = []
  for k in schedule.calls(tcfg.num_steps, tcfg.steps_per_call):
    state, m = train.make_ensemble_train_fn(model, tcfg, source.sample, mesh, k, vmap_chunk)(
      state, hp, source.arrays()
    )
    metrics.append(m[metric] if isinstance(metric, str) else np.stack([m[n] for n in metric]))
  return state, np.concatenate(metrics, axis=-2)


def _tree_errors(a, b) -> dict:
  """Per leaf, ``‖a − b‖ / ‖b‖`` (relative to the leaf's norm: elementwise relative error is
  meaningless for entries near zero, which Adam moves by ~lr regardless of their size)."""
  errors = {}
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if "qkv']['bias" in jax.tree_util.keystr(path):
      # The key bias shifts every score of a row equally, so softmax cancels it: its true
      # gradient is 0 and Adam turns the rounding noise there into lr-sized random steps.
      x, y = np.delete(x, 1, axis=-3), np.delete(y, 1, axis=-3)  # [..., 3, H, K]
    errors[jax.tree_util.keystr(path)] = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-300)
  return errors


def _assert_trees_close(a, b, rtol=RTOL):
  worst = max(_tree_errors(a, b).items(), key=lambda kv: kv[1])
  assert worst[1] <= rtol, worst


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


def test_vmapped_ensemble_equals_models_trained_alone(tiny, x64):
  cfg = tiny(**{"ensemble.size": 3})
  seeds, lrs = [5, 6, 7], [1e-3, 3e-3, 1e-2]
  ens_state, ens_loss = _train_ensemble(cfg, jax.devices()[:1], seeds, lrs)
  model, tcfg, source, _ = _setup(cfg, jax.devices()[:1])
  step = jax.jit(lambda s, hp, tok: train.train_step(s, hp, tok, model=model, tcfg=tcfg))
  for i, (seed, lr) in enumerate(zip(seeds, lrs)):
    state = train.init_state(seed, model, tcfg)
    hp = train.HParams(peak_lr=jnp.float64(lr), data={})
    for t in range(tcfg.num_steps):
      tokens = source.sample(jax.random.fold_in(state.data_key, t), {}, source.arrays())
      state, m = step(state, hp, tokens)
      np.testing.assert_allclose(m["loss"], ens_loss[t, i], rtol=RTOL)
    one = jax.tree_util.tree_map(lambda x: x[i], ens_state)
    assert one.params["embed"]["embedding"].dtype == np.float64
    _assert_trees_close(one.params, state.params)
    assert int(one.step) == tcfg.num_steps == 20
  # Different learning rates really gave different models.
  assert not np.allclose(ens_loss[-1, 0], ens_loss[-1, 2])


def test_equivalence_tolerance_catches_real_differences(tiny, x64):
  """The tolerance of the equivalence tests fails for a real difference: another seed, or one
  model's peak learning rate off by one part in a million."""
  cfg = tiny(**{"ensemble.size": 2})
  base, _ = _train_ensemble(cfg, jax.devices()[:1], [0, 1], [2e-3, 2e-3])
  same, _ = _train_ensemble(cfg, jax.devices()[:1], [0, 1], [2e-3, 2e-3])
  _assert_trees_close(same.params, base.params, rtol=0.0)  # deterministic on one device
  for seeds, lrs in (([0, 2], [2e-3, 2e-3]), ([0, 1], [2e-3, 2e-3 * (1 + 1e-6)])):
    other, _ = _train_ensemble(cfg, jax.devices()[:1], seeds, lrs)
    errors = _tree_errors(other.params, base.params)
    assert max(errors.values()) > 100 * RTOL, (seeds, lrs, max(errors.values()))
    with pytest.raises(AssertionError):
      _assert_trees_close(other.params, base.params)


@pytest.mark.parametrize(
  "n_models,batch,expect", [(4, 8, (4, 1)), (2, 8, (2, 2)), (3, 8, (1, 4)), (6, 2, (2, 2))]
)
def test_mesh_shape_rule(n_models, batch, expect):
  assert sharding.mesh_shape(n_models, batch, 4) == expect


def test_mesh_refuses_to_idle_devices():
  with pytest.raises(sharding.MeshError, match="E = 3 and batch size B = 6"):
    sharding.mesh_shape(3, 6, 4)


@pytest.mark.parametrize("n_models", [4, 3])  # (ensemble 4, data 1) and (ensemble 1, data 4)
def test_sharded_over_four_devices_equals_one_device(tiny, x64, n_models):
  assert len(jax.devices()) == 4
  cfg = tiny(**{"ensemble.size": n_models})
  seeds, lrs = list(range(n_models)), [2e-3] * n_models
  one_state, one_loss = _train_ensemble(cfg, jax.devices()[:1], seeds, lrs)
  four_state, four_loss = _train_ensemble(cfg, jax.devices(), seeds, lrs)
  assert len(four_state.params["embed"]["embedding"].sharding.device_set) == 4
  np.testing.assert_allclose(one_loss, four_loss, rtol=RTOL)
  _assert_trees_close(one_state.params, four_state.params)


def test_vmap_chunks_do_not_change_results(tiny, x64):
  """E = 8 on 4 devices is 2 models per device: vmapped together (chunk 2) or one at a time."""
  cfg = tiny(**{"ensemble.size": 8, "train.num_steps": 10})
  seeds, lrs = list(range(8)), np.linspace(1e-3, 8e-3, 8)
  whole, whole_loss = _train_ensemble(cfg, jax.devices(), seeds, lrs, vmap_chunk=2)
  chunked, chunked_loss = _train_ensemble(cfg, jax.devices(), seeds, lrs, vmap_chunk=1)
  assert chunked_loss.shape == (10, 8)
  np.testing.assert_allclose(whole_loss, chunked_loss, rtol=RTOL)
  _assert_trees_close(whole.params, chunked.params)
  assert len(chunked.params["embed"]["embedding"].sharding.device_set) == 4


ARCHITECTURES = [  # between them every model choice: learned/rotary, tied/untied, MLP or not
  {"model.pos_encoding": "learned", "model.tie_embeddings": True, "model.d_mlp": 64},
  {"model.pos_encoding": "rotary", "model.tie_embeddings": False, "model.d_mlp": 0},
]


def _accumulation_run(cfg, **train_fields):
  """Two models, 6 updates in one call (one compile), on 2 devices (E = 2 over the ensemble
  axis): params, optimizer state and per-update (loss, grad_norm)."""
  cfg = cfg.copy_and_resolve_references()
  cfg.train.update(num_steps=6, steps_per_call=6, **train_fields)
  return _train_ensemble(cfg, jax.devices()[:2], [3, 4], [3e-3, 1e-2], metric=("loss", "grad_norm"))


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: "-".join(map(str, a.values())))
def test_gradient_accumulation_equals_one_update_on_the_whole_batch(tiny, x64, arch):
  """k ∈ {2, 4} microbatches of B/k = 4, 2 sequences equal k = 1 on B = 8 after 6 updates:
  params, Adam state, loss and gradient norm (float64, RTOL); k = 2 with block
  rematerialisation too."""
  cfg = tiny(**arch)
  whole, whole_m = _accumulation_run(cfg, gradient_accumulation_steps=1)
  assert whole_m.shape == (2, 6, 2)  # (loss, grad_norm) × updates × models
  for fields in (
    {"gradient_accumulation_steps": 4},
    {"gradient_accumulation_steps": 2, "remat": "blocks"},
  ):
    acc, acc_m = _accumulation_run(cfg, **fields)
    np.testing.assert_allclose(acc_m, whole_m, rtol=RTOL, err_msg=str(fields))
    _assert_trees_close(acc.params, whole.params)
    _assert_trees_close(acc.opt_state, whole.opt_state)


def test_gradient_accumulation_over_a_data_sharded_batch(tiny, x64):
  """E = 1 on 4 devices: B = 8 split over the 'data' axis; k = 2 microbatches of 4 rows keep
  one row per device each (rows j, j + k, …) and equal k = 1 sharded and on one device."""
  cfg = tiny(**{"ensemble.size": 1, "train.num_steps": 6, "train.steps_per_call": 6})
  one, one_loss = _train_ensemble(cfg, jax.devices()[:1], [7], [1e-2])
  cfg.train.gradient_accumulation_steps = 2
  four, four_loss = _train_ensemble(cfg, jax.devices(), [7], [1e-2])
  assert len(four.params["embed"]["embedding"].sharding.device_set) == 4
  np.testing.assert_allclose(four_loss, one_loss, rtol=RTOL)
  _assert_trees_close(four.params, one.params)


def test_a_wrongly_weighted_accumulation_fails(tiny, x64, monkeypatch):
  """The comparison above catches a real error: microbatch j's gradient weighted by
  2(j + 1)/(k + 1) (weights averaging 1, as a mean of means weighted by the wrong counts)."""
  cfg = tiny(**ARCHITECTURES[0])
  whole, whole_m = _accumulation_run(cfg, gradient_accumulation_steps=1)
  real = train.accumulated_value_and_grad

  def weighted_wrongly(loss_fn, params, tokens, k):
    def weighted(p, tokens_k):  # tokens_k: one microbatch; its index from a counter
      weighted.j += 1
      return loss_fn(p, tokens_k) * (2.0 * weighted.j / (k + 1))

    weighted.j = 0
    micro = jnp.swapaxes(tokens.reshape((tokens.shape[0] // k, k) + tokens.shape[1:]), 0, 1)
    out = [jax.value_and_grad(weighted)(params, micro[j]) for j in range(k)]
    loss = sum(o[0] for o in out) / k
    return loss, jax.tree_util.tree_map(lambda *g: sum(g) / k, *[o[1] for o in out])

  monkeypatch.setattr(train, "accumulated_value_and_grad", weighted_wrongly)
  wrong, wrong_m = _accumulation_run(cfg, gradient_accumulation_steps=2)
  monkeypatch.setattr(train, "accumulated_value_and_grad", real)
  with pytest.raises(AssertionError):
    _assert_trees_close(wrong.params, whole.params)
  assert not np.allclose(wrong_m[1], whole_m[1], rtol=RTOL)  # the gradient norms


def test_gradient_accumulation_must_divide_b():
  params = {"w": jnp.zeros(3)}
  with pytest.raises(ValueError, match="gradient_accumulation_steps = 3 must divide B = 8"):
    train.accumulated_value_and_grad(lambda p, t: jnp.sum(p["w"]), params, jnp.zeros((8, 5)), 3)


def test_auto_vmap_chunk():
  ref = train.TrainConfig(batch_size=16, context_size=128)
  assert train.auto_vmap_chunk(16, ref, 4096, backend="cpu") == 1  # 32 MiB of logits
  tiny = train.TrainConfig(batch_size=8, context_size=64)
  assert train.auto_vmap_chunk(16, tiny, 512, backend="cpu") == 2  # 1 MiB per model
  assert train.auto_vmap_chunk(3, tiny, 512, backend="cpu") == 1
  assert train.auto_vmap_chunk(16, ref, 4096, backend="gpu") == 16


def test_loss_falls_on_a_learnable_source(tiny, tmp_path):
  cfg = tiny(
    **{
      "train.num_steps": 200,
      "train.steps_per_call": 50,
      "train.lr": 1e-2,
      "data.source": "markov_chain",
      "ensemble.size": 2,
    }
  )
  out = fit(cfg, str(tmp_path), progress=False)
  rows = [line for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
  assert len(rows) == 4
  source = make_source(cfg.data, 64, 8, 32)
  floor = source.entropy_rate()  # ≤ ln 4 ≈ 1.39 nats; ln 64 ≈ 4.16 at the start
  assert np.all(out.losses < np.log(64) - 2.0), out.losses
  assert np.all(out.losses < floor + 0.6), (out.losses, floor)
  assert (tmp_path / "config.json").exists()


def test_schedules():
  tcfg = train.TrainConfig(num_steps=1000, warmup_frac=0.01)
  cos = train.schedule_shape(tcfg)
  assert float(cos(0)) == 0.0 and float(cos(10)) == pytest.approx(1.0)
  assert float(cos(505)) == pytest.approx(0.5, abs=0.01) and float(cos(1000)) == pytest.approx(0)
  const = train.schedule_shape(train.TrainConfig(num_steps=1000, schedule="constant"))
  assert float(const(5)) == pytest.approx(0.5) and float(const(900)) == 1.0
  inv = train.schedule_shape(train.TrainConfig(num_steps=1000, schedule="inverse_sqrt"))
  assert float(inv(10)) == pytest.approx(1.0) and float(inv(40)) == pytest.approx(0.5)


def test_calls_cover_the_run():
  assert schedule.calls(120, 50) == [50, 50, 20]
  assert schedule.calls(100, 50, done=50) == [50]


def test_an_on_device_training_call_makes_no_implicit_transfers(tiny):
  """Under ``jax.transfer_guard('disallow')`` a compiled training call whose inputs are already
  on the device runs: no hidden host round trip (a Python scalar, a numpy array, a ``float()`` of
  a device value) inside the call. The same call with a host numpy input is refused, so the
  guard is live."""
  cfg = tiny(**{"train.steps_per_call": 5})
  mcfg, tcfg = train.model_and_train_config(cfg)
  model = Transformer(mcfg)
  source = make_source(cfg.data, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  mesh = sharding.make_mesh(cfg.ensemble.size, tcfg.batch_size, jax.devices()[:1])
  state = train.make_init_fn(model, tcfg, mesh)(jnp.asarray([0, 1], jnp.int32))
  host_hp = train.HParams(
    peak_lr=np.full(2, 1e-3, np.float32), data=source.data_params(cfg.ensemble.size)
  )
  hp, arrays = jax.device_put((host_hp, source.arrays()), jax.devices()[0])
  fn = train.make_ensemble_train_fn(model, tcfg, source.sample, mesh, 5)
  state, _ = fn(state, hp, arrays)  # compiles
  with jax.transfer_guard("disallow"):
    state, metrics = fn(state, hp, arrays)
    jax.block_until_ready((state, metrics))
    with pytest.raises(Exception, match="[Dd]isallowed"):
      fn(state, host_hp, arrays)
  assert np.isfinite(np.asarray(metrics["loss"])).all()


def test_the_train_steps_attention_is_resolved_for_the_devices(monkeypatch):
  """'auto' is cuDNN's flash attention on a GPU where the shapes allow and cuDNN is found, XLA's
  implementation on TPUs, the explicit pattern elsewhere; 'cudnn' where it cannot run is
  refused with why."""
  from ihsweep.compute.model import ModelConfig

  study = ModelConfig(n_heads=8, d_model=768, dtype="bfloat16")  # head dimension 96
  monkeypatch.setattr(train, "cudnn_available", lambda: True)
  assert train.resolve_attention("auto", study, "gpu") == "cudnn"
  assert train.resolve_attention("auto", study, "cpu") == "explicit"
  assert train.resolve_attention("auto", study, "tpu") == "xla"
  float32 = ModelConfig(n_heads=8, d_model=768, dtype="float32")
  assert train.resolve_attention("auto", float32, "gpu") == "explicit"
  odd_heads = ModelConfig(n_heads=12, d_model=60, dtype="bfloat16")  # head dimension 5
  assert train.resolve_attention("auto", odd_heads, "gpu") == "explicit"
  assert train.resolve_attention("xla", float32, "cpu") == "xla"
  with pytest.raises(ValueError, match="cuDNN runs on GPUs and these devices are tpu"):
    train.resolve_attention("cudnn", study, "tpu")
  with pytest.raises(ValueError, match="head dimension d_model / n_heads = 5"):
    train.resolve_attention("cudnn", odd_heads, "gpu")
  volta = types.SimpleNamespace(platform="gpu", compute_capability="7.0")
  hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
  assert train.resolve_attention("auto", study, hopper) == "cudnn"
  assert train.resolve_attention("auto", study, volta) == "explicit"
  with pytest.raises(ValueError, match="needs compute capability 8.0 and these GPUs have 7.0"):
    train.resolve_attention("cudnn", study, volta)
  monkeypatch.setattr(train, "cudnn_available", lambda: False)
  assert train.resolve_attention("auto", study, "gpu") == "explicit"
  with pytest.raises(ValueError, match="JAX finds no cuDNN library"):
    train.resolve_attention("cudnn", study, hopper)
  assert train.training_model(study, train.TrainConfig(attention="xla")).attention == "xla"
  assert train.training_model(study, train.TrainConfig(attention="auto")).attention == "explicit"


def test_an_early_stop_keeps_the_learning_rate_of_the_full_budget(tiny, x64):
  """A model whose training stops at update 8 of a schedule over 24 (``train.schedule_steps``)
  trains, at each of its 8 updates, at exactly the learning rate of the same model trained to
  24 (the schedule's values, and so the losses: float64); a schedule over its 8 updates alone
  (before ``schedule_steps``) differs from the first update on (warmup over 1% of 8 vs 24)."""
  full = tiny(**{"train.num_steps": 24, "train.steps_per_call": 8, "train.warmup_frac": 0.25})
  stopped = tiny(**{"train.num_steps": 8, "train.steps_per_call": 8, "train.warmup_frac": 0.25,
                    "train.schedule_steps": 24})  # fmt: skip
  short = tiny(**{"train.num_steps": 8, "train.steps_per_call": 8, "train.warmup_frac": 0.25})
  lr = {}
  for name, cfg in (("full", full), ("stopped", stopped), ("short", short)):
    tcfg = train.model_and_train_config(cfg)[1]
    lr[name] = np.asarray([train.schedule_shape(tcfg)(t) for t in range(8)])
  np.testing.assert_array_equal(lr["stopped"], lr["full"])  # exactly, at every trained update
  assert lr["full"][1] > 0 and np.all(np.abs(lr["short"][1:] - lr["full"][1:]) > 1e-3)
  seeds, lrs = [3, 4], [3e-3, 1e-2]
  _, full_loss = _train_ensemble(full, jax.devices()[:1], seeds, lrs)
  _, stopped_loss = _train_ensemble(stopped, jax.devices()[:1], seeds, lrs)
  _, short_loss = _train_ensemble(short, jax.devices()[:1], seeds, lrs)
  np.testing.assert_allclose(stopped_loss, full_loss[:8], rtol=1e-12)
  assert np.max(np.abs(short_loss[2:] - full_loss[2:8]) / full_loss[2:8]) > 1e-6
