"""The numbers that `ihsweep plan` and `ihsweep predict` print, in the docs (plan tables and
checkpoint totals in docs/planning.md, docs/sweeps.md and docs/benchmarks.md, the study's law's
predictions in docs/study.md, docs/usage.md, docs/analysis.md and docs/results.md), produced
from the commands that print them, so that the docs cannot drift from what the commands say.

  python benchmarks/docs_tables.py                       # every table, rewritten in place
  python benchmarks/docs_tables.py --check NAME [NAME]   # exit 1 (and a diff) where a table differs
  python benchmarks/docs_tables.py --list                # the tables, their files and commands

Each table sits between ``<!-- docs_tables.py NAME -->`` and ``<!-- /docs_tables.py NAME -->`` in
its file (a paragraph or table, or inline: a few words within a sentence); the script runs its
commands (``ihsweep plan ... --json``, ``ihsweep predict ...``), each once per run of the script,
and renders their output. Plans without ``--target`` and predictions run with an empty
``$IHSWEEP_CACHE`` (and no ``$IHSWEEP_COMPILED_TIMES``), so that compiled facts and times a
``--target`` plan left in a cache cannot change them. ``CHECKED`` names the tables that take
seconds, which tests/test_docs_tables.py compares (the tiny config's compiled plan, ``tiny-h100``,
where the GPU compiler is installed); the others take minutes (exp1-h100: ~10 min on 2 cores;
exp1-flops, exp1-why: ~1 min) and are regenerated here when the planner changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
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
  commands: tuple  # each: an ihsweep command and its arguments (a plan's without --json)
  render: Callable[[list], str]  # the commands' outputs (a plan's JSON, parsed) -> markdown
  inline: bool = False  # a few words within a line of prose: no "from:" comment


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


def _gb(n_bytes: float) -> str:
  """Bytes as the plan's checkpoint line prints them (schedule.describe_checkpoint_totals)."""
  return f"{n_bytes / 1e9:,.1f} GB"


def _range(values, fmt: str = "{:,}") -> str:
  lo, hi = fmt.format(min(values)), fmt.format(max(values))
  return lo if lo == hi else f"{lo}–{hi}"


def _default(field: str):
  from ihsweep.base import schema

  return next(f.default for f in schema.FIELDS if f.path == field)


EVERY = 500  # the earlier default: a full state every 500 updates


def checkpoints_text(plans: list) -> str:
  """exp1's checkpoint totals on 64 devices: today's default (full states by the predicted
  minutes), priced and ``--network=none``, and the earlier default of every EVERY updates.
  ``plans``: those three ``--flops_per_s`` plans, in that order."""
  p, none, every = plans
  c, c_none, c_every = p["checkpoints"], none["checkpoints"], every["checkpoints"]
  minutes = _default("checkpoint.state_every_minutes")
  slowest = max(g["seconds"] for g in p["groups"])
  small = min(every["groups"], key=lambda g: g["batch_size"] * g["context_size"])
  layout = (
    f"{p['n_workers']} workers of {p['devices_per_worker']} devices"
    if p["n_workers"] else f"the phases {_phases(p)}"
  )  # fmt: skip
  axis = (
    "no group has a data axis" if not p["groups_with_data_axis"]
    else f"{p['groups_with_data_axis']} groups have a data axis"
  )  # fmt: skip
  within = (
    f"every group is predicted to finish within {minutes:g} minutes (the slowest "
    f"{_duration(slowest)})" if slowest < 60 * minutes
    else f"the slowest group is predicted to take {_duration(slowest)}"
  )  # fmt: skip
  priced = (
    "with communication priced (the default) or not (`--network=none`)"
    if c_none == c else f"with communication priced (the default; `--network=none`: "
    f"{c_none['state_saves']:,} state saves, {_gb(c_none['written_bytes'])})"
  )  # fmt: skip
  kept = (
    "all of it kept" if c["kept_bytes"] == c["written_bytes"] else f"{_gb(c['kept_bytes'])} kept"
  )
  return (
    f"exp1 on {p['n_devices']} devices at {p['throughput']['flops_per_s']:.0e} FLOP/s "
    "(`ihsweep plan --config=configs/exp1_natural.py --devices=64 --flops_per_s=4e14`): with "
    f"full states every {minutes:g} minutes of a group's predicted time (the default), "
    f"{c['state_saves']:,} state saves and {_gb(c['written_bytes'])} written, {priced}: the plan "
    f"runs {layout}, {axis}, and {within}; {kept} ({c['params_saves']:,} params checkpoints). "
    f"With the earlier default of a full state every {EVERY} updates "
    f"(`--config.checkpoint.state_every_steps={EVERY}`), {c_every['state_saves']:,} state saves "
    f"and {_gb(c_every['written_bytes'])} written (the B {small['batch_size']} × C "
    f"{small['context_size']} group alone {small['checkpoints']['state_saves']:,} saves of "
    f"{small['checkpoints']['state_bytes'] / 1e9:.2f} GB), {_gb(c_every['kept_bytes'])} of it kept."
  ).replace("4e+14", "4e14")


def setup_text(plans: list) -> str:
  """exp1 at study scale in a sentence: groups, models, grid, tokens, FLOPs and parameters,
  from one ``--flops_per_s`` plan, introducing the exp1-flops table."""
  (p,) = plans
  g = p["groups"]
  tokens = [x["updates"] * x["batch_size"] * x["context_size"] for x in g]
  flops = [x["cost_flops"] for x in g]
  exp = min(int(f"{f:e}".split("e")[1]) for f in flops)
  return (
    f"The study's Experiment 1 at study scale (`configs/exp1_natural.py`: {len(g)} groups of "
    f"E = {_range([x['n_models'] for x in g])} models, B "
    f"{_range([x['batch_size'] for x in g], '{}')} × C "
    f"{_range([x['context_size'] for x in g], '{}')}, "
    f"{_range([t / 1e9 for t in tokens], '{:.3g}')}B tokens per model, "
    f"{_range([f / 10**exp for f in flops], '{:.1f}')}e{exp} FLOPs per group, "
    f"{_range([x['n_params'] / 1e6 for x in g], '{:.1f}')}M parameters per model) at "
    f"`--flops_per_s=4e14` on H100s ({p['throughput']['network']['devices_per_host']} per host), "
    "with communication priced (`--network=h100`, the default) and without it "
    "(`--network=none`, the model before it was priced):"
  )


def schedule_text(outputs: list) -> str:
  """exp1's cheap rerun (``--config.sweep.budget=emergence --config.sweep.law_multiple=3``)
  for its smallest cell: the warmup over the token schedule's horizon against over the cap, and
  the law's predicted update. ``outputs``: that plan, then ``ihsweep predict`` at that cell."""
  p, predicted = outputs
  g = min(p["groups"], key=lambda x: x["batch_size"] * x["context_size"])
  frac = _default("train.warmup_frac")
  updates = re.search(r"after ([\d,]+) updates", predicted).group(1)
  return (
    "exp1 sets `tokens`: its recommended cheap rerun, `--config.sweep.budget=emergence "
    "--config.sweep.law_multiple=3`, then trains every cell at the study's learning rate at "
    f"every update up to its stop (B {g['batch_size']} × C {g['context_size']}: warmup over "
    f"{round(frac * g['schedule_updates']):,} updates, emergence predicted at {updates}) instead "
    f"of a schedule compressed into the cap (warmup over {round(frac * g['cap_updates']):,} "
    "updates). `ihsweep plan` says which, and over how many updates (its `learning-rate "
    "schedule:` line)."
  )


def _predicted(text: str) -> tuple[str, str]:
  """``(updates, tokens)`` as ``ihsweep predict`` prints them: ("20,173", "10.3M")."""
  m = re.search(r"after ([\d,]+) updates = ([\d.,]+[MBk]?) tokens", text)
  return m.group(1), m.group(2)


def _count(text: str) -> int:
  return int(_predicted(text)[0].replace(",", ""))


def examples_text(outputs: list) -> str:
  """docs/study.md's examples of the study's law: each cell's updates and tokens."""
  parts = [
    f"B {b}, C {c} → {u} updates ({t} tokens)"
    for (b, c), (u, t) in zip(STUDY_EXAMPLES, map(_predicted, outputs))
  ]
  return (
    "Examples of the v2 law, as `ihsweep predict --batch_size=B --context_size=C` prints them: "
    + "; ".join(parts)
    + ". `--law=FILE` uses a law fitted by ihsweep's analysis instead."
  )


def updates_range(outputs: list) -> str:
  """The study's law's predicted updates over a grid's cells, as a range (inline)."""
  return _range([_count(t) for t in outputs])


def layouts_text(plans: list) -> str:
  """docs/benchmarks.md's issue 47 paragraph: on 64 and on 8 H100s, one worker per host
  (``--devices_per_worker=8``) against the default launch. ``plans``: 64 devices default and
  one worker per host, then 8 devices likewise."""
  p64, best, new8, old8 = plans  # each plan's own layout: its top-level fields
  per_process = p64["devices_per_process"] // p64["devices_per_worker"]
  bound = 0.78  # the packing bound issue 47 names
  return (
    "`ihsweep run` splits each process's devices into the workers the plan's model finds fastest "
    "(`sweep.devices_per_worker` = 0, auto; [sweeps.md](sweeps.md)). What that layout changes, "
    "from `ihsweep plan --config=configs/exp1_natural.py --flops_per_s=4e14` (H100s, "
    f"{p64['throughput']['network']['devices_per_host']} per host, NVLink and InfiniBand "
    f"priced): on {p64['n_devices']} devices the default launch went from one worker per host "
    f"({best['n_workers']} × {best['devices_per_worker']}: {_duration(best['makespan_s'])}, "
    f"utilisation {best['utilisation']:.1%}, {best['comm_share']:.1%} of it all-reduces) to "
    f"{per_process} workers of {p64['devices_per_worker']} GPUs in each of the "
    f"{p64['n_processes']} processes ({p64['n_workers']} × {p64['devices_per_worker']}: "
    f"{_duration(p64['makespan_s'])}, {p64['utilisation']:.1%}, "
    + (
      "no all-reduce"
      if not p64["groups_with_data_axis"]
      else f"{p64['comm_share']:.1%} all-reduces"
    )
    + f"), {p64['utilisation'] / bound:.2f} of the {bound} packing bound issue 47 names; on one "
    f"{new8['n_devices']}-GPU machine from {old8['n_workers']} × {old8['devices_per_worker']} "
    f"({_duration(old8['makespan_s'])}) to {new8['n_workers']} × {new8['devices_per_worker']} "
    f"({_duration(new8['makespan_s'])}, {new8['utilisation']:.1%})."
  )


def _flops(devices: int, network: str, *config) -> tuple:
  return ("plan", *config, f"--devices={devices}", "--flops_per_s=4e14", f"--network={network}")


def _predict(b: int, c: int) -> tuple:
  return ("predict", f"--batch_size={b}", f"--context_size={c}")


STUDY_EXAMPLES = ((8, 64), (8, 1024), (128, 1024))


TABLES = {
  t.name: t
  for t in (
    Table("tiny-h100", "docs/planning.md",
          (("plan", *TINY, "--target=h100-80gb", "--devices=2", "--compare_attention"),),
          gpu_table),
    Table("tiny-flops", "docs/sweeps.md",
          tuple(_flops(n, net, *TINY) for n in (2, 8) for net in ("none", "h100")), flops_table),
    Table("exp1-h100", "docs/planning.md",
          (("plan", EXP1, "--target=h100-80gb", "--devices=8", "--compare_attention"),),
          gpu_table),
    Table("exp1-flops", "docs/sweeps.md",
          tuple(_flops(n, net, EXP1) for n in (8, 64, 256) for net in ("none", "h100")),
          flops_table),
    Table("exp1-why", "docs/sweeps.md",
          (*(_flops(n, net, EXP1) for net in ("h100", "none") for n in (64, 256)),
           *(_flops(n, "h100", f"{EXP1}:models=3") for n in (256, 64)),
           (*_flops(64, "h100", EXP1), "--devices_per_worker=8")),
          why_text),
    Table("exp1-checkpoints", "docs/planning.md",
          (_flops(64, "h100", EXP1), _flops(64, "none", EXP1),
           (*_flops(64, "h100", EXP1), f"--config.checkpoint.state_every_steps={EVERY}")),
          checkpoints_text),
    Table("exp1-setup", "docs/sweeps.md", (_flops(64, "h100", EXP1),), setup_text),
    Table("exp1-schedule", "docs/sweeps.md",
          ((*_flops(64, "h100", EXP1), "--config.sweep.budget=emergence",
            "--config.sweep.law_multiple=3"), _predict(8, 64)),
          schedule_text),
    Table("exp1-layouts", "docs/benchmarks.md",
          (_flops(64, "h100", EXP1), (*_flops(64, "h100", EXP1), "--devices_per_worker=8"),
           _flops(8, "h100", EXP1), (*_flops(8, "h100", EXP1), "--devices_per_worker=8")),
          layouts_text),
    Table("study-examples", "docs/study.md", tuple(_predict(b, c) for b, c in STUDY_EXAMPLES),
          examples_text),
    Table("usage-law", "docs/usage.md", (_predict(16, 64),),
          lambda out: _predicted(out[0])[0], inline=True),
    Table("analysis-law", "docs/analysis.md",
          tuple(_predict(b, c) for b in (8, 16, 32) for c in (32, 64)), updates_range, inline=True),
    Table("results-law", "docs/results.md",
          tuple(_predict(b, c) for b in (8, 16, 32) for c in (16, 32, 64)), updates_range,
          inline=True),
  )
}  # fmt: skip
# Seconds each: compared by tests/test_docs_tables.py (tiny-h100 there too, given the compiler).
CHECKED = ("tiny-flops", "exp1-checkpoints", "exp1-setup", "exp1-schedule", "study-examples",
           "usage-law", "analysis-law", "results-law")  # fmt: skip


def _markers(name: str) -> tuple[str, str]:
  return doc_blocks.markers(TOOL, name)


def _argv(args: tuple) -> list:
  return [*args, "--json"] if args[0] == "plan" else list(args)


def command_line(args: tuple) -> str:
  return "ihsweep " + " ".join(_argv(args))


_OUTPUTS: dict = {}  # command -> its output: each command runs once per process
_EMPTY_CACHE = tempfile.TemporaryDirectory(prefix="docs_tables_cache_")


def output(args: tuple):
  """What ``ihsweep ARGS`` prints now (a plan's JSON, parsed), in a process of its own: without
  ``--target``, with an empty ``$IHSWEEP_CACHE`` (no compiled facts or times)."""
  if args not in _OUTPUTS:
    env = dict(os.environ)
    if not any(a.startswith("--target=") for a in args):
      env["IHSWEEP_CACHE"] = _EMPTY_CACHE.name
      env.pop("IHSWEEP_COMPILED_TIMES", None)  # nor compiled times (planning/compiled_times.py)
    r = subprocess.run(
      [sys.executable, "-m", "ihsweep.cli", *_argv(args)],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
    )
    if r.returncode:
      raise SystemExit(f"docs_tables: `{command_line(args)}` failed: {r.stderr.strip()[-500:]}")
    _OUTPUTS[args] = json.loads(r.stdout) if args[0] == "plan" else r.stdout
  return _OUTPUTS[args]


def run(table: Table) -> str:
  """The table's markdown, from its commands' outputs."""
  body = table.render([output(a) for a in table.commands])
  if table.inline:
    return body
  commands = "\n".join(f"  {command_line(a)}" for a in table.commands)
  return f"<!-- from:\n{commands}\n-->\n{body}"


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
