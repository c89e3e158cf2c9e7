"""``ihsweep plan --target``: every group compiled for an accelerator this machine lacks (TPU
through libtpu's compile-only devices; GPU by XLA:GPU through JAX's CUDA plugin, deviceless, or
estimated by the XLA CPU compiler without it); every target's interconnect priced; the launch
lines of the plan's layout, run in the launchers' dry-run mode."""

import dataclasses
import json
import os
import pathlib
import re
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


@pytest.fixture(scope="module")
def tiny_h100():
  """The tiny config (B 16) planned for 2 H100s: one subprocess, shared by the tests below."""
  if not (JAX_CUDA / "jax_plugins").is_dir():
    pytest.skip("make test installs build/jax-cuda")
  r = _plan(
    "--target=h100-80gb", "--devices=2", *TINY, "--config.train.batch_size=16", libtpu=False
  )
  assert r.returncode == 0, r.stderr[-2000:]
  return r


@needs_jax_cuda
def test_plan_for_a_gpu_is_compiled_by_xla_gpu_and_bad_targets_are_refused(tiny_h100):
  # B 16: 2 MiB of logits per model, so this CPU would vmap one model at a time; the GPU's own
  # setting is both models at once.
  p = json.loads(tiny_h100.stdout)
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


@needs_jax_cuda
def test_the_plans_layout_is_launched_as_printed_and_its_compiles_are_told(tiny_h100):
  """The plan's launch lines carry the planned run's flags; the local one, run in the
  launcher's dry-run mode, starts the planned workers with `ihsweep run` flags the CLI accepts;
  stderr names each compile's pass and group as it starts and ends, with the seconds so far;
  the explicit-pattern comparison ran only where asked (--compare_attention)."""
  from ihsweep import cli
  from ihsweep.commands import flags
  from ihsweep.planning import plan_text, target_plan

  p = json.loads(tiny_h100.stdout)
  assert p["n_workers"] == 1 and p["devices_per_worker"] == 2, p["layouts"]
  # its choice is `ihsweep run`'s own layout on the 2 GPUs, launched as the FLOPs plan launches
  # it (one process, the auto layout: prediction._default_launch)
  assert p["chosen"] == "phases"
  assert [(ph["n_workers"], ph["devices_per_worker"]) for ph in p["phases"]] == [(1, 2)]
  words = (
    "--config=configs/default.py:tiny --config.ensemble.size=2 --config.train.batch_size=16 "
    "--workdir=runs/default_tiny"
  )
  assert p["launch"]["lines"] == [f"launch/local.sh {words}"]
  # the typed plan reads back what --json printed, and formats from it
  plan = target_plan.TargetPlan.from_json(p)
  assert plan.to_json() == p and plan.best.devices_per_worker == 2 and plan.fits
  text = plan_text.format_plan(plan)
  assert "to run it (1 phase(s): 1 worker(s) × 2 device(s); `ihsweep run`'s auto layout" in text
  assert text.endswith("\n  " + "\n  ".join(p["launch"]["lines"]))
  path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"  # the venv's ihsweep
  env = {**os.environ, "IHSWEEP": "ihsweep", "XLA_FLAGS": "", "PATH": path}
  r = subprocess.run(["bash", "-c", p["launch"]["lines"][0] + " --dry-run"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=60)  # fmt: skip
  assert r.returncode == 0, r.stderr
  (worker,) = r.stdout.strip().splitlines()
  assert worker.strip() == f"ihsweep run {words}"
  found, positional = flags.split_args(worker.split("ihsweep run ", 1)[1].split())
  assert cli._check_flags("run", found, positional) is None
  err = tiny_h100.stderr
  assert "pass 1 (memory on workers of 1 device(s)), group 1 of 1: group g000 (E = 2, B = 16" in err
  assert re.search(r"\[ +\d+ s\] pass 1 .*group g000 done in \d+ s: gradient_accumulation_st", err)
  assert "explicit" not in err and "explicit_bytes" not in p["groups"][0]["attention"]


def test_every_target_is_priced_from_a_published_figure():
  """Each GPU and TPU generation names its interconnect (chips.NETWORKS, per device each way,
  its source cited); a plan on a chip without one keeps to layouts without all-reduces and says
  so."""
  import types

  from ihsweep.planning import chips, target_plan, targets, timing, toolchain

  for name, chip in {**chips.GPUS, **chips.TPU_CHIPS}.items():
    net = chips.NETWORKS.get(chip.network)
    assert net is not None and net.name == chip.network, name
    assert "bidirectional" in net.source or "all-reduce bandwidth" in net.source, name
  assert chips.NETWORKS["a100"].intra_host_bytes_per_s == 600e9 / 2
  assert chips.NETWORKS["l40s"].intra_host_bytes_per_s == 64e9 / 2
  assert chips.NETWORKS["v6e"].inter_host_bytes_per_s == 800e9 / 2
  # 8 A100s, E = 2 models of 54M parameters, B split over 4 of them: 2 · 3/4 · 218 MB / 300 GB/s
  job = types.SimpleNamespace(n_models=2, batch_size=8, n_params=54_000_000)
  a100 = timing.FlopsModel(312e12, chips.NETWORKS["a100"], 8)
  assert a100.all_reduce_s(job, 8) == pytest.approx(2 * 3 / 4 * 54e6 * 4 / 300e9 + 6 * 10e-6)
  # v4: libtpu lists a chip as 2 TensorCores, which share its links
  v4 = toolchain.Target("v4:2x2x1", chips.TPU_CHIPS["v4"], [], 0, 8, "TPU compiler")
  assert v4.network.intra_host_bytes_per_s == pytest.approx(1.1e15 / 4096 / 2)
  layouts = [
    target_plan.Layout(1, 8, makespan_s=9.0, utilisation=0.3, data_axis_groups=0, comm_share=0.0),
    target_plan.Layout(4, 2, makespan_s=5.0, utilisation=0.6, data_axis_groups=0, comm_share=0.0),
    target_plan.Layout(8, 1, makespan_s=3.0, utilisation=0.9, data_axis_groups=2, comm_share=0.1),
  ]
  h100 = types.SimpleNamespace(network=chips.NETWORKS["h100"], chip=chips.GPUS["h100-80gb"])
  assert targets.best_layout(layouts, h100) == (layouts[2], None)
  unknown = types.SimpleNamespace(network=None, chip=chips.GPUS["h100-80gb"])
  best, why = targets.best_layout(layouts, unknown)
  assert best is layouts[1] and "no published interconnect figure" in why
  best, why = targets.best_layout(layouts[2:], unknown)
  assert best is layouts[2] and "the choice ignores that time" in why
  # a TPU layout narrower than a host is not launchable (one process per host), so not chosen
  layouts[2] = dataclasses.replace(layouts[2], not_launchable="a TPU host runs one process")
  assert targets.best_layout(layouts, h100)[0] is layouts[1]


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
  from ihsweep.planning import chips

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
    assert chips.tpu_topology_problem(chip, shape) is None, ok


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

  from ihsweep.planning import toolchain

  monkeypatch.setattr(toolchain, "CHECKOUT_JAX_CUDA", "/nonexistent/jax-cuda")
  t = toolchain.make_target("h100-80gb", 2)
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
  GiB with the explicit pattern (--compare_attention, that cell alone), against the CPU
  estimate's 96); the plan's layout, 4 workers of 2 GPUs, priced on NVLink, with its launch
  line (`ihsweep run`'s auto layout, which is that layout), and a progress line per compile."""
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
  for i in range(1, 5):
    assert f"pass 1 (memory on workers of 1 device(s)), group {i} of 4: group g00" in r.stderr
  assert "explicit" not in r.stderr  # the comparison only where asked
  assert (p["n_workers"], p["devices_per_worker"], p["unpriced"]) == (4, 2, None), p["layouts"]
  # run's auto layout on the node is the same 4 × 2, so the launch is its own (one process)
  assert p["chosen"] == "phases"
  assert [(ph["n_workers"], ph["devices_per_worker"]) for ph in p["phases"]] == [(4, 2)]
  assert p["launch"]["lines"] == [
    "launch/local.sh --config=configs/exp1_natural.py "
    "'--config.sweep.grid.train.batch_size=(8, 128)' "
    "'--config.sweep.grid.train.context_size=(64, 1024)' --workdir=runs/exp1_natural"
  ]
  big = cells[(128, 1024)]
  assert big["gradient_accumulation_steps"] == 1 and big["vmap_chunk"] == 2, big
  # The train step's attention is cuDNN's flash attention (bf16, head dimension 96), and at
  # C = 1024 it saves what the explicit [B·H, C, C] pattern needs: 46.65 -> 22.72 GiB.
  for g in cells.values():
    assert g["attention"] == {"compiled": "cudnn"}, g["attention"]
  r = _plan("--target=h100-80gb", "--devices=1", "--config=configs/exp1_natural.py",
            "--config.sweep.grid.train.batch_size=(128,)",
            "--config.sweep.grid.train.context_size=(1024,)", "--compare_attention", "--json",
            libtpu=False)  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  assert "pass 2 (--compare_attention: the explicit pattern), group 1 of 1" in r.stderr
  # Pass 1's two programs (train and evaluation) are the 8-H100 plan's for this cell, which
  # ran each on one device of a node: read back, not compiled (JAX's own cache keeps no program
  # of a compile-only device). The explicit pattern's pass compiles the train program anew and
  # reads back the evaluation program.
  assert re.search(r"pass 1 .*group g000 done in \d+ s: .*; 2 program\(s\) read back from ",
                   r.stderr), r.stderr[-3000:]  # fmt: skip
  assert re.search(r"pass 2 .*group g000 done in \d+ s: .*; 1 program\(s\) read back from ",
                   r.stderr), r.stderr[-3000:]  # fmt: skip
  (g,) = json.loads(r.stdout)["groups"]
  assert g["memory"]["per_device_bytes"] == big["memory"]["per_device_bytes"]
  assert g["attention"]["saved_bytes"] > 20 * GIB, g["attention"]
  assert g["attention"]["explicit_bytes"] > 40 * GIB
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


@pytest.mark.skipif(not (LIBTPU / "libtpu").is_dir(), reason="make test installs build/libtpu")
def test_a_tpu_target_starts_without_libtpus_metadata_noise():
  """Off a TPU VM libtpu asked the metadata server and printed "could not determine TPU
  accelerator type" and an E0000 "unexpected worker hostname" before every TPU plan."""
  code = (
    "from ihsweep.planning import toolchain\n"
    "for n in ('v5e:2x4', 'v4:2x2x2'): print(n, len(toolchain.make_target(n).devices))"
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ["v5e:2x4", "8", "v4:2x2x2", "16"]
  assert "could not determine" not in r.stderr and "E0000" not in r.stderr, r.stderr
