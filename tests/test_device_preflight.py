"""benchmarks/device_check.sh --preflight: every program the device check runs on an H200,
compiled here by XLA:GPU without a GPU (a file of its own, so that pytest-xdist runs it beside
the other long files)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 1 << 30


@pytest.mark.skipif(
  not (ROOT / "build" / "jax-cuda" / "nvidia" / "cudnn").is_dir(),
  reason="make test installs JAX's CUDA plugin and cuDNN in build/jax-cuda",
)
def test_every_program_of_the_device_check_compiles_for_an_h200(tmp_path):
  out = tmp_path / "out"
  env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
  env.pop("XLA_FLAGS", None)
  env.pop("JAX_PLATFORMS", None)
  r = subprocess.run(
    ["bash", "benchmarks/device_check.sh", "--preflight"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
  )  # fmt: skip
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  result = json.loads((out / "preflight.json").read_text())
  assert result["ok"] and result["target"] == "h200-141gb"
  by_part = {}
  for row in result["programs"]:
    assert row["ok"] and row["error"] is None and row["per_device_bytes"] > 0, row
    by_part.setdefault(row["part"], []).append(row["program"])
  assert len(by_part["a"]) == 4  # the peak matmul, ensemble, sequential, sequential_scan
  assert len(by_part["c"]) == 4  # the tiny sweep's groups, B 8/16/32/64
  (d,) = by_part["d"]
  cell = result["largest_cell"]
  assert cell["memory_from"] == "XLA GPU compiler (deviceless: no autotuning)"
  # Both models at once without accumulation, cuDNN's flash attention: ~22 GiB of the H200's
  # 0.75 × 143,771 MiB.
  assert cell["setting"] == {
    "gradient_accumulation_steps": 1, "vmap_chunk": 2, "remat": "none", "attention": "cudnn"
  }  # fmt: skip
  assert 10 * GIB < cell["predicted_bytes"] < 30 * GIB < cell["capacity_bytes"]


@pytest.mark.parametrize(
  "args,words",
  [
    (["--preflight", "--cpu-smoke"], "--preflight and --cpu-smoke are not allowed together"),
    (["--cpu-smoke", "--preflight"], "--preflight and --cpu-smoke are not allowed together"),
    (["--gpu"], "usage: "),
  ],
)
def test_device_check_refuses_flags_it_cannot_honour(tmp_path, args, words):
  """Two modes at once (the pre-flight has no smoke size), or an unknown flag: one line, exit 2,
  nothing written."""
  out = tmp_path / "out"
  r = subprocess.run(
    ["bash", "benchmarks/device_check.sh", *args],
    cwd=ROOT, env={**os.environ, "OUT": str(out)}, capture_output=True, text=True, timeout=60,
  )  # fmt: skip
  assert r.returncode == 2 and r.stdout == "" and not out.exists(), r.stderr
  assert words in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
