"""The study's largest exp1 cell on this machine's accelerator: the memory setting ihsweep
chooses, the bytes it predicted against the device's measured peak, and its speed.

  python benchmarks/memory_check.py --json            # on a GPU/TPU (device_check.sh part d)
  python benchmarks/memory_check.py --json --smoke    # here: a tiny cell on a CPU whose
                                                       # capacity is set so that k = 1 cannot fit

The cell: ``configs/exp1_natural.py`` at study scale (2 layers, 8 heads, d_model 768, d_mlp
3072, V 50,257, tied, bf16 compute) at B 128 × C 1024, E = 2, trained for ``--updates`` updates
on uniform random tokens generated in-graph (the corpus is not needed to measure memory and
speed: the program is the same but for its data argument). ``ihsweep.training.runner.fit`` chooses
the setting (``train.gradient_accumulation_steps`` = 0, ``train.remat`` = auto) from the compiled
programs' memory analysis, as ``ihsweep train`` does.

With ``--planned FILE`` (benchmarks/device_preflight.py's JSON) the cell trains at the setting
that the pre-flight chose for this GPU without one, and the measured peak is also compared with
that deviceless prediction (``planned_bytes``, ``peak_over_planned``).

Prints one JSON object: ``{"device", "cell", "setting" (k, vmap chunk, remat, attention, as
recorded in the run's config.json), "predicted_bytes" (ihsweep.training.memory's need per
device, compiled here), "planned_bytes", "planned_from", "peak_over_planned", "capacity_bytes",
"peak_bytes" (the device's peak_bytes_in_use after training; null on a CPU), "peak_over_predicted",
"tokens_per_s" (after the compiling call), "mfu" (model FLOPs per token × tokens/s over the
nominal dense bf16 peak: 989.4 TFLOP/s for H100/H200, null elsewhere), "updates", "wall_s"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

NOMINAL_BF16 = {"H100": 989.4e12, "H200": 989.4e12}


def cell_config(smoke: bool, updates: int):
  from configs import exp1_natural
  from ihsweep import data

  cfg = exp1_natural.get_config()
  cfg.data = data.default_config()
  cfg.data.source = "uniform"
  cfg.sweep.grid = type(cfg.sweep.grid)()
  if smoke:
    cfg.model.update(n_layers=1, n_heads=2, d_model=32, d_mlp=64, vocab_size=256, max_context=64)
    cfg.train.update(batch_size=16, context_size=64)
    cfg.model.dtype = "float32"
  else:
    cfg.train.update(batch_size=128, context_size=1024)
    cfg.model.dtype = "bfloat16"
  cfg.train.update(num_steps=updates, steps_per_call=max(1, updates // 2))
  cfg.train.update(gradient_accumulation_steps=0, remat="auto")
  cfg.ensemble.update(size=2, vmap_chunk=0)
  cfg.eval.update(every_steps=0, every_tokens=0)
  cfg.checkpoint.update(params_schedule="none", state_every_steps=0, async_save=False)
  return cfg


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--smoke", action="store_true", help="a tiny cell on a CPU (a test)")
  p.add_argument("--updates", type=int, default=10)
  p.add_argument(
    "--planned",
    default=None,
    help="benchmarks/device_preflight.py's JSON: train at the setting it chose without a GPU "
    "and report the measured peak against its prediction",
  )
  args = p.parse_args(argv)
  planned = None
  if args.planned:
    with open(args.planned) as f:
      planned = json.load(f)["largest_cell"]
  if args.smoke:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

  import jax

  from ihsweep.training import memory, runner
  from ihsweep.workers import compile_cache

  # As `ihsweep run`: a persistent compilation cache, so that fit loads the programs the
  # memory search compiled (a temporary one unless JAX_COMPILATION_CACHE_DIR chooses).
  cache = tempfile.TemporaryDirectory(prefix="ihsweep-memory-check-xla-")
  compile_cache.enable(cache.name)
  from ihsweep.compute.model import ModelConfig, flops_per_token

  cfg = cell_config(args.smoke, args.updates)
  device = jax.devices()[0]
  if args.smoke:  # a capacity just under what k = 1 needs: the run must accumulate
    os.environ[memory.CAPACITY_ENV] = str(1 << 40)
    one = cfg.copy_and_resolve_references()
    one.train.update(gradient_accumulation_steps=1, remat="none")
    one.ensemble.vmap_chunk = 1
    need = runner.resolve_memory(one, [device])[1].per_device_bytes
    os.environ[memory.CAPACITY_ENV] = str(int(0.9 * need / (1 - memory.HEADROOM)))
  if planned and "setting" in planned:  # the plan's setting, compiled again here, on the GPU
    s = planned["setting"]
    cfg.train.update(
      gradient_accumulation_steps=s["gradient_accumulation_steps"],
      remat=s["remat"],
      attention=s.get("attention", "auto"),
    )
    cfg.ensemble.vmap_chunk = s["vmap_chunk"]
  start = time.perf_counter()
  _, choice = runner.resolve_memory(cfg, [device], "the largest exp1 cell")
  with tempfile.TemporaryDirectory(prefix="ihsweep-memory-check-") as tmp:
    out = runner.fit(cfg, os.path.join(tmp, "run"), progress=False, devices=[device])
    with open(os.path.join(tmp, "run", "config.json")) as f:
      stored = json.load(f)
  wall = time.perf_counter() - start
  stats = device.memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  predicted = choice.per_device_bytes if choice else None
  mcfg = ModelConfig.from_config(cfg.model)
  nominal = next((v for k, v in NOMINAL_BF16.items() if k in device.device_kind), None)
  tok_s = out.tokens_per_s
  result = {
    "device": device.device_kind,
    "cell": {
      "batch_size": cfg.train.batch_size,
      "context_size": cfg.train.context_size,
      "n_models": cfg.ensemble.size,
      "d_model": mcfg.d_model,
      "vocab_size": mcfg.vocab_size,
      "dtype": mcfg.dtype,
    },
    "setting": {
      "gradient_accumulation_steps": stored["train"]["gradient_accumulation_steps"],
      "vmap_chunk": stored["ensemble"]["vmap_chunk"],
      "remat": stored["train"]["remat"],
      "attention": stored["train"]["attention"],
    },
    "predicted_bytes": predicted,
    "planned_bytes": planned.get("predicted_bytes") if planned else None,
    "planned_from": planned.get("memory_from") if planned else None,
    "peak_over_planned": peak / planned["predicted_bytes"]
    if peak and planned and planned.get("predicted_bytes")
    else None,
    "capacity_bytes": choice.capacity_bytes if choice else None,
    "settings_compiled": len(choice.tried) if choice else 0,
    "peak_bytes": peak,
    "peak_over_predicted": peak / predicted if peak and predicted else None,
    "tokens_per_s": tok_s,
    "mfu": tok_s * flops_per_token(mcfg, cfg.train.context_size) / nominal
    if tok_s and nominal
    else None,
    "updates": out.step,
    "wall_s": round(wall, 1),
  }
  print(json.dumps(result) if args.json else json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
