"""Figures of analysis/plots.py, read from the matplotlib objects (scales, limits, tick labels,
patches, texts), not from pixels; tiny synthetic tables."""

import math
import os

import numpy as np
import pandas as pd
import pytest

from analysis import law_figure, plots, scaling

B_GRID, C_GRID = (8, 16, 32), (16, 32, 64)


def _curves() -> pd.DataFrame:
  """Two grid points with different checkpoints: B 8 at 0, 1, 2, 4, … 1024; B 32 at 0, 4, 8, …
  4096 (a longer run); ps_max rises as a sigmoid in log-updates."""
  rows = []
  for cell, (b, steps) in enumerate(
    [(8, [0] + [2**k for k in range(11)]), (32, [0] + [2**k for k in range(2, 13)])]
  ):
    for s in steps:
      x = math.log(max(s, 0.5)) - math.log(200)
      rows.append(
        {
          "run": "r",
          "cell": cell,
          "seed": 0,
          "batch_size": b,
          "context_size": 32,
          "step": s,
          "ps_max": 0.02 + 0.8 / (1 + math.exp(-3 * x)),
        }
      )
  return pd.DataFrame(rows)


def _points(censored=((8, 64, 1),), seeds=2, alpha=0.8, beta=0.0, scatter=0.05, seed=0):
  """One row per cell over B_GRID × C_GRID × seeds, UPT = e^10 / (B^alpha C^beta) with log-normal
  scatter; (B, C, seed) in ``censored`` are right-censored at 5,000 updates."""
  rng = np.random.default_rng(seed)
  rows, cell = [], 0
  for b in B_GRID:
    for c in C_GRID:
      for s in range(seeds):
        t = math.exp(10 - alpha * math.log(b) - beta * math.log(c) + rng.normal(0, scatter))
        cens = (b, c, s) in censored
        rows.append(
          {
            "run": "r",
            "cell": cell,
            "seed": s,
            "batch_size": b,
            "context_size": c,
            "emergence_step": math.nan if cens else t,
            "censored": cens,
            "censor_step": 5000.0 if cens else math.nan,
            "step_before": t / 1.19,
            "step_after": t * 1.19,
            "emergence_tokens": t * b * c,
          }
        )
        cell += 1
  return pd.DataFrame(rows)


def test_curve_panels_share_one_log_x_range_from_where_the_curves_start_to_change():
  curves = _curves()
  fig = plots.figure_curves(curves, None)
  panels = [ax for ax in fig.axes if ax.get_visible()]
  assert len(panels) == 2
  # ps_max departs from its update-0 value by more than 5% of its range (0.8) first at update
  # 128 in both cells (0.187; at 64 it is 0.045), so the axis starts one checkpoint before, at 64
  for _, line in curves.groupby("cell"):
    moved = line[(line["ps_max"] - line["ps_max"].iloc[0]).abs() > 0.05 * 0.8]
    assert moved["step"].min() == 128
  assert plots.curve_start(curves, "ps_max") == 64.0
  for ax in panels:
    assert ax.get_xscale() == "log"  # not symlog from 0
    # one range for both panels: from there to the last checkpoint (4096, of B 32)
    assert ax.get_xlim() == pytest.approx((64.0, 4096.0))
    # no point at update 0 is drawn
    assert all((line.get_xdata() > 0).all() for line in ax.get_lines())
  fig.canvas.draw()
  labels = [t.get_text() for t in panels[0].get_xticklabels() if t.get_text()]
  assert "1,000" in labels and not any("10^" in t or "times" in t for t in labels)
  # one curve that changes early (from update 4 on) moves the start of both panels there
  early = curves.copy()
  rise = (early["cell"] == 0) & (early["step"] >= 8)
  early.loc[rise, "ps_max"] = early.loc[rise, "ps_max"].clip(lower=0.2)
  assert plots.curve_start(early, "ps_max") == 4.0
  assert plots.figure_curves(early, None).axes[0].get_xlim()[0] == pytest.approx(4.0)
  # never before the first checkpoint after 0: a curve that changes at once starts there (1)
  at_once = curves.copy()
  at_once.loc[(at_once["cell"] == 0) & (at_once["step"] > 0), "ps_max"] = 0.82
  assert plots.curve_start(at_once, "ps_max") == 1.0
  # nothing changes (flat curves): from the first checkpoint after 0, as before
  flat = curves.assign(ps_max=0.02)
  assert plots.figure_curves(flat, None).axes[0].get_xlim() == pytest.approx((1.0, 4096.0))
  with pytest.raises(ValueError, match="no checkpoint after update 0"):
    plots.figure_curves(_curves().query("step == 0"), None)


def test_law_figure_has_one_panel_per_c_with_the_grid_batch_sizes_and_the_law_band():
  pts = _points(censored=((8, 64, 1),))
  fit = scaling.fit_law(pts, n_boot=50)
  fig = law_figure.figure_law(fit, pts)
  # observed vs predicted, then one panel per C: three C values never share one patch
  assert len(fig.axes) == 1 + len(C_GRID)
  panels = fig.axes[1:]
  assert [ax.get_title() for ax in panels] == ["C = 16", "C = 32", "C = 64"]
  colours = set()
  for ax, cv in zip(panels, C_GRID):
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16", "32"]
    assert list(ax.get_xticks()) == [8.0, 16.0, 32.0]
    assert len(ax.collections) == 1  # this C's band only
    colours.add(tuple(ax.collections[0].get_facecolor()[0]))
    # its law line is this C's
    law_line = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert len(law_line) == 1
    x, y = law_line[0].get_data()
    np.testing.assert_allclose(y, fit.predict_updates(x, np.full_like(x, cv)), rtol=1e-9)
  assert len(colours) == len(C_GRID)  # and distinct colours
  assert panels[1].get_shared_y_axes().joined(panels[0], panels[1])  # one y scale to compare
  legend = [t.get_text() for t in panels[0].get_legend().get_texts()]
  assert legend[:3] == ["emerged", "censored", "fitted law"] and "95%" in legend[3]
  ax = panels[2]  # C 64, where the censored cell is
  # the band contains the fitted line everywhere
  b = np.array([8.0, 16.0, 32.0])
  lo, hi, how = law_figure.law_band(fit, b, np.full(3, 32.0))
  center = fit.predict_updates(b, np.full(3, 32.0))
  assert (lo < center).all() and (center < hi).all() and "95%" in how
  assert fig.band_source == how
  # the censored cell (B 8, C 64) as an open triangle at its last checkpoint, 5,000
  triangles = [line for line in ax.get_lines() if line.get_marker() == "^"]
  assert [(list(t.get_xdata()), list(t.get_ydata())) for t in triangles] == [([8.0], [5000.0])]


class _LeastSquaresFit:
  """A fit that carries only what the emerged-cells least-squares fit did before the censored
  fit: coefficients, fixed ones, a residual table; no cov, no sigma."""

  def __init__(self, residuals, fixed):
    self.residuals, self.fixed = residuals, fixed
    self.log_T, self.alpha, self.beta, self.gamma = 10.0, 0.8, 0.0, None

  def to_dict(self):
    return {"log_T": self.log_T, "alpha": self.alpha, "beta": self.beta, "fixed": self.fixed}


def test_law_band_without_a_covariance_is_rebuilt_from_the_residuals():
  # alpha and beta fixed: only ln T is free, so Var(ln T) = s²/n and the prediction band for a
  # cell is ± z·s·sqrt(1 + 1/n), s² = Σ r² / (n − 1)
  r = np.array([0.1, -0.1, 0.2, -0.2])
  res = pd.DataFrame(
    {"batch_size": [8, 16, 32, 8], "context_size": [16, 16, 32, 64], "residual_ln": r}
  )
  fit = _LeastSquaresFit(res, {"alpha": 0.8, "beta": 0.0})
  lo, hi, how = law_figure.law_band(fit, [16.0], [32.0])
  s = math.sqrt((r**2).sum() / 3)
  center = 10.0 - 0.8 * math.log(16)
  assert math.log(hi[0]) - center == pytest.approx(1.959964 * s * math.sqrt(1 + 1 / 4), rel=1e-5)
  assert math.log(lo[0]) - center == pytest.approx(-1.959964 * s * math.sqrt(1 + 1 / 4), rel=1e-5)
  assert "least-squares" in how
  # no residual degrees of freedom: no band
  assert (
    law_figure.law_band(_LeastSquaresFit(res.iloc[:1], {"alpha": 0.8, "beta": 0.0}), [16.0], [32.0])
    is None
  )


def test_law_band_from_a_covariance_and_scatter_is_the_normal_band():
  fit = scaling.fit_law(_points(censored=()), n_boot=0)
  law = fit.to_dict()
  law.pop("sigma", None)  # first the band of the law itself
  law["cov"] = {
    "log_T": {"log_T": 0.01, "alpha": 0.0, "beta": 0.0},
    "alpha": {"log_T": 0.0, "alpha": 0.0, "beta": 0.0},
    "beta": {"log_T": 0.0, "alpha": 0.0, "beta": 0.0},
  }
  lo, hi, how = law_figure.law_band(law, [8.0], [16.0])
  z = 1.959964
  center = law["log_T"] - law["alpha"] * math.log(8) - law["beta"] * math.log(16)
  assert math.log(hi[0]) - center == pytest.approx(z * 0.1, rel=1e-5)
  assert math.log(lo[0]) - center == pytest.approx(-z * 0.1, rel=1e-5)
  assert "covariance" in how
  law["sigma"] = 0.3  # a prediction band adds the cell-to-cell scatter
  lo, hi, how = law_figure.law_band(law, [8.0], [16.0])
  assert math.log(hi[0]) - center == pytest.approx(z * math.sqrt(0.01 + 0.09), rel=1e-5)
  assert "prediction" in how
  # a matrix with its names gives the same band as the nested form
  law["cov"] = {"names": ["log_T", "alpha", "beta"], "matrix": [[0.01, 0, 0], [0, 0, 0], [0, 0, 0]]}
  assert law_figure.law_band(law, [8.0], [16.0])[1][0] == pytest.approx(hi[0])


def test_seed_median_bounds_a_censored_median():
  assert plots.seed_median([100.0, 300.0], [False, False], [math.nan] * 2) == (200.0, False)
  # one seed emerged at 100, the other censored at 500: the median exceeds (100 + 500) / 2
  assert plots.seed_median([100.0, math.nan], [False, True], [math.nan, 500.0]) == (300.0, True)
  # 3 seeds, one censored: the median is the middle emerged one
  assert plots.seed_median(
    [100.0, 200.0, math.nan], [False, False, True], [math.nan, math.nan, 900.0]
  ) == (200.0, False)


def test_heatmap_of_b_by_c_marks_censored_grid_points(tmp_path):
  pts = _points(censored=((8, 64, 0), (8, 64, 1), (16, 64, 1)))
  fig = plots.figure_emergence_heatmap(pts)
  ax = fig.axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32", "64"]
  assert [t.get_text() for t in ax.get_yticklabels()] == ["8", "16", "32"]
  hatched = [p for p in ax.patches if p.get_hatch()]
  assert len(hatched) == 2  # B 8 / C 64 (both seeds censored) and B 16 / C 64 (one of two)
  corners = sorted((p.get_x() + 0.5, p.get_y() + 0.5) for p in hatched)
  assert corners == [(2.0, 0.0), (2.0, 1.0)]  # column C 64, rows B 8 and B 16
  texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}
  assert texts[(2, 0)] == "> 5,000"  # both censored at 5,000
  assert texts[(2, 1)].startswith("> ") and "1/2 seeds" in texts[(2, 1)]
  assert not texts[(0, 0)].startswith(">")
  grid = plots.emergence_grid(pts)
  assert grid["censored"].sum() == 2 and len(grid) == 9
  paths = plots.plot_emergence_heatmap(pts, str(tmp_path / "figures" / "emergence_bc"))
  assert [os.path.basename(p) for p in paths] == ["emergence_bc.png", "emergence_bc.pdf"]
  assert all(os.path.getsize(p) > 1000 for p in paths)
  with pytest.raises(ValueError, match="missing .*censored"):
    plots.figure_emergence_heatmap(pts.drop(columns="censored"))


def test_law_band_matches_the_fits_own_prediction_interval():
  """The band drawn is the interval ``ihsweep predict`` and ``LawFit.predict_interval`` give for
  a cell (same covariance, scatter and t quantile), where the fit has them."""
  fit = scaling.fit_law(_points(), n_boot=200)
  b = np.array([8.0, 11.0, 32.0])
  lo, hi, _ = law_figure.law_band(fit, b, np.full(3, 64.0))
  _, lo_fit, hi_fit = fit.predict_interval(b, np.full(3, 64.0), cell=True)
  np.testing.assert_allclose(lo, lo_fit, rtol=1e-9)
  np.testing.assert_allclose(hi, hi_fit, rtol=1e-9)
