"""The emergence law fitted to emergence points: ln UPT = ln T − α ln B − β ln C.

UPT (updates to the phase transition) is a cell's emergence step in updates, B its batch size
(sequences per update), C its context size (tokens per sequence); logs are natural, so ``log_T``
compares directly with the study's ln T = 13.26 (Aoyama, Wilcox & Schneider 2025, arXiv
2511.16893 v2, experiment 1: α = 0.37, β = 0.62, r = 0.98; summarised in docs/study.md).
Optional terms + γ_k ln x_k for other columns of the cells (``terms``; coefficients named
``gamma[x_k]``): the model-size term + γ[n_params] ln n_params tests the study's finding that
UPT does not depend on model size (γ ≈ 0); data.frequency or train.lr say how much a data or
training property moves the transition.

Two fits of the law on the same cells:

* **censored log-normal MLE** (the main fit, ``method`` = ``MLE``): ln UPT_i = x_i·θ + σ ε_i with
  ε_i ~ N(0, 1) independent — the log-normal accelerated-failure-time model (Kalbfleisch &
  Prentice, *The Statistical Analysis of Failure Time Data*, 2nd ed. 2002, §2.2), i.e. a
  right-censored normal regression on ln UPT (Tobin 1958). An emerged cell contributes the
  density of its ln UPT; a censored cell (not emerged by its last checkpoint, ``censor_step``)
  contributes its survival term P(UPT > censor_step) = Φ((x_i·θ − ln censor_step) / σ). It is
  maximised by Newton's method in Olsen's parameters δ = θ/σ, τ = 1/σ, in which the
  log-likelihood is globally concave (Olsen 1978, Econometrica 46:1211), so Newton with
  step-halving converges from any start (here: the least-squares fit). σ is the cell-to-cell
  scatter of ln UPT about the law (ML estimate: divides by n, not n − k).
* **emerged-only least squares** (``emerged_only``, ``method`` = ``LSQ``): ordinary least
  squares on the emerged cells, censored cells excluded (and counted). Where censoring depends on
  B and C — a budget reached first at small B and C — it is biased: the cells that emerge in the
  slow corner are its fast ones, so UPT there is underestimated and α, β (and ln T) shrink
  towards 0. Kept for comparison with earlier fits.

``r`` is Pearson's correlation between predicted and observed ln UPT over the **emerged** cells
(a censored cell has no observed UPT), reported only with at least ``MIN_DOF_FOR_INTERVALS``
residual degrees of freedom (``dof`` = emerged cells − free coefficients); below that the fit
passes (nearly) through its points and r says nothing.

Uncertainty: a percentile bootstrap over grid points with a small-sample factor (``fit_law``
says why not over cells, and what coverage it measured).
Predictions carry an interval from the bootstrap covariance of the coefficients
(``LawFit.predict_interval``, the same formula as ``ihsweep predict``: ``ihsweep.base.law``).

The fitted law is a ``law_fit.LawFit`` (with ``law_fit.MLE``, ``law_fit.LSQ`` and the study's
``ihsweep.base.law.STUDY``); the points come from ``law_points`` (``read_points``, ``FitError``).

The comparison table (``compare``) scores, on the emerged cells: the fitted law, the study's law
as published, and version 1's form N_PT = T·sqrt(B·C) tokens (i.e. α = β = 0.5) both with T
fitted and with v1's T = 10^5.7.
"""

from __future__ import annotations

import dataclasses
import math
import shlex

import numpy as np
import pandas as pd
from scipy import stats

from ihsweep.base.law import STUDY, term_column, term_name

from . import held_out as held_out_lib
from . import lack_of_fit
from .censored_fit import (
  cluster_bootstrap,
  fit_mle,
  fit_ols,
  identifiable,
  percentile_intervals,
  small_sample_factor,
)
from .law_fit import LSQ, MIN_DOF_FOR_INTERVALS, MLE, V1_LOG10_T_TOKENS, LawFit, score
from .law_points import FitError, as_bool, clean_points, law_terms

# Fewer bootstrap resamples than this give no intervals: a 2.5% percentile needs 1 of 40.
MIN_BOOT = 40

# The censored-cell check's family-wise level: a grid where the law holds marks any of its
# censored cells as contradicting it with probability at most this (censored_check).
CHECK_P = 0.01


def _design(pts: pd.DataFrame, names: list[str]) -> np.ndarray:
  cols = {
    "log_T": np.ones(len(pts)),
    "alpha": -np.log(pts["batch_size"].to_numpy(float)),
    "beta": -np.log(pts["context_size"].to_numpy(float)),
  }
  for name in names:  # a term's coefficient gamma[X]: its column is ln X
    if term_column(name):
      cols[name] = np.log(pts[term_column(name)].to_numpy(float))
  return np.stack([cols[n] for n in names], axis=1)


def _fix_hint(
  x_all: np.ndarray,
  all_names: list[str],
  fixed: dict,
  emerged_pts: pd.DataFrame,
  n_censored: int,
  csv: str,
) -> str:
  """A ``--fix`` suggestion for an unidentifiable fit, only where the fit with it succeeds
  (``x_all``: the emerged cells' full design; ``csv``: the points' file, for the command)."""
  varied = {c: int(emerged_pts[c].nunique()) for c in ("batch_size", "context_size")}
  options = []
  if varied["batch_size"] > 1 and varied["context_size"] <= 1:
    options = [("only B varies: hold beta fixed", {"beta": STUDY["beta"]})]
  elif varied["context_size"] > 1 and varied["batch_size"] <= 1:
    options = [("only C varies: hold alpha fixed", {"alpha": STUDY["alpha"]})]
  elif varied["context_size"] <= 1 and varied["batch_size"] <= 1:
    options = [
      ("neither B nor C varies: hold both fixed", {"alpha": STUDY["alpha"], "beta": STUDY["beta"]})
    ]
  for words, extra in options:
    extra = {k: v for k, v in extra.items() if k not in fixed}
    free = [i for i, n in enumerate(all_names) if n not in fixed and n not in extra]
    if extra and free and identifiable(x_all[:, free], np.ones((1, len(x_all))))[0]:
      flags = " ".join(f"--fix {k}={v:g}" for k, v in extra.items())
      return f" ({words}, e.g. `python -m analysis fit-law --csv {shlex.quote(csv)} {flags}`)"
  if n_censored:
    return f" (train the {n_censored} censored cell(s) longer, or add grid points)"
  return " (add grid points or seeds)"


def _r(pred: np.ndarray, y: np.ndarray, dof: int) -> tuple[float, str | None]:
  if dof < MIN_DOF_FOR_INTERVALS:
    return math.nan, (
      f"not reported: {dof} residual degree(s) of freedom (fewer than "
      f"{MIN_DOF_FOR_INTERVALS}); the fit passes (nearly) through its points"
    )
  if not (np.std(pred) > 0 and np.std(y) > 0):
    return math.nan, "not defined: the predicted or observed ln UPT does not vary"
  return float(np.corrcoef(pred, y)[0, 1]), None


def _range(pts: pd.DataFrame, terms: tuple) -> dict:
  def num(v):
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else float(v)

  cols = ("batch_size", "context_size", *terms)
  return {c: [num(pts[c].min()), num(pts[c].max())] for c in cols}


def fit_law(
  points: pd.DataFrame,
  *,
  terms: tuple = (),
  with_params: bool = False,
  n_boot: int = 2000,
  seed: int = 0,
  fixed: dict | None = None,
  csv: str = "emergence.csv",
  shape_tests: bool = True,
  held_out: bool = True,
  _censored: np.ndarray | None = None,
) -> LawFit:
  """The emergence law (module docstring) fitted to emergence points: the censored log-normal
  MLE, with the emerged-only least-squares fit under ``emerged_only``.

  Intervals: 95% percentile intervals from a bootstrap over **grid points**: each resample
  draws the G distinct (B, C, term values) points with replacement — every cell of a point (all
  its seeds, emerged and censored) together — and refits both fits on it (a point drawn k times
  weighs k). Why not over cells: (1) the seeds of one point share whatever makes that point
  deviate from a power law, and its checkpoints and budget, hence its censoring; they are not
  independent replicates of the law, and resampling cells would count two seeds as two points
  and narrow the intervals; (2) seeds are paired across points (seed s runs at every point),
  so a seed-level effect (a fast initialisation or data order) shifts every point alike and
  cancels from α and β on a balanced grid — resampling whole points keeps every resample
  balanced over seeds, resampling cells does not and lets seed effects into the slopes. Limits:
  a seed-level shift of ln T for the whole grid is not resampled (with 2–3 seeds no bootstrap
  can), so ln T's interval leaves it out; with few points (a 3 × 3 grid: 9 clusters) cluster
  percentile intervals run narrow (Cameron, Gelbach & Miller 2008, Rev. Econ. Stat. 90:414).
  Resamples whose emerged cells cannot identify the free coefficients (no more distinct cells
  than coefficients, or a rank-deficient design, e.g. one batch size) are redrawn, as are the
  rare ones in which the MLE does not converge. Small-sample factor: each percentile end is
  moved away from the estimate by c = sqrt(G/(G − 1))·t(G − 1)/z (``small_sample_factor``;
  1.05 for 36 points, 1.25 for 9; the intervals' measured coverage: docs/benchmarks.md,
  "Interval coverage of the law fit"). ``cov`` is
  the covariance of the bootstrap coefficients times G/(G − 1), read with t(G − 1) quantiles
  (prediction intervals).
  σ's interval is not a percentile interval but the basic bootstrap interval on ln σ, which
  contains σ̂ (the resampled σ runs below σ̂: ``censored_fit.percentile_intervals``).

  Args:
    points: one row per cell with ``batch_size``, ``context_size``, ``emergence_step``
      (updates; empty/NaN = censored) and each column of ``terms``; an optional
      ``censored`` column (true/false) also marks censored rows. Censored rows need
      ``censor_step`` (updates: the last checkpoint at which the cell had not emerged, as in
      an analysis emergence.csv). Other columns (``run``, ``cell``, ``seed``) are carried
      into ``residuals``.
    terms: columns x_k of ``points`` (positive numbers, e.g. ``n_params``,
      ``data.frequency``, ``train.lr``) whose terms + γ_k ln x_k the law adds beyond B and C;
      their coefficients are named ``gamma[x_k]`` (``names``, ``ci``, ``cov``, ``fixed``).
    with_params: the model-size term alone: the same as ``terms=("n_params",)``.
    n_boot: bootstrap resamples (0: no intervals; none either with fewer than
      ``MIN_DOF_FOR_INTERVALS`` residual degrees of freedom, or fewer grid points with emerged
      cells than free coefficients + ``MIN_DOF_FOR_INTERVALS``).
    seed: the bootstrap's random seed.
    fixed: coefficients held at given values instead of fitted, e.g. ``{"alpha": 0.37}`` when
      only C was varied (both fits).
    csv: the file ``points`` came from, named in the ``--fix`` command an unidentifiable fit's
      error suggests.
    shape_tests: run the lack-of-fit tests of each axis and the separability test
      (``lack_of_fit``; not with ``fixed`` or ``terms``).
    held_out: leave each grid point out in turn and predict it from the law refitted on the
      others (``held_out``: ``LawFit.held_out``).

  Returns:
    A ``LawFit`` with ``method`` = ``MLE`` and ``emerged_only`` = the ``LSQ`` fit.

  Raises:
    FitError: missing columns, non-positive values, a censored row without a positive
      ``censor_step`` (naming its line); a term that is B, C or an outcome column, given
      twice, not numeric, or that does not vary among the emerged cells (``clean_points``);
      ``with_params`` beside other terms; too few emerged cells or distinct (B, C, term)
      values among them to identify the free coefficients (with a ``--fix`` suggestion where
      that fit would succeed), or an MLE that does not converge (emerged cells exactly on a law).
  """
  fixed = dict(fixed or {})
  terms = law_terms(terms, with_params)
  all_names = ["log_T", "alpha", "beta", *map(term_name, terms)]
  _check_fixed(fixed, all_names)
  if _censored is None:
    pts, censored = clean_points(points, terms)
  else:  # a refit on cells this module cleaned already (held out): their censored mask
    pts, censored = points, _censored
  emerged = ~censored
  n_em, n_cens = int(emerged.sum()), int(censored.sum())
  names = [n for n in all_names if n not in fixed]
  free = [all_names.index(n) for n in names]
  k = len(names)
  full = _design(pts, all_names)
  offset = full @ np.array([fixed.get(n, 0.0) for n in all_names])
  x = full[:, free]
  y = _ln_times(pts, censored)
  v = y - offset
  if not identifiable(x[emerged], np.ones((1, n_em)))[0]:
    n_b, n_c = (int(pts.loc[emerged, c].nunique()) for c in ("batch_size", "context_size"))
    varied = f"{n_b} batch size(s) and {n_c} context size(s)"
    raise FitError(
      f"{n_em} emerged cell(s) ({n_cens} censored) with {varied} among them cannot "
      f"identify {', '.join(names)}: need more emerged cells than coefficients and at least "
      f"two values of each varied quantity"
      + _fix_hint(full[emerged], all_names, fixed, pts[emerged], n_cens, csv)
    )
  dof = n_em - k
  coef_ls, s_ls, a, p = _least_squares_then_mle(x, v, emerged, n_cens, dof)
  exact = p is None  # the emerged cells lie exactly on a law: σ = 0, the MLE is least squares
  coef_ml, s_ml = (coef_ls, s_ls * math.sqrt(dof / n_em)) if exact else (p[:-1] / p[-1], 1 / p[-1])

  cluster = pd.MultiIndex.from_frame(pts[["batch_size", "context_size", *terms]]).factorize()[0]
  n_groups = int(cluster.max()) + 1
  em_points = len(np.unique(cluster[emerged]))
  boot, ci_note = None, _no_interval_note(n_boot, dof, em_points, k)
  if ci_note is None and exact:
    ci_note = "the emerged cells lie exactly on a law (sigma = 0): no scatter to resample"
  if ci_note is None:
    boot = cluster_bootstrap(cluster, x, v, emerged, a, p, n_boot, seed)
    if not len(boot.ml):
      ci_note = f"none of {20 * n_boot} resamples of grid points gave a fit ({boot.note(n_boot)})"
      boot = None
  problem = _Problem(
    pts=pts,
    full=full,
    all_names=all_names,
    names=names,
    free=free,
    fixed=fixed,
    emerged=emerged,
    y=y,
    dof=dof,
    terms=terms,
    n_groups=n_groups,
    factor=small_sample_factor(n_groups) if n_groups > 1 else math.nan,
    ci_note=ci_note,
    boot_note=boot.note(n_boot) if boot is not None else None,
  )
  no = (None, None, None, None)
  ml_draws, ml_sig, ls_draws, ls_sig = (
    (boot.ml, boot.ml_sigma, boot.ls, boot.ls_sigma) if boot is not None else no
  )
  emerged_only = _law_fit(problem, coef_ls, s_ls, ls_draws, ls_sig, LSQ, n_em, emerged)
  all_cells = np.ones(len(pts), bool)
  fit = _law_fit(problem, coef_ml, s_ml, ml_draws, ml_sig, MLE, len(pts), all_cells)
  fit.emerged_only = emerged_only
  if shape_tests and not fixed and not terms:
    fit.lack_of_fit = lack_of_fit.axis_tests(pts, censored, y)
    fit.separability = lack_of_fit.separability_test(pts, censored, y)
  if held_out:
    fit.held_out = _held_out(pts, censored, y, cluster, terms, fixed)
  return fit


def held_out_by(
  points: pd.DataFrame, by: list[str], *, terms=(), fixed: dict | None = None
) -> held_out_lib.HeldOut:
  """The held-out check (``analysis.held_out``) with the grid point defined by the columns
  ``by`` instead of the law's own coordinates (B, C and its terms): e.g. ``by`` =
  ["data.frequency", "data.reliability"] scores laws of different forms (no term, one term,
  both) on the same folds, the experiment's grid points.

  Raises:
    FitError: as ``fit_law``; or a column of ``by`` missing.
  """
  missing = [c for c in by if c not in points]
  if missing:
    raise FitError(f"held out by {', '.join(missing)}: no such column(s)")
  pts, censored = clean_points(points, law_terms(terms, False))
  y = _ln_times(pts, censored)
  cluster = pd.MultiIndex.from_frame(pts[list(by)]).factorize()[0]
  return _held_out(pts, censored, y, cluster, law_terms(terms, False), dict(fixed or {}))


def _ln_times(pts: pd.DataFrame, censored: np.ndarray) -> np.ndarray:
  """ln UPT of each emerged cell, ln censor_step of each censored one (float64, len(pts))."""
  bound = pts.get("censor_step", pd.Series(np.nan, pts.index)).to_numpy(float)
  return np.log(np.where(censored, bound, pts["emergence_step"].to_numpy(float)))


def _held_out(pts, censored, y, cluster, terms, fixed) -> held_out_lib.HeldOut:
  """Each grid point of ``cluster`` left out, the law (``terms``, ``fixed``) refitted on the
  others by ``fit_law`` and the point predicted (``held_out.evaluate``)."""

  def refit(keep):
    try:
      law = fit_law(
        pts[keep], terms=terms, n_boot=0, fixed=fixed, shape_tests=False, held_out=False,
        _censored=censored[keep],
      )  # fmt: skip
    except FitError:
      return "the other points do not identify the law without it"
    if not law.sigma > 1e-8:  # an exact fit keeps rounding's ~1e-14
      return "the other points lie exactly on a law (sigma = 0): no scale for an interval"
    return law

  return held_out_lib.evaluate(pts, censored, y, cluster, refit, _cell_interval)


def _cell_interval(law: LawFit, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
  """``(ln median UPT, prediction scale, t dof)`` of one new cell at each of ``rows`` under
  ``law`` (``_prediction_scale``), for the held-out check."""
  at = _law_args(rows, law)
  return np.log(law.predict_updates(*at)), *_prediction_scale(law, at)


def _law_args(rows: pd.DataFrame, law: LawFit) -> tuple:
  """``(B, C, {term column: values})`` of ``rows`` as ``law``'s predictions take them."""
  return (
    rows["batch_size"].to_numpy(float),
    rows["context_size"].to_numpy(float),
    {t: rows[t].to_numpy(float) for t in law.terms},
  )


def _least_squares_then_mle(x, v, emerged, n_cens: int, dof: int) -> tuple:
  """``(LSQ coefficients, LSQ scale, rows a, MLE p)``: least squares on the emerged cells, and
  from it the censored MLE in Olsen's parameters (``fit_mle``). Where the emerged cells lie
  exactly on a law (scatter below 1e-8 of their ln UPT's size) and every censored cell's
  prediction is at or past its censor step, the MLE is that law with σ = 0 (the limit of the
  likelihood), and p is None.

  Raises:
    FitError: the MLE does not converge.
  """
  n_em = int(emerged.sum())
  ones = np.ones((1, len(v)))
  coef_ls, s_ls = fit_ols(x[emerged], v[emerged], ones[:, emerged])
  coef_ls, s_ls = coef_ls[0], float(s_ls[0])
  s0 = math.sqrt(max(s_ls**2 * dof / n_em, 1e-12))  # the ML scale of the LSQ residuals
  a = np.concatenate([-x, v[:, None]], axis=1)
  size = max(1.0, float(np.abs(v[emerged]).max()))
  if s_ls <= 1e-8 * size and (x[~emerged] @ coef_ls >= v[~emerged] - 1e-8 * size).all():
    return coef_ls, s_ls, a, None
  p, ok = fit_mle(a, emerged, ones, np.append(coef_ls / s0, 1.0 / s0)[None])
  if not ok[0]:
    raise FitError(
      f"the censored maximum-likelihood fit did not converge ({n_em} emerged, "
      f"{n_cens} censored cells): the emerged cells lie (nearly) exactly on a law, "
      f"so the scatter sigma -> 0"
    )
  return coef_ls, s_ls, a, p[0]


def _check_fixed(fixed: dict, all_names: list[str]) -> None:
  """Raises ``FitError`` for fixed coefficients that are unknown, not finite, or all of them."""
  unknown = set(fixed) - set(all_names)
  if unknown:
    raise FitError(
      f"fixed coefficients {sorted(unknown)}: allowed {', '.join(all_names)}"
      + (
        " (a term's gamma[COLUMN] only with that term: --terms=COLUMN)"
        if any(n.startswith("gamma") for n in unknown)
        else ""
      )
    )
  for name, value in fixed.items():
    if not math.isfinite(value):
      raise FitError(f"fixed {name} = {value}: must be a finite number")
  if set(fixed) == set(all_names):
    raise FitError("every coefficient is fixed: nothing to fit")


def _no_interval_note(n_boot: int, dof: int, em_points: int, k: int) -> str | None:
  """Why ``fit_law`` draws no bootstrap (``LawFit.ci_note``), or None when it does."""
  if not n_boot:
    return "no bootstrap (n_boot = 0)"
  if n_boot < MIN_BOOT:
    return (
      f"{n_boot} bootstrap resample(s) cannot place a 95% interval's 2.5% ends (at least "
      f"{MIN_BOOT}; 2000 by default)"
    )
  if dof < MIN_DOF_FOR_INTERVALS:
    return (
      f"{dof} residual degree(s) of freedom (fewer than {MIN_DOF_FOR_INTERVALS}): a "
      f"bootstrap of so few cells mostly redraws the same design"
    )
  if em_points - k < MIN_DOF_FOR_INTERVALS:
    return (
      f"{em_points} grid point(s) with emerged cells for {k} coefficient(s): a "
      f"bootstrap over grid points needs at least {k + MIN_DOF_FOR_INTERVALS} (with "
      f"fewer, nearly every resample that identifies the law is the grid itself)"
    )
  return None


@dataclasses.dataclass
class _Problem:
  """What ``fit_law``'s two fits share: the cleaned points (``pts``), the full design over
  ``all_names`` and which of them are free (``names``, their columns ``free``) or ``fixed``,
  which cells emerged, ln of their times ``y``, the residual degrees of freedom, the grid
  points (``n_groups``) with the intervals' small-sample ``factor``, and ``ci_note``."""

  pts: pd.DataFrame
  full: np.ndarray
  all_names: list
  names: list
  free: list
  fixed: dict
  emerged: np.ndarray
  y: np.ndarray
  dof: int
  terms: tuple
  n_groups: int
  factor: float
  ci_note: str | None
  boot_note: str | None = None


def _law_fit(q: _Problem, coef, sigma, draws, sigmas, method, n, cells) -> LawFit:
  """One fit as a ``LawFit``: free coefficients ``coef`` and scatter ``sigma`` (``method``, on
  ``n`` cells), its residuals over the emerged cells, and with bootstrap ``draws`` its
  intervals and covariance; ``cells``: the rows whose range it covers."""
  keep = ("run", "cell", "batch_size", "context_size", "n_params", *q.terms)
  keep = [c for c in dict.fromkeys(keep) if c in q.pts]
  y_em = q.y[q.emerged]
  values = dict(q.fixed)
  values.update(zip(q.names, (float(c) for c in coef)))
  pred = q.full[q.emerged] @ np.array([values[n_] for n_ in q.all_names])
  r, r_note = _r(pred, y_em, q.dof)
  residuals = q.pts.loc[q.emerged, keep].reset_index(drop=True)
  residuals["observed_updates"] = np.exp(y_em)
  residuals["predicted_updates"] = np.exp(pred)
  residuals["residual_ln"] = y_em - pred
  ci, cov, all_draws = {}, None, None
  if draws is not None:
    all_draws = np.tile(np.array([values[n_] for n_ in q.all_names]), (len(draws), 1))
    all_draws[:, q.free] = draws
    ci = percentile_intervals(draws, q.names, values, sigmas, sigma, q.factor)
    cov = np.zeros((len(q.all_names), len(q.all_names)))  # fixed coefficients: exactly 0
    cov[np.ix_(q.free, q.free)] = (
      np.atleast_2d(np.cov(draws, rowvar=False)) * q.n_groups / (q.n_groups - 1)
    )
  return LawFit(
    log_T=values["log_T"],
    alpha=values["alpha"],
    beta=values["beta"],
    r=r,
    n=n,
    ci=ci,
    residuals=residuals,
    terms=q.terms,
    gammas={t: values[term_name(t)] for t in q.terms},
    n_censored=int((~q.emerged).sum()),
    n_boot=0 if draws is None else len(draws),
    fixed=q.fixed,
    dof=q.dof,
    sigma=float(sigma),
    method=method,
    n_emerged=int(q.emerged.sum()),
    r_note=r_note,
    names=list(q.all_names),
    draws=all_draws,
    cov=cov,
    range=_range(q.pts[cells], q.terms),
    n_grid_points=q.n_groups,
    ci_note=q.ci_note,
    boot_note=q.boot_note,
  )


def _prediction_scale(law: LawFit, at: tuple) -> tuple[np.ndarray, int]:
  """``(scale, t dof)``: the scale of ln UPT of a new cell at ``at`` = (B, C, term values:
  ``_law_args``) about ``law``'s prediction, s·sqrt(1 + x (XᵀX)⁻¹ xᵀ), and the degrees of
  freedom to read it with — the classical prediction interval of a new observation (Draper &
  Smith, *Applied Regression Analysis*, 3rd ed., §3.3) with the grid point as the unit: s is
  the cells' scatter on their residual degrees of freedom, but X holds each emerged grid point
  once and dof = emerged points − free coefficients, since a point's seeds share its deviation
  and do not narrow the coefficients' uncertainty as independent cells would (counting cells
  gave 93.3% coverage of left-out points at 95%; ``analysis.held_out``)."""
  free = [i for i, n in enumerate(law.names) if n not in law.fixed]
  design = law._x(*_law_args(law.residuals, law))[:, free]
  points = np.unique(design, axis=0)
  new = law._x(*at)[:, free]
  leverage = np.einsum("ij,jk,ik->i", new, np.linalg.pinv(points.T @ points), new)
  s = law.sigma * math.sqrt(law.n_emerged / law.dof)
  return s * np.sqrt(1 + leverage), max(len(points) - len(free), 1)


def compare(fit: LawFit) -> pd.DataFrame:
  """The fitted law against the study's laws on the fit's cells: r, RMS and mean residual of ln
  UPT (positive mean residual = emergence later than the law predicts).

  Rows: 'fitted'; 'study v2 (published)' (ln T 13.26, α 0.37, β 0.62); 'v1 form, T fitted'
  (α = β = 0.5, only T fitted: N_PT = T·sqrt(B·C) tokens ⇔ UPT = T / sqrt(B·C)); 'v1 as
  published' (T = 10^5.7 tokens)."""
  res = fit.residuals
  b, c, y = fit._by()
  rows = []
  if not fit.terms:
    rows.append(score("fitted", fit.log_T, fit.alpha, fit.beta, b, c, y, 3 - len(fit.fixed)))
  else:
    pred = np.log(res["predicted_updates"].to_numpy(float))
    rows.append(
      {
        "law": f"fitted (with {', '.join(map(term_name, fit.terms))})",
        "log_T": fit.log_T,
        "alpha": fit.alpha,
        "beta": fit.beta,
        "free_parameters": len(fit.names) - len(fit.fixed),
        "r": fit.r,
        "rmse_ln": float(np.sqrt(np.mean((y - pred) ** 2))),
        "mean_residual_ln": float(np.mean(y - pred)),
      }
    )
  rows.append(
    score("study v2 (published)", STUDY["log_T"], STUDY["alpha"], STUDY["beta"], b, c, y, 0)
  )
  log_t_v1 = float(np.mean(y + 0.5 * np.log(b) + 0.5 * np.log(c)))
  rows.append(score("v1 form sqrt(BC), T fitted", log_t_v1, 0.5, 0.5, b, c, y, 1))
  rows.append(
    score(
      "v1 as published (T = 10^5.7 tokens)", V1_LOG10_T_TOKENS * math.log(10), 0.5, 0.5, b, c, y, 0
    )
  )
  return pd.DataFrame(rows)


def censored_check(fit: LawFit, points: pd.DataFrame, level: float = CHECK_P) -> pd.DataFrame:
  """The censored cells against the law: each one's last checkpoint (``censor_step``) and the fitted
  law's predicted UPT; ``before_median`` = the law's median predicts emergence before the cell's
  last checkpoint, yet it had not emerged (with scatter σ about half of the cells near the law
  do so); ``p_not_emerged`` = the probability that such a cell had not emerged by
  ``censor_step`` under the law refitted **without the cell's grid point** (so a cell far off
  the law cannot widen σ to excuse itself): the t(dof) probability of (ln predicted − ln
  censor_step) over that fit's prediction scale (``_prediction_scale``); ``contradicts`` =
  ``p_not_emerged`` below ``level`` / (censored cells): Bonferroni over the censored cells, so a
  grid where the law holds marks any cell with probability at most ``level`` (measured:
  docs/benchmarks.md, "Calibration of the report's verdicts"). Where the refit without the point
  is impossible (too few points left) the full fit stands in (``left_out`` False). Without a
  scatter (σ = 0: the emerged cells lie exactly on a law) every cell before the median
  contradicts it."""
  mask = (
    pd.to_numeric(points["emergence_step"], errors="coerce").isna()
    if "emergence_step" in points
    else pd.Series(False, points.index)
  )
  if "censored" in points:
    mask |= as_bool(points["censored"], points)
  cens = points[mask]
  cols = ("run", "cell", "batch_size", "context_size", "n_params", *fit.terms, "censor_step")
  out = cens[[c for c in dict.fromkeys(cols) if c in cens]].copy()
  if out.empty or any(t not in out for t in fit.terms):
    return out.assign(predicted_updates=[], contradicts=[]) if out.empty else out

  out["predicted_updates"] = fit.predict_updates(*_law_args(out, fit))
  out["before_median"] = out["predicted_updates"] < out["censor_step"]
  if not (math.isfinite(fit.sigma) and fit.sigma > 0):
    out["contradicts"] = out["before_median"]
    return out.reset_index(drop=True)
  keys = ["batch_size", "context_size", *fit.terms]  # a grid point
  p_not, left_out = np.empty(len(out)), np.zeros(len(out), bool)
  for point, rows in out.reset_index(drop=True).groupby(keys, sort=False):
    here = (points[keys].to_numpy(float) == np.asarray(point, float)).all(1)
    try:
      law = fit_law(
        points[~here],
        terms=fit.terms,
        n_boot=0,
        fixed=fit.fixed,
        shape_tests=False,
        held_out=False,
      )
    except FitError:
      law = fit
    law = law if law.sigma > 0 and law.dof > 0 else fit
    left_out[rows.index] = law is not fit
    z = np.log(law.predict_updates(*_law_args(rows, law)) / rows["censor_step"].to_numpy(float))
    scale, dof = _prediction_scale(law, _law_args(rows, law))
    p_not[rows.index] = stats.t.cdf(z / scale, dof)
  out["p_not_emerged"] = p_not
  out["left_out"] = left_out
  out["contradicts"] = out["p_not_emerged"] < level / len(out)
  return out.reset_index(drop=True)
