"""Kernels a compiled XLA:GPU program launches per update, read from its optimised HLO.

XLA:GPU runs a program as a sequence of kernels launched from the host: each fusion, each library
call (a GEMM emitted as a Triton or cuBLAS call, cuDNN's attention) and each unfused op is one
launch; loops run on the host, their body's kernels launched once per iteration. A train
program's update loop is the ``while`` whose op name carries ``UPDATE_LOOP_SCOPE``
(``train.k_updates`` names it; its trip count is traced): the kernels of its body and condition,
nested loops (microbatches, loss tiles) multiplied by their known trip counts, times the loops
around it (vmap chunks), are one update's launches; the rest of the program (e.g. a data
sampler's loops before it) runs once per call. Free instructions (parameters, tuples, bitcasts,
control flow) launch nothing.

Each launch costs the host about ``LAUNCH_S``: with short kernels, launches rather than FLOPs or
bytes set an update's time (``targets.update_time_terms``).
"""

from __future__ import annotations

import collections
import re

UPDATE_LOOP_SCOPE = "ihsweep_updates"  # = train.UPDATE_LOOP_SCOPE (planning imports no JAX)
# Seconds per kernel launch: 4-6 µs through the CUDA driver and runtime, measured back to back
# on an RTX 5070 Ti with CUDA 13 ("pegainfer (3): From Launch Overhead to CUDA Graph",
# susun-blog.com/blog/pegainfer-3-cuda-graph); the lower end. XLA:GPU replays some kernel
# sequences as CUDA graphs (command buffers), which launch for less: an estimate, stated as one.
LAUNCH_S = 4e-6

FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
  "call", "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
  "copy-start", "copy-done", "send-done", "recv-done", "all-reduce-done", "async-done",
  "async-update", "collective-permute-done", "all-gather-done", "reduce-scatter-done",
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


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape's text (a tuple's elements summed)."""
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


def new_counts() -> dict:
  """What ``kernels`` fills: launches per update and per call by kind, the update's GEMMs and
  the instructions whose results it writes."""
  return {
    "update": collections.Counter(),
    "call": collections.Counter(),
    "gemms": [],
    "written": [],
  }


def kernels(comps: dict, name: str, counts: dict, multiplier: int = 1, in_update=False) -> None:
  """Adds the launches of computation ``name`` (× ``multiplier``) to ``counts``
  (``new_counts``), descending into called computations, the largest branch of a conditional
  and loops: × their known trip count, or, for a loop whose trip count is traced (the update
  loop), once, its launches counted as one update's (``in_update``)."""
  for ins in comps.get(name, []):
    op, line = ins["op"], ins["line"]
    if op == "while":
      n = _trip_count(line)
      update = in_update or (n is None and f'{UPDATE_LOOP_SCOPE}/while"' in line)
      for part in ("condition", "body"):
        kernels(comps, _attr(line, part), counts, multiplier * (n or 1), update)
      continue
    if op == "call":
      kernels(comps, _attr(line, "to_apply"), counts, multiplier, in_update)
      continue
    if op == "conditional":
      if "branch_computations=" in line:
        branches = re.findall(r"%([\w.\-]+)", line.split("branch_computations=")[1].split("}")[0])
      else:  # the two-way form
        branches = [_attr(line, "true_computation"), _attr(line, "false_computation")]
      branches = [b for b in branches if b]
      if branches:
        kernels(
          comps, max(branches, key=lambda b: _launches(comps, b)), counts, multiplier, in_update
        )
      continue
    if op in FREE:
      continue
    gemm = _gemm_kind(ins)
    kind = gemm or ("layout copy" if op in ("copy", "transpose") else op)
    counts["update" if in_update else "call"][kind] += multiplier
    if in_update:
      counts["gemms"].extend([ins] * multiplier if gemm else [])
      counts["written"].append(ins)


def _launches(comps: dict, name: str) -> int:
  counts = new_counts()
  kernels(comps, name, counts)
  return sum(counts["update"].values()) + sum(counts["call"].values())


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


def per_update(hlo_text: str) -> dict:
  """``{"kernels", "gemms", "layout_copies", "kinds", "once_per_call"}``: the launches of one
  update of every model of the program whose optimised HLO is ``hlo_text``
  (``jax.stages.Compiled.as_text()``; the update loop: module docstring) and those made once
  per call around it; with ``"gemms_list"`` (the GEMM
  instructions, one entry per launch), ``"written"`` and ``"computations"`` for a closer
  reading (benchmarks/gpu_kernels.py). A program without such a loop is one update."""
  comps, entry = parse_hlo(hlo_text)
  counts = new_counts()
  kernels(comps, entry, counts)
  update, call = counts["update"], counts["call"]
  if not update:  # no update loop: the whole program is the update
    counts = new_counts()
    kernels(comps, entry, counts, in_update=True)
    update, call = counts["update"], counts["call"]
  return {
    "kernels": sum(update.values()),
    "gemms": sum(n for k, n in update.items() if k in GEMM_KINDS),
    "layout_copies": update.get("layout copy", 0),
    "kinds": dict(update.most_common()),
    "once_per_call": sum(call.values()),
    "gemms_list": counts["gemms"],
    "written": counts["written"],
    "computations": comps,
  }
