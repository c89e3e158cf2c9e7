"""The report's law section (``law_section``): the emergence law fitted to the emergence points
(``analysis.scaling.fit_law``), written as law.json, described in words and a table, refitted
with flagged models censored, compared with the study's, and drawn (``law_figure.figure_law``)."""

from __future__ import annotations

import json
import logging
import math

import pandas as pd

from ihsweep.base.law import STUDY, term_name

from . import emergence as emergence_lib
from . import figure_axes, lack_of_fit, law_figure, law_fit, law_points, scaling
from .outputs import Outputs

log = logging.getLogger("analysis")


def law_section(doc, points, opts, outs: Outputs, written) -> None:
  """The report's "Emergence law" section: the fit (law.json), its words and table, the refit
  with flagged models censored, the comparison with the study, and the law's figure; records
  ``law``, ``law_error`` and ``law_sensitivity`` in ``written``."""
  doc.h(2, "Emergence law")
  written["law"], written["law_error"] = None, None
  try:
    fit = scaling.fit_law(
      points, n_boot=opts.n_boot, seed=opts.seed, csv=written.get("emergence_csv", "emergence.csv")
    )
  except law_points.FitError as e:
    written["law_error"] = str(e)
    doc.p(f"Not fitted, so no law.json is written: {e}")
    return
  law = fit.to_dict()
  with open(outs.claim("law.json"), "w") as f:
    json.dump(law, f, indent=2)
  written["law"] = law
  written["law_sensitivity"] = _sensitivity(points, opts)
  doc.p(
    _law_words(fit) + " `law.json` is accepted by `ihsweep predict --law=FILE`, which "
    "prints the prediction with its interval."
    + (
      " The column `flagged censored` is the law refitted with the models flagged in the "
      "emergence table's `caution` column censored at their last checkpoint (its intervals: "
      "the summary's limitations)."
      if written["law_sensitivity"] and "alpha" in written["law_sensitivity"]
      else ""
    )
  )
  doc.table(_law_table(fit, written["law_sensitivity"]))
  if fit.lack_of_fit:
    doc.p(_lack_of_fit_words(fit))
  if fit.held_out is not None:
    doc.p(_held_out_words(fit, outs))
  n_emerged = getattr(fit, "n_emerged", 0) or fit.n
  if fit.dof < law_fit.MIN_DOF_FOR_INTERVALS:
    doc.p(
      f"Warning: {n_emerged} emerged cells for {n_emerged - fit.dof} coefficients leave "
      f"{fit.dof} degree(s) of freedom: the fit passes (nearly) through the points, r says "
      f"nothing, and no intervals are given. Treat this law as a description of these "
      f"cells only."
    )
  _censored_check(doc, fit, points, outs)
  doc.p(
    "Against the study's laws on the same cells (ln-UPT residuals; a positive mean = later "
    "than the law predicts):"
  )
  doc.table(scaling.compare(fit))
  _terms_refit(doc, points, opts)
  fit.residuals.to_csv(outs.claim("residuals.csv"), index=False)
  doc.p("Residuals per cell (`residuals.csv`):")
  doc.table(fit.residuals)
  _law_figure(doc, fit, points, outs, written)


def _lack_of_fit_words(fit) -> str:
  """Both axes' lack-of-fit tests in words (``analysis.lack_of_fit``): flagged, not rejected,
  or why not tested."""
  said = [t.sentence() for t in fit.lack_of_fit]
  text = (
    "Does the power law describe the grid along each axis? A free level per value of C (or B) "
    "against the law, by an F test whose unit is the grid point (its seeds averaged: they share "
    f"the point's deviation); p < {lack_of_fit.FLAG_P:g} rejects the law, p < "
    f"{lack_of_fit.SOME_P:g} is some evidence against it: "
    + "; ".join(t[0].upper() + t[1:] if i == 0 else t for i, t in enumerate(said))
    + "."
  )
  if fit.separability is not None:
    sep = fit.separability.sentence()
    text += (
      " Is the law separable (one exponent in B at every C)? The law against the law with an "
      f"added ln B · ln C term, on the same grid points: {sep[0].upper() + sep[1:]}."
    )
  return text


def _held_out_words(fit, outs: Outputs) -> str:
  """The held-out check in words (``analysis.held_out``), its cells written to held_out.csv."""
  h = fit.held_out
  if h.cells is not None:
    h.cells.to_csv(outs.claim("held_out.csv"), index=False)
  text = h.sentence()
  return (
    "How well does the law predict a grid point it has not seen? "
    + text[0].upper()
    + text[1:]
    + (" (`held_out.csv`)." if h.cells is not None else ".")
  )


def _censored_check(doc, fit, points, outs: Outputs) -> None:
  """Censored cells against the law (censored_check.csv): how many had not emerged by a
  checkpoint past the law's median prediction, and how many contradict it at the check's
  level."""
  check = scaling.censored_check(fit, points)
  if len(check):
    check.to_csv(outs.claim("censored_check.csv"), index=False)
    past = int(check["before_median"].sum()) if "before_median" in check else 0
    bad = int(check["contradicts"].sum()) if "contradicts" in check else 0
    text = (
      f"Censored cells against the law (`censored_check.csv`): {past} of {len(check)} had not "
      f"emerged by a checkpoint past the law's median prediction"
    )
    if "p_not_emerged" in check:
      text += (
        f"; {bad} contradict it (the fit gives it a probability below "
        f"{scaling.CHECK_P:g}/{len(check)} of not having emerged by then: at most a "
        f"{scaling.CHECK_P:.0%} chance that a grid where the law holds shows any)"
        + (
          " — evidence that the law predicts too early there, or cells that never emerge."
          if bad
          else "; with scatter σ some cells past the median are expected."
        )
      )
    else:
      text += " (the fit has no scatter: each of them contradicts the law)." if past else "."
    doc.p(text)
    doc.table(check)


def _terms_refit(doc, points, opts) -> None:
  """The law refitted with + γ ln x for each column x of ``opts.terms`` (``--terms``), or, with
  several model sizes (or ``opts.with_params``), for n_params: each γ with its interval."""
  sizes = points["n_params"].nunique() if "n_params" in points else 0
  terms = tuple(opts.terms) or (("n_params",) if opts.with_params or sizes > 1 else ())
  if not terms:
    return
  try:
    tfit = scaling.fit_law(points, terms=terms, n_boot=opts.n_boot, seed=opts.seed)
  except law_points.FitError as e:
    doc.p(f"The law with terms in {', '.join(terms)} not fitted: {e}")
    return
  said = []
  for t in terms:
    lo, hi = tfit.ci.get(term_name(t), [None, None])
    ci = f" (95% CI {lo:.3f} … {hi:.3f})" if lo is not None else ""
    said.append(f"γ[{t}] = {tfit.gammas[t]:.3f}{ci}")
  doc.p(
    f"With + γ ln x for {', '.join(terms)}: {'; '.join(said)}."
    + (
      " The study finds UPT independent of model size (γ[n_params] = 0)."
      if "n_params" in terms
      else ""
    )
  )


def _law_figure(doc, fit, points, outs: Outputs, written) -> None:
  """The law's figure (``law_figure.figure_law``), its paths added to ``written["figures"]``."""
  fig = law_figure.figure_law(fit, points)
  band = getattr(fig, "band_source", None)
  paths = figure_axes.save(fig, outs.figure("law"))
  written["figures"] += paths
  doc.figure(
    paths[0],
    "Observed vs predicted updates to the transition (fitted and study laws), "
    "and updates vs batch size, one panel per context size, with the fitted law"
    + (f" and its {band}" if band else "")
    + "; censored cells as open "
    "triangles at their last checkpoint (emergence later than that)"
    + (
      "; dashed: the law moved to each C's own cells (the mean ln residual there), since the "
      "lack-of-fit test finds that the power law in C does not describe the grid"
      if any(t.lacks_fit and t.symbol == "C" for t in fit.lack_of_fit)
      else ""
    )
    + ".",
  )


def _is_censored_fit(fit) -> bool:
  return getattr(fit, "method", None) == getattr(scaling, "MLE", object())


def _law_words(fit) -> str:
  """How the law was fitted, for the law section (both the censored fit of analysis.scaling and
  a fit without ``method``: least squares on the emerged cells)."""
  n_cens = fit.n_censored
  if _is_censored_fit(fit):
    text = (
      f"ln UPT = ln T − α ln B − β ln C, fitted by maximum likelihood to "
      f"{fit.n_emerged} emerged and {n_cens} censored cell{'' if n_cens == 1 else 's'} "
      f"(log-normal scatter; a "
      f"censored cell enters by the probability that it emerges after its last "
      f"checkpoint); σ = {fit.sigma:.3f} is the scatter of ln UPT about the law."
    )
    if fit.n_boot:
      grid = getattr(fit, "n_grid_points", 0)
      text += (
        f" 95% intervals from {fit.n_boot} bootstrap resamples of the "
        f"{grid or ''} grid points (all seeds of a point together)."
      ).replace("  ", " ")
    if getattr(fit, "emerged_only", None) is not None:
      text += (
        " The column `emerged_only` is least squares on the emerged cells alone (the "
        "fit used before censored cells entered)"
        + (
          f"; it leaves the censored cell{'' if n_cens == 1 else 's'} ({n_cens}) out and is "
          f"biased towards early emergence where censored cells cluster."
          if n_cens
          else "; with no censored cell both fits estimate the same law."
        )
      )
    return text
  text = (
    f"ln UPT = ln T − α ln B − β ln C, least squares on {fit.n} emerged cells "
    f"({n_cens} censored, excluded); 95% intervals from {fit.n_boot} bootstrap resamples."
  )
  if n_cens:
    text += (
      f" Caution: leaving the {n_cens} censored cells out biases the law towards early "
      f"emergence where they cluster."
    )
  return text


def _by_name(law: dict | None) -> dict | None:
  """A ``LawFit.to_dict()`` with each term's γ also under its coefficient's name, gamma[X]."""
  if not law:
    return law
  return {**law, **{term_name(t): g for t, g in (law.get("gammas") or {}).items()}}


def _law_table(fit, sensitivity: dict | None = None) -> pd.DataFrame:
  """Coefficients with 95% intervals, the emerged-only fit beside them where there is one, the
  law refitted with the flagged models censored (``sensitivity``, ``_sensitivity``) where there
  is one, the study's published values (its r on its own cells), and the study's law's r on
  these cells."""
  law, ci = _by_name(fit.to_dict()), fit.ci
  eo = _by_name(law.get("emerged_only") or None)
  flagged = sensitivity if sensitivity and "alpha" in sensitivity else None
  names = ["log_T", "T", "alpha", "beta", *map(term_name, fit.terms)]
  if "sigma" in law:
    names.append("sigma")
  rows = []
  for k in names:
    row = {
      "coefficient": k,
      "estimate": law.get(k, math.nan),
      "ci_low": ci.get(k, [math.nan] * 2)[0],
      "ci_high": ci.get(k, [math.nan] * 2)[1],
    }
    if eo is not None:
      row["emerged_only"] = eo.get(k, math.nan)
    if flagged is not None:
      row["flagged censored"] = flagged.get(k, math.nan)
    row["study (published)"] = math.exp(STUDY["log_T"]) if k == "T" else STUDY.get(k, math.nan)
    if any(lack_of_fit.caution(law, n) for n in ("alpha", "beta")):
      row["lack of fit"] = lack_of_fit.caution(law, k).strip(" ()")
    rows.append(row)
  r = law.get("r")
  row = {
    "coefficient": "r",
    "estimate": math.nan if r is None else r,
    "ci_low": math.nan,
    "ci_high": math.nan,
  }
  if eo is not None:
    row["emerged_only"] = math.nan if eo.get("r") is None else eo["r"]
  if flagged is not None:
    row["flagged censored"] = math.nan if flagged.get("r") is None else flagged["r"]
  row["study (published)"] = STUDY["r"]  # on the study's own cells
  rows.append(row)
  if law.get("study_r") is not None:  # the study's law on these cells
    rows.append(
      {
        "coefficient": "r of the study's law on these cells",
        "estimate": law["study_r"],
        "ci_low": math.nan,
        "ci_high": math.nan,
      }
    )
  return pd.DataFrame(rows)


def _sensitivity(points: pd.DataFrame, opts) -> dict | None:
  """The law refitted with the flagged models censored at their last checkpoint (``last_step``,
  their cap or end of training): ``LawFit.to_dict()``, ``{"error": why}`` when it cannot be
  fitted, None when no model is flagged."""
  flagged = emergence_lib.flagged(points)
  if flagged.empty:
    return None
  try:
    moved = law_points.censor(points, points.index.isin(flagged.index), at="last_step")
    return scaling.fit_law(moved, n_boot=opts.n_boot, seed=opts.seed).to_dict()
  except law_points.FitError as e:
    return {"error": str(e)}
