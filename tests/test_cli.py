"""End-to-end: the installed ``ihsweep`` console script."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.model.d_model=32", "--config.model.n_heads=2", "--config.model.d_mlp=64",
        "--config.model.vocab_size=64", "--config.model.max_context=32",
        "--config.train.batch_size=8", "--config.train.context_size=32",
        "--config.train.num_steps=30", "--config.train.steps_per_call=10",
        "--config.train.lr=3e-3", "--config.ensemble.size=2", "--config.eval.every_steps=0",
        "--config.checkpoint.params_schedule=none"]


def _ihsweep(*args):
  exe = shutil.which("ihsweep", path=os.path.dirname(sys.executable))
  cmd = [exe] if exe else [sys.executable, "-m", "ihsweep.cli"]
  # XLA_FLAGS without a device count, so that the CLI picks one device per core itself.
  env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "JAX_PLATFORMS": "cpu"}
  return subprocess.run(cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)


def test_train_command_writes_config_and_metrics(tmp_path):
  work = tmp_path / "run"
  r = _ihsweep("train", "--config=configs/default.py", f"--workdir={work}", "--noprogress",
               *TINY, "--config.ensemble.peak_lrs=(1e-3, 3e-3)", "--config.eval.every_steps=15",
               "--config.eval.n_probes=10", "--config.eval.n_sequences=8")
  assert r.returncode == 0, r.stderr
  assert "final loss per model" in r.stdout
  resolved = json.loads((work / "config.json").read_text())
  assert resolved["train"]["num_steps"] == 30
  assert resolved["ensemble"]["peak_lrs"] == [1e-3, 3e-3]
  rows = [json.loads(x) for x in (work / "train_log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [10, 15, 25, 30]  # calls end at evaluations
  assert rows[-1]["tokens"] == 30 * 8 * 32
  assert all(len(r["loss"]) == 2 for r in rows)
  evals = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["cell"]) for r in evals] == [(s, c) for s in (0, 15, 30) for c in (0, 1)]
  assert evals[0]["train_loss"] is None and evals[-1]["train_loss"] > 0
  assert all(0 <= r["ps_max"] <= 1 and len(r["ps"]) == 2 and len(r["ps"][0]) == 2 for r in evals)
  assert sorted(os.listdir(work / "checkpoints" / "state")) == ["30"]


def test_bad_override_is_reported(tmp_path):
  r = _ihsweep("train", "--config=configs/default.py", f"--workdir={tmp_path}/x",
               "--config.model.n_heads=3")
  assert r.returncode == 2
  assert "config.model.n_heads = 3" in r.stderr and "divisor" in r.stderr
  assert not (tmp_path / "x").exists()


def test_usage_lists_commands():
  r = _ihsweep("--help")
  assert r.returncode == 0 and "train" in r.stdout
  r = _ihsweep("frobnicate")
  assert r.returncode == 2 and "unknown command" in r.stderr


@pytest.mark.parametrize("args,words", [
    (["--config=configs/default.py", "--config.train.lrr=1"], ["lrr", 'Did you mean "lr"']),
    (["--config=configs/nope.py"], ["No such file", "configs/nope.py"]),
    (["--config=configs/default.py:nope"], ["unknown variant 'nope'"]),
    (["--config=configs/default.py", "--config.train.batch_size=abc"], ["batch_size=abc"]),
    (["--config=configs/default.py", "stray", "words"], ["takes flags only", "'stray words'"]),
])
def test_bad_config_files_and_fields_get_one_line(tmp_path, args, words):
  r = _ihsweep("train", f"--workdir={tmp_path}/x", *args)
  assert r.returncode == 2, r.stderr
  assert "Traceback" not in r.stderr and r.stderr.startswith("ihsweep: ")
  for w in words:
    assert w in r.stderr
  assert not (tmp_path / "x").exists()


def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / "f").write_text("")
  r = _ihsweep("train", "--config=configs/default.py", f"--workdir={tmp_path}/f")
  assert r.returncode == 2 and "is not a directory" in r.stderr


def test_train_on_local_text_files_then_prepare_hits_the_cache(tmp_path):
  from test_natural import write_corpus
  files = write_corpus(str(tmp_path / "text"))
  data = ["--config.data.source=natural", f"--config.data.files={files}",
          f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.model.vocab_size=300"]
  r = _ihsweep("train", "--config=configs/default.py", f"--workdir={tmp_path / 'run'}",
               "--noprogress", *TINY, *data, "--config.train.num_steps=4",
               "--config.train.steps_per_call=2")
  assert r.returncode == 0, r.stderr
  assert "on device, windows gathered in-graph" in r.stderr and "cache built" in r.stderr
  rows = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
  assert rows[-1]["step"] == 4
  r = _ihsweep("corpus", "prepare", "--config=configs/default.py", *data)
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert out["cache_hit"] is True and out["train_tokens"] > 1000


def test_corpus_command_usage_and_bad_data(tmp_path):
  r = _ihsweep("corpus", "frobnicate")
  assert r.returncode == 2 and "ihsweep corpus fetch NAME" in r.stderr
  r = _ihsweep("train", "--config=configs/default.py", f"--workdir={tmp_path}/x",
               "--config.data.source=natural", f"--config.data.files={tmp_path}/none/*.txt",
               "--config.model.vocab_size=300")
  assert r.returncode == 2 and "matches no file" in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1
