"""ihsweep.runs.export: a model in TransformerLens (HookedTransformer) and Hugging Face (GPT-2),
cross-checked against code we did not write.

Each architecture ihsweep trains (learned or rotary positions × attention-only or with MLPs ×
tied or untied embeddings) is exported with every parameter perturbed away from its init
(biases and LayerNorms nonzero, so a dropped bias shows), a non-default ``ln_eps`` and
``rotary_base`` (so a default used by mistake shows), and its logits compared with ihsweep's
own forward (``ihsweep.compute.model.Transformer``) on random tokens:

* float64 (jax_enable_x64, torch float64): to 1e-9. Both sides compute the same function in
  double precision; what differs is the order of summation (XLA's dots vs torch's BLAS), whose
  rounding is ~1e-16 relative per operation (measured: ≤ 1e-14 on logits of size ~5).
* float32: to 1e-4 absolute on logits of size ~5. float32 rounds at ~1e-7 relative per
  operation; over sums of ≤ 32 terms, two layers, LayerNorms and softmaxes, different
  summation orders differ by ~1e-6; 1e-4 leaves margin for other CPUs' kernels and lies far
  below what a wrong mapping changes (``test_a_wrong_export_fails``: > 1e-2).

The induction-head test trains configs/induction.py (one model, ~1 minute on the CPU) and
compares TransformerLens's own attention patterns (``run_with_cache``) and induction-head
detector (``head_detector.detect_head``) with ihsweep's prefix-matching score head by head.
"""

import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The interop extra, looked up without importing it: torch and TransformerLens take ~5 s to
# import, which every pytest-xdist worker would pay while collecting.
pytestmark = pytest.mark.skipif(
  not all(importlib.util.find_spec(m) for m in ("torch", "transformer_lens", "transformers")),
  reason="the interop extra: pip install 'ihsweep[interop]'",
)


class _Torch:
  """torch, imported by the first test that uses it."""

  def __getattr__(self, name):
    if name.startswith("_"):  # pytest's probes while collecting (_mock_name, __wrapped__, …)
      raise AttributeError(name)
    import torch

    return getattr(torch, name)


torch = _Torch()

from ihsweep.commands import flags  # noqa: E402
from ihsweep.runs import export  # noqa: E402

VARIANTS = list(itertools.product(("learned", "rotary"), (0, 24), (True, False)))
IDS = [f"{p}-{'mlp' if m else 'attn_only'}-{'tied' if t else 'untied'}" for p, m, t in VARIANTS]
F64_TOL = 1e-9
F32_TOL = 1e-4
V, T = 23, 12


def _model(pos, d_mlp, tie, dtype="float32", seed=0):
  """(params, ModelConfig) of a 2-layer, 2-head, d_model 16 model with every leaf perturbed
  (N(0, 0.3²) added: nonzero biases, LayerNorm scales away from 1)."""
  import jax

  from ihsweep.compute.model import ModelConfig, Transformer

  cfg = ModelConfig(
    n_layers=2,
    n_heads=2,
    d_model=16,
    d_mlp=d_mlp,
    vocab_size=V,
    max_context=T,
    pos_encoding=pos,
    tie_embeddings=tie,
    dtype=dtype,
    param_dtype=dtype,
    rotary_base=100.0,  # not the default 10,000: a default used by mistake shows
    ln_eps=1e-2,  # not the default 1e-5, and large enough to matter at these scales
  )
  params = Transformer(cfg).init(jax.random.PRNGKey(seed), np.zeros((1, T), np.int32))["params"]
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  leaves = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(tree, leaves), cfg


def _tokens(seed=0, b=3):
  return np.random.RandomState(seed).randint(0, V, (b, T)).astype(np.int32)


def _ihsweep(params, cfg, tokens, internals=False):
  from ihsweep.compute.model import Transformer

  out = Transformer(cfg).apply({"params": params}, tokens, return_internals=internals)
  if internals:
    return np.asarray(out[0]), {k: np.asarray(v) for k, v in out[1].items()}
  return np.asarray(out)


def _tl_logits(model, tokens):
  with torch.no_grad():
    return model(torch.from_numpy(tokens).long()).numpy()


def _hf_logits(model, tokens):
  with torch.no_grad():
    return model(torch.from_numpy(tokens).long()).logits.numpy()


def test_import_ihsweep_and_export_stays_free_of_torch():
  code = (
    "import sys, ihsweep, ihsweep.runs.export, ihsweep.cli, ihsweep.runs.notebook; "
    "print(sorted(m for m in ('torch', 'transformer_lens', 'transformers') if m in sys.modules))"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
  )
  assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("pos,d_mlp,tie", VARIANTS, ids=IDS)
def test_float64_logits_and_internals_equal_ihsweep(pos, d_mlp, tie):
  import jax

  with jax.enable_x64(True):
    params, cfg = _model(pos, d_mlp, tie, "float64")
    tokens = _tokens()
    ref, internals = _ihsweep(params, cfg, tokens, internals=True)
    tl = export.to_transformer_lens(params, cfg, dtype="float64")
    assert tl.cfg.attn_only == (d_mlp == 0)
    assert tl.cfg.positional_embedding_type == ("standard" if pos == "learned" else "rotary")
    with torch.no_grad():
      logits, cache = tl.run_with_cache(torch.from_numpy(tokens).long())
    assert logits.dtype == torch.float64
    np.testing.assert_allclose(logits.numpy(), ref, rtol=0, atol=F64_TOL)
    for layer in range(cfg.n_layers):  # attention patterns [B, H, T, T], z [B, T, H, K]
      np.testing.assert_allclose(
        cache["pattern", layer].numpy(), internals["attn"][layer], rtol=0, atol=F64_TOL
      )
      np.testing.assert_allclose(
        cache["z", layer].numpy(), internals["z"][layer], rtol=0, atol=F64_TOL
      )
    np.testing.assert_allclose(
      cache["resid_post", cfg.n_layers - 1].numpy(), internals["resid_final"], atol=F64_TOL
    )
    if pos == "learned" and d_mlp:
      hf = export.to_hf(params, cfg, dtype="float64")
      np.testing.assert_allclose(_hf_logits(hf, tokens), ref, rtol=0, atol=F64_TOL)
      assert (hf.lm_head.weight is hf.transformer.wte.weight) == tie
    else:  # GPT-2 cannot hold it: refused, naming the field and its value
      with pytest.raises(export.ExportError) as e:
        export.to_hf(params, cfg)
      field = "model.pos_encoding = 'rotary'" if pos == "rotary" else "model.d_mlp = 0"
      assert field in str(e.value) and "--to=transformer_lens" in str(e.value)


@pytest.mark.parametrize("pos,d_mlp,tie", VARIANTS, ids=IDS)
def test_float32_logits_equal_ihsweep(pos, d_mlp, tie):
  params, cfg = _model(pos, d_mlp, tie, "float32", seed=3)
  tokens = _tokens(seed=4)
  ref = _ihsweep(params, cfg, tokens)
  assert np.abs(ref).max() > 1  # logits of size ~5: the tolerance is meaningful
  tl = export.to_transformer_lens(params, cfg)
  np.testing.assert_allclose(_tl_logits(tl, tokens), ref, rtol=0, atol=F32_TOL)
  if pos == "learned" and d_mlp:
    np.testing.assert_allclose(_hf_logits(export.to_hf(params, cfg), tokens), ref, atol=F32_TOL)


def test_bfloat16_params_export_exactly():
  """bfloat16 storage → float32 is exact: the export computes ihsweep's float32 forward."""
  import dataclasses

  import jax
  import jax.numpy as jnp

  params, cfg = _model("rotary", 24, False)
  bf = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
  cfg_bf = dataclasses.replace(cfg, param_dtype="bfloat16")
  f32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), bf)
  tokens = _tokens()
  tl = export.to_transformer_lens(bf, cfg_bf)
  np.testing.assert_allclose(_tl_logits(tl, tokens), _ihsweep(f32, cfg, tokens), atol=F32_TOL)


def _max_diff_with(monkeypatch, mutate, pos="rotary", d_mlp=24, tie=False, to="tl"):
  """Largest logit difference between ihsweep and an export whose mapping ``mutate`` broke."""
  params, cfg = _model(pos, d_mlp, tie, seed=5)
  tokens = _tokens(seed=6)
  ref = _ihsweep(params, cfg, tokens)
  with monkeypatch.context() as m:
    mutate(m)
    if to == "tl":
      got = _tl_logits(export.to_transformer_lens(params, cfg), tokens)
    else:
      got = _hf_logits(export.to_hf(params, cfg), tokens)
  return float(np.abs(got - ref).max())


def _patch_state_dict(m, name, fn):
  orig = getattr(export, name)

  def patched(params, cfg):
    return fn(dict(orig(params, cfg)))

  m.setattr(export, name, patched)


def _patch_config(m, name, **changes):
  orig = getattr(export, name)
  m.setattr(export, name, lambda *a, **k: {**orig(*a, **k), **changes})


def _swap(sd, a, b):
  sd[a], sd[b] = sd[b], sd[a]
  return sd


def _zero(sd, name):
  sd[name] = np.zeros_like(sd[name])
  return sd


@pytest.mark.parametrize(
  "case",
  [
    "swap_q_k",
    "drop_b_v",
    "drop_b_o",
    "adjacent_rotary_pairs",
    "default_rotary_base",
    "default_ln_eps",
    "drop_ln_final_bias",
    "hf_swap_q_k",
    "hf_drop_c_attn_bias",
    "hf_default_ln_eps",
  ],
)
def test_a_wrong_export_fails(monkeypatch, case):
  """Each mistake a mapping could make moves the logits far beyond the tolerances above, so the
  equality tests would catch it."""
  sd = "transformer_lens_state_dict"
  hsd = "hf_state_dict"
  mutate, kw = {
    "swap_q_k": (lambda m: _patch_state_dict(m, sd, lambda d: _swap(d, *_qk("blocks.0"))), {}),
    "drop_b_v": (lambda m: _patch_state_dict(m, sd, lambda d: _zero(d, "blocks.1.attn.b_V")), {}),
    "drop_b_o": (lambda m: _patch_state_dict(m, sd, lambda d: _zero(d, "blocks.0.attn.b_O")), {}),
    "adjacent_rotary_pairs": (
      lambda m: _patch_config(m, "transformer_lens_config", rotary_adjacent_pairs=True),
      {},
    ),
    "default_rotary_base": (
      lambda m: _patch_config(m, "transformer_lens_config", rotary_base=10000.0),
      {},
    ),
    "default_ln_eps": (lambda m: _patch_config(m, "transformer_lens_config", eps=1e-5), {}),
    "drop_ln_final_bias": (
      lambda m: _patch_state_dict(m, sd, lambda d: _zero(d, "ln_final.b")),
      {},
    ),
    "hf_swap_q_k": (
      lambda m: _patch_state_dict(m, hsd, _hf_swap_q_k),
      dict(pos="learned", to="hf"),
    ),
    "hf_drop_c_attn_bias": (
      lambda m: _patch_state_dict(m, hsd, lambda d: _zero(d, "transformer.h.0.attn.c_attn.bias")),
      dict(pos="learned", to="hf"),
    ),
    "hf_default_ln_eps": (
      lambda m: _patch_config(m, "hf_config", layer_norm_epsilon=1e-5),
      dict(pos="learned", to="hf"),
    ),
  }[case]
  assert _max_diff_with(monkeypatch, mutate, **kw) > 100 * F32_TOL


def _qk(block):
  return f"{block}.attn.W_Q", f"{block}.attn.W_K"


def _hf_swap_q_k(sd):
  w = sd["transformer.h.0.attn.c_attn.weight"]
  d = w.shape[0]
  sd["transformer.h.0.attn.c_attn.weight"] = np.concatenate(
    [w[:, d : 2 * d], w[:, :d], w[:, 2 * d :]], 1
  )
  return sd


def test_the_extra_missing_says_how_to_install(monkeypatch):
  params, cfg = _model("learned", 24, True)
  monkeypatch.setitem(sys.modules, "transformer_lens", None)  # import raises ModuleNotFoundError
  with pytest.raises(ModuleNotFoundError, match=r"pip install 'ihsweep\[interop\]'"):
    export.to_transformer_lens(params, cfg)


# ------------------------------------------------------------------ runs: CLI and notebook


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  """`ihsweep run` over model.pos_encoding ∈ {learned, rotary}, one seed each: cell 0 learned,
  cell 1 rotary (groups g000, g001), 10 updates, params saved at 0 and 10."""
  from ihsweep.configuration import axes as axes_lib
  from ihsweep.workers import sweep

  cfg = tiny_config(
    **{
      "train.num_steps": 10,
      "train.steps_per_call": 5,
      "sweep.seeds": 1,
      "ensemble.size": 1,
      "eval.every_steps": 10,
      "eval.n_probes": 4,
      "eval.n_sequences": 2,
      "checkpoint.params_schedule": "none",
      "checkpoint.state_every_steps": 0,
    }
  )
  axes_lib.add_axes(cfg, ["model.pos_encoding=learned,rotary"])
  workdir = str(tmp_path_factory.mktemp("export") / "sweep")
  sweep.run(cfg, workdir, progress=False)
  return workdir


def _cli(*args):
  from ihsweep import cli

  flags.FLAGS.unparse_flags()  # flags set by an earlier in-process call must not carry over
  try:
    return cli.main(["ihsweep", "export", *args])
  finally:
    flags.FLAGS.unparse_flags()


def test_run_layout(swept):
  import ihsweep

  run = ihsweep.load_run(swept)
  assert [run.model_config(c).pos_encoding for c in run.cell_ids] == ["learned", "rotary"]
  assert run.steps(0) == run.steps(1) == [0, 10]


def test_cli_export_to_transformer_lens_then_load(swept, tmp_path, capsys):
  import ihsweep

  out = tmp_path / "cell1.pt"
  assert _cli(f"--workdir={swept}", "--cell=1", "--to=transformer_lens", f"--out={out}") == 0
  assert f"at step 10 of {swept} to {out}" in capsys.readouterr().out  # default: the last step
  model = export.load_transformer_lens(out)
  tokens = _tokens(b=2) % 64
  ref = ihsweep.load_run(swept).model(1, 10)(tokens)
  np.testing.assert_allclose(_tl_logits(model, tokens), ref, rtol=0, atol=F32_TOL)
  # by hand, as the README says: HookedTransformer(cfg); load_state_dict
  from transformer_lens import HookedTransformer

  blob = torch.load(out)
  assert blob["ihsweep"]["cell"] == 1 and blob["ihsweep"]["step"] == 10
  assert blob["ihsweep"]["ihsweep_model_config"]["pos_encoding"] == "rotary"
  again = HookedTransformer(blob["cfg"])
  again.load_state_dict(blob["state_dict"])
  np.testing.assert_allclose(_tl_logits(again.eval(), tokens), ref, rtol=0, atol=F32_TOL)


def test_cli_export_to_hf_at_a_step(swept, tmp_path, capsys):
  from transformers import GPT2LMHeadModel

  import ihsweep

  out = tmp_path / "hf"
  assert _cli(f"--workdir={swept}", "--cell=0", "--step=0", "--to=hf", f"--out={out}") == 0
  assert "at step 0" in capsys.readouterr().out
  assert json.loads((out / "ihsweep_source.json").read_text())["step"] == 0
  model = GPT2LMHeadModel.from_pretrained(out).eval()
  tokens = _tokens(b=2) % 64
  ref = ihsweep.load_run(swept).model(0, 0)(tokens)
  np.testing.assert_allclose(_hf_logits(model, tokens), ref, rtol=0, atol=F32_TOL)


def test_cli_refuses_bad_input_naming_the_flag(swept, tmp_path, capsys):
  out = tmp_path / "m.pt"
  good = [f"--workdir={swept}", "--to=transformer_lens", f"--out={out}"]
  cases = [
    ([f"--workdir={tmp_path}/missing", "--cell=0", *good[1:]], "--workdir=", "no such directory"),
    ([f"--workdir={tmp_path}", "--cell=0", *good[1:]], f"--workdir={tmp_path}", "run"),
    ([*good, "--cell=7"], "--cell=7", "valid cells: 0, 1"),
    ([*good, "--cell=0", "--step=5"], "--step=5", "saved steps: 0, 10"),
    (
      [*good[:1], "--cell=1", "--to=hf", f"--out={out}"],
      "--to=hf",
      "model.pos_encoding = 'rotary'",
    ),
    ([*good[:1], "--cell=0", "--to=onnx", f"--out={out}"], "--to=onnx", "transformer_lens"),
    ([good[0], "--cell=0", f"--out={out}"], "missing --to", "--to=transformer_lens|hf"),
    ([*good, "--cell=0", "--config=configs/default.py"], "--config is not a flag", "--cell=N"),
  ]
  for args, flag, allowed in cases:
    assert _cli(*args) == 2, args
    err = capsys.readouterr().err
    assert err.startswith("ihsweep: ") and flag in err and allowed in err, (args, err)
    assert len(err.strip().splitlines()) == 1, err
  assert not out.exists()
  # an existing --out is never overwritten, file or directory
  out.write_text("mine")
  assert _cli(*good, "--cell=0") == 2
  assert f"--out={out} exists" in capsys.readouterr().err and out.read_text() == "mine"
  (tmp_path / "d").mkdir()
  assert _cli(*good[:1], "--cell=0", "--to=hf", f"--out={tmp_path / 'd'}") == 2
  assert os.listdir(tmp_path / "d") == []
  assert sorted(os.listdir(tmp_path)) == ["d", "m.pt"]  # no temporary left behind


def test_cli_refuses_an_out_inside_the_run_or_unwritable(swept, tmp_path, capsys):
  """--out inside the run directory is refused (an hf directory under checkpoints/params/ was
  read as a checkpoint: every later load of the last step failed); an empty --out names
  --out; a write the OS refuses is one line naming --out, leaving nothing behind."""
  import ihsweep

  good = [f"--workdir={swept}", "--cell=0", "--to=hf"]
  inside = [
    os.path.join(swept, "groups", "g000", "checkpoints", "params", "99"),
    os.path.join(swept, "cell0-hf"),
    os.path.join(swept, "analysis"),
  ]
  os.makedirs(os.path.join(swept, "analysis"), exist_ok=True)
  os.rmdir(os.path.join(swept, "analysis"))  # absent, so the refusal is the inside rule's
  for out in inside:
    assert _cli(*good, f"--out={out}") == 2
    err = capsys.readouterr().err
    assert f"--out={out} is inside the run directory" in err and "analysis/export" in err
    assert "outside the run" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not os.path.lexists(out)
  assert ihsweep.load_run(swept).steps(0) == [0, 10]
  assert _cli(*good, "--out=") == 2
  err = capsys.readouterr().err
  assert err.startswith("ihsweep: --out=: a path to write to is needed"), err
  long_name = tmp_path / ("m" * 250)  # the name fits; its temporary beside it does not
  for to in ("hf", "transformer_lens"):
    assert _cli(*good[:2], f"--to={to}", f"--out={long_name}") == 2
    err = capsys.readouterr().err
    assert f"--out={long_name}: cannot be written (File name too long)" in err, err
    assert len(err.strip().splitlines()) == 1, err
  assert os.listdir(tmp_path) == []


def test_cli_default_out_is_under_the_runs_analysis(swept, tmp_path, capsys):
  """Without --out the export lands in RUN/analysis/export/ (named by cell and step); an --out
  there is allowed, elsewhere in analysis/ (the report's files, e.g. law.json) refused; a second
  export to the same default path is refused; an analysis/ that cannot be created, or resolves
  to elsewhere inside the run, is one line that creates nothing."""
  import ihsweep

  good = [f"--workdir={swept}", "--cell=1", "--to=transformer_lens"]
  folder = os.path.join(swept, "analysis", "export")
  try:
    assert _cli(*good) == 0
    out = os.path.join(folder, "cell1_step10.pt")
    assert f"to {out} (HookedTransformer file)" in capsys.readouterr().out
    assert os.path.isfile(out)
    assert _cli(*good) == 2
    assert f"--out not given: its default {out} exists" in capsys.readouterr().err
    mine = os.path.join(folder, "mine.pt")
    assert _cli(*good, "--step=0", f"--out={mine}") == 0 and os.path.isfile(mine)
    law = os.path.join(swept, "analysis", "law.json")
    assert _cli(*good, "--step=0", f"--out={law}") == 2
    assert "is inside the run directory" in capsys.readouterr().err and not os.path.exists(law)
    assert ihsweep.load_run(swept).steps(1) == [0, 10]  # the run still reads
  finally:
    shutil.rmtree(os.path.join(swept, "analysis"), ignore_errors=True)
  # analysis/ a symlink into the run's checkpoints: refused before anything is created there
  os.symlink(os.path.join(swept, "groups"), os.path.join(swept, "analysis"))
  try:
    assert _cli(*good) == 2
    err = capsys.readouterr().err
    assert "--out not given: its default folder" in err and "elsewhere inside the run" in err
    assert len(err.strip().splitlines()) == 1 and not os.path.exists(
      os.path.join(swept, "groups", "export")
    )
  finally:
    os.remove(os.path.join(swept, "analysis"))
  # analysis/ a file: the folder cannot be created
  (tmp_path / "blocker").write_text("")
  os.symlink(tmp_path / "blocker", os.path.join(swept, "analysis"))
  try:
    assert _cli(*good) == 2
    err = capsys.readouterr().err
    assert "cannot be created (Not a directory); give --out=PATH outside" in err, err
  finally:
    os.remove(os.path.join(swept, "analysis"))


def test_cli_damaged_checkpoint_is_one_line(swept, tmp_path, capsys):
  """A params checkpoint cut short after it was written: one line naming --step, the step and
  the steps that remain (was: orbax's 80-line traceback); the other steps still export."""
  import shutil

  import ihsweep
  from ihsweep.runs.notebook import CheckpointUnreadable

  copy = str(tmp_path / "run")
  shutil.copytree(swept, copy)
  data = os.path.join(copy, "groups", "g000", "checkpoints", "params", "10", "params", "d")
  for name in os.listdir(data):
    os.truncate(os.path.join(data, name), 10)
  out = tmp_path / "m.pt"
  for step_flag, flag in (([], "--step: step = 10"), (["--step=10"], "--step=10: step = 10")):
    assert (
      _cli(f"--workdir={copy}", "--cell=0", *step_flag, "--to=transformer_lens", f"--out={out}")
      == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"ihsweep: {flag}: cell 0 (group g000)"), err
    assert "cannot be read" in err and "other saved steps: 0" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists()
  with pytest.raises(CheckpointUnreadable, match="step = 10"):
    ihsweep.load_run(copy).model(0)
  assert (
    _cli(f"--workdir={copy}", "--cell=0", "--step=0", "--to=transformer_lens", f"--out={out}") == 0
  )
  assert export.load_transformer_lens(out).cfg.d_model == 32


def test_notebook_methods(swept, tmp_path):
  import ihsweep

  run = ihsweep.load_run(swept)
  tokens = _tokens(b=2) % 64
  ref = run.model(0)(tokens)
  np.testing.assert_allclose(_tl_logits(run.to_transformer_lens(0), tokens), ref, atol=F32_TOL)
  np.testing.assert_allclose(_hf_logits(run.to_hf(0), tokens), ref, atol=F32_TOL)
  with pytest.raises(export.ExportError, match="model.pos_encoding = 'rotary'"):
    run.to_hf(1)
  path = run.export(1, 0, to="transformer_lens", out=tmp_path / "r.pt")
  ref1 = run.model(1, 0)(tokens)
  np.testing.assert_allclose(
    _tl_logits(export.load_transformer_lens(path), tokens), ref1, atol=F32_TOL
  )
  from ihsweep.runs.notebook import StepNotSaved, UnknownCell

  with pytest.raises(UnknownCell, match="valid cells: 0, 1"):
    run.export(2, to="hf", out=tmp_path / "x")
  with pytest.raises(StepNotSaved, match="saved steps: 0, 10"):
    run.to_transformer_lens(0, 3)


# ------------------------------------------------------------------ a trained induction head


@pytest.fixture(scope="module")
def induction(tmp_path_factory):
  """configs/induction.py (2 attention-only layers, one head each, repeated random blocks),
  shrunk to 2 seeds × 1,000 updates (the warmup is the full config's 20 updates): in the runs
  measured here one of the two models formed an induction head (ps_max 0.6 at layer 1 from
  update ~600), the other not yet. Probes: 16 of block length L = 16 (2L = 32 < max_context
  64, as TransformerLens's detector needs).

  Trained by ``ihsweep train`` in a process of its own, compiled as users' programs are (not
  with the suite's fast-compile flags, conftest.CPU_COMPILE_FLAGS): this is the suite's one
  run whose time goes into computing, 1,000 updates, not compiling (CPU time on the 2-core
  Xeon: 52 s with XLA's default flags, 93 s at -O0)."""
  workdir = str(tmp_path_factory.mktemp("export") / "induction")
  overrides = {
    "ensemble.size": 2,
    "train.num_steps": 1000,
    "train.steps_per_call": 100,
    "train.warmup_frac": 0.02,
    "eval.every_steps": 500,
    "eval.n_probes": 16,
    "eval.probe_len": 16,
    "eval.probe_position": "start",
    "eval.n_sequences": 4,
    "checkpoint.params_schedule": "none",
    "checkpoint.state_every_steps": 0,
  }
  r = subprocess.run(
    [sys.executable, "-m", "ihsweep.cli", "train", "--config=configs/induction.py",
     f"--workdir={workdir}", "--noprogress", *(f"--config.{k}={v}" for k, v in overrides.items())],
    cwd=ROOT, capture_output=True, text=True, timeout=900,
    env={**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


def test_transformer_lens_finds_the_induction_head_ihsweep_measured(induction):
  """Head by head, on the run's own repeated-token probes (a block of L distinct ids, then the
  block again; no BOS):

  * exact: the prefix-matching score PS (mean over probes and second-block positions i of the
    attention from i to i − L + 1; ihsweep.compute.metrics.prefix_matching_score) computed from
    TransformerLens's attention pattern (``run_with_cache``, ``pattern``) equals PS from
    ihsweep's forward, and the PS the run recorded in metrics.jsonl at that step, to 1e-5
    (attention probabilities in [0, 1] rounded in float32 at ~1e-7);
  * TransformerLens's own detector, ``detect_head(model, probes, "induction_head")`` (defaults:
    ``error_measure='mul'``, no position excluded), scores the share of a head's attention on
    the positions whose previous token equals the current one: on these probes exactly the L
    pairs (i, i − L + 1), so its score is Σ_i attn[i, i − L + 1] / 2L = PS / 2 (the 2L rows
    each sum to 1), to 1e-5;
  * looser, the conclusion: the head with the largest detector score is the head ihsweep
    recorded as its ps_argmax, and a model whose ps_max passed 0.3 has an induction head by
    TransformerLens too (detector ≥ 0.15 = 0.3 / 2 there, the other heads ≤ 0.05).
  """
  from transformer_lens.head_detector import detect_head

  import ihsweep
  from ihsweep.compute.metrics import prefix_matching_score

  run = ihsweep.load_run(induction)
  last = run.metrics.groupby("cell").tail(1).set_index("cell")
  formed = []
  for cell in run.cell_ids:
    step = run.steps(cell)[-1]
    assert int(last.loc[cell, "step"]) == step
    probes = run.probes(cell)
    toks, L = probes.repeated, probes.block_len
    assert toks.shape == (16, 2 * L) and L == 16
    ps_ihsweep = np.asarray(
      prefix_matching_score(run.model(cell, step)(toks, return_internals=True)[1]["attn"], L)
    )
    np.testing.assert_allclose(ps_ihsweep, np.asarray(last.loc[cell, "ps"]), atol=1e-5)

    tl = run.to_transformer_lens(cell, step)
    with torch.no_grad():
      _, cache = tl.run_with_cache(torch.from_numpy(toks).long())
    i = np.arange(L, 2 * L)
    ps_tl = np.stack(
      [cache["pattern", layer].numpy()[:, :, i, i - L + 1].mean(axis=(0, 2)) for layer in (0, 1)]
    )
    np.testing.assert_allclose(ps_tl, ps_ihsweep, atol=1e-5)

    # TransformerLens's detector reads its tokens from strings: ids spelled "t<id>" here
    tl.to_tokens = lambda s, *a, **k: torch.tensor(
      [[int(w[1:]) for w in one.split()] for one in ([s] if isinstance(s, str) else s)]
    )
    seqs = [" ".join(f"t{t}" for t in row) for row in toks]
    score = detect_head(tl, seqs, "induction_head").numpy()
    np.testing.assert_allclose(2 * score, ps_ihsweep, atol=1e-5)

    best = np.unravel_index(np.argmax(score), score.shape)
    assert list(best) == list(last.loc[cell, "ps_argmax"])
    if last.loc[cell, "ps_max"] > 0.3:
      formed.append(cell)
      assert score[best] >= 0.15 and np.sort(score.ravel())[-2] <= 0.05, score
  assert formed, f"no model formed an induction head in 1,000 updates: {last['ps_max'].tolist()}"


def test_the_readme_example_runs(induction, capsys):
  """docs/analysis.md "Open a model in TransformerLens / Hugging Face": its Python block, as
  written but for the run (runs/demo → this 2-layer run of the classic induction task). The
  printed stripe is the prefix-matching score that ihsweep's own forward gives on the same
  tokens."""
  from ihsweep.compute.metrics import prefix_matching_score

  text = open(os.path.join(ROOT, "docs", "analysis.md")).read()
  block = text.split("<!-- export-example -->\n```python\n", 1)[1].split("```", 1)[0]
  assert '"runs/demo"' in block
  namespace = {}
  exec(compile(block.replace('"runs/demo"', repr(induction)), "analysis.md", "exec"), namespace)
  out = capsys.readouterr().out.strip()
  found = re.fullmatch(
    r"cell (\d): layer 1 induction stripe (\d\.\d\d) \(head 0\), next token of the repeat "
    r"(\d+)%",
    out,
  )
  assert found, out
  run, tokens = namespace["run"], namespace["tokens"].numpy()
  cell = int(found.group(1))
  _, internals = run.model(cell)(tokens[0], return_internals=True)
  ps = prefix_matching_score(np.asarray(internals["attn"])[:, None], 16)  # [layers, heads]
  assert abs(float(ps[1, 0]) - float(found.group(2))) <= 0.006, (ps, out)


def test_the_readme_export_command_names_the_demo_cell_it_says(
  swept, tmp_path, monkeypatch, python_docs_corpus
):
  """docs/analysis.md's `ihsweep export --workdir=runs/demo --cell=10 …` line: cell 10 of the
  demo's plan (configs/demo.py) is B 16 × C 64, seed 0, as it says; the line runs as written
  (on a tiny sweep as runs/demo, whose cells are 0 and 1: cell 10 → 1) and writes where its
  comment says."""
  import shlex

  from configs import demo
  from ihsweep.configuration import grid as grid_lib

  text = open(os.path.join(ROOT, "docs", "analysis.md")).read()
  line = text.split("<!-- export-command -->\n```bash\n", 1)[1].splitlines()[0]
  args = shlex.split(line, comments=True)
  assert args[:2] == ["ihsweep", "export"] and "--cell=10" in args and "--workdir=runs/demo" in args
  cell = grid_lib.make_plan(demo.get_config()).cells[10]
  assert (cell.cfg.train.batch_size, cell.cfg.train.context_size, cell.seed) == (16, 64, 0)
  assert "Cell 10 of the demo is B 16 × C 64, seed 0" in " ".join(text.split())
  os.makedirs(tmp_path / "runs")
  os.symlink(swept, tmp_path / "runs" / "demo")
  monkeypatch.chdir(tmp_path)
  try:
    assert _cli(*[a.replace("--cell=10", "--cell=1") for a in args[2:]]) == 0
    assert os.path.isfile(os.path.join(swept, "analysis", "export", "cell1_step10.pt"))
  finally:
    shutil.rmtree(os.path.join(swept, "analysis"), ignore_errors=True)


def test_cli_a_cell_whose_params_are_gone_names_the_cell_not_a_step(swept, tmp_path, capsys):
  """With no --step and the group's params/ removed: one line naming --cell and the missing
  directory, not a '--step=None' the user never gave."""
  import shutil

  copy = str(tmp_path / "run")
  shutil.copytree(swept, copy)
  shutil.rmtree(os.path.join(copy, "groups", "g001", "checkpoints", "params"))
  out = tmp_path / "m.pt"
  assert _cli(f"--workdir={copy}", "--cell=1", "--to=transformer_lens", f"--out={out}") == 2
  err = capsys.readouterr().err
  assert err.startswith("ihsweep: --cell=1: cell 1 (group g001) has no complete params"), err
  assert "groups/g001/checkpoints/params was removed" in err and "None" not in err, err
  assert len(err.strip().splitlines()) == 1 and not out.exists()
