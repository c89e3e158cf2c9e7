"""Start-up of the light ``ihsweep`` commands: wall seconds from process start to exit, and
which heavy libraries each one imports.

  python benchmarks/startup.py [--n 5] [--workdir runs/demo] [--law FILE] [--json]

Commands timed (each ``--n`` times, one after the other, in a fresh process: the median and the
range are printed):
  help          ihsweep --help
  run --help    ihsweep run --help (the flags and every config field)
  predict       ihsweep predict --batch_size=8 --context_size=1024 (the study's law)
  predict law   the same with --law=FILE (default: WORKDIR/analysis/law.json, a report's law,
                when it exists)
  status        ihsweep status --workdir=WORKDIR (default runs/demo, a sweep's run directory:
                ``ihsweep run`` writes one; left out when there is none)

"heavy" lists the libraries among jax, jaxlib, flax, optax, orbax, tensorflow, torch, pandas,
scipy, matplotlib and numpy that the command imported, read from one more run under
``python -X importtime`` (its stderr); "import s" is the cumulative time of the command's
imports by that run (``-X importtime`` adds its own overhead: compare it with itself). The load
average (1 min, ``os.getloadavg``) before and after is printed: timings taken on a loaded
machine are longer, sometimes many times so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = (
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax",
  "tensorflow",
  "torch",
  "pandas",
  "scipy",
  "matplotlib",
  "numpy",
)
# The console script beside this Python (as users start it), or ihsweep.cli.main as it calls it.
SCRIPT = os.path.join(os.path.dirname(sys.executable), "ihsweep")
CLI = ["-c", "import sys; from ihsweep.cli import main; sys.exit(main(['ihsweep'] + sys.argv[1:]))"]


def _commands(workdir: str | None, law: str | None) -> dict[str, list[str]]:
  """Name → the words after ``ihsweep``."""
  out = {
    "help": ["--help"],
    "run --help": ["run", "--help"],
    "predict": ["predict", "--batch_size=8", "--context_size=1024"],
  }
  if law:
    out["predict law"] = out["predict"] + [f"--law={law}"]
  if workdir:
    out["status"] = ["status", f"--workdir={workdir}"]
  return out


def _argv(words: list[str], importtime: bool = False) -> list[str]:
  """The process for ``ihsweep WORDS``: the console script run by this Python."""
  entry = [SCRIPT] if os.path.isfile(SCRIPT) else CLI
  return [sys.executable] + (["-X", "importtime"] if importtime else []) + entry + words


def wall(words: list[str]) -> float:
  """Seconds from starting ``ihsweep WORDS`` to its exit.

  Raises:
    SystemExit: the command failed (its exit status and stderr's last line).
  """
  start = time.perf_counter()
  p = subprocess.run(_argv(words), cwd=ROOT, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if p.returncode != 0:
    last = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    raise SystemExit(f"startup: ihsweep {' '.join(words)} exited {p.returncode}: {last}")
  return seconds


def imports(words: list[str]) -> tuple[list[str], float]:
  """``(heavy libraries imported, cumulative import seconds)`` of ``ihsweep WORDS``, from one
  run under ``-X importtime`` (top-level modules only, each once)."""
  p = subprocess.run(_argv(words, importtime=True), cwd=ROOT, capture_output=True, text=True)
  seen, total = set(), 0
  for line in p.stderr.splitlines():
    m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
    if not m:
      continue
    if m.group(3) == " ":  # a top-level import: its cumulative time counts once
      total += int(m.group(2))
    seen.add(m.group(4).split(".")[0])
  return [h for h in HEAVY if h in seen], total / 1e6


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--n", type=int, default=5, help="runs per command (default 5)")
  p.add_argument("--workdir", default=os.path.join(ROOT, "runs", "demo"))
  p.add_argument("--law", default=None, help="default: WORKDIR/analysis/law.json if it exists")
  p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
  args = p.parse_args(argv)
  if args.n < 1:
    p.error(f"--n={args.n}: give at least 1 run per command")
  notes = []
  args.workdir = os.path.abspath(args.workdir)  # the commands run in the checkout
  args.law = args.law and os.path.abspath(args.law)
  workdir = args.workdir if os.path.isfile(os.path.join(args.workdir, "sweep.json")) else None
  if workdir is None:
    notes.append(f"status left out: {args.workdir} is not a sweep's run directory (no sweep.json)")
  law = args.law
  if law is None and workdir and os.path.isfile(os.path.join(workdir, "analysis", "law.json")):
    law = os.path.join(workdir, "analysis", "law.json")
  load_before = os.getloadavg()[0]
  rows = []
  for name, words in _commands(workdir, law).items():
    times = [wall(words) for _ in range(args.n)]
    heavy, import_s = imports(words)
    rows.append(
      {
        "command": name,
        "argv": "ihsweep " + " ".join(words),
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "import_s": import_s,
        "heavy": heavy,
      }
    )
  load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()}
  if args.json:
    print(json.dumps({"n": args.n, "load_1min": load, "rows": rows, "notes": notes}))
    return 0
  print(f"{'command':12s} {'median s':>9s} {'min–max s':>12s} {'import s':>9s}  heavy imports")
  for r in rows:
    span = f"{r['min_s']:.2f}–{r['max_s']:.2f}"
    heavy = ", ".join(r["heavy"]) or "none"
    print(f"{r['command']:12s} {r['median_s']:9.2f} {span:>12s} {r['import_s']:9.2f}  {heavy}")
  print(
    f"\n{args.n} runs each; load average (1 min) {load['before']:.2f} before, "
    f"{load['after']:.2f} after, on {load['cpus']} CPUs"
  )
  for note in notes:
    print(note)
  return 0


if __name__ == "__main__":
  sys.exit(main())
