"""``python -m analysis report DIR [DIR …]``: run directories → curves, emergence points, the law,
frontier and factorial tables, figures, and a report.

Writes into ``OUT`` (default ``DIR/analysis/`` of the first DIR):

  report.md      a generated summary (setup, finding, against the study, limitations:
                 ``analysis.summary``), then tables and figure links (Markdown)
  report.html    the same, self-contained: figures embedded as base64 PNG, opens offline
  emergence.csv  one row per (run, cell, metric, method): ``analysis.emergence.emergence_table``
  law.json       the fitted law (``analysis.law_fit.LawFit.to_dict``; ``ihsweep predict --law``)
                 when the cells identify it; the report says why not otherwise
  agreement.csv, residuals.csv, frontier.csv / emergence_map.csv, factorial.csv (when present)
  circuit.csv    per model, the emergence updates of the previous-token and the prefix-matching
                 scores (``analysis.circuit``)
  figures/       curves_<metric>, loss (training loss, emergence marked), attention (the
                 strongest model's best heads on a probe), emergence_bc (B × C heat map), law,
                 emergence_map, factorial (.png and .pdf)
  report_manifest.json  the files above that this report wrote, with checksums: a rerun into
                 OUT replaces only those, and refuses to overwrite any other file with their
                 names (``analysis.outputs``)

The recomputed curves are cached per run in ``DIR/analysis/curves.parquet`` (``analysis.curves``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import sys
import time

import numpy as np
import pandas as pd

from ihsweep.base.atomic import atomic_file
from ihsweep.compute import metric_registry
from ihsweep.runs.reader import dir_identity, load_runs, unwritable

from . import circuit as circuit_lib
from . import curves as curves_lib
from . import emergence as emergence_lib
from . import frontier as frontier_lib
from . import plots
from . import positions as positions_lib
from . import summary as summary_lib
from .law_section import law_section
from .outputs import OutputError, Outputs
from .report_doc import (
  Doc,
)

CURVE_FIGURES = ("ps_max", "pt_max", "ar_acc", "la_max")
METHOD_TEXT = {
  "threshold": "the first crossing of the level {fraction:g} of the way from the early to the "
  "late plateau, interpolated in log-updates",
  "max_slope": "the midpoint, in log-updates, of the checkpoint interval with the steepest rise "
  "between the plateaus",
  "breakpoint": "the centre of the ramp of a flat-ramp-flat piecewise-linear fit in log-updates",
}


@dataclasses.dataclass
class Options:
  """Report settings (``python -m analysis report --help``)."""

  metric: str = "ps_max"
  method: str = "threshold"
  fraction: float = 0.5
  source: str = "auto"
  cache: bool = True
  n_probes: int | None = curves_lib.DEFAULT_PROBES
  n_sequences: int | None = curves_lib.DEFAULT_SEQUENCES
  n_boot: int = 2000
  seed: int = 0
  with_params: bool = False  # the law refitted with the n_params term: terms=("n_params",)
  terms: tuple = ()  # the law refitted with + γ ln x for each of these columns (--terms)
  progress: bool = True


def _sizes(curves: pd.DataFrame) -> str:
  if "n_probes" not in curves or curves["n_probes"].isna().all():
    return ""
  p = sorted(curves["n_probes"].dropna().astype(int).unique())
  q = sorted(curves["n_sequences"].dropna().astype(int).unique())
  return (
    f"; recomputed on {'/'.join(map(str, p))} repeated-token probes and "
    f"{'/'.join(map(str, q))} held-out sequences per model"
  )


def _median_all(cells: pd.DataFrame) -> str:
  """Median emergence step over all seeds, a censored seed counting as later than its last
  checkpoint: a number, or '> s' when the median falls on a censored seed — s the lower bound
  (with 2 seeds, one emerged at a and one censored at c: the median exceeds (a + c) / 2)."""
  censored = cells["censored"].astype(bool).to_numpy()
  steps = np.where(censored, np.inf, cells["emergence_step"].to_numpy(float))
  order = np.argsort(steps, kind="stable")
  n = len(steps)
  mid = order[(n - 1) // 2 : n // 2 + 1]  # one (odd n) or two (even n) middle cells
  if censored[mid].any():
    bound = np.where(censored[mid], cells["censor_step"].to_numpy(float)[mid], steps[mid])
    return f"> {bound.mean():,.0f}"
  return f"{np.median(steps[mid]):,.0f}"


def _per_point(points: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
  """Emergence per grid point over seeds: n, emerged, median step and tokens."""
  keys = [k for k in ["run", *axes, "batch_size", "context_size"] if k in points]
  keys = list(dict.fromkeys(keys))
  g = points.assign(emerged=~points["censored"].astype(bool)).groupby(keys, sort=True, dropna=False)
  out = g.agg(
    n=("cell", "size"),
    emerged=("emerged", "sum"),
    median_step=("emergence_step", "median"),
    median_tokens=("emergence_tokens", "median"),
    censored_at=("censor_step", "max"),
  ).reset_index()
  all_medians = g.apply(_median_all, include_groups=False).reset_index(drop=True)
  out.insert(out.columns.get_loc("median_step") + 1, "median_all", all_medians)
  if "law_updates" in points:
    out = out.merge(points.groupby(keys)["law_updates"].first().reset_index(), on=keys)
  if "caution" in points and (points["caution"].fillna("") != "").any():
    out["caution"] = g.apply(_point_caution, include_groups=False).reset_index(drop=True)
  return out


def _point_caution(cells: pd.DataFrame) -> str:
  """The flagged seeds of one grid point and why ('seed 1: last interval, plateau on 2
  checkpoints'; ``analysis.emergence.caution``), '' for none."""
  flagged = cells[cells["caution"].fillna("") != ""]
  if len(cells) == 1:
    return "" if flagged.empty else str(flagged["caution"].iloc[0])
  name = "seed" if "seed" in cells else "cell"
  return "; ".join(f"{name} {r[name]}: {r['caution']}" for _, r in flagged.iterrows())


class _Phases:
  """The steps after the metrics, named on stderr as each starts, with the seconds since the
  metrics ended (``report: the circuit ... [36.0 s]``), and a last line with what each took,
  slowest first. Silent when ``on`` is False (``--noprogress``)."""

  def __init__(self, on: bool):
    self.on, self.took, self.start = on, [], time.perf_counter()

  def _say(self, text: str) -> None:
    if self.on:
      print(f"report: {text}", file=sys.stderr, flush=True)

  @contextlib.contextmanager
  def __call__(self, name: str, short: str):
    """``name``: the step in words; ``short``: its name in the last line."""
    self._say(f"{name} ... [{time.perf_counter() - self.start:.1f} s]")
    begin = time.perf_counter()
    try:
      yield
    finally:
      self.took.append((short, time.perf_counter() - begin))

  def finish(self) -> None:
    took = sorted(self.took, key=lambda t: -t[1])
    self._say(
      f"done {time.perf_counter() - self.start:.1f} s after the metrics ("
      + ", ".join(f"{name} {s:.1f} s" for name, s in took)
      + ")"
    )


def report(dirs: list[str], out_dir: str | None = None, options: Options | None = None) -> dict:
  """Analyses the run directories and writes the report files (module docstring).

  Returns a dict of what was written (paths) and computed (``law``: the fit dict or None,
  ``law_error``, counts; ``no_models``: True when no curve could be read).

  Raises:
    ihsweep.runs.reader.NotARun: a directory that is not a run.
    OutputError: the output directory cannot be written (e.g. a read-only run directory
      without ``out_dir``), lies inside a run directory but outside its ``analysis/``, or holds
      a file the report did not write under a name it writes (raised before anything is
      computed).
  """
  opts = options or Options()
  runs = load_runs(dirs)
  out_dir = _output_dir(runs, out_dir)
  default = {dir_identity(os.path.join(r.dir, "analysis")) for r in runs}
  outs = Outputs(out_dir, legacy=dir_identity(out_dir) in default)
  outs.check_and_clear()
  all_axes = list(dict.fromkeys(a for r in runs for a in r.axes))
  # B and C have their own columns; their axis columns would repeat them.
  axes = [a for a in all_axes if a not in ("train.batch_size", "train.context_size")]
  try:
    curves = curves_lib.load_curves(
      runs,
      out_dir,
      source=opts.source,
      cache=opts.cache,
      n_probes=opts.n_probes,
      n_sequences=opts.n_sequences,
      progress=opts.progress,
    )
  finally:
    for r in runs:
      r.close()
  written: dict = {"out_dir": out_dir, "figures": []}
  doc = Doc(out_dir)
  doc.h(1, "Induction-head emergence report")
  summary_at = doc.mark()  # the generated summary goes here once the law is fitted
  _overview(doc, runs, curves, all_axes)
  if curves.empty or "ps_max" not in curves:
    doc.p("No curves could be read: no group has params checkpoints or online metrics yet.")
    written["no_models"] = True  # the command exits 1: a report of no models is no result
    return _finish(doc, outs, written, runs)

  phase = _Phases(opts.progress)
  n_models = curves.groupby(["run", "cell"]).ngroups
  what = f"emergence points of {n_models} models (every metric and method)"
  with phase(what, "emergence points"):
    curves, table, points, one_layer = _emergence_points(runs, curves, opts, outs, written)
    _emergence_section(doc, points, axes, opts, outs, written)
  with phase("figures of the curves (.png and .pdf per metric)", "curve figures"):
    _curve_figures(doc, curves, table, axes, opts, outs, written)
  with phase("the circuit: previous-token and induction heads, loss and attention", "circuit"):
    _circuit_section(doc, runs, curves, table, axes, opts, outs, written, one_layer)
  where = "where the heads work (last saved params; probes at the start, middle, end)"
  with phase(where, "head positions"):
    _positions_section(doc, runs, outs, written)
  with phase("agreement across metrics and methods", "agreement"):
    _agreement_section(doc, table, opts, outs)
  with phase(
    f"fitting the law ({opts.n_boot} bootstrap resamples), lack-of-fit tests, law figure", "law"
  ):
    law_section(doc, points, opts, outs, written)
  with phase("the summary (and frequency × reliability tables where the grid has them)", "summary"):
    _frontier_section(doc, points, outs, written)
    doc.insert(summary_at, lambda d: _summary_section(d, points, runs, axes, opts, written))
  with phase("writing report.md and report.html (figures embedded)", "writing"):
    out = _finish(doc, outs, written, runs)
  phase.finish()
  return out


def _emergence_points(runs, curves, opts: Options, outs, written: dict) -> tuple:
  """Every model's emergence points (``curves.csv``, ``emergence.csv``) and the primary ones
  with their reach and cautions; one-layer models lose their pt_max (no head below their last
  layer: ``analysis.circuit``). Returns ``(curves, table, points, one_layer)``."""
  one_layer = circuit_lib.one_layer_models(runs)
  curves = circuit_lib.without_one_layer(curves, one_layer)
  curves.to_csv(outs.claim("curves.csv"), index=False)
  table = circuit_lib.without_one_layer(
    emergence_lib.emergence_table(curves, fraction=opts.fraction), one_layer
  )
  written["emergence_csv"] = outs.claim("emergence.csv")
  table.to_csv(written["emergence_csv"], index=False)
  points = _with_reach(
    emergence_lib.primary(table, opts.metric, opts.method), curves, runs, opts.metric
  )
  points["caution"] = emergence_lib.cautions(points)
  return curves, table, points, one_layer


def _output_dir(runs, out_dir: str | None) -> str:
  """The report's directory (default: the first run's ``analysis/``), absolute.

  Raises:
    OutputError: inside a run directory but outside its ``analysis/``, or not writable.
  """
  out_dir = os.path.abspath(out_dir or os.path.join(runs[0].dir, "analysis"))
  for run in runs:  # a run's own files (checkpoints, groups) are never the report's place
    real, root = os.path.realpath(out_dir), os.path.realpath(run.dir)
    inside = os.path.commonpath([real, root]) == root
    if inside and os.path.commonpath([real, os.path.join(root, "analysis")]) != os.path.join(
      root, "analysis"
    ):
      raise OutputError(
        f"--out {out_dir} is inside the run directory {run.dir}: the report "
        f"writes there only into {os.path.join(run.dir, 'analysis')} (the "
        f"default) — give that or a directory outside the run"
      )
  error = unwritable(os.path.join(out_dir, "figures"))
  if error is not None:
    raise OutputError(
      f"cannot write the report into {out_dir} ({error.strerror or error}); "
      f"give a writable directory with --out"
    )
  return out_dir


def _overview(doc: Doc, runs, curves: pd.DataFrame, all_axes: list[str]) -> None:
  """The runs, what was read from them, and the warnings (the runs' own and diverged cells)."""
  warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
  names = ", ".join(r.dir for r in runs)
  doc.p(
    f"Runs: {names}. Written {datetime.datetime.now().isoformat(timespec='seconds')} by "
    f"`python -m analysis report`."
  )
  n_cells = sum(len(r.cells) for r in runs)
  n_groups = sum(r.cells["group"].nunique() for r in runs)
  n_read = sum(g.n_models for r in runs for g in r.groups)
  states = pd.Series([g.state for r in runs for g in r.groups]).value_counts().to_dict()
  doc.p(
    f"{n_cells} cells (models) in {n_groups} group(s); {n_read} cells read from "
    f"{sum(len(r.groups) for r in runs)} group(s) "
    f"({', '.join(f'{v} {k}' for k, v in states.items()) or 'none'}); grid axes: "
    f"{', '.join(all_axes) or 'none'}; curves from "
    f"{', '.join(sorted(curves['source'].dropna().unique())) if 'source' in curves else 'nothing'}"
    f" ({curves['step'].nunique() if not curves.empty else 0} distinct steps"
    f"{_sizes(curves)})."
  )
  diverged = [
    f"{r.name}:{int(c)}"
    for r in runs
    if "diverged" in r.cells
    for c in r.cells.loc[r.cells["diverged"].astype(str) == "True", "cell"]
  ]
  if diverged:
    warnings.append(
      f"{len(diverged)} cell(s) diverged (loss NaN/inf); their curves end where "
      f"they diverged: {', '.join(diverged[:20])}"
    )
  if warnings:
    doc.h(2, "Warnings")
    doc.p(" • ".join(warnings))


def _emergence_section(doc: Doc, points, axes, opts, outs: Outputs, written) -> None:
  """How many cells emerged and how that was measured, the per-point table, and the B × C
  heatmap; records the counts and the cautions in ``written``."""
  n_emerged = int((~points["censored"]).sum())
  written.update(n_cells=len(points), n_emerged=n_emerged)
  cols = [
    c
    for c in (
      "run", "cell", "seed", "batch_size", "context_size", "emergence_step", "step_before",
      "step_after", "last_step", "late_points", "caution",
    )
    if c in points
  ]  # fmt: skip
  written["cautions"] = emergence_lib.flagged(points)[cols].to_dict("records")

  doc.h(2, "Emergence points")
  n_cens = len(points) - n_emerged
  how = METHOD_TEXT[opts.method].format(fraction=opts.fraction)
  doc.p(
    f"Metric {opts.metric}, method {opts.method} ({how}; see analysis/emergence.py). "
    f"{n_emerged} of {len(points)} cells emerged"
    + (f"; the other {n_cens} are right-censored at their last checkpoint" if n_cens else "")
    + ". Per grid point: `median_step` over the seeds that emerged, `median_all` over all "
    "seeds with censored ones counted as later than their last checkpoint ('> s': the median "
    "falls on a censored seed and is only known to exceed s)"
    + (
      "; `caution`: a seed whose jump lies in the last checkpoint interval of its curve, or "
      f"whose late plateau rests on fewer than {emergence_lib.MIN_LATE_POINTS} checkpoints "
      "(a slightly shorter run would have censored it; see the limitations)"
      if written["cautions"]
      else ""
    )
    + ". `emergence.csv` has every cell, metric and method; `curves.csv` every curve."
  )
  doc.table(_per_point(points, axes))
  if points["batch_size"].nunique() > 1 or points["context_size"].nunique() > 1:
    paths = plots.plot_emergence_heatmap(points, outs.figure("emergence_bc"), by=["run", *axes])
    written["figures"] += paths
    doc.figure(
      paths[0],
      "Median emergence update over seeds per batch size B × context size C "
      f"({opts.metric}, {opts.method}); hatched '> s': the median falls on "
      "a censored seed, so it is only known to exceed s.",
    )


def _curve_figures(doc: Doc, curves, table, axes, opts, outs: Outputs, written) -> None:
  """One figure of curves per metric in ``CURVE_FIGURES`` (none while every curve has only
  its update-0 point)."""
  if not (curves["step"] > 0).any():
    doc.p(
      "No curve figures: every curve has only its update-0 point so far (the figures' "
      "log axis of updates starts at the first checkpoint after 0)."
    )
  for metric in CURVE_FIGURES if (curves["step"] > 0).any() else ():
    if metric in curves and curves[metric].notna().any():
      base = outs.figure(f"curves_{metric}")
      paths = plots.plot_curves(curves, table, base, metric=metric, method=opts.method, axes=axes)
      written["figures"] += paths
      doc.figure(
        paths[0],
        f"{metric_registry.label(metric)} against updates (log axis from the last checkpoint "
        "before any curve changes); seeds as lines, "
        f"emergence points ({opts.method}) marked o, censored x.",
      )


def _circuit_section(
  doc: Doc, runs, curves, table, axes, opts, outs: Outputs, written, one_layer=frozenset()
) -> None:
  """Both halves of the circuit (``analysis.circuit``): when the previous-token and the
  induction head emerged per model and grid point (not for the ``one_layer`` models, which have
  no head below the last layer), the training loss with the emergence points marked, and the
  strongest model's two best heads' attention on a probe."""
  doc.h(2, "The circuit: previous-token and induction heads")
  models = circuit_lib.order(table, opts.method)
  read = set(zip(curves["run"].astype(str), curves["cell"].astype(int)))
  n_one, n_all = len(read & set(one_layer)), len(read)
  shallow = circuit_lib.one_layer_words(n_one, n_all) if n_one else ""
  if models.empty:
    doc.p(
      shallow
      or "Not measured: the curves have no previous-token score (pt_max), e.g. online metrics "
      "of a run made before it existed; `--source=checkpoints` recomputes it from saved params."
    )
  else:
    models.to_csv(outs.claim("circuit.csv"), index=False)
    words = circuit_lib.order_words(models, opts.method)
    doc.p(" ".join(filter(None, (words, shallow, "Per model: `circuit.csv`."))))
    doc.table(circuit_lib.order_by_point(models, ["run", *axes]))
  loss = circuit_lib.loss_curves(runs, curves)
  if not loss.empty and (loss["step"] > 0).any():
    paths = plots.plot_curves(
      loss,
      table,
      outs.figure("loss"),
      metric="train_loss",
      method=opts.method,
      axes=axes,
      mark=opts.metric,
      label="training loss (nats/token)",
    )
    written["figures"] += paths
    doc.figure(
      paths[0],
      "Training loss per model (mean over each logged stretch of updates, train_log.jsonl) "
      f"against updates; o = the model's emergence point ({opts.metric}, {opts.method}), where "
      "the loss's drop (the induction bump) is expected.",
    )
  best = circuit_lib.strongest(curves)
  run = next((r for r in runs if best and r.name == best[0]), None)
  if run is None:
    return
  try:
    example = circuit_lib.attention_example(run, best[1])
  except (ValueError, OSError) as e:  # no probes or params saved for it
    doc.p(f"No attention figure: {e}")
    return
  finally:
    run.close()
  cell = curves[(curves["run"] == best[0]) & (curves["cell"] == best[1])].iloc[0]
  where = f"B {int(cell['batch_size'])} × C {int(cell['context_size'])}"
  title = f"cell {best[1]} ({where}, seed {cell.get('seed', '?')}) at update {example['step']:,}"
  paths = circuit_lib.plot_attention(example, outs.figure("attention"), title)
  written["figures"] += paths
  doc.figure(
    paths[0],
    f"The attention of the model with the highest final prefix-matching score ({title}) on one "
    f"of the run's repeated-token probes (the last 2L = {2 * example['block_len']} positions: "
    "a block, then the same block again): left "
    + (
      "its head with the highest previous-token score (a one-layer model: no head lies below "
      "its last layer, so none can feed the induction head)"
      if example["pt"].shape[0] == 1
      else "its best previous-token head below the last layer"
    )
    + ", right its best prefix-matching head; dashed: key = query − 1 (left) and "
    "key = query − L + 1, the token after the earlier copy (right).",
  )


def _agreement_section(doc: Doc, table, opts, outs: Outputs) -> None:
  """How the other metrics and methods agree with the primary one (agreement.csv)."""
  doc.h(2, "Agreement across metrics and methods")
  agree = emergence_lib.agreement(table, (opts.metric, opts.method))
  agree.to_csv(outs.claim("agreement.csv"), index=False)
  doc.p(
    f"Against {opts.metric}/{opts.method}: share of cells with the same status (emerged or "
    f"censored), and over cells where both emerged the median log10 ratio of the steps "
    f"(0.30 = twice as late) and the correlation of log-steps."
  )
  doc.table(agree)


def _summary_section(d: Doc, points, runs, axes, opts, written) -> None:
  """The generated summary (``summary.summary``), inserted after the title once the law is
  fitted."""
  d.h(2, "Summary")
  for text in summary_lib.summary(
    points,
    written["law"],
    config=runs[0].config,
    axes=axes,
    law_error=written["law_error"],
    metric=opts.metric,
    method=opts.method,
    n_runs=len(runs),
    sensitivity=written.get("law_sensitivity"),
  ):
    d.p(text)
  d.p(
    "What the study measured and found, and where ihsweep differs from it: docs/study.md "
    "in the ihsweep repository."
  )


def _with_reach(points: pd.DataFrame, curves: pd.DataFrame, runs, metric: str) -> pd.DataFrame:
  """``points`` with ``last_step`` (each model's last checkpoint with a value of ``metric``) and
  ``budget_updates`` (from the run's cells table, when it has one) for the summary."""
  have = curves[curves[metric].notna()] if metric in curves else curves
  last = have.groupby(["run", "cell"])["step"].max().rename("last_step").reset_index()
  out = points.drop(columns=[c for c in ("last_step",) if c in points]).merge(
    last, on=["run", "cell"], how="left"
  )
  if "budget_updates" not in out:
    budgets = [
      r.cells[["cell", "budget_updates"]].assign(run=r.name)
      for r in runs
      if "budget_updates" in r.cells
    ]
    if budgets:
      b = pd.concat(budgets).drop_duplicates(["run", "cell"])
      b["budget_updates"] = pd.to_numeric(b["budget_updates"], errors="coerce")
      out = out.merge(b, on=["run", "cell"], how="left")
  return out


def _frontier_section(doc, points, outs: Outputs, written) -> None:
  fr, rel = frontier_lib.FREQUENCY, frontier_lib.RELIABILITY
  if fr in points and rel in points and points[fr].nunique() > 1 and points[rel].nunique() > 1:
    doc.h(2, "Frequency × reliability")
    emap = frontier_lib.emergence_map(points)
    front = frontier_lib.pareto_frontier(emap)
    emap.to_csv(outs.claim("emergence_map.csv"), index=False)
    front.to_csv(outs.claim("frontier.csv"), index=False)
    doc.table(emap)
    doc.p(
      "Frontier: the least reliability (along='y') or frequency (along='x') at which half "
      "the seeds emerge, interpolated between grid values:"
    )
    doc.table(front)
    paths = plots.plot_emergence_map(emap, front, outs.figure("emergence_map"))
    written["figures"] += paths
    doc.figure(paths[0], "Emergence rate over frequency × reliability with the frontier.")
  if frontier_lib.factors_present(points):
    doc.h(2, "Data properties (factorial)")
    fact = frontier_lib.factorial_table(points)
    fact.to_csv(outs.claim("factorial.csv"), index=False)
    doc.table(fact)
    paths = plots.plot_factorial(fact, outs.figure("factorial"))
    written["figures"] += paths
    doc.figure(paths[0], "Emergence rate per condition; median emergence step above the bars.")


def _positions_section(doc, runs, outs: Outputs, written) -> None:
  """Where in the context each model's best head works (``analysis.positions``): its
  prefix-matching score and next-token accuracy on the run's probe blocks placed at the start,
  the middle and the end of the context, at its last saved update; positions.csv per model,
  the table per grid point. Nothing when no run saved params with its probes."""
  tables = []
  for run in runs:
    try:
      t = positions_lib.head_positions(run)
    finally:
      run.close()
    if not t.empty:
      tables.append(t.assign(run=run.name) if len(runs) > 1 else t)
  if not tables:
    doc.h(2, "Where the heads work")
    doc.p(
      "Not measured: no model has both saved params and saved probes (probes.npz is written "
      "only with evaluation on, eval.every_steps > 0)."
    )
    return
  table = pd.concat(tables, ignore_index=True)
  written["positions_csv"] = outs.claim("positions.csv")
  table.to_csv(written["positions_csv"], index=False)
  doc.h(2, "Where the heads work")
  starts = {
    r.config.data.get("induction_start", "half")
    for r in runs
    if r.config.data.get("source") == "markov"
  }
  doc.p(positions_lib.words(table, starts))
  cells = positions_lib.by_cell(table)
  for col in [c for c in cells.columns if c.startswith(("ps_", "acc_"))]:
    cells[col] = cells[col].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")  # one way: 0.90
  doc.table(cells)


def _finish(doc: Doc, outs: Outputs, written: dict, runs) -> dict:
  md, page = outs.claim("report.md"), outs.claim("report.html")
  for path, text in ((md, doc.markdown()), (page, doc.html("ihsweep report"))):
    with atomic_file(path) as f:
      f.write(text)
  outs.finish()
  written.update(report_md=md, report_html=page, warnings=[w for r in runs for w in r.warnings])
  return written
