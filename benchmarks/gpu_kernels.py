"""What the GPU compiler makes of ihsweep's train program, read without a GPU: every program
compiled by XLA:GPU for a compile-only H100 (``ihsweep.planning.toolchain``, JAX's CUDA plugin from
``make install``), and its optimised HLO read.

  python benchmarks/gpu_kernels.py            # the table
  python benchmarks/gpu_kernels.py --json     # one JSON object

Programs: benchmarks/throughput.py's 'reference' workload in bf16 (2 layers, d_model 128, V 4096,
B 16, C 128; 10 updates per call, as device_check.sh runs it) at E = 1, 16 and 64, and the
study's smallest and largest exp1 cells (B 8 × C 64 and B 128 × C 1024, E 2, d 768, V 50,257,
bf16) at the memory setting ``runner.resolve_memory`` chooses for an 80 GB H100.

Per program and update (the body of the program's update loop, nested loops multiplied by their
known trip counts, and the loop's condition):
  kernels       instructions that launch work on the GPU: fusions, library calls (GEMMs emitted
                as Triton or cuBLAS calls, cuDNN's attention), and unfused ops, not the free ones
                (parameters, tuples, bitcasts, control flow);
  gemms         of them, the matrix products; ``gemms_batched_over_models``: the products whose
                output has the ensemble's E as its leading dimension (one kernel for E models);
  dots by dtype operand dtypes → result dtype of every dot inside them (bf16 → f32 is intended:
                bf16 inputs, float32 accumulation; f32 operands in a bf16 model are not);
  layout copies copy and transpose kernels (data moved to change a layout);
  temp_bytes    the program's temporaries (``memory_analysis``) and the largest arrays its
                update writes;
  roofline      FLOPs / 989 TFLOP/s and bytes / 3.35 TB/s (H100 SXM bf16 dense peak and HBM
                bandwidth), from XLA's HLO cost analysis of the lowered program
                (``memory.analyse``: the compile-only plugin gives none; its bytes count every
                unfused op, so the bytes term is an over-estimate), plus cuDNN's attention
                FLOPs, which the analysis cannot see (``targets.fused_attention_flops``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

H100_PEAK, H100_HBM = 989e12, 3.35e12


def analyse_program(lowered, n_models: int, cost=None, attention_flops: float = 0.0) -> dict:
  """The per-update reading of one lowered program (module docstring). XLA's cost analysis
  counts a loop's body once, so its FLOPs and bytes are one update's (of an untiled loss, one
  microbatch, one vmap chunk); ``cost`` (FLOPs, bytes) replaces them where those loops run more
  than once (``targets.update_cost``)."""
  from ihsweep.planning import kernels
  from ihsweep.training import memory

  compiled = lowered.compile()
  k = kernels.per_update(compiled.as_text())
  gemms = k["gemms_list"]
  batched = [g for g in gemms if re.match(rf"\(?\w+\[{n_models},", g["shape"])]
  m = memory.analyse(compiled, lowered)
  flops, n_bytes = cost or (m.flops + attention_flops, m.bytes_accessed)
  written = sorted(k["written"], key=lambda i: -kernels.shape_bytes(i["shape"]))
  return {
    "kernels_per_update": k["kernels"],
    "kernels_once_per_call": k["once_per_call"],
    "kernel_kinds": k["kinds"],
    "gemms_per_update": k["gemms"],
    "gemms_batched_over_models": len(batched) if n_models > 1 else None,
    "dots_by_dtype": kernels.dots_by_dtype(k["computations"], gemms),
    "layout_copies_per_update": k["layout_copies"],
    "temp_bytes": m.temp_bytes,
    "largest_written": [
      {"op": i["op"], "shape": i["shape"][:80], "bytes": kernels.shape_bytes(i["shape"])}
      for i in written[:3]
    ],
    "flops_per_update": flops,
    "bytes_per_update": n_bytes,
    "roofline_flops_s": flops / H100_PEAK,
    "roofline_bytes_s": n_bytes / H100_HBM,
    "launch_s": k["kernels"] * kernels.LAUNCH_S,
  }


def reference(target, n_models: int, attention: str | None = None) -> dict:
  """The reference workload's ensemble program at E = n_models on one device of ``target``."""
  import throughput

  from ihsweep.compute import train
  from ihsweep.compute.model import ModelConfig
  from ihsweep.planning import targets

  mcfg = ModelConfig(**throughput.WORKLOADS["reference"]["model"], dtype="bfloat16")
  attention = attention or train.resolve_attention("auto", mcfg, target.devices[0])
  lowered, mcfg, tcfg = throughput.lower_bf16_reference(n_models, 10, target.devices[:1], attention)
  tokens = n_models * tcfg.batch_size * tcfg.context_size  # one update, untiled loss
  extra = 0.0
  if attention == "cudnn":
    extra = targets.fused_attention_flops(mcfg.n_layers, mcfg.d_model, tcfg.context_size, tokens)
  return {
    "program": f"reference, E = {n_models}",
    "attention": attention,
    **analyse_program(lowered, n_models, None, extra),
  }


def exp1_cell(target, batch: int, context: int, attention: str = "auto") -> dict:
  """memory_check.py's cell at B × C, at the setting chosen for ``target``."""
  import memory_check

  from ihsweep.base import sharding
  from ihsweep.planning import targets
  from ihsweep.training import runner

  cfg = memory_check.cell_config(False, 10)
  cfg.train.update(batch_size=batch, context_size=context, attention=attention)
  out, choice = runner.resolve_memory(
    cfg, target.devices[:1], f"B {batch} x C {context}", target.capacity_bytes, None, "gpu"
  )
  lowered = runner.lower_train_program(out, target.devices[:1])
  s = choice.setting
  n = int(cfg.ensemble.size)
  mesh = sharding.mesh_shape(n, batch, 1)
  cost = targets.update_cost(choice, out, mesh, "gpu")
  row = analyse_program(lowered, n, cost)
  return {
    "program": f"exp1 B {batch} x C {context}, E = {n} (k = {s.gradient_accumulation_steps}, "
    f"chunk {s.vmap_chunk})",
    "attention": out.train.attention,
    **row,
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument(
    "--attention", default=None, help="compile with this train.attention (default: auto)"
  )
  args = p.parse_args(argv)
  from ihsweep.planning import toolchain

  why = toolchain.use_gpu_compiler()
  if why:
    print(f"gpu_kernels: {why}", file=sys.stderr)
    return 2
  target = toolchain.make_target("h100-80gb", 1)
  rows = [reference(target, e, args.attention) for e in (1, 16, 64)]
  rows += [exp1_cell(target, b, c, args.attention or "auto") for b, c in ((8, 64), (128, 1024))]
  if args.json:
    print(json.dumps({"target": "h100-80gb", "programs": rows}))
    return 0
  print(
    f"{'program':44} {'attn':8} {'kernels':>7} {'gemms':>5} {'batched':>7} {'copies':>6} "
    f"{'temp GiB':>8} {'FLOPs ms':>8} {'bytes ms':>8}  dots by dtype"
  )
  for r in rows:
    print(
      f"{r['program']:44} {r['attention']:8} {r['kernels_per_update']:>7} "
      f"{r['gemms_per_update']:>5} {str(r['gemms_batched_over_models']):>7} "
      f"{r['layout_copies_per_update']:>6} {r['temp_bytes'] / 2**30:>8.2f} "
      f"{r['roofline_flops_s'] * 1e3:>8.3f} {r['roofline_bytes_s'] * 1e3:>8.3f}  "
      f"{r['dots_by_dtype']}"
    )
    print(f"{'':44}   kinds: {dict(list(r['kernel_kinds'].items())[:8])}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
