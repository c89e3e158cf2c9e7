"""What the analysis commands share: the flags both take, each defined once
(``ARGUMENTS``, added by ``add``), the one-line failure (``fail``) and the table of fitted
laws beside the study's (``law_table``)."""

from __future__ import annotations

import argparse
import sys

# Flags of more than one command: argparse keyword arguments, help included.
ARGUMENTS = {
  "--n_boot": dict(type=int, default=2000, help="bootstrap resamples (default 2000)"),
  "--with_params": dict(
    action="store_true",
    help="also fit + gamma[n_params] ln n_params (model-size dependence): --terms=n_params",
  ),
  "--terms": dict(
    action="append",
    metavar="COLUMN[,COLUMN...]",
    help="also fit + gamma[X] ln X for each column X of the emergence points (positive "
    "numbers that vary among the emerged cells), e.g. --terms=data.frequency,data.reliability",
  ),
}
# The spellings these commands had before they took the other ihsweep commands' (absl's:
# underscores, --noX): still accepted, with a one-line notice (``modern_spellings``).
OLD_SPELLINGS = {
  "--n-boot": "--n_boot",
  "--with-params": "--with_params",
  "--no-cache": "--nocache",
  "--no-progress": "--noprogress",
}


def add(parser: argparse.ArgumentParser, *names: str) -> None:
  """Adds the shared flags ``names`` (``ARGUMENTS``) to ``parser``."""
  for name in names:
    parser.add_argument(name, **ARGUMENTS[name])


def modern_spellings(argv: list[str], prog: str) -> list[str]:
  """``argv`` with each old spelling (``OLD_SPELLINGS``: ``--n-boot 200``, ``--no-progress``)
  replaced by the one every ihsweep command uses (``--n_boot 200``, ``--noprogress``), saying
  so once per flag on stderr; anything after ``--`` is left alone."""
  out, said = [], set()
  for i, arg in enumerate(argv):
    if arg == "--":
      return out + argv[i:]
    name, eq, value = arg.partition("=")
    if name in OLD_SPELLINGS:
      new = OLD_SPELLINGS[name]
      if name not in said:
        print(f"{prog}: {name} is now spelled {new}, as in every ihsweep command (the old "
              f"spelling still works for now)", file=sys.stderr)  # fmt: skip
        said.add(name)
      arg = new + eq + value
    out.append(arg)
  return out


def fail(args, message: str) -> int:
  """``PROG: message`` on stderr (``args.prog``: the command as typed); exit code 2."""
  print(f"{args.prog}: {message}", file=sys.stderr)
  return 2


def law_terms(args) -> tuple[tuple, str | None]:
  """``(the law's terms beyond B and C from --terms and --with_params, None)``, or ``((), why
  they are refused)``: --with_params beside other terms, or a term that is B or C, says when a
  cell emerged, has no name or is given twice (``law_points.law_terms``)."""
  from .. import law_points

  text = ",".join(args.terms or [])  # --terms may be given more than once: all of them
  given = () if args.terms is None else tuple(c.strip() for c in text.split(","))
  try:
    return law_points.law_terms(given, args.with_params), None
  except law_points.FitError as e:
    return (), f"--terms={text}" + (" --with_params" if args.with_params else "") + f": {e}"


def bad_n_boot(args) -> int | None:
  """Exit code 2 after one line for a negative --n_boot or --seed; None if they are fine."""
  if args.n_boot < 0:
    return fail(args, f"--n_boot {args.n_boot}: must be >= 0")
  if getattr(args, "seed", 0) < 0:
    return fail(args, f"--seed {args.seed}: must be >= 0 (numpy's generator seeds)")
  return None


def law_table(law: dict, sensitivity: dict | None = None, tablefmt: str = "plain") -> str:
  """The fitted law(s) beside the study's, one row each: the main fit ("fitted", or "censored
  MLE" when the law has an ``emerged_only`` fit, which gets the next row), the law refitted with
  the flagged cells censored ("flagged censored", ``sensitivity``: its ``to_dict()``, when
  given and fitted), the study; columns ln T, alpha, beta (95% intervals where there are any),
  sigma (where the law has it), r ("-" where withheld), cells. ``tablefmt``: tabulate's
  ('github': Markdown)."""
  from tabulate import tabulate

  headers, rows = law_rows(law, sensitivity)
  return tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True)


def law_rows(law: dict, sensitivity: dict | None = None) -> tuple[tuple, list[tuple]]:
  """``law_table``'s ``(headers, rows)`` of text; a law with terms beyond B and C (``terms``,
  ``gammas``) gets a column ``gamma[X]`` per term."""
  from ihsweep.base.law import STUDY, term_column, term_name

  from ..lack_of_fit import caution
  from ..law_fit import MLE

  with_sigma = "sigma" in law
  gammas = [term_name(t) for t in law.get("terms") or []]

  def row(label, fit, cells):
    ci = fit.get("ci") or {}

    def value(name):
      column = term_column(name)
      v = (fit.get("gammas") or {}).get(column) if column else fit[name]
      if v is None:  # a fit without that term
        return ""
      text = f"{v:.2f}"
      if name in (fit.get("fixed") or {}):
        return text + " (fixed)"
      text += f" [{ci[name][0]:.2f}, {ci[name][1]:.2f}]" if name in ci else ""
      return text + caution(law, name)

    r = "-" if fit.get("r") is None else f"{fit['r']:.2f}"
    return (
      (label, value("log_T"), value("alpha"), value("beta"), *map(value, gammas))
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
    + ("",) * len(gammas)
    + (("",) if with_sigma else ())
    + (study_r, f"(published r {STUDY['r']:.2f} on the study's cells)")
  )
  headers = (
    ("", "ln T", "alpha (B)", "beta (C)", *gammas)
    + (("sigma",) if with_sigma else ())
    + ("r", "cells")
  )
  return headers, rows
