"""The plan tables of docs/planning.md and docs/sweeps.md, produced from the commands that print
them, so that the docs cannot drift from what `ihsweep plan` says.

  python benchmarks/docs_tables.py                       # every table, rewritten in place
  python benchmarks/docs_tables.py --check NAME [NAME]   # exit 1 (and a diff) where a table differs
  python benchmarks/docs_tables.py --list                # the tables, their files and commands

Each table sits between ``<!-- docs_tables.py NAME -->`` and ``<!-- /docs_tables.py NAME -->``
in its file; the script runs its ``ihsweep plan ... --json`` commands and renders their JSON.
The small configs' tables (``tiny-*``) take seconds and are checked by a test
(tests/test_docs_tables.py); the study-scale ones take minutes (exp1-h100: ~10 min on 2 cores)
and are regenerated here when the planner changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Callable

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import doc_blocks  # noqa: E402 (benchmarks/ is on the path from here on)

TOOL = "docs_tables.py"
EXP1 = "--config=configs/exp1_natural.py"
TINY = (
  "--config=configs/default.py:tiny",
  "--grid=train.batch_size=8,16",
  "--config.train.num_steps=100000",
)


@dataclasses.dataclass(frozen=True)
class Table:
  name: str
  doc: str  # relative to the repository root
  commands: tuple  # each: ihsweep plan arguments (without --json)
  render: Callable[[list], str]  # the commands' JSON outputs -> markdown


def _duration(seconds: float) -> str:
  from ihsweep.planning.prediction import duration

  return duration(seconds)


def gpu_table(plans: list) -> str:
  """A GPU target plan: its per-group table (benchmarks/gpu_plan_table.py) and its layouts."""
  import gpu_plan_table

  (p,) = plans
  t = p["target"]
  lines = [
    f"`{t['name']}` × {t['devices']}, memory from the {t['memory_from']}, "
    f"{p['target']['capacity_bytes'] / 2**30:.2f} GiB per device:",
    "",
    gpu_plan_table.table(p),
    "",
    "Roofline makespan by layout (workers × GPUs): "
    + "; ".join(
      f"{lay['n_workers']} × {lay['devices_per_worker']}: {_duration(lay['makespan_s'])}, "
      f"{lay['utilisation']:.0%}" + (" (the plan's)" if lay["devices_per_worker"] ==
                                      p["devices_per_worker"] else "")
      for lay in p["layouts"]
    )
    + ".",
  ]  # fmt: skip
  return "\n".join(lines)


def _phases(p: dict) -> str:
  parts = []
  for ph in p["phases"]:
    groups = ph["groups"]
    what = groups[0] if len(groups) == 1 else str(len(groups))
    parts.append(f"{ph['n_workers']} × {ph['devices_per_worker']}: {what}")
  return ", then ".join(parts)


def _share(network: str, share: float) -> str:
  return "" if network == "none" else f" ({share:.0%})"


def flops_table(plans: list) -> str:
  """``--flops_per_s`` plans, one row each: the phases chosen and the best one-phase layout
  (bold where it is shorter than the phases)."""
  rows = [
    "| devices | network | phases (workers × devices: groups) | their makespan, utilisation "
    "(all-reduce share) | best one-phase layout |",
    "|---|---|---|---|---|",
  ]
  for p in plans:
    net = p["throughput"]["network"]["name"] if p["throughput"].get("network") else "none"
    best = next(lay for lay in p["layouts"] if lay["best"])
    lay = (
      f"{best['n_workers']} × {best['devices_per_worker']}: {_duration(best['makespan_s'])}, "
      f"{best['utilisation']:.1%}{_share(net, best['comm_share'])}"
    )
    if best["makespan_s"] < 0.99 * p["makespan_s"]:
      lay = f"**{lay}**"
    rows.append(
      f"| {p['n_devices']} | {net} | {_phases(p)} | {_duration(p['makespan_s'])}, "
      f"{p['utilisation']:.1%}{_share(net, p['comm_share'])} | {lay} |"
    )
  return "\n".join(rows)


def _flops(devices: int, network: str, *config) -> tuple:
  return (*config, f"--devices={devices}", "--flops_per_s=4e14", f"--network={network}")


TABLES = {
  t.name: t
  for t in (
    Table("tiny-h100", "docs/planning.md",
          ((*TINY, "--target=h100-80gb", "--devices=2"),), gpu_table),
    Table("tiny-flops", "docs/sweeps.md",
          tuple(_flops(n, net, *TINY) for n in (2, 8) for net in ("none", "h100")), flops_table),
    Table("exp1-h100", "docs/planning.md", ((EXP1, "--target=h100-80gb", "--devices=8"),),
          gpu_table),
    Table("exp1-flops", "docs/sweeps.md",
          tuple(_flops(n, net, EXP1) for n in (8, 64, 256) for net in ("none", "h100")),
          flops_table),
  )
}  # fmt: skip


def _markers(name: str) -> tuple[str, str]:
  return doc_blocks.markers(TOOL, name)


def command_line(args: tuple) -> str:
  return "ihsweep plan " + " ".join(args) + " --json"


def run(table: Table) -> str:
  """The table's markdown, from its commands run now (one process each)."""
  outputs = []
  for args in table.commands:
    r = subprocess.run(
      [sys.executable, "-m", "ihsweep.cli", "plan", *args, "--json"],
      cwd=ROOT,
      capture_output=True,
      text=True,
    )
    if r.returncode:
      raise SystemExit(f"docs_tables: `{command_line(args)}` failed: {r.stderr.strip()[-500:]}")
    outputs.append(json.loads(r.stdout))
  commands = "\n".join(f"  {command_line(a)}" for a in table.commands)
  return f"<!-- from:\n{commands}\n-->\n{table.render(outputs)}"


def current(table: Table) -> str:
  """The table as its file has it now."""
  return doc_blocks.read(os.path.join(ROOT, table.doc), TOOL, table.name)


def write(table: Table, body: str) -> None:
  doc_blocks.write(os.path.join(ROOT, table.doc), TOOL, table.name, body)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("names", nargs="*", help=f"tables (default: all): {', '.join(TABLES)}")
  p.add_argument("--check", action="store_true", help="compare instead of rewriting")
  p.add_argument("--list", action="store_true", help="list the tables and their commands")
  args = p.parse_args(argv)
  unknown = [n for n in args.names if n not in TABLES]
  if unknown:
    p.error(f"unknown table(s) {', '.join(unknown)}: one of {', '.join(TABLES)}")
  tables = [TABLES[n] for n in args.names or TABLES]
  if args.list:
    for t in tables:
      print(f"{t.name} ({t.doc}):\n" + "\n".join(f"  {command_line(a)}" for a in t.commands))
    return 0
  stale = 0
  for t in tables:
    body = run(t)
    if not args.check:
      write(t, body)
      print(f"{t.name}: {t.doc} written")
      continue
    if not doc_blocks.compare(os.path.join(ROOT, t.doc), TOOL, t.name, body, t.doc):
      stale += 1
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main())
