"""The emergence law fitted to emergence points: log UPT = log T − α log B − β log C.

UPT (updates to the phase transition) is a cell's emergence step in updates, B its batch size
(sequences per update), C its context size (tokens per sequence); logs are natural, so ``log_T``
compares directly with the study's ln T = 13.26 (Aoyama et al. 2025, v2, Experiment 1: α = 0.37,
β = 0.62, r = 0.98; PAPER.md). The fit is ordinary least squares on emerged cells (censored
cells are excluded and counted), optionally with a model-size term + γ log n_params to test the
study's finding that UPT does not depend on model size (γ ≈ 0). Uncertainty: a percentile
bootstrap over cells (resampling cells with replacement; resamples whose design cannot identify
every coefficient are redrawn). ``r`` is Pearson's correlation between predicted and observed
log UPT.

The comparison table (``compare``) scores, on the same cells: the fitted law, the study's law as
published, and version 1's form N_PT = T·sqrt(B·C) tokens (i.e. α = β = 0.5) both with T fitted
and with v1's T = 10^5.7.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

STUDY = {"log_T": 13.26, "alpha": 0.37, "beta": 0.62, "r": 0.98}
V1_LOG10_T_TOKENS = 5.7  # version 1: N_PT = T·sqrt(B·C) tokens with T ≈ 10^5.7


# Fewer residual degrees of freedom than this: the fit is reported without intervals.
MIN_DOF_FOR_INTERVALS = 3


class FitError(ValueError):
  """Emergence points from which the law cannot be fitted (too few, not identifiable, bad
  values)."""


@dataclasses.dataclass
class LawFit:
  """A fitted law. ``ci`` maps each of log_T, T, alpha, beta (and gamma) to its 95% bootstrap
  interval ``[lo, hi]``; ``residuals`` has one row per cell used (batch_size, context_size,
  observed/predicted UPT in updates, residual in ln units)."""
  log_T: float
  alpha: float
  beta: float
  r: float
  n: int
  ci: dict
  residuals: pd.DataFrame
  gamma: float | None = None
  n_censored: int = 0
  n_boot: int = 0
  fixed: dict = dataclasses.field(default_factory=dict)
  dof: int = 0

  @property
  def T(self) -> float:
    return math.exp(self.log_T)

  def predict_updates(self, batch_size, context_size, n_params=None) -> np.ndarray:
    """Predicted UPT (updates) for arrays of B, C (and n_params when γ was fitted)."""
    log_upt = (self.log_T - self.alpha * np.log(batch_size) - self.beta * np.log(context_size))
    if self.gamma is not None:
      log_upt = log_upt + self.gamma * np.log(n_params)
    return np.exp(log_upt)

  def to_dict(self) -> dict:
    """The JSON of ``python -m analysis fit-law`` (DESIGN.md): log_T, T, alpha, beta, r, n and
    ``ci``; also gamma (if fitted), n_censored, n_boot, fixed coefficients and the units. Read
    by ``ihsweep.law.Law.from_json`` (``ihsweep predict --law=FILE``)."""
    out = {"log_T": self.log_T, "T": self.T, "alpha": self.alpha, "beta": self.beta,
           "r": self.r, "n": self.n, "ci": self.ci}
    if self.gamma is not None:
      out["gamma"] = self.gamma
    out.update(n_censored=self.n_censored, n_boot=self.n_boot, dof=self.dof, units="updates",
               form="ln UPT = ln T - alpha ln B - beta ln C" +
               (" + gamma ln n_params" if self.gamma is not None else ""))
    if self.fixed:
      out["fixed"] = self.fixed
    return out


def _clean(points: pd.DataFrame, with_params: bool) -> tuple[pd.DataFrame, int]:
  need = ["batch_size", "context_size", "emergence_step"] + (["n_params"] if with_params else [])
  missing = [c for c in need if c not in points]
  if missing:
    raise FitError(f"emergence points need columns {', '.join(need)}; missing "
                   f"{', '.join(missing)}")
  if points.empty:
    raise FitError("no emergence points (the table has no rows)")
  pts = points.copy()
  for c in need:
    values = pd.to_numeric(pts[c], errors="coerce")
    text = values.isna() & pts[c].notna() & (pts[c].astype(str).str.strip() != "")
    if text.any():
      row = int(np.flatnonzero(text)[0])
      raise FitError(f"column {c}: {_where(pts, row)} has {str(pts[c].iloc[row])!r}, not a "
                     f"number (leave emergence_step empty for a censored cell)")
    pts[c] = values
  censored = pts["emergence_step"].isna()
  if "censored" in pts:
    censored |= _as_bool(pts["censored"], pts)
  n_censored = int(censored.sum())
  pts = pts[~censored]
  for c in need:
    bad = np.flatnonzero(~(pts[c] > 0) | ~np.isfinite(pts[c]))
    if len(bad):
      raise FitError(f"column {c} must be positive and finite; {_where(pts, int(bad[0]))} has "
                     f"{float(pts[c].iloc[bad[0]])!r}")
  return pts.reset_index(drop=True), n_censored


def _where(points: pd.DataFrame, position: int) -> str:
  """Names the row at ``position``: 'line N' (of the CSV file, the header being line 1) when the
  index holds file line numbers (index name 'line', as ``read_points`` makes it), else the row's
  index label."""
  label = points.index[position]
  return f"line {label}" if points.index.name == "line" else f"the row with index {label!r}"


def read_points(path: str) -> pd.DataFrame:
  """A CSV of emergence points, indexed by each row's line number in the file (the header is
  line 1; blank lines are skipped but counted), so that errors name the line a user sees.

  Raises:
    OSError, ValueError: the file cannot be read as a CSV.
  """
  import csv
  points = pd.read_csv(path)
  with open(path, newline="", encoding="utf-8", errors="replace") as f:
    reader, lines, start = csv.reader(f), [], 1
    for row in reader:
      if any(field.strip() for field in row) or len(row) > 1:  # pandas skips empty lines only
        lines.append(start)
      start = reader.line_num + 1
  if len(lines) - 1 == len(points):  # else an unusual layout: rows are named by number
    points.index = pd.Index(lines[1:], name="line")
  return points


def _as_bool(column: pd.Series, points: pd.DataFrame | None = None) -> pd.Series:
  """A ``censored`` column as booleans: true/false, 1/0, yes/no (any case); empty = False.

  Raises:
    FitError: any other value (naming its row, ``_where``).
  """
  if column.dtype == bool:
    return column
  text = column.astype(str).str.strip().str.lower()
  mapping = {"true": True, "1": True, "1.0": True, "yes": True, "false": False, "0": False,
             "0.0": False, "no": False, "": False, "nan": False, "none": False}
  unknown = ~text.isin(list(mapping))
  if unknown.any():
    row = int(np.flatnonzero(unknown)[0])
    where = f"{_where(points, row)} has " if points is not None else ""
    raise FitError(f"column censored: {where}{column.iloc[row]!r}, not true/false")
  return text.map(mapping).astype(bool)


def _design(pts: pd.DataFrame, names: list[str]) -> np.ndarray:
  cols = {"log_T": np.ones(len(pts)), "alpha": -np.log(pts["batch_size"].to_numpy(float)),
          "beta": -np.log(pts["context_size"].to_numpy(float))}
  if "gamma" in names:
    cols["gamma"] = np.log(pts["n_params"].to_numpy(float))
  return np.stack([cols[n] for n in names], axis=1)


def fit_law(points: pd.DataFrame, *, with_params: bool = False, n_boot: int = 2000,
            seed: int = 0, fixed: dict | None = None) -> LawFit:
  """Least-squares fit of the emergence law (module docstring) to emergence points.

  Args:
    points: one row per cell with ``batch_size``, ``context_size``, ``emergence_step``
      (updates; NaN = censored, excluded) and, with ``with_params``, ``n_params``; an optional
      boolean ``censored`` column also excludes rows.
    with_params: also fit γ for + γ log n_params.
    n_boot: bootstrap resamples for the 95% intervals (0: no intervals; none either when fewer
      than ``MIN_DOF_FOR_INTERVALS`` residual degrees of freedom remain).
    fixed: coefficients held at given values instead of fitted, e.g. ``{"alpha": 0.37}`` when
      only C was varied.

  Raises:
    FitError: missing columns, non-positive values, or too few distinct (B, C[, n_params])
      points to identify the free coefficients (e.g. one batch size: fix alpha).
  """
  fixed = dict(fixed or {})
  allowed = ["log_T", "alpha", "beta"] + (["gamma"] if with_params else [])
  unknown = set(fixed) - set(allowed)
  if unknown:
    raise FitError(f"fixed coefficients {sorted(unknown)}: allowed {', '.join(allowed)}"
                   + ("" if with_params else " (gamma only with the n_params term)"))
  for name, value in fixed.items():
    if not math.isfinite(value):
      raise FitError(f"fixed {name} = {value}: must be a finite number")
  if set(fixed) == set(allowed):
    raise FitError("every coefficient is fixed: nothing to fit")
  pts, n_censored = _clean(points, with_params)
  names = [n for n in ("log_T", "alpha", "beta") + (("gamma",) if with_params else ())
           if n not in fixed]
  all_names = ["log_T", "alpha", "beta"] + (["gamma"] if with_params else [])
  y = np.log(pts["emergence_step"].to_numpy(float)) if len(pts) else np.zeros(0)
  full = _design(pts, all_names) if len(pts) else np.zeros((0, len(all_names)))
  offset = sum(fixed[n] * full[:, all_names.index(n)] for n in fixed) if fixed else 0.0
  x = full[:, [all_names.index(n) for n in names]]
  if len(pts) < len(names) + 1 or np.linalg.matrix_rank(x) < len(names):
    varied = {c: int(pts[c].nunique()) for c in ("batch_size", "context_size") if c in pts}
    hint = ""
    if not fixed and varied.get("batch_size", 0) > 1 and varied.get("context_size", 0) <= 1:
      hint = (" (only B varies: hold beta fixed, e.g. `python -m analysis fit-law --csv "
              "DIR/analysis/emergence.csv --fix beta=0.62`)")
    elif not fixed and varied.get("context_size", 0) > 1 and varied.get("batch_size", 0) <= 1:
      hint = (" (only C varies: hold alpha fixed, e.g. `python -m analysis fit-law --csv "
              "DIR/analysis/emergence.csv --fix alpha=0.37`)")
    raise FitError(
        f"{len(pts)} emerged cell(s) ({n_censored} censored) with distinct values "
        f"{varied} cannot identify {', '.join(names)}: need more emerged cells than coefficients "
        f"and at least two values of each varied quantity{hint}")
  coef = np.linalg.lstsq(x, y - offset, rcond=None)[0]
  values = dict(fixed)
  values.update(zip(names, coef))
  pred = x @ coef + offset
  r = float(np.corrcoef(pred, y)[0, 1]) if np.std(pred) > 0 and np.std(y) > 0 else math.nan

  ci = {}
  dof = len(pts) - len(names)
  if dof < MIN_DOF_FOR_INTERVALS:
    n_boot = 0  # a bootstrap of so few cells mostly redraws the same design: no honest interval
  draws = []
  if n_boot:
    rng = np.random.default_rng(seed)
    tries = 0
    while len(draws) < n_boot and tries < 20 * n_boot:
      tries += 1
      idx = rng.integers(0, len(pts), len(pts))
      xb = x[idx]
      if np.linalg.matrix_rank(xb) < len(names):
        continue
      draws.append(np.linalg.lstsq(xb, (y - offset)[idx], rcond=None)[0])
  if len(draws):
    draws = np.asarray(draws)
    for j, n in enumerate(names):
      lo, hi = np.percentile(draws[:, j], [2.5, 97.5])
      ci[n] = [float(lo), float(hi)]
    if "log_T" in ci:
      ci["T"] = [math.exp(ci["log_T"][0]), math.exp(ci["log_T"][1])]
  residuals = pts[[c for c in ("run", "cell", "batch_size", "context_size", "n_params")
                   if c in pts]].copy()
  residuals["observed_updates"] = np.exp(y)
  residuals["predicted_updates"] = np.exp(pred)
  residuals["residual_ln"] = y - pred
  return LawFit(log_T=float(values["log_T"]), alpha=float(values["alpha"]),
                beta=float(values["beta"]), r=r, n=len(pts), ci=ci, residuals=residuals,
                gamma=float(values["gamma"]) if with_params else None, n_censored=n_censored,
                n_boot=len(draws), fixed=fixed, dof=dof)


def _score(name, log_T, alpha, beta, b, c, y, free: int) -> dict:
  pred = log_T - alpha * np.log(b) - beta * np.log(c)
  resid = y - pred
  r = float(np.corrcoef(pred, y)[0, 1]) if len(y) > 2 and np.std(pred) > 0 else math.nan
  return {"law": name, "log_T": float(log_T), "alpha": alpha, "beta": beta,
          "free_parameters": free, "r": r, "rmse_ln": float(np.sqrt(np.mean(resid ** 2))),
          "mean_residual_ln": float(np.mean(resid))}


def compare(fit: LawFit) -> pd.DataFrame:
  """The fitted law against the study's laws on the fit's cells: r, RMS and mean residual of ln
  UPT (positive mean residual = emergence later than the law predicts).

  Rows: 'fitted'; 'study v2 (published)' (ln T 13.26, α 0.37, β 0.62); 'v1 form, T fitted'
  (α = β = 0.5, only T fitted: N_PT = T·sqrt(B·C) tokens ⇔ UPT = T / sqrt(B·C)); 'v1 as
  published' (T = 10^5.7 tokens)."""
  res = fit.residuals
  b, c = res["batch_size"].to_numpy(float), res["context_size"].to_numpy(float)
  y = np.log(res["observed_updates"].to_numpy(float))
  rows = []
  if fit.gamma is None:
    rows.append(_score("fitted", fit.log_T, fit.alpha, fit.beta, b, c, y,
                       3 - len(fit.fixed)))
  else:
    pred = np.log(res["predicted_updates"].to_numpy(float))
    rows.append({"law": "fitted (with gamma)", "log_T": fit.log_T, "alpha": fit.alpha,
                 "beta": fit.beta, "free_parameters": 4 - len(fit.fixed),
                 "r": fit.r, "rmse_ln": float(np.sqrt(np.mean((y - pred) ** 2))),
                 "mean_residual_ln": float(np.mean(y - pred))})
  rows.append(_score("study v2 (published)", STUDY["log_T"], STUDY["alpha"], STUDY["beta"],
                     b, c, y, 0))
  log_t_v1 = float(np.mean(y + 0.5 * np.log(b) + 0.5 * np.log(c)))
  rows.append(_score("v1 form sqrt(BC), T fitted", log_t_v1, 0.5, 0.5, b, c, y, 1))
  rows.append(_score("v1 as published (T = 10^5.7 tokens)", V1_LOG10_T_TOKENS * math.log(10),
                     0.5, 0.5, b, c, y, 0))
  return pd.DataFrame(rows)


def censored_check(fit: LawFit, points: pd.DataFrame) -> pd.DataFrame:
  """The censored cells against the fitted law: each one's last checkpoint (``censor_step``)
  and the law's predicted UPT; ``contradicts`` = the law predicts emergence before the cell's
  last checkpoint, yet it had not emerged (evidence against the law, or a cell that never
  emerges)."""
  cens = points[points["censored"].astype(bool)] if "censored" in points else points.iloc[:0]
  cols = [c for c in ("run", "cell", "batch_size", "context_size", "n_params", "censor_step")
          if c in cens]
  out = cens[cols].copy()
  if out.empty or (fit.gamma is not None and "n_params" not in out):
    return out.assign(predicted_updates=[], contradicts=[]) if out.empty else out
  out["predicted_updates"] = fit.predict_updates(
      out["batch_size"].to_numpy(float), out["context_size"].to_numpy(float),
      out["n_params"].to_numpy(float) if fit.gamma is not None else None)
  out["contradicts"] = out["predicted_updates"] < out["censor_step"]
  return out.reset_index(drop=True)
