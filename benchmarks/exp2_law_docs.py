"""Experiment 2 as a law at CPU scale: the numbers of docs/results.md's section "Experiment 2
as a law", produced from the run directory by the commands that print them.

  ihsweep run --config=configs/exp2_seminatural.py:scale=cpu_law --workdir=runs/exp2_cpu_law
  python -m analysis report runs/exp2_cpu_law
  python benchmarks/exp2_law_docs.py runs/exp2_cpu_law            # the blocks rewritten
  python benchmarks/exp2_law_docs.py runs/exp2_cpu_law --check    # exit 1 where one differs
  python benchmarks/exp2_law_docs.py runs/exp2_cpu_law --print    # the blocks, nothing written

It reads the report's emergence.csv (ps_max, threshold) and runs ``python -m analysis fit-law``
on it with the data's repetition statistics as terms of the law (``--terms``; B and C are one
value each here, so α and β are held at the study's values: they only move ln T). Blocks:
``exp2-law-map`` (each frequency × reliability point's emergence), ``exp2-law-fit`` (fit-law's
table and held-out line for the law in frequency and reliability), ``exp2-law-forms`` (the
held-out error of each form: no term, frequency only, reliability only, both), between
``<!-- exp2_law_docs.py NAME -->`` markers. The run directory is written as ``runs/exp2_cpu_law``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import pandas as pd

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.append(os.path.dirname(os.path.abspath(__file__)))

import doc_blocks  # noqa: E402

TOOL = "exp2_law_docs.py"
DOC = os.path.join(ROOT, "docs", "results.md")
SHOWN = "runs/exp2_cpu_law"
FIX = ["--fix", "alpha=0.37", "--fix", "beta=0.62"]
AXES = ["data.frequency", "data.reliability"]  # the grid point of the held-out folds
FORMS = {  # name: --terms
  "no term": "",  # one ln T for every point
  "frequency only": "data.frequency",
  "reliability only": "data.reliability",
  "frequency and reliability": "data.frequency,data.reliability",
}


def fit_law(csv: str, terms: str) -> tuple[dict, str]:
  """``python -m analysis fit-law`` on ``csv`` with ``terms``: (its JSON, its stderr)."""
  cmd = [sys.executable, "-m", "analysis", "fit-law", "--csv", csv, *FIX]
  if terms:
    cmd.append(f"--terms={terms}")
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
  return json.loads(r.stdout), r.stderr


def command(terms: str) -> str:
  flags = " ".join(FIX) + (f" --terms={terms}" if terms else "")
  return f"python -m analysis fit-law --csv {SHOWN}/analysis/emergence.csv {flags}"


def map_block(points: pd.DataFrame) -> str:
  """Each point: seeds emerged, and their emergence steps (or the last checkpoint without)."""
  rel = sorted(points["data.reliability"].unique())
  lines = ["| frequency ↓ reliability → | " + " | ".join(f"{r:g}" for r in rel) + " |"]
  lines.append("|---" * (len(rel) + 1) + "|")
  for f, rows in points.groupby("data.frequency"):
    cells = []
    for r in rel:
      at = rows[rows["data.reliability"] == r].sort_values("seed")
      steps = [
        f"> {s.censor_step:,.0f}" if s.censored else f"**{s.emergence_step:,.0f}**"
        for s in at.itertuples()
      ]
      cells.append(", ".join(steps))
    lines.append(f"| {f:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def fit_block(csv: str) -> str:
  terms = FORMS["frequency and reliability"]
  _, err = fit_law(csv, terms)
  kept = [ln for ln in err.splitlines() if not ln.startswith("python -m analysis: warning")]
  return f"`{command(terms)}` prints (stderr):\n\n```text\n" + "\n".join(kept) + "\n```"


def forms_block(points: pd.DataFrame) -> str:
  """The held-out error of each form of the law, every form scored on the same folds: each
  frequency × reliability point left out in turn (``scaling.held_out_by``)."""
  from analysis import scaling

  fixed = {"alpha": 0.37, "beta": 0.62}
  lines = [
    "| form (`--terms`) | held-out error: median / 90th percentile factor | emerged cells "
    "inside their 95% interval | censored cells agreeing |",
    "|---|---|---|---|",
  ]
  for name, terms in FORMS.items():
    cols = tuple(t for t in terms.split(",") if t)
    h = scaling.held_out_by(points, AXES, terms=cols, fixed=fixed)
    f = h.fitted
    if f is None:
      lines.append(f"| {name} | not held out: {h.skip_note} | | |")
      continue
    lines.append(
      f"| {name} (`{terms or '-'}`) | {math.exp(f.median_abs_ln):.2f} / "
      f"{math.exp(f.p90_abs_ln):.2f} | {f.coverage:.0%} of {h.n_emerged} | "
      f"{f.censored_agree} of {h.n_censored} |"
    )
  return "\n".join(lines)


def blocks(run_dir: str) -> dict[str, str]:
  csv = os.path.join(run_dir, "analysis", "emergence.csv")
  em = pd.read_csv(csv)
  points = em[(em["metric"] == "ps_max") & (em["method"] == "threshold")]
  out = {
    "exp2-law-map": map_block(points),
    "exp2-law-fit": fit_block(csv),
    "exp2-law-forms": forms_block(points),
  }
  return {k: v.replace(run_dir.rstrip("/"), SHOWN) for k, v in out.items()}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("run_dir", help="the reported run directory (python -m analysis report DIR)")
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--check", action="store_true", help="exit 1 where a block differs")
  mode.add_argument("--print", action="store_true", help="print the blocks, write nothing")
  opts = ap.parse_args(argv)
  stale = 0
  for name, body in blocks(opts.run_dir).items():
    if opts.print:
      print(f"{doc_blocks.markers(TOOL, name)[0]}\n{body}\n")
    elif opts.check:
      stale += not doc_blocks.compare(DOC, TOOL, name, body, "docs/results.md")
    else:
      doc_blocks.write(DOC, TOOL, name, body)
  return 1 if stale else 0


if __name__ == "__main__":
  raise SystemExit(main())
