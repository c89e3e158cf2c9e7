"""What the GPU compiler makes of ihsweep's train program, read without a GPU: every program
compiled by XLA:GPU for a compile-only H100 (``ihsweep.planning.targets``, JAX's CUDA plugin from
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
FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
  "call", "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
  "copy-start", "copy-done", "send-done", "recv-done", "all-reduce-done", "async-done",
  "async-update", "collective-permute-done",
}  # fmt: skip
GEMM_KINDS = ("__triton_gemm", "__triton_nested_gemm_fusion", "__cublas", "__cudnn$fmha")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
               "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}  # fmt: skip


def _shape_end(text: str, i: int) -> int:
  """Index after the shape starting at text[i] (a tuple's parentheses balanced)."""
  if text[i] != "(":
    return text.index(" ", i)
  depth = 0
  for j in range(i, len(text)):
    depth += {"(": 1, ")": -1}.get(text[j], 0)
    if depth == 0:
      return j + 1
  return len(text)


def parse_hlo(text: str) -> tuple[dict, str]:
  """``({computation name: [instruction dict]}, entry name)`` of an HLO module's text; each
  instruction has ``name``, ``shape`` (its text), ``op`` and ``line``."""
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    if not line.startswith(" ") and line.rstrip().endswith("{"):
      head = line.split(" (")[0].split()
      name = head[-1].lstrip("%")
      current = comps.setdefault(name, [])
      if head[0] == "ENTRY":
        entry = name
      continue
    if current is None or " = " not in line:
      continue
    left, _, right = line.partition(" = ")
    end = _shape_end(right, 0)
    shape, rest = right[:end], right[end:].lstrip()
    op = rest.split("(", 1)[0]
    current.append({"name": left.split()[-1].lstrip("%"), "shape": shape, "op": op, "line": line})
  return comps, entry


def _attr(line: str, key: str) -> str | None:
  m = re.search(rf"{key}=%?([\w.\-]+)", line)
  return m.group(1) if m else None


def _trip_count(line: str) -> int | None:
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
  return int(m.group(1)) if m else None


def _bytes(shape: str) -> int:
  total = 0
  for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * DTYPE_BYTES.get(dtype, 4)
  return total


def _gemm_kind(ins: dict) -> str | None:
  if ins["op"] not in ("fusion", "custom-call"):
    return None
  return next((k for k in GEMM_KINDS if k in ins["line"]), None)


def kernels(comps: dict, name: str, counts: dict, multiplier: int = 1) -> None:
  """Adds the kernels of computation ``name`` (× ``multiplier``) into ``counts``, descending
  into called computations and loops (× their known trip count)."""
  for ins in comps.get(name, []):
    op, line = ins["op"], ins["line"]
    if op == "while":
      n = _trip_count(line) or 1
      for part in ("condition", "body"):
        kernels(comps, _attr(line, part), counts, multiplier * n)
      continue
    if op == "call":
      kernels(comps, _attr(line, "to_apply"), counts, multiplier)
      continue
    if op == "conditional":
      branches = re.findall(r"%([\w.\-]+)", line.split("branch_computations=")[-1].split("}")[0])
      best: dict = {}
      for b in branches:
        c: dict = {}
        kernels(comps, b, c)
        if sum(c.get("all", {}).values()) > sum(best.get("all", {}).values()):
          best = c
      for key, per in best.items():
        for k, v in per.items():
          counts.setdefault(key, {})[k] = counts.get(key, {}).get(k, 0) + v * multiplier
      continue
    if op in FREE:
      continue
    kind = _gemm_kind(ins) or ("layout copy" if op in ("copy", "transpose") else op)
    bucket = "gemm" if _gemm_kind(ins) else "other"
    for key in ("all", bucket):
      counts.setdefault(key, {})[kind] = counts.get(key, {}).get(kind, 0) + multiplier
    counts.setdefault("_gemms", []).extend([ins] * multiplier if bucket == "gemm" else [])
    counts.setdefault("_written", []).append(ins)


def update_loop(comps: dict, entry: str) -> str | None:
  """The body of the outermost loop of the entry (the update loop) or None."""
  for ins in comps[entry]:
    if ins["op"] == "while":
      return ins["line"]
  return None


def dots_by_dtype(comps: dict, gemms: list) -> dict:
  """``"bf16,bf16->f32": n`` over the dots inside the GEMM fusions (and plain dots)."""
  out: dict = {}
  for ins in gemms:
    called = _attr(ins["line"], "calls")
    bodies = [called] if called else []
    seen = set()
    while bodies:  # nested fusions (Triton's nested GEMM fusions)
      body = bodies.pop()
      if body in seen or body not in comps:
        continue
      seen.add(body)
      shapes = {i["name"]: i["shape"] for i in comps[body]}
      for inner in comps[body]:
        if inner["op"] == "dot":
          names = re.findall(r"%([\w.\-]+)", inner["line"].split(" dot(", 1)[1].split(")")[0])
          dtypes = [shapes.get(n, "?").split("[")[0] for n in names]
          key = f"{','.join(dtypes)}->{inner['shape'].split('[')[0]}"
          out[key] = out.get(key, 0) + 1
        for c in re.findall(r"calls=%([\w.\-]+)", inner["line"]):
          bodies.append(c)
  return out


def analyse_program(lowered, n_models: int, cost=None, attention_flops: float = 0.0) -> dict:
  """The per-update reading of one lowered program (module docstring). XLA's cost analysis
  counts a loop's body once, so its FLOPs and bytes are one update's (of an untiled loss, one
  microbatch, one vmap chunk); ``cost`` (FLOPs, bytes) replaces them where those loops run more
  than once (``targets.update_cost``)."""
  from ihsweep.planning import memory

  compiled = lowered.compile()
  comps, entry = parse_hlo(compiled.as_text())
  loop = update_loop(comps, entry)
  per_update: dict = {}
  if loop:
    for part in ("condition", "body"):
      kernels(comps, _attr(loop, part), per_update)
  per_call: dict = {}
  kernels(comps, entry, per_call)  # the loop's body once, plus what runs once per call
  gemms = per_update.get("_gemms", [])
  batched = [g for g in gemms if re.match(rf"\(?\w+\[{n_models},", g["shape"])]
  m = memory.analyse(compiled, lowered)
  flops, n_bytes = cost or (m.flops + attention_flops, m.bytes_accessed)
  written = sorted(per_update.get("_written", []), key=lambda i: -_bytes(i["shape"]))
  return {
    "kernels_per_update": sum(per_update.get("all", {}).values()),
    "kernels_once_per_call": sum(per_call.get("all", {}).values())
    - sum(per_update.get("all", {}).values()),
    "kernel_kinds": dict(sorted(per_update.get("all", {}).items(), key=lambda kv: -kv[1])),
    "gemms_per_update": len(gemms),
    "gemms_batched_over_models": len(batched) if n_models > 1 else None,
    "dots_by_dtype": dots_by_dtype(comps, gemms),
    "layout_copies_per_update": per_update.get("all", {}).get("layout copy", 0),
    "temp_bytes": m.temp_bytes,
    "largest_written": [
      {"op": i["op"], "shape": i["shape"][:80], "bytes": _bytes(i["shape"])} for i in written[:3]
    ],
    "flops_per_update": flops,
    "bytes_per_update": n_bytes,
    "roofline_flops_s": flops / H100_PEAK,
    "roofline_bytes_s": n_bytes / H100_HBM,
  }


def reference(target, n_models: int, attention: str | None = None) -> dict:
  """The reference workload's ensemble program at E = n_models on one device of ``target``."""
  import jax
  import jax.numpy as jnp
  import throughput

  from ihsweep.training import runner, train
  from ihsweep.training.model import ModelConfig
  from ihsweep.workers import sharding

  w = throughput.WORKLOADS["reference"]
  mcfg = ModelConfig(**w["model"], dtype="bfloat16")
  attention = attention or train.resolve_attention("auto", mcfg, "gpu")
  throughput.ModelConfig = lambda **kw: ModelConfig(**{**kw, "dtype": "bfloat16"})
  u = 10
  devices = target.devices[:1]
  _, tcfg, init, step, hp, _, source = throughput._build(
    "reference", n_models, u, 50, "uniform", "device", devices, attention
  )
  mesh = sharding.make_mesh(n_models, tcfg.batch_size, devices)
  state = init.lower(jax.ShapeDtypeStruct((n_models,), jnp.int32)).out_info
  hp = runner._abstract(jax.device_get(hp), sharding.ensemble_sharding(mesh))
  data = runner._abstract(source.arrays(), sharding.replicated(mesh))
  lowered = step.lower(state, hp, data)
  tokens = n_models * tcfg.batch_size * tcfg.context_size  # one update, untiled loss
  extra = 0.0
  if attention == "cudnn":
    extra = 0.5 * 12.0 * mcfg.n_layers * mcfg.d_model * tcfg.context_size * tokens
  return {
    "program": f"reference, E = {n_models}",
    "attention": attention,
    **analyse_program(lowered, n_models, None, extra),
  }


def exp1_cell(target, batch: int, context: int, attention: str = "auto") -> dict:
  """memory_check.py's cell at B × C, at the setting chosen for ``target``."""
  import memory_check

  from ihsweep.planning import targets
  from ihsweep.training import runner
  from ihsweep.workers import sharding

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
  from ihsweep.planning import targets

  why = targets.use_gpu_compiler()
  if why:
    print(f"gpu_kernels: {why}", file=sys.stderr)
    return 2
  target = targets.make_target("h100-80gb", 1)
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
