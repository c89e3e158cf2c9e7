"""``python -m analysis fit-law --csv FILE`` (``ihsweep fit-law``): the emergence law fitted to
a CSV of emergence points (``analysis.scaling.fit_law``), one JSON object on stdout."""

from __future__ import annotations

import argparse
import json
import math
import sys

from .common import add, bad_n_boot, fail, law_table, law_terms

NAME = "fit-law"
HELP = "fit the emergence law to a CSV of emergence points"
DESCRIPTION = (
  "CSV columns batch_size, context_size, emergence_step (updates; empty = censored; 'NaN' "
  "only where censored is true), "
  "censor_step (updates; needed for censored rows: the last checkpoint without emergence), "
  "optionally censored and the columns of --terms. Fits ln UPT = ln T - alpha ln B - beta ln C "
  "(+ gamma[X] ln X for each column X of --terms, e.g. n_params, data.frequency) by censored "
  "log-normal maximum likelihood (censored cells enter by their survival term) and, for "
  "comparison, by least squares on emerged cells. Prints one JSON object on stdout: log_T, T, "
  "alpha, beta, terms and gammas (with --terms), sigma, r, n, n_censored, ci (95 percent "
  "intervals from a bootstrap over grid points), cov, range, emerged_only, ...; and a table of "
  "both fits on stderr. An analysis emergence.csv is read at "
  "--metric/--method (default ps_max/threshold)."
)
USES_DEVICES = False


def add_arguments(f: argparse.ArgumentParser) -> None:
  f.add_argument(
    "--csv",
    required=True,
    help="emergence points (e.g. DIR/analysis/emergence.csv filtered to one metric and method)",
  )
  add(f, "--terms", "--with_params", "--n_boot")
  f.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  f.add_argument(
    "--fix",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="hold a coefficient fixed, e.g. alpha=0.37 when B was not varied, or "
    "gamma[data.frequency]=0.5 for a term of --terms",
  )
  f.add_argument("--metric", help="with an emergence.csv: rows of this metric (default ps_max)")
  f.add_argument("--method", help="with an emergence.csv: rows of this method (default threshold)")


def _fixed(args) -> tuple[dict, str | None]:
  """``(coefficients held fixed by --fix, None)``, or ``({}, why a --fix is refused)``."""
  fixed = {}
  for spec in args.fix:
    name, _, value = spec.partition("=")
    if name.strip() in fixed:
      return {}, (
        f"--fix {spec!r}: {name.strip()} is already fixed (--fix {name.strip()}="
        f"{fixed[name.strip()]:g}); give each coefficient once"
      )
    try:
      fixed[name.strip()] = float(value)
    except ValueError:
      return {}, f"--fix {spec!r}: expected NAME=NUMBER, e.g. alpha=0.37"
  return fixed, None


def _points(args):
  """``(the CSV's rows at --metric/--method, None)``, or ``(None, why not)``."""
  from .. import law_points

  try:
    points = law_points.read_points(args.csv)
  except (OSError, ValueError) as e:
    return None, f"--csv {args.csv}: cannot read a CSV ({e})"
  if {"metric", "method"} <= set(points):  # an analysis emergence.csv: one metric and method
    args.metric = args.metric or "ps_max"
    args.method = args.method or "threshold"
  for column, value in (("metric", args.metric), ("method", args.method)):
    if value is not None:
      if column not in points:
        return None, f"--{column} {value}: {args.csv} has no {column!r} column"
      if not (points[column] == value).any():
        return None, (
          f"--{column} {value}: no rows of {args.csv} have it (it has "
          f"{sorted(points[column].dropna().astype(str).unique())})"
        )
      points = points[points[column] == value]
  return points, None


def main(args) -> int:
  from .. import law_points, scaling

  fixed, problem = _fixed(args)
  if problem:
    return fail(args, problem)
  terms, problem = law_terms(args)
  if problem:
    return fail(args, problem)
  points, problem = _points(args)
  if problem:
    return fail(args, problem)
  failed = bad_n_boot(args)
  if failed is not None:
    return failed
  repeats = law_points.duplicated_lines(points)
  if repeats:  # two seeds may emerge at one checkpoint; a copied table is likelier
    shown = ", ".join(repeats[:5]) + (f" and {len(repeats) - 5} more" if len(repeats) > 5 else "")
    print(
      f"{args.prog}: warning: {len(repeats)} of {len(points)} rows repeat an earlier row in "
      f"every column ({shown}); each is fitted as a cell of its own: drop them if they are "
      f"copies",
      file=sys.stderr,
    )
  try:
    fit = scaling.fit_law(
      points,
      terms=terms,
      n_boot=args.n_boot,
      seed=args.seed,
      fixed=fixed,
      csv=args.csv,
    )
  except law_points.FitError as e:
    return fail(args, f"{args.csv}: {e}")
  law = fit.to_dict()
  print(json.dumps(law, indent=2))
  print(fit_summary(law), file=sys.stderr)
  if not fit.ci and args.n_boot:
    print(
      f"{args.prog}: warning: no confidence intervals ('ci' is empty): {fit.ci_note}",
      file=sys.stderr,
    )
  return 0


def fit_summary(law: dict) -> str:
  """fit-law's words on stderr: the table (``law_table``), the censored cells, why r or the
  intervals are missing."""
  boot = (
    f"95% intervals from {law['n_boot']} bootstrap resamples of "
    f"{law.get('n_grid_points', '?')} grid points"
    if law.get("n_boot")
    else "no intervals"
  )
  form = law.get("form") or "ln UPT = ln T - alpha ln B - beta ln C"
  lines = [f"law: {form} (updates); {boot}"]
  lines += ["  " + line for line in law_table(law).splitlines()]
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
  for t in law.get("lack_of_fit") or []:
    lines.append(f"lack of fit in {t['symbol']}: {t['sentence']}" if t["tested"] else t["sentence"])
  if law.get("separability"):
    lines.append(f"separability: {law['separability']['sentence']}")
  if not law.get("lack_of_fit") and not law.get("separability"):
    lines.append(f"lack of fit and separability not tested: {untested_reason(law)}")
  if law.get("held_out"):
    lines.append(f"held-out prediction: {law['held_out']['sentence']}")
  return "\n".join(lines)


def untested_reason(law: dict) -> str:
  """Why a law has no lack-of-fit or separability test: coefficients held fixed (``--fix``)
  or a term beyond B and C (their tests compare levels of B and C at fixed other values)."""
  fixed = law.get("fixed") or {}
  if fixed:
    held = ", ".join(f"{k} = {v:g}" for k, v in fixed.items())
    return (
      f"{held} held fixed (--fix): the tests compare free levels of B and C with the "
      f"fitted exponents, which a fixed exponent does not have"
    )
  return "the law has terms beyond B and C; the tests compare levels of B and C alone"
