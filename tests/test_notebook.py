"""The notebook API (ihsweep/runs/notebook.py): ihsweep.load_run on a tiny run and a tiny sweep."""

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_config

from ihsweep.data import corpus as corpus_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One attention-only layer, 2 models, 20 updates; evaluated at 0, 10 and 20; params saved on the
# log schedule (0, 1, 2, 3, 4, 6, 8, 11, 16, 20).
RUN = {
  "model.n_layers": 1,
  "model.d_mlp": 0,
  "train.num_steps": 20,
  "train.steps_per_call": 10,
  "train.lr": 1e-2,
  "eval.every_steps": 10,
  "eval.n_probes": 6,
  "eval.n_sequences": 4,
  "checkpoint.params_schedule": "log",
  "checkpoint.law_points_per_octave": 0,
  "checkpoint.state_every_steps": 0,
}
STEPS = [0, 1, 2, 3, 4, 6, 8, 11, 16, 20]


def _tree(path):
  """Every file and directory under ``path`` with its size and modification time."""
  out = {}
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      p = os.path.join(root, name)
      st = os.stat(p)
      out[os.path.relpath(p, path)] = (st.st_size, st.st_mtime_ns)
  return out


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  """`ihsweep train` of 2 models (cells 0 and 1)."""
  from ihsweep.training.runner import fit

  workdir = str(tmp_path_factory.mktemp("notebook") / "run")
  fit(tiny_config(**RUN), workdir, progress=False)
  return workdir


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  """`ihsweep run` over B ∈ {4, 8} × 2 seeds: cells 0, 1 (B 4) and 2, 3 (B 8) in two groups
  of 2 (g000 and g001, in the plan's order), 10 updates."""
  from ihsweep.configuration import axes as axes_lib
  from ihsweep.workers import sweep

  cfg = tiny_config(**{**RUN, "train.num_steps": 10, "sweep.seeds": 2})
  axes_lib.add_axes(cfg, ["train.batch_size=4,8"])
  workdir = str(tmp_path_factory.mktemp("notebook") / "sweep")
  sweep.run(cfg, workdir, progress=False)
  return workdir


def test_import_ihsweep_stays_cheap():
  code = (
    "import sys, ihsweep; assert 'jax' not in sys.modules and 'pandas' not in sys.modules;"
    " f = ihsweep.load_run; assert 'jax' not in sys.modules; print(f.__module__)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
  )
  assert out.stdout.strip() == "ihsweep.runs.notebook"


def test_load_run_from_a_directory_outside_the_repository(single, tmp_path):
  """A notebook anywhere: the run-directory reader is ihsweep's own (ihsweep.runs.reader)."""
  code = (
    f"import ihsweep; run = ihsweep.load_run({single!r}); "
    f"print(run.cell_ids, run.steps(1)[-1], type(run.analysis).__module__)"
  )
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split("\n")[-2] == "[0, 1] 20 ihsweep.runs.reader"


def test_a_single_run_tables_params_model_and_probes(single):
  import jax

  import ihsweep
  from ihsweep.compute.model import ModelConfig, Transformer
  from ihsweep.data.probes import Probes
  from ihsweep.runs.checkpoint import RunCheckpoints

  before = _tree(single)
  run = ihsweep.load_run(single)
  assert run.kind == "train" and run.cell_ids == [0, 1] and run.group_of(1) == "run"
  assert run.cells["cell"].tolist() == [0, 1] and run.cells["batch_size"].tolist() == [8, 8]
  metrics = run.metrics
  assert list(zip(metrics["cell"], metrics["step"])) == [
    (c, s) for c in (0, 1) for s in (0, 10, 20)
  ]
  assert {"group", "seed", "tokens", "ps", "ps_max", "val_loss"} <= set(metrics.columns)
  assert (metrics["tokens"] == metrics["step"] * 8 * 32).all()
  log = run.train_log
  assert sorted(set(log["cell"])) == [0, 1] and log.groupby("cell")["step"].max().tolist() == [
    20,
    20,
  ]
  assert np.isfinite(log["loss"]).all() and (log["loss"] > 0).all()
  assert run.steps(0) == run.steps(1) == STEPS

  ckpts = RunCheckpoints(os.path.join(single, "checkpoints"))
  ensemble = ckpts.restore_params(20)
  ckpts.close()
  cfg = run.model_config(1)
  assert cfg == ModelConfig.from_config(tiny_config(**RUN).model)
  p1 = run.params(1, 20)
  paths = jax.tree_util.tree_flatten_with_path(ensemble)[0]
  assert [k for k, _ in jax.tree_util.tree_flatten_with_path(p1)[0]] == [k for k, _ in paths]
  for (key, ens), one in zip(paths, jax.tree_util.tree_leaves(p1)):
    assert one.shape == ens.shape[1:] and one.dtype == ens.dtype == np.float32, key
    np.testing.assert_array_equal(np.asarray(one), np.asarray(ens[1]), err_msg=str(key))
  assert not np.array_equal(
    np.asarray(run.params(0, 20)["embed"]["embedding"]), np.asarray(p1["embed"]["embedding"])
  )  # the other model
  assert not np.array_equal(
    np.asarray(run.params(1, 0)["embed"]["embedding"]), np.asarray(p1["embed"]["embedding"])
  )  # an earlier step

  probes = run.probes(1)
  saved = Probes.load(os.path.join(single, "probes.npz"))
  L = saved.block_len
  assert probes.repeated.shape == (6, 2 * L) and probes.repeated.dtype == np.int32
  assert probes.sequences.shape == (4, 33) and probes.recall.shape == (4, 32)
  np.testing.assert_array_equal(probes.sequences, saved.sequences[1])

  # Logits of model 1 alone equal the compiled ensemble forward's member 1: bitwise on this CPU
  # (max |difference| 4.8e-7 against the eager, uncompiled vmap, |logits| <= 4.2). The tolerance,
  # about 8 float32 ulps at 1, leaves XLA room to batch the vmapped matmuls in another
  # summation order elsewhere.
  model = run.model(1, 20)
  assert run.model(1).step == 20  # default: the last saved step
  for a, b in zip(jax.tree_util.tree_leaves(run.params(1)), jax.tree_util.tree_leaves(p1)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens = probes.repeated
  ens_logits, ens_internals = jax.jit(
    jax.vmap(lambda p: Transformer(cfg).apply({"params": p}, tokens, return_internals=True))
  )(ensemble)
  logits, internals = model(tokens, return_internals=True)
  assert logits.shape == (6, 2 * L, 64) and logits.dtype == np.float32
  np.testing.assert_allclose(logits, np.asarray(ens_logits[1]), rtol=1e-6, atol=1e-6)
  assert internals["attn"].shape == (1, 6, 2, 2 * L, 2 * L)
  np.testing.assert_allclose(internals["attn"], np.asarray(ens_internals["attn"][1]), atol=1e-6)
  one_logits, one = model(tokens[2], return_internals=True)  # one sequence: no batch axis
  assert one_logits.shape == (2 * L, 64) and one["attn"].shape == (1, 2, 2 * L, 2 * L)
  assert one["resid_final"].shape == (2 * L, 32) and one["head_out"].shape == (1, 2 * L, 2, 32)
  np.testing.assert_allclose(one_logits, logits[2], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(model.attention(tokens[2]), one["attn"], atol=1e-7)
  np.testing.assert_allclose(model(tokens[2]), one_logits, atol=1e-6)
  # The attention patterns give the prefix-matching score the online evaluation logged.
  from ihsweep.compute.metrics import prefix_matching_score

  ps = np.asarray(prefix_matching_score(internals["attn"], L))
  logged = metrics.set_index(["cell", "step"]).loc[(1, 20), "ps"]
  np.testing.assert_allclose(ps, np.asarray(logged), rtol=2e-5, atol=1e-6)
  run.close()
  assert _tree(single) == before  # read-only


def test_a_sweep_slices_each_cell_from_its_own_group(swept):
  import jax

  import ihsweep
  from ihsweep.runs.checkpoint import RunCheckpoints

  before = _tree(swept)
  with ihsweep.load_run(swept) as run:
    assert run.kind == "sweep" and run.axes == ["train.batch_size"]
    cells = run.cells
    assert cells["cell"].tolist() == [0, 1, 2, 3]
    assert cells.set_index("cell")["batch_size"].to_dict() == {0: 4, 1: 4, 2: 8, 3: 8}
    group = cells.set_index("cell")["group"].to_dict()
    assert [run.group_of(c) for c in range(4)] == [group[c] for c in range(4)]
    assert sorted(set(group.values())) == ["g000", "g001"] and group[0] == group[1] != group[2]
    m = run.metrics
    assert sorted(set(zip(m["cell"], m["step"]))) == [(c, s) for c in range(4) for s in (0, 10)]
    assert (m["group"] == m["cell"].map(group)).all()
    assert (m["tokens"] == m["step"] * m["cell"].map({0: 4, 1: 4, 2: 8, 3: 8}) * 32).all()
    assert run.steps(3) == [0, 1, 2, 3, 4, 6, 8, 10]
    for cell in range(4):  # each cell from its group's ensemble, at its index there
      ckpts = RunCheckpoints(os.path.join(swept, "groups", group[cell], "checkpoints"))
      ens = ckpts.restore_params(10)
      ckpts.close()
      index = [int(c) for c in run.config_of(cell).ensemble.cell_ids].index(cell)
      for got, want in zip(
        jax.tree_util.tree_leaves(run.params(cell, 10)), jax.tree_util.tree_leaves(ens)
      ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want[index]))
    logits = run.model(3, 10)(run.probes(3).repeated[0])
    assert logits.shape == (run.probes(3).repeated.shape[1], 64) and np.isfinite(logits).all()
  assert _tree(swept) == before  # read-only


def test_a_cell_of_a_skipped_group_says_why(swept, tmp_path):
  import shutil

  import ihsweep
  from ihsweep.runs import notebook

  work = tmp_path / "sweep"
  shutil.copytree(swept, work)
  run = ihsweep.load_run(work)
  gone = run.group_of(3)
  shutil.rmtree(work / "groups" / gone)
  run = ihsweep.load_run(work)
  kept = run.cells.loc[run.cells["group"] != gone, "cell"].tolist()
  assert run.cell_ids == kept
  with pytest.raises(
    notebook.UnknownCell,
    match=rf"cell = 3 cannot be read: group {gone} "
    rf"\(2 cells\) is skipped: cells.csv lists it "
    rf"as done, but its directory .* is missing; "
    rf"readable cells: {kept[0]}, {kept[1]}$",
  ):
    run.params(3, 10)


def test_errors_name_what_is_allowed(single, tmp_path):
  import ihsweep
  from ihsweep.runs import notebook

  run = ihsweep.load_run(single)
  with pytest.raises(
    notebook.UnknownCell,
    match=r"cell = 7 is not a model of this run; "
    r"valid cells: 0, 1",
  ):
    run.params(7, 20)
  with pytest.raises(notebook.UnknownCell, match=r"cell = '0'.*cells are 0, 1"):
    run.model("0", 20)
  with pytest.raises(
    notebook.StepNotSaved,
    match=r"step = 5: cell 0 \(group run\).*saved steps: 0, 1, 2, 3, 4, 6, 8, "
    r"11, 16, 20; nearest to 5: 4, 6",
  ):
    run.params(0, 5)
  with pytest.raises(notebook.StepNotSaved, match="saved steps"):
    run.model(0, 20.0)
  model = run.model(0, 20)
  for bad, words in [
    (np.array([1, 64]), r"\[0, 64\) \(model.vocab_size\).*max 64"),
    (np.zeros(33, int), "T = 33 is longer than model.max_context = 32"),
    (np.zeros(3, float), "integer token ids"),
    (np.zeros((1, 1, 3), int), r"shape \[T\] or \[B, T\]"),
  ]:
    with pytest.raises(ValueError, match=words):
      model(bad)
  with pytest.raises(ValueError, match="data.source = 'markov_chain'.*natural"):
    run.tokenizer()
  for path, words in [
    (tmp_path / "missing", "is not a directory"),
    (tmp_path, "is not a run directory"),
  ]:
    with pytest.raises(notebook.NotARun, match=words):
      ihsweep.load_run(path)
  run.close()


def test_a_run_without_checkpoints_or_probes_says_so(tmp_path):
  import ihsweep
  from ihsweep.runs import notebook
  from ihsweep.training.resume import write_resolved_config

  write_resolved_config(tiny_config(), str(tmp_path))  # a run that has not evaluated or saved
  open(tmp_path / "metrics.jsonl", "w").close()
  run = ihsweep.load_run(tmp_path)
  assert run.steps(0) == [] and run.metrics.empty and run.train_log.empty
  with pytest.raises(notebook.StepNotSaved, match=r"no params checkpoints were saved"):
    run.params(0, 0)
  with pytest.raises(ValueError, match=r"no probes.npz: evaluation was off"):
    run.probes(1)


def test_tokenizer_of_a_natural_text_run(tmp_path):
  from test_natural import natural_cfg

  import ihsweep
  from ihsweep.training.resume import write_resolved_config

  cfg = natural_cfg(tiny_config, tmp_path)
  corpus = corpus_lib.prepare_corpus(cfg.data, 300)  # as training fills the cache
  run_dir = tmp_path / "run"
  write_resolved_config(cfg, str(run_dir))
  open(run_dir / "metrics.jsonl", "w").close()
  tok = ihsweep.load_run(run_dir).tokenizer()
  text = "Document 7.\nthe quick brown fox"
  assert tok.encode(text).ids == corpus.tokenizer.encode(text).ids
  assert tok.decode(corpus.train[:50].tolist()) == corpus.tokenizer.decode(
    corpus.train[:50].tolist()
  )


DOCS = ["README.md"] + sorted(
  os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")
)


def _readme_blocks() -> dict:
  """The python blocks of README.md and docs/*.md that read a run directory, by the comment
  before them ('notebook-example', 'export-example', …) or their file and first line."""
  blocks = {}
  for doc in DOCS:
    with open(os.path.join(ROOT, doc)) as f:
      text = f.read()
    for tag, code in re.findall(r"(<!-- [\w-]+ -->\n)?```python\n(.*?)\n```", text, re.S):
      if "runs/" in code:
        blocks[tag.strip()[5:-4] if tag else f"{doc}: {code.splitlines()[0]}"] = code
  return blocks


def test_the_readme_blocks_read_what_the_readme_creates():
  """Every python block of the README and docs/ that reads a run reads the demo's (`make demo`:
  runs/demo), and the quick, notebook and export examples are among them."""
  blocks = _readme_blocks()
  assert {"quick-example", "notebook-example", "export-example"} <= set(blocks), list(blocks)
  for name, code in blocks.items():
    assert set(re.findall(r"runs/\w+", code)) == {"runs/demo"}, (name, code)


def test_the_readme_examples_run_on_a_tiny_sweep(swept, tmp_path, monkeypatch, capsys):
  """The python blocks of the README and docs/ that read runs/demo (but the TransformerLens
  one, which tests/test_export.py runs on a 2-layer run), executed as written with runs/demo a
  tiny sweep."""
  os.makedirs(tmp_path / "runs")
  os.symlink(swept, tmp_path / "runs" / "demo")
  monkeypatch.chdir(tmp_path)
  blocks = _readme_blocks()
  for name, code in blocks.items():
    if name != "export-example":
      namespace = {}
      exec(compile(code, f"README.md:{name}", "exec"), namespace)
      if name == "notebook-example":
        found = namespace
      if name == "quick-example":
        t = namespace["run"].probes(namespace["cell"]).repeated.shape[1]
        assert namespace["attn"].shape == (1, 4, 2, t, t)  # 1 layer, 2 heads
      if "run" in namespace:
        namespace["run"].close()
  out = capsys.readouterr().out
  L = found["L"]
  assert found["logits"].shape == (2 * L, 64)
  assert found["attn"].shape == (1, 2, 2 * L, 2 * L)
  assert found["score"].shape == (1, 2) and 0 <= found["score"].max() <= 1
  assert found["step"] == 10 and isinstance(found["ps_max"], pd.DataFrame)
  assert list(found["ps_max"].index) == [0, 10] and found["cell"] in range(4)
  assert re.search(
    r"cell \d at update 10, layer 0 head \d: prefix matching 0\.\d\d, next token of the "
    r"repeat predicted \d+%",
    out,
  ), out
