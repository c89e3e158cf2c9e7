"""How far the XLA CPU compiler's memory analysis (what ``ihsweep plan --target`` uses for GPUs)
is from the TPU compiler's on the same programs.

  PYTHONPATH=build/libtpu JAX_PLATFORMS=cpu python benchmarks/memory_estimate.py --json \
      [--config configs/exp1_natural.py] [--tpu v5e:2x2] [--groups g000,g005] [--k 0]

For each chosen group of the config (default: every group), compiles its train and evaluation
programs on one device twice — for the TPU topology's first device (libtpu) and for this
machine's CPU — at the same memory setting: ``--k`` microbatches (0: the setting the TPU plan
chooses for the group, ``runner.resolve_memory`` with the TPU's capacity), vmap chunk and
remat as chosen there. Prints one JSON object: per group the setting, ``tpu_bytes``,
``cpu_bytes`` (``memory.Choice.per_device_bytes``) and ``cpu_over_tpu``, and over the groups
the ratio's min, median and max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--config", default="configs/exp1_natural.py", help="FILE[:ARG]")
  p.add_argument("--tpu", default="v5e:2x2", help="a TPU topology libtpu knows")
  p.add_argument("--groups", default="", help="group ids, comma-separated (default: all)")
  p.add_argument("--k", type=int, default=0, help="gradient_accumulation_steps (0: TPU's)")
  p.add_argument("--set", action="append", default=[], help="FIELD=VALUE config overrides")
  args = p.parse_args(argv)

  import ast
  import copy
  import importlib.util

  import jax

  from ihsweep.planning import placement, targets, toolchain
  from ihsweep.training import runner

  path, _, arg = args.config.partition(":")
  spec = importlib.util.spec_from_file_location("config_module", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config(arg)
  for item in args.set:  # FIELD=VALUE, as --config.FIELD=VALUE
    field, _, value = item.partition("=")
    *parents, name = field.split(".")
    node = cfg
    for part in parents:
      node = node[part]
    try:
      node[name] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      node[name] = value
  _, jobs = placement.make_jobs(cfg, None, check_data=False)
  wanted = set(filter(None, args.groups.split(",")))
  tpu = toolchain.make_target(args.tpu)
  cpu = jax.devices("cpu")[:1]
  rows = []
  for job in jobs:
    if wanted and job.id not in wanted:
      continue
    one = copy.deepcopy(job.cfg)
    with one.unlocked():
      if one.model.dtype == "auto":
        one.model.dtype = "bfloat16"
      if args.k:
        one.train.gradient_accumulation_steps = args.k
    source = targets.planned_source(one)
    chosen, on_tpu = runner.resolve_memory(one, tpu.devices[:1], job.id, tpu.capacity_bytes, source)
    _, on_cpu = runner.resolve_memory(chosen, cpu, job.id, 1 << 50, source)
    s = on_tpu.setting
    rows.append(
      {
        "group": job.id,
        "batch_size": job.batch_size,
        "context_size": job.context_size,
        "gradient_accumulation_steps": s.gradient_accumulation_steps,
        "vmap_chunk": s.vmap_chunk,
        "remat": s.remat,
        "tpu_bytes": on_tpu.per_device_bytes,
        "cpu_bytes": on_cpu.per_device_bytes,
        "cpu_over_tpu": on_cpu.per_device_bytes / on_tpu.per_device_bytes,
      }
    )
    if not args.json:
      print(json.dumps(rows[-1]), flush=True)
  ratios = [r["cpu_over_tpu"] for r in rows]
  out = {
    "config": args.config,
    "tpu": args.tpu,
    "groups": rows,
    "cpu_over_tpu": {
      "min": min(ratios),
      "median": statistics.median(ratios),
      "max": max(ratios),
    }
    if ratios
    else None,
  }
  print(json.dumps(out) if args.json else json.dumps(out["cpu_over_tpu"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
