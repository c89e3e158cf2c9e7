"""docs/planning.md and docs/sweeps.md hold the plan tables that benchmarks/docs_tables.py makes
from the commands: the small configs' tables must equal what the commands print now."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))  # last: benchmarks/analysis.py is not `analysis`

import docs_tables  # noqa: E402

JAX_CUDA = ROOT / "build" / "jax-cuda"
needs_gpu_compiler = pytest.mark.skipif(
  not ((JAX_CUDA / "jax_plugins").is_dir() and (JAX_CUDA / "nvidia" / "cudnn").is_dir()),
  reason="make test installs JAX's CUDA plugin and cuDNN in build/jax-cuda",
)


def _check(*names):
  env = {**os.environ}
  env.pop("XLA_FLAGS", None)
  env.pop("JAX_PLATFORMS", None)
  r = subprocess.run(
    [sys.executable, "benchmarks/docs_tables.py", "--check", *names],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
  )  # fmt: skip
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  assert r.stdout.count(" matches") == len(names)


def test_the_sweeps_small_table_is_what_the_commands_print():
  _check("tiny-flops")


@needs_gpu_compiler
def test_the_gpu_plans_small_table_is_what_the_command_prints():
  _check("tiny-h100")


def test_a_table_that_differs_fails_the_check(tmp_path, monkeypatch, capsys):
  doc = tmp_path / "docs" / "sweeps.md"
  doc.parent.mkdir()
  begin, end = docs_tables._markers("tiny-flops")
  doc.write_text(f"# x\n\n{begin}\n| 2 | none | 0.7 s |\n{end}\n\nafter\n")
  monkeypatch.setattr(docs_tables, "ROOT", str(tmp_path))
  monkeypatch.setattr(docs_tables, "run", lambda table: "| 2 | none | 0.8 s |")
  assert docs_tables.main(["--check", "tiny-flops"]) == 1
  out = capsys.readouterr().out
  assert "-| 2 | none | 0.7 s |" in out and "+| 2 | none | 0.8 s |" in out
  assert docs_tables.main(["tiny-flops"]) == 0  # rewritten: now it matches
  assert doc.read_text() == f"# x\n\n{begin}\n| 2 | none | 0.8 s |\n{end}\n\nafter\n"
  assert docs_tables.main(["--check", "tiny-flops"]) == 0
