"""The demo's numbers in README.md, docs/results.md and docs/analysis.md, produced from a demo run
directory by the command that prints them, so that the docs say what `make demo` prints.

  make demo                                              # runs/demo, trained and reported
  python benchmarks/demo_docs.py runs/demo               # every block rewritten in place
  python benchmarks/demo_docs.py runs/demo --check       # exit 1 (and a diff) where one differs
  python benchmarks/demo_docs.py runs/demo --print       # the blocks, nothing written

It runs `python -m analysis report DIR` (the command `make demo` ends with; the curves come from
its cache) and renders its printed lines and its files (emergence.csv, law.json, circuit.csv,
positions.csv, agreement.csv, curves.csv, report.md), and what the README's quick example and
docs/analysis.md's TransformerLens example print on the run, into the blocks between
``<!-- demo_docs.py NAME -->`` and ``<!-- /demo_docs.py NAME -->``. The run directory's path is
written as ``runs/demo`` (``--as``). Words around the blocks are the docs' own and hold no
number the report prints. tests/test_report.py renders every block from a small sweep's report
and checks its form.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
# After the root: benchmarks/analysis.py must not hide the analysis package.
sys.path.append(os.path.dirname(os.path.abspath(__file__)))

import doc_blocks  # noqa: E402 (benchmarks/ is on the path from here on)

TOOL = "demo_docs.py"
# The report's figures the docs show: figures/NAME.png -> docs/figures/DOC_NAME (copied on write;
# --check compares the text blocks only: a PNG's bytes change with matplotlib's version).
FIGURES = {
  "curves_ps_max": "demo_curves_ps_max.png",
  "law": "demo_law.png",
  "emergence_bc": "demo_emergence_bc.png",
  "loss": "demo_loss.png",
  "attention": "demo_attention.png",
}
PLACES = {"start": "from position 0", "middle": "across C/2", "end": "at the end of the context"}


@dataclasses.dataclass
class Demo:
  """A reported demo run: the report's printed lines and its files (None where not written)."""

  printed: str
  emergence: pd.DataFrame
  curves: pd.DataFrame
  law: dict | None
  circuit: pd.DataFrame | None
  positions: pd.DataFrame | None
  agreement: pd.DataFrame | None
  summary: list[str]
  quick: str = ""  # the README's quick example's printed line
  export: str = ""  # docs/analysis.md's TransformerLens example's printed line

  @property
  def quick_cell(self) -> tuple[int, int]:
    b, c = json.loads(self.quick.split("]")[0] + "]")
    return int(b), int(c)

  @property
  def quick_tokens(self) -> int:
    return int(self.quick.rstrip(")").split(",")[-1])


def run_report(run_dir: str, shown_as: str, flags: list[str]) -> str:
  """``python -m analysis report run_dir`` run now; its standard output with ``run_dir``
  written as ``shown_as``.

  Raises:
    SystemExit: the report failed (its error's last lines).
  """
  r = subprocess.run(
    [sys.executable, "-m", "analysis", "report", run_dir, "--noprogress", *flags],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  if r.returncode:
    raise SystemExit(f"demo_docs: the report of {run_dir} failed: {r.stderr.strip()[-800:]}")
  return r.stdout.replace(os.path.abspath(run_dir), shown_as).replace(run_dir, shown_as).strip()


def load(run_dir: str, printed: str) -> Demo:
  """The report's files in ``run_dir/analysis``."""
  out = os.path.join(run_dir, "analysis")

  def csv(name):
    path = os.path.join(out, name)
    return pd.read_csv(path) if os.path.exists(path) else None

  law_path = os.path.join(out, "law.json")
  law = json.load(open(law_path)) if os.path.exists(law_path) else None
  with open(os.path.join(out, "report.md")) as f:
    md = f.read()
  summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0] if "## Summary" in md else ""
  paragraphs = [p.strip() for p in summary.split("\n\n") if p.strip().startswith("**")]
  return Demo(
    printed=printed,
    emergence=csv("emergence.csv"),
    curves=csv("curves.csv"),
    law=law,
    circuit=csv("circuit.csv"),
    positions=csv("positions.csv"),
    agreement=csv("agreement.csv"),
    summary=paragraphs,
  )


# ---------------------------------------------------------------- the blocks


def _n(v: float) -> str:
  return f"{v:,.0f}"


def _span(values, digits: int = 2) -> str:
  values = pd.Series(values, dtype=float).dropna()
  lo, hi = values.min(), values.max()
  return (
    f"{lo:.{digits}f}"
    if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
    else (f"{lo:.{digits}f}–{hi:.{digits}f}")
  )


def _primary(demo: Demo, metric: str = "ps_max") -> pd.DataFrame:
  e = demo.emergence
  return e[(e["metric"] == metric) & (e["method"] == "threshold")].copy()


def _median_table(points: pd.DataFrame) -> str:
  """B down, C across: the median emergence update over seeds (``plots.emergence_grid``;
  '> s' where the median falls on a censored seed)."""
  from analysis import plots

  grid = plots.emergence_grid(points)
  bs = sorted(grid["batch_size"].unique())
  cs = sorted(grid["context_size"].unique())
  lines = ["| B ↓ C → | " + " | ".join(f"{c:g}" for c in cs) + " |"]
  lines.append("|---" * (len(cs) + 1) + "|")
  for b in bs:
    cells = []
    for c in cs:
      row = grid[(grid["batch_size"] == b) & (grid["context_size"] == c)]
      if row.empty:
        cells.append("")
        continue
      r = row.iloc[0]
      cells.append(("> " if r["censored"] else "") + _n(r["median_updates"]))
    lines.append(f"| {b:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def printed_block(demo: Demo) -> str:
  return f"```\n{demo.printed}\n```"


def finding_block(demo: Demo) -> str:
  """The README's paragraph of numbers: emerged models, the metric's range before and after,
  recall, the span of emergence updates and the fitted law against the study's."""
  pts = _primary(demo)
  em = pts[~pts["censored"].astype(bool)]
  curves = demo.curves.sort_values("step")
  first = curves.groupby(["run", "cell"]).head(1)
  last = curves.dropna(subset=["ps_max"]).groupby(["run", "cell"]).tail(1)
  text = (
    f"{len(em)} of {len(pts)} models emerged (prefix-matching score of the best head "
    f"{_span(first['ps_max'])} at update 0 → {_span(last['ps_max'])} at the last checkpoint"
  )
  if "ar_acc" in last:
    text += f"; associative recall on the probes → {_span(last['ar_acc'])}"
  text += ")"
  if len(em):
    lo, hi = em.loc[em["emergence_step"].idxmin()], em.loc[em["emergence_step"].idxmax()]
    text += (
      f", between update {_n(lo['emergence_step'])} (B {lo['batch_size']:g}, C "
      f"{lo['context_size']:g}) and {_n(hi['emergence_step'])} (B {hi['batch_size']:g}, C "
      f"{hi['context_size']:g})"
    )
  text += "."
  law = demo.law
  if law is None:
    return text + " No law was fitted (the report says why)."
  from ihsweep.base.law import STUDY

  def coef(name):
    ci = (law.get("ci") or {}).get(name)
    return f"{law[name]:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

  text += (
    f" The fitted law: α = {coef('alpha')} (the study's {STUDY['alpha']:.2f}), "
    f"β = {coef('beta')} (the study's {STUDY['beta']:.2f}), ln T = {coef('log_T')}"
    f" ({STUDY['log_T']:.2f})"
  )
  if law.get("study_r") is not None:
    text += f"; the study's law scores r = {law['study_r']:.2f} on these cells"
  text += "."
  against = next((p for p in demo.summary if p.startswith("**Against the study.**")), "")
  sentence = next((s for s in against.split(". ") if "the study's law predicts" in s), None)
  if sentence:
    text += f" {sentence.rstrip('.')} (the report)."
  for test in (law.get("lack_of_fit") or []) + [law.get("separability") or {}]:
    if test.get("evidence") in ("rejected", "some"):  # the report's 1% level, or short of it
      text += f" {test['sentence'][0].upper()}{test['sentence'][1:]}."
  if law.get("held_out"):
    text += f" {law['held_out']['sentence'][0].upper()}{law['held_out']['sentence'][1:]}."
  return text


def law_block(demo: Demo) -> str:
  """The fitted law(s) and the study's as a Markdown table (the rows `fit-law` prints), and each
  lack-of-fit test."""
  if demo.law is None:
    return "No law was fitted (the report says why)."
  from analysis.commands.common import law_table

  lines = [law_table(demo.law, tablefmt="github")]
  for test in demo.law.get("lack_of_fit") or []:
    what = (
      f"Lack of fit in {test['symbol']} (a free level per value against the power law, an F "
      f"test on the grid points)"
    )
    lines += ["", f"{what}: {test['sentence']}."]
  if demo.law.get("separability"):
    lines += [
      "",
      f"Separability (an added ln B · ln C term): {demo.law['separability']['sentence']}.",
    ]
  if demo.law.get("held_out"):
    lines += ["", f"Held-out prediction: {demo.law['held_out']['sentence']}."]
  return "\n".join(lines)


def emergence_block(demo: Demo) -> str:
  return _median_table(_primary(demo))


def circuit_block(demo: Demo) -> str:
  """Per grid point the median emergence update of the previous-token and the prefix-matching
  scores (the report's table), then the report's sentence."""
  if demo.circuit is None:
    return "Not measured (the report has no circuit.csv)."
  from analysis import circuit

  table = circuit.order_by_point(demo.circuit)
  lines = ["| B | C | previous-token (pt_max) | induction (ps_max) |", "|---|---|---|---|"]
  for _, r in table.iterrows():
    cells = [
      v if isinstance(v, str) else _n(v) if np.isfinite(v) else ""
      for v in r[["pt_median", "ps_median"]]
    ]
    lines.append(f"| {r['batch_size']:g} | {r['context_size']:g} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines) + "\n\n" + circuit.order_words(demo.circuit, "threshold")


def positions_block(demo: Demo) -> str:
  """Per C, the range over models of the best head's prefix-matching score at each place, and
  the mean next-token accuracy."""
  t = demo.positions
  if t is None or t.empty:
    return "Not measured (no positions.csv: no model saved params with probes)."
  lines = ["| C | " + " | ".join(PLACES.values()) + " |", "|---" * (len(PLACES) + 1) + "|"]
  for c, rows in t.groupby("context_size"):
    cells = []
    for place in PLACES:
      ps = rows[f"ps_{place}"]
      low = int((ps < 0.3).sum())
      cells.append(
        f"{_span(ps)} ({rows[f'acc_{place}'].mean():.0%})"
        + (f", {low} of {len(rows)} below 0.3" if low else "")
      )
    lines.append(f"| {c:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def agreement_block(demo: Demo) -> str:
  """How each metric's emergence points agree with ps_max's (threshold): the report's
  agreement.csv."""
  a = demo.agreement
  if a is None or a.empty:
    return "Not computed."
  lines = [
    "| metric | method | emerged | same status | median log10 ratio | r of log-steps |",
    "|---|---|---|---|---|---|",
  ]
  for _, r in a.iterrows():
    ratio = "" if pd.isna(r["median_log10_ratio"]) else f"{r['median_log10_ratio']:+.3f}"
    corr = "" if pd.isna(r["pearson_r"]) else f"{r['pearson_r']:.3f}"
    lines.append(
      f"| {r['metric']} | {r['method']} | {int(r['emerged'])} of {int(r['n'])} | "
      f"{r['same_status']:.0%} | {ratio} | {corr} |"
    )
  return "\n".join(lines)


def summary_block(demo: Demo) -> str:
  """The report's generated "Finding" and "Against the study" paragraphs, quoted."""
  keep = [p for p in demo.summary if p.startswith(("**Finding.**", "**Against the study.**"))]
  return "\n>\n".join("> " + p.replace("\n", " ") for p in keep) or "> (no summary)"


def quick_block(demo: Demo) -> str:
  """What the README's quick example (the Python block after ``<!-- quick-example -->``) prints
  on the demo, run now on the run directory."""
  return (
    f"On the demo it prints `{demo.quick}`: the model of B {demo.quick_cell[0]} × C "
    f"{demo.quick_cell[1]}, whose probes are T = {demo.quick_tokens} tokens long."
  )


def lack_of_fit_block(demo: Demo) -> str:
  """The README's sentences on C: which C is the fastest at each B, and the report's lack-of-fit
  test in C (law.json's ``lack_of_fit``)."""
  tests = {t["symbol"]: t for t in (demo.law or {}).get("lack_of_fit") or []}
  test = tests.get("C")
  if test is None:
    return "The report fitted no law, so it did not test the power law in C."
  fastest = sorted(set(test.get("fastest", {}).values()))
  where = (
    f"C = {fastest[0]:g} is the fastest at every B."
    if len(fastest) == 1
    else f"The fastest C differs between the values of B ({', '.join(f'{c:g}' for c in fastest)})."
  )
  if not test["tested"]:
    return f"{where} The report did not test the power law in C: {test['reason']}."
  return (
    f"{where} The report's lack-of-fit test in C, whose unit is the grid point (a point's seeds "
    f"share its deviation): {test['sentence']}."
  )


def export_block(demo: Demo) -> str:
  """What docs/analysis.md's TransformerLens example (the Python block after ``<!--
  export-example -->``) prints on the demo, run now on the run directory."""
  if not demo.export:
    return "Not run here (the example needs the interop extra: torch and transformer-lens)."
  return f"On the demo it prints `{demo.export}`."


def _run_example(run_dir: str, doc: str, tag: str) -> str:
  """The Python block after ``<!-- tag -->`` in ``doc``, run on ``run_dir`` (in place of
  runs/demo); its last printed line.

  Raises:
    SystemExit: the example failed.
  """
  with open(os.path.join(ROOT, doc)) as f:
    text = f.read()
  code = text.split(f"<!-- {tag} -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
  code = code.replace('"runs/demo"', repr(os.path.abspath(run_dir)))
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  if r.returncode:
    raise SystemExit(f"demo_docs: {doc}'s {tag} failed: {r.stderr.strip()[-800:]}")
  return r.stdout.strip().splitlines()[-1]


def run_quick_example(run_dir: str) -> str:
  """The README's quick example run on ``run_dir``; its printed line (``_run_example``)."""
  return _run_example(run_dir, "README.md", "quick-example")


def run_export_example(run_dir: str) -> str:
  """docs/analysis.md's TransformerLens example run on ``run_dir``; its printed line."""
  return _run_example(run_dir, "docs/analysis.md", "export-example")


BLOCKS = {
  "readme-quick": ("README.md", quick_block),
  "readme-printed": ("README.md", printed_block),
  "readme-finding": ("README.md", finding_block),
  "readme-positions": ("README.md", positions_block),
  "readme-circuit": ("README.md", lambda d: circuit_block(d).rsplit("\n\n", 1)[-1]),
  "readme-lack-of-fit": ("README.md", lack_of_fit_block),
  "analysis-export": ("docs/analysis.md", export_block),
  "results-emergence": ("docs/results.md", emergence_block),
  "results-law": ("docs/results.md", law_block),
  "results-agreement": ("docs/results.md", agreement_block),
  "results-circuit": ("docs/results.md", circuit_block),
  "results-positions": ("docs/results.md", positions_block),
  "results-summary": ("docs/results.md", summary_block),
}


def render(demo: Demo) -> dict[str, str]:
  """Every block's text."""
  return {name: fn(demo) for name, (_, fn) in BLOCKS.items()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("run_dir", help="the demo's run directory (make demo: runs/demo)")
  p.add_argument("--check", action="store_true", help="compare instead of rewriting")
  p.add_argument("--print", action="store_true", help="print the blocks, write nothing")
  p.add_argument("--as", dest="shown_as", default="runs/demo", help="the path the docs show")
  p.add_argument(
    "--report-flag", action="append", default=[], help="a flag for the report (repeatable)"
  )
  args = p.parse_args(argv)
  if not os.path.isdir(args.run_dir):
    p.error(f"{args.run_dir}: not a directory (make demo writes runs/demo)")
  demo = load(args.run_dir, run_report(args.run_dir, args.shown_as, args.report_flag))
  demo.quick = run_quick_example(args.run_dir)
  demo.export = run_export_example(args.run_dir)
  bodies = render(demo)
  if args.print:
    for name, body in bodies.items():
      print(f"{doc_blocks.markers(TOOL, name)[0]}\n{body}\n")
    return 0
  stale = 0
  for name, body in bodies.items():
    doc = BLOCKS[name][0]
    path = os.path.join(ROOT, doc)
    if args.check:
      stale += not doc_blocks.compare(path, TOOL, name, body, doc)
    else:
      doc_blocks.write(path, TOOL, name, body)
      print(f"{name}: {doc} written")
  if not args.check:
    for name, target in FIGURES.items():
      shutil.copyfile(
        os.path.join(args.run_dir, "analysis", "figures", f"{name}.png"),
        os.path.join(ROOT, "docs", "figures", target),
      )
      print(f"figures/{name}.png: docs/figures/{target} written")
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main())
