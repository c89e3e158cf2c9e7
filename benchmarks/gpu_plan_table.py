"""The per-group table of an `ihsweep plan --target=<GPU> --json` output, as docs/planning.md
shows it: B × C, the memory setting, GiB per device and which compiler measured them, FLOPs per
update and the roofline, the train step's attention and, where it is not the explicit pattern,
the bytes the explicit pattern needs at the same setting; with ``--estimate`` a second plan's
bytes (the XLA CPU compiler's estimate of the same programs at the same setting) beside them,
and their ratio.

  ihsweep plan --config=configs/exp1_natural.py --target=h100-80gb --devices=8 --json > gpu.json
  python benchmarks/gpu_plan_table.py gpu.json [--estimate cpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys

GIB = 1 << 30


def table(plan: dict, estimate: dict | None = None) -> str:
  """Markdown rows of ``plan``'s groups, smallest B then C first.

  Raises:
    ValueError: ``estimate`` lacks a cell of ``plan`` or compiled it at another setting.
  """

  def setting(g):
    return (g["gradient_accumulation_steps"], g["vmap_chunk"], g["remat"])

  def attention(g):
    return g.get("attention", {}).get("compiled", "explicit")

  other = {(g["batch_size"], g["context_size"]): g for g in (estimate or {}).get("groups", [])}
  fused = any(attention(g) != "explicit" for g in plan["groups"])
  head = "| B × C | k | chunk | remat | GiB / device | TFLOP / update | roofline / update |"
  rule = "|---|---|---|---|---|---|---|"
  if fused:
    head += " attention | explicit pattern GiB |"
    rule += "---|---|"
  if estimate:
    head += " CPU estimate GiB | estimate ÷ GPU |"
    rule += "---|---|"
  rows = [head, rule]
  for g in sorted(plan["groups"], key=lambda g: (g["batch_size"], g["context_size"])):
    cell = (g["batch_size"], g["context_size"])
    gib = g["memory"]["per_device_bytes"] / GIB
    row = (
      f"| {cell[0]} × {cell[1]} | {setting(g)[0]} | {setting(g)[1]} | {setting(g)[2]} | "
      f"{gib:.2f} | {g['flops_per_update'] / 1e12:.1f} | {g['roofline_update_s'] * 1e3:.0f} ms |"
    )
    if fused:
      explicit = g.get("attention", {}).get("explicit_bytes", g["memory"]["per_device_bytes"])
      explicit /= GIB
      row += f" {attention(g)} | {explicit:.2f} |"
    if estimate:
      e = other.get(cell)
      if e is None or setting(e) != setting(g):
        raise ValueError(f"the estimate has no cell {cell} at the setting {setting(g)}")
      est = e["memory"]["per_device_bytes"] / GIB
      row += f" {est:.2f} | {est / gib:.1f}× |"
    rows.append(row)
  return "\n".join(rows)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("plan", help="an `ihsweep plan --target=<GPU> --json` output")
  parser.add_argument("--estimate", help="the same plan compiled by the XLA CPU compiler")
  args = parser.parse_args(argv)
  with open(args.plan) as f:
    plan = json.load(f)
  estimate = None
  if args.estimate:
    with open(args.estimate) as f:
      estimate = json.load(f)
  print(f"{plan['target']['name']} × {plan['target']['devices']}: memory from the "
        f"{plan['target']['memory_from']}")  # fmt: skip
  try:
    print(table(plan, estimate))
  except ValueError as e:
    print(f"gpu_plan_table: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
