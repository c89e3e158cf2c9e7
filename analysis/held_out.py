"""How well the fitted law predicts grid points it has not seen: leave-one-grid-point-out
cross-validation of the emergence law (``scaling.fit_law`` runs it on every fit).

Each grid point (a distinct (B, C[, terms]) with all its seeds: the unit of the fit's bootstrap)
is left out in turn, the law is refitted on the others by the same censored MLE, and the left-out
point's cells are predicted:

* **emerged cells**: the error ln(observed / predicted) UPT, summarised as the median and 90th
  percentile of its size (and as factors, e^|error|), and whether the cell falls inside the
  refit's 95% prediction interval for one cell (``scaling``'s classical interval of a new
  observation, s·sqrt(1 + leverage) with t(dof): Draper & Smith, *Applied Regression Analysis*,
  3rd ed., §3.3; the interval ``censored_check`` reads too);
* **censored cells** (not emerged by their last checkpoint, ``censor_step``: a lower bound of
  their UPT): the law agrees with the bound where its interval reaches past it (the cell may
  emerge later, as the law allows), and is contradicted where the whole 95% interval lies
  before the bound.

The study's published law (fixed coefficients, nothing refitted) is scored on the same cells
beside it: its error, and its coverage with a scatter estimated from the other points' emerged
cells (the standard deviation of its residuals there, t(n − 1): an offset is error, not
scatter), so the two columns are comparable: a refitted law
that predicts no better than the study's fixed one has learnt nothing from the grid.

This is cross-validation with the grid point as the fold (Stone 1974, J. R. Stat. Soc. B 36:111;
grouped folds for clustered data: Roberts et al. 2017, Ecography 40:913): leaving out one cell
would let its seeds, which share the point's deviation, predict it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats

from ihsweep.base.law import STUDY

LEVEL = 0.95  # the one-cell prediction interval's level


@dataclasses.dataclass(frozen=True)
class Score:
  """One law's held-out numbers over the left-out cells.

  median_abs_ln, p90_abs_ln: median and 90th percentile of |ln(observed / predicted)| over the
    emerged cells (ln units; NaN without any); ``factor`` properties give e^that.
  coverage: share of emerged cells inside their 95% prediction interval (NaN without any).
  censored_agree, censored_contradict: censored cells whose interval reaches past their bound,
    and those whose whole interval lies before it.
  """

  median_abs_ln: float
  p90_abs_ln: float
  coverage: float
  censored_agree: int
  censored_contradict: int

  def to_dict(self) -> dict:
    out = {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}
    out["median_factor"] = _json(math.exp(self.median_abs_ln))
    out["p90_factor"] = _json(math.exp(self.p90_abs_ln))
    return out


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """Leave-one-grid-point-out prediction of the law (module docstring).

  n_points: grid points; n_left_out: those whose refit without them succeeded (the others are
    counted in ``skipped``, with ``skip_note`` saying why). n_emerged, n_censored: the left-out
    cells scored. fitted: the refitted law's ``Score``; study: the study's published law's.
  cells: one row per left-out cell: its coordinates, ``censored``, ``observed_updates`` (its
    UPT, or its bound ``censor_step`` where censored), ``predicted_updates``, ``lo``, ``hi``
    (the 95% interval for one cell), ``error_ln`` (NaN where censored), ``inside``,
    ``study_predicted_updates``, ``study_error_ln``.
  """

  n_points: int
  n_left_out: int
  n_emerged: int
  n_censored: int
  fitted: Score | None
  study: Score | None
  skipped: int = 0
  skip_note: str | None = None
  cells: pd.DataFrame | None = None

  def sentence(self) -> str:
    """The held-out check in words, fitted law and study's side by side."""
    if self.fitted is None:
      return f"no held-out prediction: {self.skip_note}"
    if not self.n_emerged:
      return (
        f"held out one grid point at a time ({self.n_left_out} of {self.n_points} refitted "
        f"without it), none of the left-out cells had emerged: {self.n_censored} censored, of "
        f"which {self.fitted.censored_agree} agree with the law and "
        f"{self.fitted.censored_contradict} contradict it"
      )
    f, s = self.fitted, self.study
    text = (
      f"held out one grid point at a time ({self.n_left_out} of {self.n_points} refitted "
      f"without it), the law predicted its {self.n_emerged} emerged cell(s) within a factor "
      f"{math.exp(f.median_abs_ln):.2f} (median; 90th percentile {math.exp(f.p90_abs_ln):.2f}), "
      f"{f.coverage:.0%} of them inside their 95% one-cell prediction interval"
    )
    if s is not None:
      text += (
        f" (the study's law on the same cells: {math.exp(s.median_abs_ln):.2f}, "
        f"{math.exp(s.p90_abs_ln):.2f}, {s.coverage:.0%})"
      )
    if self.n_censored:
      text += (
        f"; of {self.n_censored} censored cell(s), {f.censored_agree} agree with it (its "
        f"interval reaches past the last checkpoint at which they had not emerged) and "
        f"{f.censored_contradict} contradict it (the whole interval lies before that checkpoint)"
      )
    if self.skipped:
      text += f"; {self.skipped} grid point(s) not left out ({self.skip_note})"
    return text

  def to_dict(self) -> dict:
    return {
      "method": "leave one grid point out",
      "level": LEVEL,
      "n_points": self.n_points,
      "n_left_out": self.n_left_out,
      "n_emerged": self.n_emerged,
      "n_censored": self.n_censored,
      "skipped": self.skipped,
      "skip_note": self.skip_note,
      "fitted": self.fitted.to_dict() if self.fitted else None,
      "study": self.study.to_dict() if self.study else None,
      "sentence": self.sentence(),
    }


def _json(v: float):
  return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def evaluate(
  pts: pd.DataFrame,
  censored: np.ndarray,
  y: np.ndarray,
  cluster: np.ndarray,
  refit: Callable[[np.ndarray], object | str],
  interval: Callable[[object, pd.DataFrame], tuple[np.ndarray, np.ndarray, float]],
) -> HeldOut:
  """Leaves out each grid point in turn (module docstring).

  Args:
    pts: the fit's cleaned cells (``batch_size``, ``context_size``, term columns, …), (n rows).
    censored: bool (n,); y: float64 (n,), ln UPT or ln censor_step where censored.
    cluster: int (n,), the grid point of each cell, 0..G − 1 (the rows' ``grid_point``).
    refit: the law refitted on the cells of a bool mask (n,), or why it cannot be (a str).
    interval: ``(ln median (m,), scale (m,), t dof)`` of a refit law's prediction for rows.
  """
  g = int(cluster.max()) + 1
  rows, ln_med, half, skipped, why = [], [], [], 0, None
  for point in range(g):
    out = np.flatnonzero(cluster == point)
    law = refit(cluster != point)
    if isinstance(law, str):
      skipped += 1
      why = why or law
      continue
    median, scale, dof = interval(law, pts.iloc[out])
    rows.append(out)
    ln_med.append(median)
    half.append(stats.t.ppf((1 + LEVEL) / 2, dof) * scale)
  if not rows:
    return HeldOut(g, 0, 0, 0, None, None, skipped, why)
  at, ln_med, half = (np.concatenate(v) for v in (rows, ln_med, half))
  table = _cells(pts.iloc[at], censored[at], y[at], ln_med, ln_med - half, ln_med + half)
  table = _study_columns(table.assign(grid_point=cluster[at]), pts, censored, y, cluster)
  em = ~table["censored"].to_numpy(bool)
  return HeldOut(
    n_points=g,
    n_left_out=g - skipped,
    n_emerged=int(em.sum()),
    n_censored=int((~em).sum()),
    fitted=_score(table, "predicted_updates", "lo", "hi"),
    study=_score(table, "study_predicted_updates", "study_lo", "study_hi"),
    skipped=skipped,
    skip_note=why,
    cells=table,
  )


def _cells(cells, censored, y, ln_med, ln_lo, ln_hi) -> pd.DataFrame:
  """The left-out cells' rows: coordinates, observation or bound, prediction and interval."""
  keep = [c for c in cells.columns if c not in _NOT_COORDS]
  out = cells[keep].reset_index(drop=True).copy()
  out["censored"] = np.asarray(censored, bool)
  out["observed_updates"] = np.exp(y)
  out["predicted_updates"] = np.exp(ln_med)
  out["lo"], out["hi"] = np.exp(ln_lo), np.exp(ln_hi)
  out["error_ln"] = np.where(out["censored"], np.nan, y - ln_med)
  out["inside"] = (out["lo"] <= out["observed_updates"]) & (out["observed_updates"] <= out["hi"])
  return out


# Columns of an emergence table that are not a cell's coordinates.
_NOT_COORDS = {
  "emergence_step",
  "emergence_tokens",
  "censor_step",
  "censored",
  "last_step",
  "metric",
  "method",
  "caution",
  "level",
}


def _study_columns(table, pts, censored, y, cluster) -> pd.DataFrame:
  """The study's published law on the left-out cells: its prediction, its interval with the
  scatter of its residuals on the other points' emerged cells (t(n − 1)), its error."""

  def ln_study(b, c):
    return STUDY["log_T"] - STUDY["alpha"] * np.log(b) - STUDY["beta"] * np.log(c)

  resid = y - ln_study(pts["batch_size"].to_numpy(float), pts["context_size"].to_numpy(float))
  em = ~np.asarray(censored, bool)
  ln_pred = ln_study(table["batch_size"].to_numpy(float), table["context_size"].to_numpy(float))
  half = np.full(len(table), np.nan)
  for point in table["grid_point"].unique():  # the scatter without the left-out point's cells
    others = em & (cluster != point)
    n = int(others.sum())
    if n > 1:  # its scatter about its own offset: a law off by a constant is not excused
      s = float(np.std(resid[others], ddof=1))
      half[table["grid_point"].to_numpy() == point] = stats.t.ppf((1 + LEVEL) / 2, n - 1) * s
  out = table.copy()
  out["study_predicted_updates"] = np.exp(ln_pred)
  with np.errstate(over="ignore"):  # cells far off the study's law: an interval to 0 or inf
    out["study_lo"], out["study_hi"] = np.exp(ln_pred - half), np.exp(ln_pred + half)
  out["study_error_ln"] = np.where(
    out["censored"], np.nan, np.log(out["observed_updates"]) - ln_pred
  )
  return out


def _score(table: pd.DataFrame, pred: str, lo: str, hi: str) -> Score:
  em = ~table["censored"].to_numpy(bool)
  obs = table["observed_updates"].to_numpy(float)
  err = np.abs(np.log(obs[em] / table[pred].to_numpy(float)[em]))
  lo_v, hi_v = table[lo].to_numpy(float), table[hi].to_numpy(float)
  inside = (lo_v[em] <= obs[em]) & (obs[em] <= hi_v[em])
  bound_past = hi_v[~em] > obs[~em]  # the law lets a censored cell emerge after its bound
  known = np.isfinite(hi_v[~em])
  return Score(
    median_abs_ln=float(np.median(err)) if len(err) else math.nan,
    p90_abs_ln=float(np.percentile(err, 90)) if len(err) else math.nan,
    coverage=float(inside.mean()) if len(err) else math.nan,
    censored_agree=int((bound_past & known).sum()),
    censored_contradict=int((~bound_past & known).sum()),
  )
