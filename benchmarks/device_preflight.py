"""Pre-flight of benchmarks/device_check.sh: every program it runs on the GPU, compiled first
on this machine, without a GPU, by XLA:GPU for compile-only devices of that GPU (JAX's CUDA
plugin from ``make install``; ``ihsweep.planning.toolchain``), so that a short device session
cannot fail in its first minute on a program that does not compile or does not fit.

  python benchmarks/device_preflight.py --json --out preflight.json   # what the CI test runs
  bash benchmarks/device_check.sh --preflight                          # the same

The programs, at the sizes device_check.sh runs them on the GPU:
  (a) the bf16 matmul of the peak measurement (8192 × 8192), and benchmarks/throughput.py's
      'reference' workload in bf16 (2 layers, d_model 128, V 4096, B 16, C 128): the ensemble
      program (E = 64, 10 updates per call) and the single-model programs of the sequential
      modes (1 and 10 updates per call); (b) compiles that ensemble program again (in a new
      process, against a warm cache): nothing new to check;
  (d) the study's largest exp1 cell (benchmarks/memory_check.py: B 128 × C 1024, E 2, d 768,
      V 50,257, bf16) at the memory setting ihsweep chooses for the target's capacity
      (``runner.resolve_memory``, the code the GPU run uses), with its predicted bytes per
      device: device_check.sh passes this file to memory_check.py (``--planned``), which trains
      at that setting and reports the measured peak against this prediction;
  (c) every group of the tiny sweep (configs/default.py:tiny, B 8/16/32/64, E 4): train and
      evaluation programs, as ``ihsweep plan --target`` compiles them.

Output: one line per program (compiled or the compiler's error, bytes per device, seconds to
compile, or to read what an earlier preflight's compile found from ``$IHSWEEP_CACHE/compiled``:
``ihsweep.training.compiled_facts``); with ``--json`` one JSON object ``{"target", "programs":
[{"part", "program", "ok", "error", "per_device_bytes", "temp_bytes", "compile_s"}],
"largest_cell": {"setting", "predicted_bytes", "capacity_bytes", "memory_from"}, "ok"}``. Exit
status 1 if any program failed to compile or does not fit, 2 if the GPU compiler is not
installed (``make install``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# device_check.sh's GPU sizes (its --cpu-smoke sizes are checked by its own CI test).
THROUGHPUT_E, THROUGHPUT_U = 64, 10
PEAK_MATMUL = 8192
SWEEP = (
  "--config=configs/default.py:tiny",
  "--grid=train.batch_size=8,16,32,64",
  "--config.train.num_steps=2000",
  "--config.eval.every_steps=200",
)


def _record(programs: list, part: str, name: str, build, facts) -> None:
  """Compiles ``build()`` (a ``jax.stages.Lowered``) through ``facts`` (the target's
  ``CompiledFacts``: a rerun reads what an earlier compile found) and appends what it found."""
  start = time.perf_counter()
  row = {"part": part, "program": name, "ok": False, "error": None}
  try:
    m = facts.analyse(build(), 1)
    row.update(ok=True, per_device_bytes=m.peak_bytes, temp_bytes=m.temp_bytes)
  except Exception as e:  # noqa: BLE001 — the compiler's own words are the result
    row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
  row["compile_s"] = round(time.perf_counter() - start, 2)
  programs.append(row)


def _throughput_programs(target, programs: list, facts) -> None:
  """(a), (b): the matmul and the reference workload's programs, as throughput.run_mode builds
  them (every model at once on the device for the ensemble, one model for the sequential
  modes), lowered against abstract arguments on the target's devices."""
  import jax
  import jax.numpy as jnp
  import throughput
  from jax.sharding import NamedSharding, PartitionSpec

  device = target.devices[0]
  one = NamedSharding(jax.sharding.Mesh([device], ("x",)), PartitionSpec())
  square = jax.ShapeDtypeStruct((PEAK_MATMUL, PEAK_MATMUL), jnp.bfloat16, sharding=one)
  _record(
    programs,
    "a",
    f"bf16 matmul {PEAK_MATMUL}x{PEAK_MATMUL}",
    lambda: jax.jit(lambda a, b: a @ b).lower(square, square),
    facts,
  )
  # device_check.sh runs the workload in bf16 (its THROUGHPUT script); 'auto' attention, as
  # ihsweep resolves it for the GPU.
  for mode, n_models, u in (
    ("ensemble", THROUGHPUT_E, THROUGHPUT_U),
    ("sequential", 1, 1),
    ("sequential_scan", 1, THROUGHPUT_U),
  ):
    name = f"reference {mode}, E = {n_models}, {u} update(s)/call"
    _record(
      programs, "a", name,
      lambda n=n_models, u=u: throughput.lower_bf16_reference(n, u, target.devices[:1])[0],
      facts,
    )  # fmt: skip


def _largest_cell(target, programs: list, facts) -> dict:
  """(d): memory_check.py's cell at the setting chosen for the target."""
  import memory_check

  from ihsweep.training import runner

  cfg = memory_check.cell_config(False, 10)
  start = time.perf_counter()
  row = {"part": "d", "program": "largest exp1 cell (train, at the chosen setting)", "ok": False}
  result = {"memory_from": target.estimate, "capacity_bytes": target.capacity_bytes}
  try:
    out, choice = runner.resolve_memory(
      cfg, target.devices[:1], "the largest exp1 cell", target.capacity_bytes, None, "gpu",
      facts=facts,
    )  # fmt: skip
    s = choice.setting
    result.update(
      setting={
        "gradient_accumulation_steps": s.gradient_accumulation_steps,
        "vmap_chunk": s.vmap_chunk,
        "remat": s.remat,
        "attention": out.train.attention,
      },
      predicted_bytes=choice.per_device_bytes,
    )
    row.update(ok=True, error=None, per_device_bytes=choice.per_device_bytes)
    row["temp_bytes"] = choice.train.temp_bytes
  except Exception as e:  # noqa: BLE001 — DoesNotFit, or the compiler's own error: the result
    row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
  row["compile_s"] = round(time.perf_counter() - start, 2)
  programs.append(row)
  return result


def _sweep_programs(target_name: str, programs: list) -> None:
  """(c): ``ihsweep plan --target`` on the tiny sweep (its own process: the plan starts JAX's
  backends with the plugin itself)."""
  start = time.perf_counter()
  cmd = [sys.executable, "-m", "ihsweep.cli", "plan", f"--target={target_name}", "--devices=1"]
  r = subprocess.run([*cmd, *SWEEP, "--json"], cwd=ROOT, capture_output=True, text=True)
  took = round(time.perf_counter() - start, 2)
  if r.returncode:
    err = (r.stderr.strip().splitlines() or ["no output"])[-1]
    programs.append({"part": "c", "program": "tiny sweep", "ok": False, "error": err[:400]})
    return
  plan = json.loads(r.stdout)
  if not plan["groups"]:
    programs.append({"part": "c", "program": "tiny sweep", "ok": False, "error": "no groups"})
    return
  for g in plan["groups"]:
    programs.append(
      {
        "part": "c",
        "program": f"tiny sweep group {g['id']} (B = {g['batch_size']}; train and evaluation)",
        "ok": g["memory"]["fits"],
        "error": None if g["memory"]["fits"] else "does not fit",
        "per_device_bytes": g["memory"]["per_device_bytes"],
        "temp_bytes": g["memory"]["temp_bytes"],
        "compile_s": round(g["compile_s"], 2),
      }
    )
  programs[-1]["plan_s"] = took


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="h200-141gb", help="the GPU device_check.sh runs on")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--out", default=None, help="also write the JSON object to this file")
  args = p.parse_args(argv)

  from ihsweep.planning import chips, toolchain

  if args.target not in chips.GPUS:
    p.error(f"--target={args.target}: one of {', '.join(chips.GPUS)}")
  why = toolchain.use_gpu_compiler()
  if why:
    print(f"device_preflight: {why}", file=sys.stderr)
    return 2
  target = toolchain.make_target(args.target, 1)
  if target.estimate != toolchain.GPU_COMPILER:
    print(f"device_preflight: {target.estimate}", file=sys.stderr)
    return 2
  programs: list = []
  facts = target.compiled_facts()
  _throughput_programs(target, programs, facts)
  largest = _largest_cell(target, programs, facts)
  _sweep_programs(args.target, programs)
  result = {
    "target": args.target,
    "programs": programs,
    "largest_cell": largest,
    "ok": all(r["ok"] for r in programs),
  }
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  if args.json:
    print(json.dumps(result))
  else:
    gib = lambda n: f"{n / 2**30:.2f} GiB"
    for r in programs:
      what = gib(r["per_device_bytes"]) if r["ok"] else f"FAILED: {r['error']}"
      print(f"({r['part']}) {r['program']}: {what} ({r.get('compile_s', 0)} s)")
    print("every program compiles and fits" if result["ok"] else "NOT every program compiles")
  return 0 if result["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
