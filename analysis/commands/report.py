"""``python -m analysis report DIR [DIR ...]`` (``ihsweep report``): curves, emergence points,
the law, figures and report.md/.html from run directories (``analysis.report.report``)."""

from __future__ import annotations

import argparse
import os
import sys

from .. import outputs
from .common import add, bad_n_boot, fail, law_table, law_terms

NAME = "report"
HELP = "curves, emergence points, law, figures and report.md/.html"
DESCRIPTION = (
  "Recompute metrics from every checkpoint (cached), find emergence points, fit the law, draw "
  "figures, write report.md/.html, emergence.csv and law.json into OUT (default: the first "
  "DIR/analysis)."
)
USES_DEVICES = True  # one CPU device per core, as in training


def _count(text: str) -> int | None:
  """A positive integer, or None for 'all' (an argparse type)."""
  if text == "all":
    return None
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: a positive integer or 'all'")
  return value


def add_arguments(r: argparse.ArgumentParser) -> None:
  from .. import curves, emergence

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
  r.add_argument(
    "--nocache", dest="no_cache", action="store_true", help="recompute every checkpoint"
  )
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
  add(r, "--n_boot", "--terms", "--with_params")
  r.add_argument("--noprogress", dest="no_progress", action="store_true", help="no progress bar")


def main(args) -> int:
  try:
    return _report(args)
  except KeyboardInterrupt:
    print(f"{args.prog}: interrupted; the cache keeps every group finished so far", file=sys.stderr)
    return 130


def missing_sweep_config(dirs) -> str | None:
  """Why a sweep directory (cells.csv, groups/) cannot be reported: its top-level config.json (the
  report's setup, data and probes) is gone or unreadable; checked before any work."""
  from ihsweep.runs import rundir

  for d in dirs:
    path = os.path.join(os.path.abspath(d), "config.json")
    sweep = [os.path.join(os.path.abspath(d), f) for f in ("cells.csv", "groups")]
    if not (os.path.exists(sweep[0]) and os.path.isdir(sweep[1])):
      continue
    try:
      rundir.read_config_json(path)
    except (OSError, ValueError) as e:
      why = "is missing" if isinstance(e, FileNotFoundError) else f"cannot be read ({e})"
      return (
        f"{path} {why}: the sweep's config, which `ihsweep run` writes and the report needs "
        f"(its setup, data and probes); restore it from a copy of the run directory"
      )
  return None


def _report(args) -> int:
  from ihsweep.runs.reader import NotARun

  from .. import report

  failed = bad_n_boot(args)
  if failed is not None:
    return failed
  problem = missing_sweep_config(args.dirs)
  if problem:
    return fail(args, problem)
  if not 0 < args.fraction < 1:
    return fail(args, f"--fraction {args.fraction}: must be in (0, 1)")
  terms, problem = law_terms(args)
  if problem:
    return fail(args, problem)
  opts = report.Options(
    metric=args.metric,
    method=args.method,
    fraction=args.fraction,
    source=args.source,
    cache=not args.no_cache,
    n_boot=args.n_boot,
    n_probes=args.probes,
    n_sequences=args.sequences,
    terms=terms,
    progress=not args.no_progress,
  )
  try:
    written = report.report(args.dirs, args.out, opts)
  except (NotARun, outputs.OutputError) as e:
    return fail(args, str(e))
  law = written.get("law")
  print(f"report: {written['report_md']} (and report.html)")
  if "n_cells" in written:
    print(
      f"emergence: {written['n_emerged']} of {written['n_cells']} cells emerged "
      f"({args.metric}, {args.method}); table {written['emergence_csv']}"
    )
  if written.get("cautions"):
    refit = written.get("law_sensitivity") or {}
    print(caution_lines(written["cautions"], refitted=bool(law) and "alpha" in refit))
  if law:
    print(law_lines(law, written["out_dir"], written.get("law_sensitivity")))
  elif written.get("law_error"):
    print(f"law: not fitted ({written['law_error']})")
  if written.get("warnings"):
    print(f"{len(written['warnings'])} warning(s); see the report")
  if written.get("no_models"):  # a report of no models is not a result: say why, exit 1
    why = written.get("warnings") or ["no group has params checkpoints or online metrics yet"]
    more = f" (and {len(why) - 1} more warning(s) in the report)" if len(why) > 1 else ""
    print(f"{args.prog}: no model could be read: {why[0]}{more}", file=sys.stderr)
    return 1
  return 0


def caution_lines(cautions: list[dict], refitted: bool = False) -> str:
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


def law_lines(law: dict, out_dir: str, sensitivity: dict | None = None) -> str:
  """The fitted law (with 95% intervals where there are any) beside the study's, and refitted
  with the flagged cells censored when ``sensitivity`` is given (``law_table``)."""
  lines = law_table(law, sensitivity).splitlines()
  text = (
    f"law: UPT = T / (B^alpha C^beta), updates; 95% bootstrap intervals -> "
    f"{out_dir}/law.json\n" + "\n".join("  " + line for line in lines)
  )
  if sensitivity and sensitivity.get("error"):
    text += f"\n  with the flagged cells censored the law cannot be fitted: {sensitivity['error']}"
  return text
