"""Speed of the analysis: ``python -m analysis report`` on E models × K params checkpoints.

  python benchmarks/analysis.py --json [--E 16] [--checkpoints 30] [--workload reference]

Builds a run directory as ``ihsweep train`` writes it (config.json, probes.npz at the default
``eval`` settings, ``checkpoints/params/<step>`` at K log-spaced steps) for E freshly initialised
models of the workload (``reference``: 2 layers, 4 heads, d_model 128, d_mlp 512, vocab 4096,
B 16, C 128, as in benchmarks/throughput.py), each checkpoint's params perturbed so no two are
equal; then times the whole report (restoring every checkpoint onto the local devices,
recomputing every metric with the compiled ensemble evaluation, emergence points, figures,
report.md/html) from a cold cache, and again with the cache warm. Building the directory is not
timed. The target (issue 7): under a minute for 16 × 30 on the 2-core CPU.

``--probes all --sequences all`` evaluates exactly what the online evaluation does (100 probes,
32 held-out sequences per model) instead of the analysis's default subset.

Prints one JSON object: ``{"workload", "E", "checkpoints", "devices", "build_s", "cold_s"
(whole report, empty cache), "warm_s" (again, cache full), "curves_s" (recomputing the curves
alone, no cache), "per_checkpoint_s", "rows", "n_probes", "n_sequences"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ihsweep.base.sharding import use_one_cpu_device_per_core  # noqa: E402

use_one_cpu_device_per_core()

import jax  # noqa: E402
import numpy as np  # noqa: E402

WORKLOADS = {
  "reference": dict(
    n_layers=2,
    n_heads=4,
    d_model=128,
    d_mlp=512,
    vocab_size=4096,
    max_context=128,
    batch_size=16,
    context_size=128,
  ),
  "tiny": dict(
    n_layers=2,
    n_heads=4,
    d_model=64,
    d_mlp=256,
    vocab_size=512,
    max_context=64,
    batch_size=8,
    context_size=64,
  ),
}


def build_run(workdir: str, workload: str, n_models: int, n_checkpoints: int) -> None:
  """A single-run directory with ``n_checkpoints`` params checkpoints of ``n_models`` models."""
  import configs.default
  from ihsweep.compute import train
  from ihsweep.compute.model import Transformer
  from ihsweep.data import make_source
  from ihsweep.data import probes as probes_lib
  from ihsweep.runs import checkpoint
  from ihsweep.training.resume import write_resolved_config
  from ihsweep.training.startup import cell_metadata

  w = WORKLOADS[workload]
  cfg = configs.default.get_config()
  cfg.model.update(
    n_layers=w["n_layers"],
    n_heads=w["n_heads"],
    d_model=w["d_model"],
    d_mlp=w["d_mlp"],
    vocab_size=w["vocab_size"],
    max_context=w["max_context"],
  )
  steps, k = {0}, 0
  while len(steps) < n_checkpoints:  # log-spaced, 2 per octave, as checkpoint.params_steps
    steps.add(int(round(2 ** (k / 2))))
    k += 1
  steps = sorted(steps)
  cfg.train.update(batch_size=w["batch_size"], context_size=w["context_size"], num_steps=steps[-1])
  cfg.ensemble.size = n_models
  cfg.data.source = "uniform"
  write_resolved_config(cfg, workdir)
  mcfg, tcfg = train.model_and_train_config(cfg)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("ensemble", "data"))
  state = train.make_init_fn(Transformer(mcfg), tcfg, mesh)(np.arange(n_models, dtype=np.int32))
  source = make_source(cfg.data, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  data_params = jax.tree_util.tree_map(np.asarray, source.data_params(n_models))
  probes = probes_lib.make_probes(
    source,
    data_params,
    jax.tree_util.tree_map(np.asarray, source.arrays()),
    cfg.eval,
    n_models,
    tcfg.context_size,
  )
  probes.save(os.path.join(workdir, "probes.npz"))
  n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params)) // n_models
  ckpts = checkpoint.RunCheckpoints(
    os.path.join(workdir, "checkpoints"),
    cell_metadata(cfg, mcfg, tcfg, source, n_params),
    read_only=False,
  )
  rng = np.random.default_rng(0)
  for step in steps:
    params = jax.tree_util.tree_map(
      lambda x: np.asarray(x) + 1e-3 * rng.standard_normal(x.shape).astype(x.dtype), state.params
    )
    ckpts.save_params(step, params)
  ckpts.close()
  with open(os.path.join(workdir, "train_log.jsonl"), "w") as f:
    f.write(json.dumps({"step": steps[-1]}) + "\n")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--json", action="store_true", help="print only the JSON result")
  p.add_argument("--E", type=int, default=16)
  p.add_argument("--checkpoints", type=int, default=30)
  p.add_argument("--workload", choices=sorted(WORKLOADS), default="reference")
  p.add_argument("--keep", help="build the run directory here and keep it")
  p.add_argument(
    "--probes",
    default=None,
    help="probes per checkpoint ('all' or N; default: the analysis default)",
  )
  p.add_argument("--sequences", default=None, help="held-out sequences ('all' or N)")
  args = p.parse_args(argv)
  import logging

  logging.basicConfig(level=logging.WARNING)
  logging.getLogger("absl").setLevel(logging.ERROR)
  from analysis import curves as curves_lib
  from analysis import report
  from ihsweep.runs.reader import load_run

  with tempfile.TemporaryDirectory(prefix="ihsweep-bench-analysis-") as tmp:
    workdir = args.keep or os.path.join(tmp, "run")
    t0 = time.perf_counter()
    build_run(workdir, args.workload, args.E, args.checkpoints)
    build_s = time.perf_counter() - t0
    sizes = {}
    for name, value in (("n_probes", args.probes), ("n_sequences", args.sequences)):
      if value is not None:
        sizes[name] = None if value == "all" else int(value)
    opts = report.Options(progress=not args.json, n_boot=2000, **sizes)
    t0 = time.perf_counter()
    report.report([workdir], None, opts)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    report.report([workdir], None, opts)
    warm = time.perf_counter() - t0
    run = load_run(workdir)
    t0 = time.perf_counter()
    table = curves_lib.compute_curves(
      run, cache=False, progress=False, n_probes=opts.n_probes, n_sequences=opts.n_sequences
    )
    curves_s = time.perf_counter() - t0
    run.close()
  result = {
    "workload": args.workload,
    "E": args.E,
    "checkpoints": args.checkpoints,
    "devices": len(jax.local_devices()),
    "backend": jax.default_backend(),
    "build_s": round(build_s, 2),
    "cold_s": round(cold, 2),
    "warm_s": round(warm, 2),
    "curves_s": round(curves_s, 2),
    "per_checkpoint_s": round(curves_s / args.checkpoints, 3),
    "rows": len(table),
    "n_probes": int(table["n_probes"].iloc[0]),
    "n_sequences": int(table["n_sequences"].iloc[0]),
  }
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
