"""Every benchmark script runs, at tiny sizes, so none can break unnoticed (the scripts time
things; these tests check only that they run and report what they claim to)."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(**extra):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **extra}
  env.pop("XLA_FLAGS", None)  # the scripts choose their own CPU device counts
  return env


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
