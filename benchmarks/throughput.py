"""Throughput of the ensemble trainer: one vmapped program vs a loop of single-model programs.

  python benchmarks/throughput.py --json [--workload reference|tiny] [--E 16] [--E 1,4,16]
      [--data uniform|natural|markov] [--loader device|host]

All modes do the same work: E models, ``--updates`` updates each per timed round, the same
``train_step``, tokens from ``--data``: ``uniform`` random tokens generated in-graph (default),
or ``natural`` windows of the python-docs corpus (byte-level BPE at the workload's vocabulary;
``ihsweep corpus fetch python-docs`` first), gathered in-graph from the token array on device
(``--loader device``) or by the host loader with prefetch (``--loader host``, ensemble mode), or
``markov``: semi-natural Markov sequences (the python-docs bigram matrix at the workload's V,
frequency 0.5, reliability 0.5) generated in-graph.
  ensemble         ``make_ensemble_train_fn``: one program, vmap over E, lax.scan over K updates
                   per call (K = ``--steps_per_call``), E sharded over the devices as
                   ``ihsweep train`` does (on CPU: one XLA device per core).
  sequential       a Python loop over E separately jitted single-model steps (one update per
                   call), model after model — what one writes without ihsweep.
  sequential_scan  the same loop, but each single-model call also scans K updates (the
                   strongest loop we know; isolates what vmap itself buys).
  data_only        the ensemble call's in-graph data generation alone.
  eval             online evaluation at the default ``eval`` settings (100 repeated-token
                   probes, 32 held-out sequences per model): seconds per evaluation of all E
                   models, and ``overhead`` = that ÷ the time of ``--eval_every`` updates
                   (``eval_s``, ``train_s`` scaled from ``--updates`` timed updates; the share
                   of training time evaluation adds).
tokens_per_s is the best of ``--rounds`` rounds (this machine is shared; the best round is the
least disturbed); the median is reported beside it.

Model FLOPs per token: ``ihsweep.compute.model.flops_per_token`` = 6·N + 12·n_layers·d_model·C
(PaLM, appendix B), N = matmul parameters incl. the unembedding. MFU = model FLOP/s ÷ the float32
matmul peak measured in the same process (best of a few square matmuls).

Prints one JSON object: ``workload``, ``matmul_peak_gflops``, ``backend``, ``devices`` and
``results``, one entry per E and mode (``run_mode``, ``eval_overhead``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ihsweep import data as data_lib
from ihsweep.base import sharding
from ihsweep.compute import train
from ihsweep.compute.model import ModelConfig, flops_per_token
from ihsweep.data.builtin import UniformSource
from ihsweep.training.group_build import GroupBuild
from ihsweep.training.loader import HostLoader

WORKLOADS = {
  "reference": dict(
    model=dict(n_layers=2, n_heads=4, d_model=128, d_mlp=512, vocab_size=4096, max_context=128),
    batch_size=16,
    context_size=128,
  ),
  "tiny": dict(
    model=dict(n_layers=2, n_heads=4, d_model=64, d_mlp=256, vocab_size=512, max_context=64),
    batch_size=8,
    context_size=64,
  ),
}


def matmul_peak_gflops(sizes=(1024, 2048), reps: int = 10) -> float:
  """Best float32 GFLOP/s of jitted n×n @ n×n matmuls (2n³ FLOPs), over sizes and repeats.

  The best, not the mean: on a shared machine a disturbed repeat would lower the peak and so
  inflate every MFU."""
  f = jax.jit(lambda a, b: a @ b)
  best = 0.0
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f(a, b).block_until_ready()
    for _ in range(reps):
      t = time.perf_counter()
      f(a, b).block_until_ready()
      best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
  return best


def _source(data: str, loader: str, mcfg: ModelConfig, tcfg: train.TrainConfig):
  if data == "uniform":
    return UniformSource(mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  data_cfg = data_lib.default_config()
  data_cfg.update(source=data, corpus="python-docs", loader=loader)
  return data_lib.make_source(data_cfg, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)


def _config(workload: str, n_models: int, steps_per_call: int, total_steps: int, attention, dtype):
  """The workload as a run config: every other field at its schema default."""
  import ml_collections

  from ihsweep.base import schema

  w = WORKLOADS[workload]
  cfg = ml_collections.ConfigDict({"seed": 0})
  for section in ("model", "train", "ensemble", "data", "mesh", "eval"):
    cfg[section] = schema.defaults(section)
  cfg.model.update(**w["model"], dtype=dtype)
  cfg.train.update(
    batch_size=w["batch_size"],
    context_size=w["context_size"],
    num_steps=total_steps,
    steps_per_call=steps_per_call,
    lr=1e-3,
    attention=attention,  # 'auto': as ihsweep trains on this backend
    gradient_accumulation_steps=1,
  )
  cfg.ensemble.size = n_models
  return cfg


def _build(
  workload: str,
  n_models: int,
  steps_per_call: int,
  total_steps: int,
  data: str,
  loader: str,
  devices=None,
  attention: str = "auto",
  dtype: str = "float32",
):
  """The ensemble's programs, built as training builds them (``group_build.GroupBuild``)."""
  cfg = _config(workload, n_models, steps_per_call, total_steps, attention, dtype)
  mcfg, tcfg = train.model_and_train_config(cfg)
  source = _source(data, loader, mcfg, tcfg)
  group = GroupBuild(cfg, list(jax.devices() if devices is None else devices), source)
  mesh = group.mesh

  def feed(state, n_calls):
    """Data for ``n_calls`` calls: the shared arrays, or a host loader's batches."""
    if not group.host_fed:
      arrays = jax.device_put(source.arrays(), sharding.replicated(mesh))
      return lambda: arrays
    loader = HostLoader(source, state, mesh, steps_per_call)
    loader.prefetch(0, [steps_per_call] * n_calls)
    return loader.next

  return group, feed


def lower_bf16_reference(
  n_models: int, steps_per_call: int, devices: list, attention: str = "auto"
) -> tuple:
  """The 'reference' workload's ensemble program in bf16 (as device_check.sh runs it) for
  ``n_models`` on the first of ``devices`` (compile-only devices too: nothing is placed),
  lowered against abstract arguments. Returns ``(jax.stages.Lowered, ModelConfig,
  TrainConfig)``."""
  group, _ = _build(
    "reference", n_models, steps_per_call, 50, "uniform", "device", devices[:1], attention,
    dtype="bfloat16",
  )  # fmt: skip
  lowered = group.train_program().lower(
    group.abstract_state(), group.abstract_hparams(), group.abstract_data()
  )
  return lowered, group.mcfg, group.tcfg


def _time_programs(step, programs, n_calls: int, rounds: int) -> tuple[float, list[float]]:
  """Runs one jitted ``step`` on each (state, hp, next_data) of ``programs`` (all of one shape).

  Returns (compile_s, seconds of each timed round). A round makes ``n_calls`` calls for every
  program, one program after another, after one untimed warm-up call each."""
  state0, hp0, next0 = programs[0]
  t0 = time.perf_counter()
  # The trainer's program (train.TrainProgram) compiles into a callable of the same arguments;
  # a plain jitted function (data_only) through its lowering.
  if isinstance(step, train.TrainProgram):
    compiled = step.compile(state0, hp0, next0())
  else:
    compiled = step.lower(state0, hp0, next0()).compile()

  compile_s = time.perf_counter() - t0
  states = []
  for state, hp, next_data in programs:
    state, metrics = compiled(state, hp, next_data())
    jax.block_until_ready(metrics)
    states.append(state)
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    for i, (_, hp, next_data) in enumerate(programs):
      for _ in range(n_calls):
        states[i], metrics = compiled(states[i], hp, next_data())
    jax.block_until_ready(states)
    times.append(time.perf_counter() - t0)
  return compile_s, times


def _data_only_program(sample, steps_per_call: int):
  """Only the in-graph data of an ensemble call (``train.sample_ensemble_batches``): its time
  over the ensemble call's is the share of step time spent generating data."""

  def generate(state, hp, arrays):
    batches = train.sample_ensemble_batches(sample, state, hp, arrays, steps_per_call)
    return state.replace(step=state.step + steps_per_call), {"checksum": batches.sum()}

  return jax.jit(generate, donate_argnums=0)


def eval_overhead(
  workload: str, n_models: int, updates: int, steps_per_call: int, rounds: int, every: int
) -> dict:
  """Seconds per online evaluation of the ensemble (``evaluation.Evaluator`` at the default
  ``eval`` config) against the seconds of ``every`` updates (timed over ``updates``, scaled)."""
  from ihsweep.data import probes as probes_lib

  group, feed = _build(workload, n_models, steps_per_call, updates, "uniform", "device")
  cfg, init, hp = group.cfg, group.init_fn(), group.hparams()
  state = init(jnp.arange(n_models, dtype=jnp.int32))
  _, times = _time_programs(
    group.train_program(), [(state, hp, feed(state, 0))], updates // steps_per_call, rounds
  )
  arrays = jax.device_put(group.source.arrays(), sharding.replicated(group.mesh))
  probes = probes_lib.make_probes(
    group.source, hp.data, arrays, cfg.eval, n_models, group.tcfg.context_size
  )
  evaluator = group.evaluator(probes)
  params = init(jnp.arange(n_models, dtype=jnp.int32)).params
  jax.block_until_ready(evaluator(params))  # compile
  eval_times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    jax.block_until_ready(evaluator(params))
    eval_times.append(time.perf_counter() - t0)
  eval_s, train_s = min(eval_times), min(times) * every / updates
  return {
    "mode": "eval",
    "E": n_models,
    "eval_s": round(eval_s, 3),
    "train_s": round(train_s, 3),
    "every_steps": every,
    "overhead": round(eval_s / train_s, 4),
    "n_probes": cfg.eval.n_probes,
    "n_sequences": cfg.eval.n_sequences,
  }


def run_mode(
  mode: str,
  workload: str,
  n_models: int,
  updates: int,
  steps_per_call: int,
  rounds: int,
  peak_gflops: float,
  data: str = "uniform",
  loader: str = "device",
) -> dict:
  """``updates`` per model per round. ensemble: one program, ``steps_per_call`` updates per
  call. sequential: E single-model programs, one update per call (a plain per-step loop).
  sequential_scan: E single-model programs, ``steps_per_call`` updates per call. data_only: the
  ensemble call's in-graph data generation alone (no model)."""
  seeds = jnp.arange(n_models, dtype=jnp.int32)
  k = 1 if mode == "sequential" else steps_per_call
  n_calls = updates // k
  calls_needed = 2 + n_calls * rounds  # compile + warm-up + timed
  if mode in ("ensemble", "data_only"):
    # Placed as `ihsweep train` places it: over every device.
    group, feed = _build(workload, n_models, k, updates, data, loader)
    step, state = group.train_program(), group.init_fn()(seeds)
    programs = [(state, group.hparams(), feed(state, calls_needed))]
    if mode == "data_only":
      if not group.source.on_device:
        raise SystemExit("data_only measures in-graph data; not --loader host")
      step = _data_only_program(group.source.sample, k)
  else:  # what one writes without ihsweep: one model at a time on one device
    if loader == "host":
      raise SystemExit("--loader host is measured in ensemble mode only")
    group, feed = _build(workload, 1, k, updates, data, loader, devices=jax.devices()[:1])
    step, init, hp = group.train_program(), group.init_fn(), group.hparams()
    programs = []
    for i in range(n_models):
      state = init(seeds[i : i + 1])
      programs.append((state, hp, feed(state, calls_needed)))
  compile_s, times = _time_programs(step, programs, n_calls, rounds)
  mcfg, tcfg = group.mcfg, group.tcfg
  tokens = n_models * updates * train.tokens_per_update(tcfg)
  best, median = tokens / min(times), tokens / float(np.median(times))
  flops = best * flops_per_token(mcfg, tcfg.context_size)
  return {
    "mode": mode,
    "E": n_models,
    "tokens_per_s": round(best, 1),
    "model_flops_per_s": round(flops, 1),
    "mfu": round(flops / (peak_gflops * 1e9), 4),
    "compile_s": round(compile_s, 2),
    "tokens_per_s_median": round(median, 1),
    "steps_per_call": k,
    "updates_per_round": updates,
    "rounds": rounds,
    "data": data,
    "loader": loader if data == "natural" else "in-graph",
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--workload", choices=sorted(WORKLOADS), default="reference")
  p.add_argument("--E", default="1,4,16", help="ensemble sizes, comma-separated")
  p.add_argument("--modes", default="ensemble,sequential,sequential_scan")
  p.add_argument("--steps_per_call", type=int, default=10)
  p.add_argument("--updates", type=int, default=10, help="timed updates per model per round")
  p.add_argument(
    "--rounds",
    type=int,
    default=3,
    help="timed rounds; tokens_per_s is the best, tokens_per_s_median the median",
  )
  p.add_argument(
    "--data",
    choices=("uniform", "natural", "markov"),
    default="uniform",
    help="uniform random tokens, python-docs windows, or Markov sequences from the "
    "python-docs bigrams (fetch the corpus first)",
  )
  p.add_argument(
    "--loader",
    choices=("device", "host"),
    default="device",
    help="natural: token array on device (in-graph windows) or host loader",
  )
  p.add_argument(
    "--eval_every",
    type=int,
    default=100,
    help="eval mode: updates between evaluations (ihsweep's default 100)",
  )
  p.add_argument(
    "--cpu_devices",
    type=int,
    default=None,
    help="XLA CPU devices (default: one per core, as `ihsweep` uses)",
  )
  args = p.parse_args(argv)
  sharding.use_one_cpu_device_per_core(args.cpu_devices)
  peak = matmul_peak_gflops()
  results = []
  for n in [int(x) for x in args.E.split(",")]:
    for mode in args.modes.split(","):
      if mode == "eval":
        results.append(
          eval_overhead(
            args.workload, n, args.updates, args.steps_per_call, args.rounds, args.eval_every
          )
        )
        continue
      r = run_mode(
        mode,
        args.workload,
        n,
        args.updates,
        args.steps_per_call,
        args.rounds,
        peak,
        args.data,
        args.loader,
      )
      results.append(r)
      if not args.json:
        print(r, file=sys.stderr)
  out = {
    "workload": args.workload,
    "matmul_peak_gflops": round(peak, 1),
    "backend": jax.default_backend(),
    "devices": len(jax.devices()),
    "results": results,
  }
  print(json.dumps(out) if args.json else json.dumps(out, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
