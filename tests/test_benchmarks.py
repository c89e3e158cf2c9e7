"""Every benchmark script runs, at tiny sizes, so none can break unnoticed (the scripts time
things; these tests check only that they run and report what they claim to)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import CPU_COMPILE_FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(**extra):
  # The scripts choose their own CPU device counts; they compile fast, as the tests do.
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": CPU_COMPILE_FLAGS, **extra}


def test_throughput_benchmark_runs_every_mode(tmp_path):
  r = subprocess.run(
    [sys.executable, "benchmarks/throughput.py", "--json", "--workload", "tiny", "--E", "1",
     "--updates", "2", "--steps_per_call", "2", "--rounds", "1", "--cpu_devices", "1"],
    cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout)
  modes = {row["mode"] for row in out["results"]}
  assert modes == {"ensemble", "sequential", "sequential_scan"}
  assert all(row["tokens_per_s"] > 0 and row["compile_s"] > 0 for row in out["results"])


def test_device_check_cpu_smoke_runs_every_part(tmp_path):
  """benchmarks/device_check.sh --cpu-smoke: throughput, warm-cache compile and the sweeps of
  benchmarks/sweep_overhead.py, each at a tiny size; every part exits 0 and reports."""
  out = tmp_path / "out"
  r = subprocess.run(
    ["bash", "benchmarks/device_check.sh", "--cpu-smoke"],
    cwd=ROOT, env=_env(OUT=str(out), PYTHON=sys.executable, TMPDIR=str(tmp_path)),
    capture_output=True, text=True, timeout=2400,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout[-3000:]
  result = json.loads((out / "device_check.json").read_text())
  assert result["smoke"] and set(result["status"].values()) == {"0"}, result["status"]
  assert result["throughput"]["results"] and result["compile_warm"]["compile_s_warm"] > 0
  for name, sweep in result["sweeps"].items():
    assert sweep and all(run["done"] == run["groups"] for run in sweep["runs"]), name


def test_analysis_benchmark_runs(tmp_path):
  r = subprocess.run(
    [sys.executable, "benchmarks/analysis.py", "--json", "--E", "2", "--checkpoints", "3",
     "--workload", "tiny"],
    cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["E"] == 2 and out["checkpoints"] == 3 and out["cold_s"] > 0


def test_code_shape_finds_cycles_long_functions_and_back_doors(tmp_path):
  """benchmarks/code_shape.py on a made-up package with known answers: a cycle only through an
  in-function import, a private name used from another module, an importlib of an own module, a
  long function, an exception hierarchy; and on this repository it runs."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    import code_shape
  finally:
    sys.path.pop(0)
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "a.py").write_text(
    "from pkg import b\nfrom pkg.b import _hidden\n\n"
    "class AError(ValueError):\n  pass\n\n"
    "def long():\n" + "  x = 1\n" * 70 + "  return x\n"
  )
  (pkg / "b.py").write_text(
    "import importlib\n\n_hidden = 1\n\n"
    "def f():\n  from pkg import a\n  return a.AError, importlib.import_module('pkg.sub.c')\n"
  )
  (pkg / "sub" / "c.py").write_text(
    "from .. import a\n\nclass CError(a.AError):\n  pass\n\nclass Plain:\n  pass\n"
  )
  r = code_shape.measure(str(tmp_path), ["pkg"], module_lines=50, function_lines=60)
  assert r["modules"] == 5 and list(r["modules_over"]) == ["pkg/a.py"]
  assert r["functions_over"] == 1 and r["longest_functions"] == ["72 lines  pkg/a.py:long"]
  assert r["import_cycles_module_level"] == []
  assert r["import_cycles_with_function_imports"] == [["pkg.a", "pkg.b"]]
  assert r["own_imports_in_functions"] == 1
  assert r["private_names_across_modules"] == ["pkg/a.py uses pkg.b._hidden"]
  assert r["importlib_of_own_modules"] == ["pkg/b.py: import_module('pkg.sub.c')"]
  assert r["exception_classes"] == 2 and r["exception_files"] == 2
  assert r["exception_roots"] == ["pkg/a.py:AError"]
  here = code_shape.measure(ROOT, ["ihsweep", "analysis"])
  assert here["modules"] > 40 and here["lines_total"] > 10_000
  # one error base class: every exception ihsweep or analysis defines derives from IhsweepError
  assert here["exception_roots"] == ["ihsweep/base/errors.py:IhsweepError"], here["exception_roots"]


def test_gpu_plan_table_renders_a_plan_and_its_estimate():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import gpu_plan_table

  def group(b, c, gib, k=1):
    return {
      "batch_size": b, "context_size": c, "gradient_accumulation_steps": k, "vmap_chunk": 2,
      "remat": "none", "memory": {"per_device_bytes": gib * (1 << 30)},
      "flops_per_update": 2.5e12, "roofline_update_s": 0.0125,
    }  # fmt: skip

  plan = {"groups": [group(16, 64, 4.0), group(8, 64, 2.0)]}
  estimate = {"groups": [group(8, 64, 3.0), group(16, 64, 10.0)]}
  rows = gpu_plan_table.table(plan, estimate).splitlines()
  assert rows[2] == "| 8 × 64 | 1 | 2 | none | 2.00 | 2.5 | 12 ms | 3.00 | 1.5× |"
  assert rows[3] == "| 16 × 64 | 1 | 2 | none | 4.00 | 2.5 | 12 ms | 10.00 | 2.5× |"
  with pytest.raises(ValueError, match="at the setting"):
    gpu_plan_table.table(plan, {"groups": [group(8, 64, 3.0, k=2), group(16, 64, 1.0)]})
  plan["groups"][0]["attention"] = {"compiled": "cudnn", "explicit_bytes": 6 << 30}
  plan["groups"][1]["attention"] = {"compiled": "explicit", "saved_bytes": 0}
  rows = gpu_plan_table.table(plan).splitlines()
  assert rows[0].endswith("| attention | explicit pattern GiB |")
  assert rows[2] == "| 8 × 64 | 1 | 2 | none | 2.00 | 2.5 | 12 ms | explicit | 2.00 |"
  assert rows[3] == "| 16 × 64 | 1 | 2 | none | 4.00 | 2.5 | 12 ms | cudnn | 6.00 |"
