"""The emergence law's figure (``figure_law``, saved by ``plot_law``) and its confidence band
(``law_band``)."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd

from . import lack_of_fit
from .figure_axes import grid_axis, number_axis, pyplot, save

# ---------------------------------------------------------------- the law and its band

_LAW_NAMES = ("log_T", "alpha", "beta")


def _law_dict(fit) -> dict:
  return fit.to_dict() if hasattr(fit, "to_dict") else dict(fit)


def _cov_matrix(cov, names) -> np.ndarray | None:
  """A covariance over ``names`` from the forms a law JSON may hold: {name: {name: v}},
  {"names"|"params": [...], "matrix": [[...]]}, or a bare matrix in ``names`` order."""
  try:
    if isinstance(cov, dict) and all(isinstance(v, dict) for v in cov.values()):
      return np.array([[float(cov.get(a, {}).get(b, 0.0)) for b in names] for a in names])
    if isinstance(cov, dict):
      order = list(cov.get("names") or cov.get("params") or cov.get("coefficients") or [])
      m = np.asarray(cov["matrix"], float)
    else:
      order, m = list(names), np.asarray(cov, float)
    out = np.zeros((len(names), len(names)))
    for i, a in enumerate(names):
      for j, b in enumerate(names):
        if a in order and b in order:
          out[i, j] = m[order.index(a), order.index(b)]
    return out
  except (KeyError, TypeError, ValueError, IndexError):
    return None


def law_band(fit, batch_size, context_size, level: float = 0.95):
  """The fitted law's 95% prediction band for one cell's UPT at arrays of B and C (a law
  without terms beyond B and C: ``fit_law(terms=...)``).

  Returns ``(lo, hi, how)``: updates (arrays like B) and a phrase saying where the band comes
  from, or None when the fit carries nothing to make one from. ``fit``: a ``LawFit`` or its
  ``to_dict()``. Sources, in order: the fit's ``cov`` (covariance of log_T, alpha, beta: a matrix
  with ``names``, or nested dicts), plus ``sigma`` (the cell-to-cell scatter in ln UPT) when
  present — without it the band is the law's own (its median's); else the least-squares
  covariance s²(XᵀX)⁻¹ and scatter s² rebuilt from the fit's residual table (emerged cells;
  the coefficients' bootstrap intervals alone give no joint distribution). Fixed coefficients
  contribute no variance. Band: ln UPT ± q·sqrt(gᵀΣg + σ²), g = (1, −ln B, −ln C), q the
  ``level`` quantile of Student's t with the cov's ``t_dof`` (grid points − 1; as ``ihsweep
  predict`` and ``LawFit.predict_interval`` compute it), else of the normal distribution.
  """
  from scipy import stats

  law = _law_dict(fit)
  if law.get("gamma") is not None or law.get("terms"):  # its band needs the terms' values
    return None
  t_dof = law["cov"].get("t_dof") if isinstance(law.get("cov"), dict) else None
  z = float(
    stats.t.ppf(0.5 + level / 2, t_dof) if t_dof and t_dof > 0 else stats.norm.ppf(0.5 + level / 2)
  )
  b = np.asarray(batch_size, float)
  c = np.asarray(context_size, float)
  b, c = np.broadcast_arrays(b, c)
  g = np.stack([np.ones_like(b), -np.log(b), -np.log(c)], axis=-1)
  center = law["log_T"] - law["alpha"] * np.log(b) - law["beta"] * np.log(c)
  fixed = set((law.get("fixed") or {}).keys())
  cov = _cov_matrix(law["cov"], list(_LAW_NAMES)) if law.get("cov") is not None else None
  sigma = law.get("sigma")
  if cov is not None:
    how = "95% band of the law's median (the fit's covariance)"
    var = np.einsum("...i,ij,...j->...", g, cov, g)
    if sigma is not None and np.isfinite(sigma):
      var = var + float(sigma) ** 2
      how = (
        "95% prediction band for a cell (the fit's covariance and its scatter "
        f"σ = {float(sigma):.2f})"
      )
  else:
    res = getattr(fit, "residuals", None)
    free = [i for i, n in enumerate(_LAW_NAMES) if n not in fixed]
    if res is None or "residual_ln" not in res or len(res) <= len(free):
      return None
    if "censored" in res:
      res = res[~res["censored"].astype(bool)]
    x = np.stack(
      [
        np.ones(len(res)),
        -np.log(res["batch_size"].to_numpy(float)),
        -np.log(res["context_size"].to_numpy(float)),
      ],
      axis=1,
    )[:, free]
    dof = len(res) - len(free)
    if dof <= 0 or np.linalg.matrix_rank(x) < len(free):
      return None
    s2 = float(np.sum(res["residual_ln"].to_numpy(float) ** 2) / dof)
    cov_free = s2 * np.linalg.inv(x.T @ x)
    cov = np.zeros((3, 3))
    cov[np.ix_(free, free)] = cov_free
    var = np.einsum("...i,ij,...j->...", g, cov, g) + s2
    how = "95% prediction band (least-squares covariance and residual scatter of the emerged cells)"
  sd = np.sqrt(np.maximum(var, 0))
  return np.exp(center - z * sd), np.exp(center + z * sd), how


def figure_law(fit, points: pd.DataFrame | None = None, max_per_row: int = 4):
  """The figure of ``plot_law``: (1) observed vs predicted UPT, log-log, for the fitted law and
  the study's; (2) UPT against B, one panel per C (``max_per_row`` panels a row, one shared log
  y axis, ticks at the grid's B) with the fitted law's line and its band (``law_band``; its
  source in the figure's ``band_source``), so the C values' bands and lines do not overlap. The
  fit's emerged cells come from its residual table; censored cells, from ``points`` (rows with
  ``censored`` true and a ``censor_step``), are drawn as open triangles at their last
  checkpoint (a lower bound). ``fig.axes``: [observed vs predicted, one panel per C …]."""
  plt = pyplot()
  b, c, obs, pred, cens = _law_cells(fit, points)
  cs = np.unique(c)
  cols = max(1, min(len(cs), max_per_row))
  rows = math.ceil(len(cs) / cols)
  fig = plt.figure(figsize=(5.0 + 3.0 * cols, max(4.2, 3.0 * rows)))
  grid = fig.add_gridspec(rows, 1 + cols, width_ratios=[1.6] + [1.0] * cols)
  ax1 = fig.add_subplot(grid[:, 0])
  panels = []
  for k in range(len(cs)):
    share = panels[0] if panels else None
    panels.append(fig.add_subplot(grid[k // cols, 1 + k % cols], sharey=share))
  _observed_vs_predicted(ax1, fit, b, c, obs, pred, cens)
  how = _law_panels(plt, fit, panels, cs, cols, rows, b, c, obs, cens)
  if panels:
    _law_legend(panels[0], cens.any(), how, fit)
  fig.suptitle(_law_title(fit), fontsize=10)
  fig.tight_layout()
  fig.band_source = how  # for the report's caption
  return fig


def _law_cells(fit, points: pd.DataFrame | None) -> tuple:
  """``(B, C, observed, predicted updates, censored)`` per cell: the fit's emerged cells (its
  residual table), then the censored ones of ``points`` at their last checkpoint."""
  res = fit.residuals
  b, c = res["batch_size"].to_numpy(float), res["context_size"].to_numpy(float)
  obs = res["observed_updates"].to_numpy(float)
  pred = res["predicted_updates"].to_numpy(float)
  cens = np.zeros(len(res), bool)
  terms = getattr(fit, "terms", ())
  if points is not None and not terms and {"censored", "censor_step"} <= set(points):
    extra = points[points["censored"].astype(bool) & points["censor_step"].notna()]
    if len(extra):
      eb, ec = extra["batch_size"].to_numpy(float), extra["context_size"].to_numpy(float)
      b, c = np.concatenate([b, eb]), np.concatenate([c, ec])
      obs = np.concatenate([obs, extra["censor_step"].to_numpy(float)])
      pred = np.concatenate([pred, fit.predict_updates(eb, ec)])
      cens = np.concatenate([cens, np.ones(len(extra), bool)])
  return b, c, obs, pred, cens


def _observed_vs_predicted(ax1, fit, b, c, obs, pred, cens) -> None:
  """Panel (1) of ``figure_law``: observed against predicted updates, for the fitted law and
  the study's, censored cells as open triangles."""
  from ihsweep.base.law import STUDY

  study = np.exp(STUDY["log_T"] - STUDY["alpha"] * np.log(b) - STUDY["beta"] * np.log(c))
  r = getattr(fit, "r", math.nan)
  r_text = "" if r is None or not np.isfinite(r) else f" (r={r:.3f})"
  ax1.loglog(
    pred[~cens],
    obs[~cens],
    "o",
    label=f"fitted: ln T={fit.log_T:.2f}, α={fit.alpha:.2f}, β={fit.beta:.2f}{r_text}",
    alpha=0.8,
  )
  ax1.loglog(
    study[~cens],
    obs[~cens],
    "s",
    mfc="none",
    label=f"study: ln T={STUDY['log_T']}, α={STUDY['alpha']}, β={STUDY['beta']}",
    alpha=0.8,
  )
  if cens.any():
    ax1.loglog(
      pred[cens],
      obs[cens],
      "^",
      mfc="none",
      color="tab:red",
      label="censored: last checkpoint (fitted law)",
      alpha=0.8,
    )
  lo = min(obs.min(), pred.min(), study.min()) / 1.5
  hi = max(obs.max(), pred.max(), study.max()) * 1.5
  ax1.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="observed = predicted")
  number_axis(ax1, "x")
  number_axis(ax1, "y")
  ax1.set_xlabel("predicted updates to the transition")
  ax1.set_ylabel("observed updates to the transition")
  ax1.legend(fontsize=7)
  ax1.grid(alpha=0.3, which="both")


def _law_panels(plt, fit, panels, cs, cols, rows, b, c, obs, cens) -> str | None:
  """Panels (2) of ``figure_law``: updates against B, one per C, with the fitted law's line
  and band. Returns the band's source (``law_band``), None without one."""
  res = fit.residuals
  c_lacks_fit = _lacking(fit, "C") is not None
  cmap = plt.get_cmap("viridis")
  shade = lambda k: cmap(0.85 * k / max(len(cs) - 1, 1))  # noqa: E731 (viridis' end is pale)
  bs = np.geomspace(b.min(), b.max(), 50) if b.max() > b.min() else np.array([b.min()])
  how = None
  for k, (ax2, cv) in enumerate(zip(panels, cs)):
    color = shade(k)
    m = c == cv
    ax2.plot(b[m & ~cens], obs[m & ~cens], "o", color=color, alpha=0.8)
    if (m & cens).any():
      ax2.plot(b[m & cens], obs[m & cens], "^", mfc="none", color=color, alpha=0.8)
    scale = 1.0
    for term, gamma in getattr(fit, "gammas", {}).items():  # at this C's mean term values
      scale *= np.exp(gamma * np.log(res[term].to_numpy(float)[m].mean()))
    law = fit.T * bs**-fit.alpha * cv**-fit.beta * scale
    ax2.plot(bs, law, "-", color=color, lw=1)
    shift = _level_shift(fit, cv) if c_lacks_fit else None
    if shift is not None:  # where C lacks fit: the law moved to this C's own cells
      ax2.plot(bs, law * math.exp(shift), "--", color=color, lw=1)
      ax2.set_title(f"C = {cv:g}: {math.exp(shift) - 1:+.0%} against the law", fontsize=9)
    band = law_band(fit, bs, np.full_like(bs, cv))
    if band is not None:
      ax2.fill_between(bs, band[0], band[1], color=color, alpha=0.2, lw=0)
      how = band[2]
    grid_axis(ax2, "x", np.unique(b))
    ax2.set_yscale("log")
    number_axis(ax2, "y")
    if shift is None:
      ax2.set_title(f"C = {cv:g}", fontsize=9)
    ax2.grid(alpha=0.3, which="both")
    ax2.tick_params(labelsize=8)
    if k // cols == rows - 1 or k + cols >= len(cs):
      ax2.set_xlabel("batch size B", fontsize=8)
    if k % cols == 0:
      ax2.set_ylabel("updates to the transition", fontsize=8)
  for k, ax2 in enumerate(panels):  # after every set_yscale: it resets the shared axes' ticks
    ax2.tick_params(which="both", labelleft=k % cols == 0)
  return how


def _lacking(fit, symbol: str) -> dict | None:
  """The lack-of-fit test of axis ``symbol`` ('B' or 'C') where it flags the law
  (``analysis.lack_of_fit``), as a dict; None otherwise."""
  for test in getattr(fit, "lack_of_fit", None) or []:
    t = test.to_dict() if hasattr(test, "to_dict") else dict(test)
    if t.get("symbol") == symbol and t.get("lacks_fit"):
      return t
  return None


def _level_shift(fit, context_size: float) -> float | None:
  """The mean ln residual (observed − law) of the emerged cells at ``context_size``: how far a
  free level for this C moves the law's line; None without emerged cells there."""
  res = fit.residuals
  if "censored" in res:
    res = res[~res["censored"].astype(bool)]
  here = res[res["context_size"].to_numpy(float) == float(context_size)]
  if here.empty:
    return None
  return float(here["residual_ln"].mean())


def _law_legend(ax, censored: bool, how: str | None, fit=None) -> None:
  """The first panel's legend: emerged, censored, the fitted law, and its band's source; where
  C lacks fit, the dashed line of a free level per C with the test's numbers."""
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch

  gray = "0.35"
  handles = [Line2D([], [], ls="", marker="o", color=gray, label="emerged")]
  if censored:
    handles.append(Line2D([], [], ls="", marker="^", mfc="none", color=gray, label="censored"))
  handles.append(Line2D([], [], color=gray, lw=1, label="fitted law"))
  lacking = _lacking(fit, "C") if fit is not None else None
  if lacking is not None:
    label = f"the law at this C's own level (lack of fit in C: {lacking['numbers']})"
    handles.append(Line2D([], [], color=gray, lw=1, ls="--", label=textwrap.fill(label, 30)))
  if how:
    handles.append(Patch(color=gray, alpha=0.2, lw=0, label=textwrap.fill(how, 30)))
  ax.legend(handles=handles, fontsize=6, loc="best")


def _law_title(fit) -> str:
  """``figure_law``'s title: how many cells the law was fitted to, and how; and, per axis
  whose lack-of-fit test flags it (``analysis.lack_of_fit``), that the power law does not
  describe the grid along it."""
  n_cens = getattr(fit, "n_censored", 0)
  if "MLE" in str(getattr(fit, "method", "")):
    title = (
      f"Emergence law fitted to {getattr(fit, 'n_emerged', fit.n)} emerged and {n_cens} "
      f"censored cells (censored-data maximum likelihood)"
    )
  else:
    title = f"Emergence law fitted to {fit.n} emerged cells ({n_cens} censored, left out)"
  for symbol in ("C", "B"):
    t = _lacking(fit, symbol)
    if t is not None:
      title += (
        f"\nthe power law does not describe {symbol} here (p {lack_of_fit.p_text(t['p_value'])})"
      )
  return title


def plot_law(fit, out_base: str, points: pd.DataFrame | None = None) -> list[str]:
  """Observed vs predicted UPT (log-log) for the fitted law and the study's, and UPT vs B in one
  panel per C with the fitted law's line and band (``figure_law``). ``fit``:
  ``analysis.law_fit.LawFit``. Returns the PNG and PDF paths."""
  return save(figure_law(fit, points), out_base)
