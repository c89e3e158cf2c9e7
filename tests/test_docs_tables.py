"""The docs hold the plan tables, checkpoint totals and law predictions that
benchmarks/docs_tables.py makes from the commands that print them: those that take seconds
(docs_tables.CHECKED) must equal what the commands print now."""

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


def test_the_tables_that_take_seconds_are_what_the_commands_print():
  """The tiny config's FLOPs plans, exp1's checkpoint totals, setup and schedule (FLOPs plans,
  ~5 s each here) and the study's law's predictions (``ihsweep predict``)."""
  _check(*docs_tables.CHECKED)


def test_every_table_has_its_block_in_its_doc():
  """Each table's markers are in its file (inline where the table is: within a line)."""
  import doc_blocks

  for t in docs_tables.TABLES.values():
    doc_blocks.read(str(ROOT / t.doc), docs_tables.TOOL, t.name)  # exits where it is not
    begin, _ = docs_tables._markers(t.name)
    line = next(x for x in (ROOT / t.doc).read_text().splitlines() if begin in x)
    assert (line.strip() != begin) == t.inline, f"{t.doc}: {t.name}'s markers"


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


def test_an_inline_block_is_rewritten_within_its_line(tmp_path, monkeypatch, capsys):
  doc = tmp_path / "docs" / "usage.md"
  doc.parent.mkdir()
  begin, end = docs_tables._markers("usage-law")
  doc.write_text(f"the law predicts {begin}15,600{end} updates; more\n")
  monkeypatch.setattr(docs_tables, "ROOT", str(tmp_path))
  monkeypatch.setattr(docs_tables, "output", lambda args: "B = 16, C = 64: induction heads "
                      "predicted after 15,609 updates = 16.0M tokens\n")  # fmt: skip
  assert docs_tables.main(["--check", "usage-law"]) == 1
  assert "-15,600" in capsys.readouterr().out
  assert docs_tables.main(["usage-law"]) == 0
  assert doc.read_text() == f"the law predicts {begin}15,609{end} updates; more\n"
