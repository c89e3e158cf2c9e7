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
# benchmarks/ after the repository: its analysis.py must not hide the analysis package from a
# process (a test session) that imports both
sys.path.append(os.path.dirname(os.path.abspath(__file__)))

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


def why_text(plans: list) -> str:
  """Why communication decides exp1's layout, in numbers: the smallest group's update against
  its all-reduce on 64 devices (h100 network), the best one-phase layout against the phases, the
  phases without communication on 64 and 256 devices, and ``:models=3`` on 256 and 64.
  ``plans``: those seven ``--flops_per_s`` plans, in that order (``TABLES["exp1-why"]``; the
  last: 64 devices in one worker per host, ``--devices_per_worker=8``)."""
  p64, p256, n64, n256, m256, m64, h64 = plans
  g = min(h64["groups"], key=lambda g: g["batch_size"] * g["context_size"])
  t, net = g["times"], p64["throughput"]["network"]
  data = g["mesh"][1]
  grad_mb = 4 * g["n_params"] / 1e6  # float32 gradients of one model
  best = next(lay for lay in p64["layouts"] if lay["best"])
  host = next(lay for lay in h64["layouts"] if lay["best"])
  best256 = next(lay for lay in p256["layouts"] if lay["best"])
  best_m256 = next(lay for lay in m256["layouts"] if lay["best"])
  best_m64 = next(lay for lay in m64["layouts"] if lay["best"])
  filled = sorted(n["utilisation"] for n in (n64, n256))
  evals = [x["times"]["eval_s"] / x["times"]["total_s"] for x in p64["groups"]]
  whole = best["devices_per_worker"] <= g["n_models"] and best["groups_with_data_axis"] == 0
  models = sum(x["n_models"] for x in p256["groups"])
  return (
    f"What it says: these models are small ({g['n_params'] / 1e6:.1f}M parameters, "
    f"{grad_mb:.0f} MB of float32 gradient each) and their updates short, so splitting a "
    f"model's batch over a data axis costs more than it saves. B {g['batch_size']} × C "
    f"{g['context_size']} on a host's {g['devices']} GPUs (mesh {g['mesh'][0]} × {data}) "
    f"computes an update in {1e3 * t['train_s'] / g['updates']:.2f} ms but all-reduces its "
    f"gradient over {data} GPUs in {1e3 * t['comm_s'] / g['updates']:.2f} ms (2 · {data - 1}/"
    f"{data} · {grad_mb:.0f} MB at {net['intra_host_bytes_per_s'] / 1e9:.0f} GB/s, + "
    f"{2 * (data - 1)} steps of {net['latency_s'] * 1e6:.0f} µs): {t['comm_s']:,.0f} s of its "
    f"{t['total_s']:,.0f} s. Workers of {best['devices_per_worker']} GPUs"
    + (" hold each model whole on its own GPU (no data axis, no all-reduce)" if whole else "")
    + f": {host['makespan_s'] / best['makespan_s']:.1f}× faster on {p64['n_devices']} devices "
    f"than one worker per host ({host['n_workers']} × {host['devices_per_worker']}: "
    f"{_duration(host['makespan_s'])}, {host['utilisation']:.1%}, what a jax.distributed job "
    "ran before its processes split into workers). The plan marks that layout best, and it is "
    f"the default launch: each of the job's {p64['n_processes']} processes runs "
    f"{p64['devices_per_process'] // best['devices_per_worker']} workers of "
    f"{best['devices_per_worker']} GPUs side by side (`sweep.devices_per_worker` = 0, auto; "
    f"{_duration(p64['makespan_s'])}, {p64['utilisation']:.1%}), started by the "
    "`launch/slurm.sbatch` line the plan prints. Without communication (`--network=none`) the "
    "phases fill "
    f"{n64['n_devices']} and {n256['n_devices']} devices at {filled[0]:.0%}–{filled[1]:.0%} by "
    "moving the largest groups to teams of several hosts; priced, that is what they cannot "
    f"afford, and {p256['n_devices']} devices are more than {models} models can use well "
    f"(the best layout leaves {1 - best256['utilisation']:.0%} of "
    "device-time idle: split the sweep, or add models — `:models=3`, "
    f"{len(m256['groups'])} groups, runs {best_m256['n_workers']} × "
    f"{best_m256['devices_per_worker']} at {best_m256['utilisation']:.1%} and "
    f"{best_m64['n_workers']} × {best_m64['devices_per_worker']} on {m64['n_devices']} devices "
    f"at {best_m64['utilisation']:.1%}, {_duration(best_m64['makespan_s'])}). The phase switch "
    f"({net['phase_switch_s']:.0f} s, assumed) and the evaluations (a third of training's FLOPs "
    f"per token on the probes and held-out sequences: {min(evals):.1%}–{max(evals):.1%} of a "
    "group's time) are priced too."
  )


def _flops(devices: int, network: str, *config) -> tuple:
  return (*config, f"--devices={devices}", "--flops_per_s=4e14", f"--network={network}")


TABLES = {
  t.name: t
  for t in (
    Table("tiny-h100", "docs/planning.md",
          ((*TINY, "--target=h100-80gb", "--devices=2", "--compare_attention"),), gpu_table),
    Table("tiny-flops", "docs/sweeps.md",
          tuple(_flops(n, net, *TINY) for n in (2, 8) for net in ("none", "h100")), flops_table),
    Table("exp1-h100", "docs/planning.md",
          ((EXP1, "--target=h100-80gb", "--devices=8", "--compare_attention"),), gpu_table),
    Table("exp1-flops", "docs/sweeps.md",
          tuple(_flops(n, net, EXP1) for n in (8, 64, 256) for net in ("none", "h100")),
          flops_table),
    Table("exp1-why", "docs/sweeps.md",
          (*(_flops(n, net, EXP1) for net in ("h100", "none") for n in (64, 256)),
           *(_flops(n, "h100", f"{EXP1}:models=3") for n in (256, 64)),
           (*_flops(64, "h100", EXP1), "--devices_per_worker=8")),
          why_text),
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
