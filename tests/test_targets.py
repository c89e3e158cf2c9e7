"""``ihsweep plan --target``: every group compiled for an accelerator this machine lacks (TPU
through libtpu's compile-only devices; GPU estimated by the XLA CPU compiler)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBTPU = ROOT / "build" / "libtpu"  # where `make test` installs libtpu (Makefile)


def _plan(*args, libtpu=True):
  exe = shutil.which("ihsweep", path=os.path.dirname(sys.executable))
  cmd = [exe] if exe else [sys.executable, "-m", "ihsweep.cli"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"}
  if libtpu:
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LIBTPU), env.get("PYTHONPATH")]))
  return subprocess.run(
    cmd + ["plan", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
  )


TINY = ["--config=configs/default.py:tiny", "--config.ensemble.size=2", "--json"]


@pytest.mark.skipif(not (LIBTPU / "libtpu").is_dir(), reason="make test installs build/libtpu")
def test_plan_compiles_for_a_tpu_topology_without_one():
  r = _plan("--target=v5e:2x2", *TINY)
  assert r.returncode == 0, r.stderr[-2000:]
  p = json.loads(r.stdout)
  t = p["target"]
  assert t["devices"] == 4 and t["devices_per_host"] == 4 and t["memory_from"] == "TPU compiler"
  assert t["capacity_bytes"] == int(15.75 * (1 << 30))  # the compiler's own v5e limit
  assert p["fits"] and p["compiled_devices_per_worker"] == 1 and len(p["groups"]) == 1
  g = p["groups"][0]
  mem = g["memory"]
  # Two models of d 64, V 512: params + Adam state ~1.5 MB; the step's temporaries more.
  assert 1 << 20 < mem["per_device_bytes"] < 1 << 30 and mem["fits"]
  assert g["gradient_accumulation_steps"] == 1 and g["remat"] == "none"
  # The compiled FLOPs of one update against PaLM's count: the compiler also counts softmax,
  # LayerNorm and the optimizer, but not far from 6N + attention.
  ratio = g["flops_per_update"] / g["analytic_flops_per_update"]
  assert 0.8 < ratio < 2.0, ratio
  assert g["roofline_s"] == pytest.approx(g["roofline_update_s"] * g["updates"])
  # One group: the best layout gives it all 4 devices, its time scaled by 1/4.
  assert p["devices_per_worker"] == 4 and [lay["devices_per_worker"] for lay in p["layouts"]] == [
    1,
    2,
    4,
  ]
  # ... plus, on a 2 × 2 mesh, each update's all-reduce of one model's float32 gradient over
  # the data axis of 2 on v5e's ICI (200 GB/s each way, 10 µs per ring step)
  ring = 2 * 1 / 2 * g["n_params"] * 4 / 200e9 + 2 * 10e-6
  assert p["target"]["network"]["name"] == "v5e"
  assert p["makespan_s"] == pytest.approx(g["roofline_s"] / 4 + g["updates"] * ring)


JAX_CUDA = ROOT / "build" / "jax-cuda"  # where `make test` installs JAX's CUDA plugin
needs_jax_cuda = pytest.mark.skipif(
  not (JAX_CUDA / "jax_plugins").is_dir(), reason="make test installs build/jax-cuda"
)
GPU_COMPILER = "XLA GPU compiler (deviceless: no autotuning)"
GIB = 1 << 30
H100_BYTES = int(0.75 * 85520809984)  # XLA's default client share of nvidia-smi's 81559 MiB


@needs_jax_cuda
def test_plan_for_a_gpu_is_compiled_by_xla_gpu_and_bad_targets_are_refused():
  # B 16: 2 MiB of logits per model, so this CPU would vmap one model at a time; the GPU's own
  # setting is both models at once.
  r = _plan(
    "--target=h100-80gb", "--devices=2", *TINY, "--config.train.batch_size=16", libtpu=False
  )
  assert r.returncode == 0, r.stderr[-2000:]
  p = json.loads(r.stdout)
  assert p["target"]["memory_from"] == GPU_COMPILER and p["fits"]
  assert p["target"]["capacity_bytes"] == H100_BYTES
  (g,) = p["groups"]
  assert g["devices"] == 1 and g["vmap_chunk"] == 2 and g["memory_from"] == GPU_COMPILER, g
  # FLOPs from XLA's HLO cost analysis of the lowered program: PaLM's count within 15%
  assert g["cost_from"] == "lowered HLO"
  assert g["flops_per_update"] == pytest.approx(g["analytic_flops_per_update"], rel=0.15)
  r = _plan("--target=h100-80gb", *TINY, libtpu=False)
  assert r.returncode == 2 and "needs --devices=N" in r.stderr
  r = _plan("--target=v9z:2x2", *TINY, libtpu=False)
  assert r.returncode == 2 and "--target=v9z:2x2 is not allowed: a TPU topology" in r.stderr
  r = _plan("--target=h100-80gb", "--devices=2", "--flops_per_s=1e14", *TINY, libtpu=False)
  assert r.returncode == 2 and "--flops_per_s is not allowed with --target" in r.stderr


@pytest.mark.skipif(not (LIBTPU / "libtpu").is_dir(), reason="make test installs build/libtpu")
def test_memory_estimate_benchmark_compares_the_cpu_and_tpu_compilers():
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(LIBTPU)}
  env.pop("XLA_FLAGS", None)
  # One layer and no evaluation program (the TPU compiler spends ~25 s on the tiny one): the
  # script's path is the same, the test a minute shorter.
  r = subprocess.run(
    [sys.executable, "benchmarks/memory_estimate.py", "--json", "--config",
     "configs/default.py:tiny", "--set", "ensemble.size=2", "--set", "model.n_layers=1",
     "--set", "eval.every_steps=0"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  (g,) = out["groups"]
  assert g["tpu_bytes"] > 0 and g["cpu_bytes"] > 0
  assert g["cpu_over_tpu"] == pytest.approx(g["cpu_bytes"] / g["tpu_bytes"])


def test_a_tpu_topology_the_chip_is_not_sold_in_is_one_line_before_libtpu():
  """libtpu's compiler aborted the process (a C++ Check failure, exit 134) on these."""
  from ihsweep.planning import targets

  for name, words in (
    ("v5e:32x32", "v5e slices are 2D: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
    ("v5e:4x4x4", "v5e slices are 2D"),
    ("v6e:1000x1000", "v6e slices are 2D"),
    ("v4:3x3x3", "v4 slices are 3D: 2x2x1, 2x2x2, 2x2x4, 2x4x4, or AxBxC with A, B, C multiples"),
    ("v5p:32x32x32", "at most 8,960 chips"),
  ):
    r = _plan(f"--target={name}", *TINY, libtpu=False)
    assert r.returncode == 2 and r.stderr.startswith(f"ihsweep: --target={name} is not allowed: ")
    assert words in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1
  for ok in ("v5e:2x2", "v5e:16x16", "v6e:8x16", "v4:2x2x1", "v4:4x4x8", "v5p:16x16x24"):
    chip, shape = ok.split(":")
    assert targets.tpu_topology_problem(chip, shape) is None, ok


def test_gpu_plans_refuse_what_they_cannot_honour():
  r = _plan("--target=h100-80gb", "--devices=2", *TINY, "--config.mesh.num_devices=5", libtpu=False)
  assert r.returncode == 2 and r.stderr == (
    "ihsweep: config.mesh.num_devices = 5 is not allowed with --target=h100-80gb on 2 "
    "device(s): 0 (the plan chooses the devices per worker) or one of 1, 2\n"
  )
  r = _plan("--target=h100-80gb", "--devices=-1", *TINY, libtpu=False)
  assert r.returncode == 2 and r.stderr.startswith("ihsweep: --devices=-1 is not allowed: an")
  # 16 models × B·C ≈ 2·10⁹ int32 tokens each: 137 GB of token batches on one 80 GB GPU
  r = _plan(
    "--target=h100-80gb", "--devices=1", "--config=configs/default.py:tiny",
    "--config.ensemble.size=16", "--config.train.batch_size=120000000",
    "--config.train.context_size=17", libtpu=False,
  )  # fmt: skip
  assert r.returncode == 2 and "cannot fit its devices at any memory setting" in r.stderr
  assert "compiling" not in r.stderr  # refused by arithmetic, before any compile


def test_without_the_cuda_plugin_the_gpu_plan_says_it_is_the_cpu_estimate(monkeypatch):
  """In this process JAX's backends are already up, so the plugin cannot join: the CPU
  compiler's estimate, labelled with why."""
  import jax

  from ihsweep.planning import targets

  monkeypatch.setattr(targets, "CHECKOUT_JAX_CUDA", "/nonexistent/jax-cuda")
  t = targets.make_target("h100-80gb", 2)
  assert t.estimate.startswith("XLA CPU compiler (estimate: JAX's ")
  assert [d.platform for d in t.devices] == ["cpu", "cpu"] and t.devices == jax.devices("cpu")[:2]
  assert t.capacity_bytes == H100_BYTES


@needs_jax_cuda
def test_the_demos_largest_group_and_exp1s_extreme_cells_fit_an_h100_by_the_gpu_compiler(
  python_docs_corpus,
):
  """The demo's largest group (B 32, C 64) on one H100; exp1 at study scale on a node of 8
  H100s, its smallest (B 8, C 64) and largest (B 128, C 1024) cells and the two between: every
  group compiled by XLA:GPU, each fits at the setting the plan chooses, and the largest runs
  both models at once (k = 1, vmap chunk 2: 22.7 GiB there with cuDNN's flash attention, 46.7
  GiB with the explicit pattern, against the CPU estimate's 96)."""
  r = _plan("--target=h100-80gb", "--devices=1", "--config=configs/demo.py",
            "--config.sweep.grid.train.batch_size=(32,)",
            "--config.sweep.grid.train.context_size=(64,)", "--json", libtpu=False)  # fmt: skip
  assert r.returncode == 0, r.stderr[-2000:]
  (g,) = json.loads(r.stdout)["groups"]
  assert g["memory_from"] == GPU_COMPILER and g["memory"]["fits"], g
  r = _plan("--target=h100-80gb", "--devices=8", "--config=configs/exp1_natural.py",
            "--config.sweep.grid.train.batch_size=(8, 128)",
            "--config.sweep.grid.train.context_size=(64, 1024)", "--json",
            libtpu=False)  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  p = json.loads(r.stdout)
  assert p["fits"] and p["target"]["memory_from"] == GPU_COMPILER
  cells = {(g["batch_size"], g["context_size"]): g for g in p["groups"]}
  assert set(cells) == {(8, 64), (8, 1024), (128, 64), (128, 1024)}
  for g in cells.values():
    assert g["memory_from"] == GPU_COMPILER and g["memory"]["fits"], g
    assert g["memory"]["capacity_bytes"] == H100_BYTES
  big = cells[(128, 1024)]
  assert big["gradient_accumulation_steps"] == 1 and big["vmap_chunk"] == 2, big
  # The train step's attention is cuDNN's flash attention (bf16, head dimension 96), and at
  # C = 1024 it saves what the explicit [B·H, C, C] pattern needs: 46.65 -> 22.72 GiB.
  for g in cells.values():
    assert g["attention"]["compiled"] == "cudnn", g["attention"]
    assert g["attention"]["saved_bytes"] >= 0
  assert big["attention"]["saved_bytes"] > 20 * GIB, big["attention"]
  assert big["attention"]["explicit_bytes"] > 40 * GIB
  # The roofline is the largest lower bound read from the compiled program: FLOPs, twice the
  # train state over HBM, kernels × 4 µs. The largest cell launches 681 kernels per update
  # with 1 GiB loss tiles (2,161 with 256 MiB ones) and is FLOP-bound; the smallest is bound by
  # AdamW's state traffic (2 × 1.28 GB in 0.77 ms) above its 157 launches (0.63 ms).
  for g in cells.values():
    terms = g["roofline_terms"]
    assert set(terms) == {"flops_s", "state_bytes_s", "launch_s"}, terms
    assert g["roofline_update_s"] == max(terms.values()) and g["kernels_per_update"] > 100
  assert (
    big["kernels_per_update"] < 1000
    and max(big["roofline_terms"].items(), key=lambda kv: kv[1])[0] == "flops_s"
  )
  small = cells[(8, 64)]["roofline_terms"]
  assert small["state_bytes_s"] > small["launch_s"] > small["flops_s"], small
