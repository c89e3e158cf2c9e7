"""``python -m analysis``: reports from run directories, and the law fitted to a CSV.

  python -m analysis report DIR [DIR ...] [--out OUT] [--metric ps_max] [--method threshold]
  python -m analysis fit-law --csv FILE [--with-params] [--n-boot 2000] [--fix alpha=0.37]

Exit status: 0 done, 2 bad input (a directory that is not a run, a CSV that cannot be fitted),
with one line on stderr saying what and why.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys

PROG = "python -m analysis"  # the command in messages; main(prog=...) sets it (`ihsweep report`)


def _count(text: str) -> int | None:
  if text == "all":
    return None
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: a positive integer or 'all'")
  return value


def _parser(prog: str = PROG) -> argparse.ArgumentParser:
  from . import curves, emergence

  p = argparse.ArgumentParser(prog=prog, description="Analyse ihsweep run directories.")
  sub = p.add_subparsers(dest="command", required=True)
  r = sub.add_parser(
    "report",
    help="curves, emergence points, law, figures and report.md/.html",
    description="Recompute metrics from every checkpoint (cached), find "
    "emergence points, fit the law, draw figures, write report.md/.html, "
    "emergence.csv and law.json into OUT (default: the first DIR/analysis).",
  )
  r.add_argument("dirs", nargs="+", metavar="DIR", help="run directories (ihsweep run/train)")
  r.add_argument("--out", help="output directory (default: DIR/analysis of the first DIR)")
  r.add_argument(
    "--metric",
    default="ps_max",
    choices=emergence.DEFAULT_METRICS,
    help="metric whose emergence points feed the law (default ps_max)",
  )
  r.add_argument(
    "--method",
    default="threshold",
    choices=emergence.METHODS,
    help="emergence estimator for the law (default threshold)",
  )
  r.add_argument(
    "--fraction",
    type=float,
    default=0.5,
    help="threshold level between the early and late plateau (default 0.5)",
  )
  r.add_argument(
    "--source",
    default="auto",
    choices=curves.SOURCES,
    help="curves from checkpoints, online metrics.jsonl, or auto (default)",
  )
  r.add_argument("--no-cache", action="store_true", help="recompute every checkpoint")
  r.add_argument(
    "--probes",
    default=str(curves.DEFAULT_PROBES),
    type=_count,
    help=f"repeated-token probes per checkpoint: the first N of the run's, or "
    f"'all' (= the online evaluation; default {curves.DEFAULT_PROBES})",
  )
  r.add_argument(
    "--sequences",
    default=str(curves.DEFAULT_SEQUENCES),
    type=_count,
    help=f"held-out sequences per model and checkpoint, or 'all' (default "
    f"{curves.DEFAULT_SEQUENCES})",
  )
  r.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
  r.add_argument(
    "--with-params",
    action="store_true",
    help="also fit + gamma ln n_params (model-size dependence)",
  )
  r.add_argument("--no-progress", action="store_true", help="no progress bar")
  f = sub.add_parser(
    "fit-law",
    help="fit the emergence law to a CSV of emergence points",
    description="CSV columns batch_size, context_size, emergence_step (updates; "
    "empty = censored), censor_step (updates; needed for censored rows: the last "
    "checkpoint without emergence), optionally censored and n_params. Fits the "
    "law by censored log-normal maximum likelihood (censored cells enter by "
    "their survival term) and, for comparison, by least squares on emerged "
    "cells. Prints one JSON object on stdout: log_T, T, alpha, beta, sigma, r, "
    "n, n_censored, ci (95 percent intervals from a bootstrap over grid points), "
    "cov, range, emerged_only, ...; and a table of both fits on stderr. An "
    "analysis emergence.csv is read at --metric/--method (default "
    "ps_max/threshold).",
  )
  f.add_argument(
    "--csv",
    required=True,
    help="emergence points (e.g. DIR/analysis/emergence.csv filtered to one metric and method)",
  )
  f.add_argument("--with-params", action="store_true", help="also fit + gamma ln n_params")
  f.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
  f.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  f.add_argument(
    "--fix",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="hold a coefficient fixed, e.g. alpha=0.37 when B was not varied",
  )
  f.add_argument("--metric", help="with an emergence.csv: rows of this metric (default ps_max)")
  f.add_argument("--method", help="with an emergence.csv: rows of this method (default threshold)")
  return p


def _fail(message: str) -> int:
  print(f"{PROG}: {message}", file=sys.stderr)
  return 2


def _fit_law(args) -> int:
  from . import scaling

  fixed = {}
  for spec in args.fix:
    name, _, value = spec.partition("=")
    if name.strip() in fixed:
      return _fail(
        f"--fix {spec!r}: {name.strip()} is already fixed (--fix {name.strip()}="
        f"{fixed[name.strip()]:g}); give each coefficient once"
      )
    try:
      fixed[name.strip()] = float(value)
    except ValueError:
      return _fail(f"--fix {spec!r}: expected NAME=NUMBER, e.g. alpha=0.37")
  try:
    points = scaling.read_points(args.csv)
  except (OSError, ValueError) as e:
    return _fail(f"--csv {args.csv}: cannot read a CSV ({e})")
  if {"metric", "method"} <= set(points):  # an analysis emergence.csv: one metric and method
    args.metric = args.metric or "ps_max"
    args.method = args.method or "threshold"
  for column, value in (("metric", args.metric), ("method", args.method)):
    if value is not None:
      if column not in points:
        return _fail(f"--{column} {value}: {args.csv} has no {column!r} column")
      if not (points[column] == value).any():
        return _fail(
          f"--{column} {value}: no rows of {args.csv} have it (it has "
          f"{sorted(points[column].dropna().astype(str).unique())})"
        )
      points = points[points[column] == value]
  if args.n_boot < 0:
    return _fail(f"--n-boot {args.n_boot}: must be >= 0")
  try:
    fit = scaling.fit_law(
      points, with_params=args.with_params, n_boot=args.n_boot, seed=args.seed, fixed=fixed
    )
  except scaling.FitError as e:
    return _fail(f"{args.csv}: {e}")
  law = fit.to_dict()
  print(json.dumps(law, indent=2))
  print(_fit_summary(law), file=sys.stderr)
  if not fit.ci and args.n_boot:
    print(
      f"{PROG}: warning: no confidence intervals ('ci' is empty): {fit.ci_note}", file=sys.stderr
    )
  return 0


def _report(args) -> int:
  from ihsweep.reader import NotARun

  from . import report

  if args.n_boot < 0:
    return _fail(f"--n-boot {args.n_boot}: must be >= 0")
  if not 0 < args.fraction < 1:
    return _fail(f"--fraction {args.fraction}: must be in (0, 1)")
  opts = report.Options(
    metric=args.metric,
    method=args.method,
    fraction=args.fraction,
    source=args.source,
    cache=not args.no_cache,
    n_boot=args.n_boot,
    n_probes=args.probes,
    n_sequences=args.sequences,
    with_params=args.with_params,
    progress=not args.no_progress,
  )
  try:
    written = report.report(args.dirs, args.out, opts)
  except (NotARun, report.OutputError) as e:
    return _fail(str(e))
  law = written.get("law")
  print(f"report: {written['report_md']} (and report.html)")
  if "n_cells" in written:
    print(
      f"emergence: {written['n_emerged']} of {written['n_cells']} cells emerged "
      f"({args.metric}, {args.method}); table {written['emergence_csv']}"
    )
  if written.get("cautions"):
    refit = written.get("law_sensitivity") or {}
    print(_caution_lines(written["cautions"], refitted=bool(law) and "alpha" in refit))
  if law:
    print(_law_lines(law, written["out_dir"], written.get("law_sensitivity")))
  elif written.get("law_error"):
    print(f"law: not fitted ({written['law_error']})")
  if written.get("warnings"):
    print(f"{len(written['warnings'])} warning(s); see the report")
  return 0


def _caution_lines(cautions: list[dict], refitted: bool = False) -> str:
  """The emerged cells whose jump lies at the end of their curve (``report``'s ``cautions``:
  one dict per cell with batch_size, context_size, seed, emergence_step, step_before,
  step_after, last_step, caution), as a table with a caution column; ``refitted``: the law
  table that follows has their 'flagged censored' row."""
  from tabulate import tabulate

  def n(v):
    return "" if v is None or v != v else f"{v:,.0f}"

  rows = [
    (
      f"{c['batch_size']:g}",
      f"{c['context_size']:g}",
      c.get("seed", c.get("cell", "")),
      n(c.get("emergence_step")),
      f"{n(c.get('step_before'))}-{n(c.get('step_after'))}",
      n(c.get("last_step")),
      c["caution"],
    )
    for c in cautions
  ]
  table = tabulate(
    rows,
    headers=("B", "C", "seed", "emerged at", "between", "last checkpoint", "caution"),
    tablefmt="plain",
    disable_numparse=True,
  )
  k = len(cautions)
  them = "it" if k == 1 else "them"
  row = (
    f"; the law's row 'flagged censored' counts {them} censored at the last checkpoint"
    if refitted
    else ""
  )
  return (
    f"caution: {k} cell{'' if k == 1 else 's'} emerged at the end of training (a slightly "
    f"shorter run would have censored {them}{row})\n"
    + "\n".join("  " + line for line in table.splitlines())
  )


def _law_table(law: dict, sensitivity: dict | None = None) -> str:
  """The fitted law(s) beside the study's, one row each: the main fit ("fitted", or "censored
  MLE" when the law has an ``emerged_only`` fit, which gets the next row), the law refitted with
  the flagged cells censored ("flagged censored", ``sensitivity``: its ``to_dict()``, when
  given and fitted), the study; columns ln T, alpha, beta (95% intervals where there are any),
  sigma (where the law has it), r ("-" where withheld), cells."""
  from tabulate import tabulate

  from .scaling import MLE, STUDY

  with_sigma = "sigma" in law

  def row(label, fit, cells):
    ci = fit.get("ci") or {}

    def value(name):
      text = f"{fit[name]:.2f}"
      if name in (fit.get("fixed") or {}):
        return text + " (fixed)"
      return text + (f" [{ci[name][0]:.2f}, {ci[name][1]:.2f}]" if name in ci else "")

    r = "-" if fit.get("r") is None else f"{fit['r']:.2f}"
    return (
      (label, value("log_T"), value("alpha"), value("beta"))
      + ((value("sigma") if "sigma" in fit else "",) if with_sigma else ())
      + (r, cells)
    )

  n, n_cens = law["n"], law.get("n_censored") or 0
  if law.get("method") == MLE:
    cells = f"{n}" + (f" ({n_cens} censored)" if n_cens else "")
  else:  # a law from before the censored fit: n counts emerged cells only
    cells = f"{n}" + (f" (+{n_cens} censored)" if n_cens else "")
  only = law.get("emerged_only")
  rows = [row("censored MLE" if only else "fitted", law, cells)]
  if only:
    rows.append(
      row("emerged only", only, f"{only['n']}" + (f" (+{n_cens} left out)" if n_cens else ""))
    )
  if sensitivity and "alpha" in sensitivity:
    s_cens = sensitivity.get("n_censored") or 0
    rows.append(row("flagged censored", sensitivity, f"{sensitivity['n']} ({s_cens} censored)"))
  # The study's law, scored on these cells (its published r, 0.98, is on the study's own)
  study_r = "-" if law.get("study_r") is None else f"{law['study_r']:.2f}"
  rows.append(
    ("study (published)", f"{STUDY['log_T']:.2f}", f"{STUDY['alpha']:.2f}", f"{STUDY['beta']:.2f}")
    + (("",) if with_sigma else ())
    + (study_r, f"(published r {STUDY['r']:.2f} on the study's cells)")
  )
  headers = (
    ("", "ln T", "alpha (B)", "beta (C)") + (("sigma",) if with_sigma else ()) + ("r", "cells")
  )
  return tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True)


def _law_lines(law: dict, out_dir: str, sensitivity: dict | None = None) -> str:
  """The fitted law (with 95% intervals where there are any) beside the study's, and refitted
  with the flagged cells censored when ``sensitivity`` is given (``_law_table``)."""
  lines = _law_table(law, sensitivity).splitlines()
  text = (
    f"law: UPT = T / (B^alpha C^beta), updates; 95% bootstrap intervals -> "
    f"{out_dir}/law.json\n" + "\n".join("  " + line for line in lines)
  )
  if sensitivity and sensitivity.get("error"):
    text += f"\n  with the flagged cells censored the law cannot be fitted: {sensitivity['error']}"
  return text


def _fit_summary(law: dict) -> str:
  """fit-law's words on stderr: the table (``_law_table``), the censored cells, why r or the
  intervals are missing."""
  boot = (
    f"95% intervals from {law['n_boot']} bootstrap resamples of "
    f"{law.get('n_grid_points', '?')} grid points"
    if law.get("n_boot")
    else "no intervals"
  )
  lines = [f"law: ln UPT = ln T - alpha ln B - beta ln C (updates); {boot}"]
  lines += ["  " + line for line in _law_table(law).splitlines()]
  n_cens = law.get("n_censored") or 0
  if n_cens:
    lines.append(
      f"{n_cens} of {law['n']} cells censored (not emerged by their last checkpoint): "
      f"in the MLE by P(UPT > censor_step); the emerged-only fit leaves them out"
    )
  else:
    lines.append("no censored cells: both fits use the same cells")
  if law.get("sigma") is not None:
    lines.append(
      f"sigma = {law['sigma']:.3f}: the cell-to-cell scatter of ln UPT about the law "
      f"(x{math.exp(law['sigma']):.2f} in updates)"
    )
  if law.get("r") is None and law.get("r_note"):
    lines.append(f"r {law['r_note']}")
  return "\n".join(lines)


def _empty_value(args) -> str | None:
  """The first flag or directory given as an empty string (``--out=``), which would otherwise
  read as not given (the default) or as the current directory."""
  for name in ("out", "csv", "metric", "method"):
    if getattr(args, name, None) == "":
      return f"--{name}= is empty: give a value, or leave the flag out for its default"
  if "" in getattr(args, "dirs", ()):
    return "an empty DIR: give a run directory written by `ihsweep run` or `ihsweep train`"
  return None


def main(argv=None, prog: str = "python -m analysis") -> int:
  """``prog``: the command named in usage, help and messages (``ihsweep`` when run as ``ihsweep
  report``)."""
  global PROG
  PROG = prog
  args = _parser(prog).parse_args(argv)
  if _empty_value(args):
    return _fail(_empty_value(args))
  logging.basicConfig(
    level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
  )
  logging.getLogger("jax").setLevel(logging.WARNING)  # backend probing
  # orbax's per-restore lines and its notes that a read-only manager will not save
  logging.getLogger("absl").setLevel(logging.ERROR)
  if args.command == "fit-law":
    return _fit_law(args)
  from ihsweep.sharding import use_one_cpu_device_per_core

  use_one_cpu_device_per_core()  # CPU: the ensemble split over cores, as in training
  try:
    return _report(args)
  except KeyboardInterrupt:
    print(f"{PROG}: interrupted; the cache keeps every group finished so far", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
