"""The report's verdicts hold their stated level on known truths: a small, fixed-seed version of
benchmarks/calibration.py (its full numbers: docs/benchmarks.md, "Calibration of the report's
verdicts"). Each bound is a binomial quantile at 1e-3 of the stated level over the draws, so a
calibrated verdict fails it 1 time in 1,000 and a miscalibrated one (the cell-level lack-of-fit
test flagged such grids at 18%) fails it surely."""

import pathlib
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import calibration  # noqa: E402

from analysis import scaling  # noqa: E402

# The truths of issue 44: the study's law on the exp1 grid, each point off the law by its own
# N(0, 0.3²) shared by its 2 seeds, seed scatter 0.15, the slowest 20% capped.
POINTS_DEVIATE = calibration.Truth(sigma_point=0.3, sigma_seed=0.15, censored=0.2)


def _at_most(level: float, draws: int) -> int:
  return int(stats.binom.ppf(1 - 1e-3, draws, level))


def _at_least(rate: float, draws: int) -> int:
  return int(stats.binom.ppf(1e-3, draws, rate))


def test_lack_of_fit_holds_its_level_when_grid_points_deviate():
  draws = 150
  got = calibration.lack_of_fit(POINTS_DEVIATE, draws, seed=1)
  bound = _at_most(0.01, draws)  # 6 of 150
  for test in ("C", "B", "BxC"):  # each axis and the separability test
    assert got[f"flagged_{test}"] * draws <= bound, got
    # p < 0.1 (rejected or "some evidence against") at its 10%
    assert (got[f"flagged_{test}"] + got[f"some_{test}"]) * draws <= _at_most(0.1, draws), got
  assert got["untested_C"] == got["untested_B"] == got["untested_BxC"] == 0, got


# Issue 56: the study's design gives every cell one token budget, so a cell's cap in updates is
# tokens / (B·C): about half of the grid censored, at different updates, and here varying by seed.
TOKEN_CAPS = calibration.Truth(
  sigma_point=0.3, sigma_seed=0.15, censored=0.5, cap="tokens", seed_cap_spread=0.3
)


def test_lack_of_fit_and_separability_hold_their_level_under_token_budget_caps():
  draws = 300
  got = calibration.lack_of_fit(TOKEN_CAPS, draws, seed=11)
  for test in ("C", "B", "BxC"):
    assert got[f"flagged_{test}"] * draws <= _at_most(0.01, draws), got  # 9 of 300


def test_separability_finds_an_exponent_that_drifts_by_as_much_as_alpha():
  """α changes by 0.37 from the smallest to the largest C of the exp1 grid (point scatter 0.1,
  seed scatter 0.1): flagged in at least 90% of grids; the axis tests stay at their level."""
  draws = 60
  truth = calibration.Truth(sigma_point=0.1, sigma_seed=0.1, interaction=0.37)
  got = calibration.lack_of_fit(truth, draws, seed=12)
  assert got["flagged_BxC"] * draws >= _at_least(0.9, draws), got  # 47 of 60
  assert got["flagged_C"] * draws <= _at_most(0.01, draws), got
  assert got["flagged_B"] * draws <= _at_most(0.01, draws), got


@pytest.mark.parametrize("truth", [POINTS_DEVIATE, TOKEN_CAPS], ids=["20% capped", "token caps"])
def test_held_out_prediction_intervals_cover_left_out_cells(truth):
  """Each grid point left out and predicted by the law refitted on the others: 95% of its
  emerged cells inside their 95% one-cell interval, within 3.3 standard errors (the draws'
  spread: a two-sided 1e-3 bound) and 2.5 points."""
  got = calibration.held_out(truth, 30, seed=13)
  assert abs(got["held_out_coverage"] - 0.95) <= max(3.3 * got["held_out_coverage_se"], 0.0), got
  assert abs(got["held_out_coverage"] - 0.95) <= 0.025, got


def test_lack_of_fit_flags_a_u_of_half_a_ln_unit():
  draws = 60
  truth = calibration.Truth(sigma_point=0.2, sigma_seed=0.15, u_shape=0.5)
  got = calibration.lack_of_fit(truth, draws, seed=2)
  assert got["flagged_C"] * draws >= _at_least(0.9, draws), got  # 47 of 60
  assert got["flagged_B"] * draws <= _at_most(0.01, draws), got


def test_law_intervals_cover_the_truth():
  draws = 60
  got = calibration.coverage(POINTS_DEVIATE, draws, seed=3, n_boot=200)
  assert got["without_intervals"] == 0, got
  for name in ("log_T", "alpha", "beta"):
    assert got[f"coverage_{name}"] * draws >= _at_least(0.95, draws), got  # 52 of 60


def test_censored_check_marks_no_cell_of_a_law_that_holds():
  draws = 40
  got = calibration.censored_check(POINTS_DEVIATE, draws, seed=4)
  assert got["false_alarm"] * draws <= _at_most(0.01, draws), got  # 2 of 40


def test_emergence_detector_on_curves_with_a_known_transition():
  """Checkpoints 4 per octave (0.17 ln units apart): the threshold crossing lands within a
  checkpoint interval of the true midpoint; curves without a jump, or whose jump comes after
  the last checkpoint, are censored."""
  got = calibration.detector(200, seed=5)
  assert abs(got["median_error_ln"]) < 0.03 and got["p95_abs_error_ln"] < 0.17, got
  assert got["missed"] == got["false_emergence_flat"] == got["false_emergence_late"] == 0, got


def _exact(shape, bs=(8, 16, 32, 64, 128), cs=(64, 128, 256, 512, 1024), seeds=2, scale=1.0):
  rows = []
  for b in bs:
    for c in cs:
      z = (np.log(c) - np.log(cs).mean()) / (np.log(cs).max() - np.log(cs).mean())
      y = calibration.law_ln_upt(b, c) + (0.5 * (2 * z**2 - 1) if shape == "u" else 0.0)
      step = np.exp(y) * scale
      rows += [
        dict(batch_size=b, context_size=c, seed=s, emergence_step=step) for s in range(seeds)
      ]
  return pd.DataFrame(rows)


@pytest.mark.parametrize(
  "name, points",
  [
    ("exact law", _exact("law")),
    ("exact law, 1 seed", _exact("law", seeds=1)),
    ("exact law, 3 x 3", _exact("law", bs=(8, 16, 32), cs=(16, 32, 64))),
    ("fractional B", _exact("law", bs=(8.5, 16.25, 32.1, 64.7, 128.3))),
    ("steps of 1e-300", _exact("law", scale=1e-303)),
    (
      "integer-rounded law",
      _exact("law").assign(emergence_step=lambda d: d.emergence_step.round()),
    ),
    ("exact U", _exact("u")),
    ("exact U, 3 x 3", _exact("u", bs=(8, 16, 32), cs=(16, 32, 64))),
    ("integer-rounded U", _exact("u").assign(emergence_step=lambda d: d.emergence_step.round())),
  ],
)
def test_exact_and_near_exact_points_fit(name, points):
  """Each input crashed the bootstrap (LinAlgError: Singular matrix) or stopped the fit. Exact
  data fit with σ = 0 and say why there are no intervals; an exact U is flagged in C, an exact
  (or integer-rounded) power law in neither axis."""
  fit = scaling.fit_law(points, n_boot=200)
  by = {t.symbol: t for t in fit.lack_of_fit}
  assert by["C"].tested and by["B"].tested
  assert by["C"].lacks_fit == ("U" in name) and not by["B"].lacks_fit, [
    t.sentence() for t in fit.lack_of_fit
  ]
  if name.startswith("exact law") or name in ("fractional B", "steps of 1e-300"):
    assert fit.sigma < 1e-6 and fit.ci == {} and "exactly on a law" in fit.ci_note
    assert abs(fit.alpha - 0.37) < 1e-6 and abs(fit.beta - 0.62) < 1e-6
  else:
    assert fit.ci, fit.ci_note


def test_an_axis_that_cannot_be_tested_says_why():
  two_c = _exact("law", cs=(64, 128)).assign(
    emergence_step=lambda d: d.emergence_step * 1.1**d.seed
  )
  by = {t.symbol: t for t in scaling.fit_law(two_c, n_boot=0).lack_of_fit}
  assert not by["C"].tested and "C has 2 value(s) in the grid" in by["C"].reason
  assert by["C"].to_dict()["sentence"].startswith("lack of fit in C not tested: C has 2 value(s)")
  heavy = calibration.draw(
    calibration.Truth(grid="6x6", sigma_point=0.3, censored=0.8), np.random.default_rng(3)
  )
  law = scaling.fit_law(heavy, n_boot=0).to_dict()
  c, b = law["lack_of_fit"]
  assert (
    not c["tested"] and "left out, no grid point there has all its cells emerged" in c["reason"]
  )
  assert all(t["sentence"] for t in law["lack_of_fit"])
