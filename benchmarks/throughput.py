"""Throughput of the ensemble trainer: one vmapped program vs a loop of single-model programs.

  python benchmarks/throughput.py --json [--workload reference|tiny] [--E 16] [--E 1,4,16]

Both modes do the same work: E models, ``--steps`` updates each, uniform random tokens sampled
in-graph, the same ``train_step``. ``ensemble`` = ``make_ensemble_train_fn`` (vmap over E, scan
over K updates per call). ``sequential`` = E separately jitted single-model programs (the same
code with E = 1, also scanning K updates per call), called one after another in a Python loop.

Model FLOPs per token: ``ihsweep.model.flops_per_token`` = 6·N + 12·n_layers·d_model·C (PaLM,
appendix B), N = matmul parameters incl. the unembedding. MFU = model FLOP/s ÷ the float32
matmul peak measured in the same process (best of a few square matmuls).

Prints one JSON object (format in DESIGN.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ihsweep import sharding, train
from ihsweep.data.builtin import UniformSource
from ihsweep.model import ModelConfig, Transformer, flops_per_token

WORKLOADS = {
    "reference": dict(model=dict(n_layers=2, n_heads=4, d_model=128, d_mlp=512, vocab_size=4096,
                                 max_context=128), batch_size=16, context_size=128),
    "tiny": dict(model=dict(n_layers=2, n_heads=4, d_model=64, d_mlp=256, vocab_size=512,
                            max_context=64), batch_size=8, context_size=64),
}


def matmul_peak_gflops(n: int = 2048, reps: int = 5) -> float:
  """Best float32 GFLOP/s of an n×n @ n×n jitted matmul (2n³ FLOPs)."""
  f = jax.jit(lambda a, b: a @ b)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best / 1e9


def _build(workload: str, n_models: int, steps_per_call: int, total_steps: int):
  w = WORKLOADS[workload]
  mcfg = ModelConfig(**w["model"], dtype="float32")
  tcfg = train.TrainConfig(batch_size=w["batch_size"], context_size=w["context_size"],
                           num_steps=total_steps, steps_per_call=steps_per_call, lr=1e-3)
  model = Transformer(mcfg)
  source = UniformSource(mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  mesh = sharding.make_mesh(n_models, tcfg.batch_size, jax.devices()[:1])
  init = train.make_init_fn(model, tcfg, mesh)
  step = train.make_ensemble_train_fn(model, tcfg, source.sample, mesh, steps_per_call)
  hp = train.HParams(peak_lr=jnp.full((n_models,), tcfg.lr), data=source.data_params(n_models))
  return mcfg, tcfg, init, step, hp


def _time_programs(programs, n_calls: int) -> tuple[float, float]:
  """programs: list of (step_fn, state, hp). Returns (compile_s, run_s) over n_calls calls each,
  calling the programs one after another per call round."""
  t0 = time.perf_counter()
  states = []
  for step, state, hp in programs:
    state, metrics = step(state, hp)
    jax.block_until_ready(metrics)
    states.append(state)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(n_calls):
    for i, (step, _, hp) in enumerate(programs):
      states[i], metrics = step(states[i], hp)
  jax.block_until_ready(states)
  return compile_s, time.perf_counter() - t0


def run_mode(mode: str, workload: str, n_models: int, steps_per_call: int, n_calls: int,
             peak_gflops: float) -> dict:
  seeds = jnp.arange(n_models, dtype=jnp.int32)
  if mode == "ensemble":
    mcfg, tcfg, init, step, hp = _build(workload, n_models, steps_per_call, n_calls)
    programs = [(step, init(seeds), hp)]
  else:
    mcfg, tcfg, init, step, hp = _build(workload, 1, steps_per_call, n_calls)
    programs = [(step, init(seeds[i:i + 1]), hp) for i in range(n_models)]
  compile_s, run_s = _time_programs(programs, n_calls)
  tokens = n_models * n_calls * steps_per_call * train.tokens_per_update(tcfg)
  tps = tokens / run_s
  flops = tps * flops_per_token(mcfg, tcfg.context_size)
  return {"mode": mode, "E": n_models, "tokens_per_s": round(tps, 1),
          "model_flops_per_s": round(flops, 1), "mfu": round(flops / (peak_gflops * 1e9), 4),
          "compile_s": round(compile_s, 2), "steps_per_call": steps_per_call,
          "updates_timed": n_calls * steps_per_call}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--workload", choices=sorted(WORKLOADS), default="reference")
  p.add_argument("--E", default="1,4,16", help="ensemble sizes, comma-separated")
  p.add_argument("--modes", default="ensemble,sequential")
  p.add_argument("--steps_per_call", type=int, default=10)
  p.add_argument("--calls", type=int, default=3, help="timed calls (after one warm-up call)")
  args = p.parse_args(argv)
  peak = matmul_peak_gflops()
  results = []
  for n in [int(x) for x in args.E.split(",")]:
    for mode in args.modes.split(","):
      if mode == "sequential" and n == 1 and "ensemble" in args.modes:
        continue  # identical to the ensemble of one
      r = run_mode(mode, args.workload, n, args.steps_per_call, args.calls, peak)
      results.append(r)
      if not args.json:
        print(r, file=sys.stderr)
  out = {"workload": args.workload, "matmul_peak_gflops": round(peak, 1),
         "backend": jax.default_backend(), "devices": len(jax.devices()), "results": results}
  print(json.dumps(out) if args.json else json.dumps(out, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
