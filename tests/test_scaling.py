"""The emergence law with censored cells (analysis.scaling): known answers, the grid-point
bootstrap's coverage, the emerged-only fit's bias, and the law JSON that ihsweep predict reads."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis import law_figure, law_fit, law_points, scaling
from ihsweep.base import law as law_lib
from ihsweep.base.law import Law

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUE = {"log_T": 13.26, "alpha": 0.37, "beta": 0.62}
SIGMA = 0.4
# Stop every cell at 18,000 updates: the law predicts 61,000 at B 4 / C 16 and 2,000 at B 128 /
# C 512, so the budget cuts off the small-B, small-C corner — ~32% of cells (21–44% per draw).
BUDGET = 18_000.0


def _grid(seed, sigma=SIGMA, budget=BUDGET, seeds=2):
  """6 × 6 (B, C) grid × ``seeds`` cells with UPT drawn from the study's law with log-normal
  scatter σ, censored at ``budget`` updates (an emergence.csv's columns)."""
  rng = np.random.default_rng(seed)
  b, c, s = np.meshgrid(
    [4, 8, 16, 32, 64, 128], [16, 32, 64, 128, 256, 512], range(seeds), indexing="ij"
  )
  b, c, s = b.ravel(), c.ravel(), s.ravel()
  upt = np.exp(
    TRUE["log_T"]
    - TRUE["alpha"] * np.log(b)
    - TRUE["beta"] * np.log(c)
    + sigma * rng.standard_normal(b.size)
  )
  cens = upt > budget
  return pd.DataFrame(
    {
      "cell": np.arange(b.size),
      "batch_size": b,
      "context_size": c,
      "seed": s,
      "censored": cens,
      "emergence_step": np.where(cens, np.nan, upt),
      "censor_step": np.where(cens, budget, np.nan),
    }
  )


def test_the_censored_fit_recovers_a_known_law_that_the_emerged_only_fit_misses():
  pts = _grid(seed=3)
  n_cens = int(pts["censored"].sum())
  assert 18 <= n_cens <= 26  # ~30% of 72
  fit = scaling.fit_law(pts, n_boot=1000)
  assert fit.method == law_fit.MLE and fit.n == 72 and fit.n_censored == n_cens
  assert fit.n_emerged == 72 - n_cens and fit.dof == fit.n_emerged - 3 and fit.n_boot == 1000
  assert fit.n_grid_points == 36
  for name, truth in TRUE.items():
    lo, hi = fit.ci[name]
    assert lo <= truth <= hi, (name, lo, hi)
    assert hi - lo < {"log_T": 2.0}.get(name, 0.3)  # informative
  assert fit.ci["sigma"][0] <= SIGMA <= fit.ci["sigma"][1]
  # Censoring takes the slow cells of the slow corner, so least squares on the rest sees UPT
  # too small there: ln T, alpha and beta all shrink. Over 200 draws (test below) the gap
  # MLE − emerged-only was ln T 0.81 ± 0.22 (min 0.39) and beta 0.110 ± 0.033 (min 0.050).
  only = fit.emerged_only
  assert only.method == law_fit.LSQ and only.n == fit.n_emerged and only.n_censored == n_cens
  assert only.log_T < fit.log_T - 0.3 and only.beta < fit.beta - 0.04
  assert not only.ci["beta"][0] <= TRUE["beta"] <= only.ci["beta"][1]  # this draw: excluded
  check = scaling.censored_check(fit, pts)
  assert len(check) == n_cens and check["p_not_emerged"].between(0, 1).all()
  slowest = check["predicted_updates"].idxmax()  # B 4, C 16: predicted ~4x the budget
  assert check.loc[slowest, "p_not_emerged"] > 0.99
  assert check["p_not_emerged"].min() > 0.05  # no censored cell surprises the fit


def test_intervals_cover_the_truth_over_repeated_draws_and_the_emerged_only_fit_is_biased():
  """200 draws of the known-answer grid, 300 resamples each. Measured over 1,000 draws (400
  resamples): coverage ln T 93.6%, alpha 94.0%, beta 94.4%. A count of 200 is binomial with
  sd sqrt(200 · 0.94 · 0.06) = 3.4, so 180–198 (90–99%) is −2.4 to +3 sd around 188. Mean
  bias over 1,000 draws: MLE ln T +0.011, alpha +0.003, beta +0.000; emerged-only ln T −0.80,
  alpha −0.050, beta −0.110 (sd of one estimate 0.34, 0.048, 0.053: the mean of 200 is good
  to 0.024, 0.0034, 0.0037)."""
  n = 200
  hits = {m: dict.fromkeys(TRUE, 0) for m in ("mle", "lsq")}
  est = {m: {k: [] for k in TRUE} for m in ("mle", "lsq")}
  for i in range(n):
    fit = scaling.fit_law(_grid(seed=1000 + i), n_boot=300, seed=i)
    for m, f in (("mle", fit), ("lsq", fit.emerged_only)):
      for k, truth in TRUE.items():
        hits[m][k] += f.ci[k][0] <= truth <= f.ci[k][1]
        est[m][k].append(getattr(f, k))
  bias = {m: {k: float(np.mean(v)) - TRUE[k] for k, v in est[m].items()} for m in est}
  for k in TRUE:
    assert 0.90 <= hits["mle"][k] / n <= 0.99, (k, hits["mle"][k])
  assert abs(bias["mle"]["log_T"]) < 0.07
  assert abs(bias["mle"]["alpha"]) < 0.012 and abs(bias["mle"]["beta"]) < 0.012
  assert -0.9 < bias["lsq"]["log_T"] < -0.7
  assert -0.065 < bias["lsq"]["alpha"] < -0.035
  assert -0.13 < bias["lsq"]["beta"] < -0.09
  assert hits["lsq"]["log_T"] / n < 0.6 and hits["lsq"]["beta"] / n < 0.7  # visibly wrong


def test_the_mle_matches_lifelines():
  """Reference values from lifelines 0.30.3's LogNormalAFTFitter (duration = min(UPT, 20,000),
  event = UPT <= 20,000, covariates ln B and ln C), fitted in a separate environment:
  lifelines needs pandas < 3, which this project does not use, so it is not a test
  dependency. lifelines stops at its own tolerance (~1e-6)."""
  upt = [
    47672,
    53696,
    27783,
    21712,
    16818,
    13568,
    13446,
    22436,
    30280,
    28766,
    29182,
    27671,
    16282,
    10758,
    10038,
    13413,
    16664,
    23757,
    8677,
    11082,
    5782,
    10994,
    4734,
    8760,
    23504,
    20485,
    5249,
    11579,
    9166,
    9779,
    3297,
    5023,
  ]
  b, c, _ = np.meshgrid([8, 16, 32, 64], [16, 32, 64, 128], [0, 1], indexing="ij")
  upt = np.asarray(upt, float)
  pts = pd.DataFrame(
    {
      "batch_size": b.ravel(),
      "context_size": c.ravel(),
      "emergence_step": np.where(upt <= 20_000, upt, np.nan),
      "censor_step": np.where(upt <= 20_000, np.nan, 20_000.0),
    }
  )
  fit = scaling.fit_law(pts, n_boot=0)
  assert fit.n_censored == 12 and fit.ci == {} and fit.cov is None
  assert fit.log_T == pytest.approx(13.652231199813238, abs=1e-5)
  assert fit.alpha == pytest.approx(0.5426338785206235, abs=1e-5)
  assert fit.beta == pytest.approx(0.616816303757853, abs=1e-5)
  assert fit.sigma == pytest.approx(0.35478528104931295, abs=1e-5)


def test_seeds_of_one_grid_point_resample_together():
  """Two seeds that are copies of each other add no information: resampling grid points gives
  the same intervals as one seed per point (resampling cells would narrow them by sqrt 2)."""
  one = _grid(seed=7, seeds=1)
  two = pd.concat([one, one]).reset_index(drop=True)
  a, b = scaling.fit_law(one, n_boot=300, seed=1), scaling.fit_law(two, n_boot=300, seed=1)
  for k in ("log_T", "alpha", "beta", "sigma"):
    assert b.ci[k] == pytest.approx(a.ci[k], abs=1e-6)  # Newton stops at a decrement < 1e-10
    assert getattr(b, k) == pytest.approx(getattr(a, k), abs=1e-6)


def test_json_keys_and_prediction_intervals():
  fit = scaling.fit_law(_grid(seed=3), n_boot=500)
  law = fit.to_dict()
  old = {
    "log_T",
    "T",
    "alpha",
    "beta",
    "r",
    "n",
    "ci",
    "n_censored",
    "n_boot",
    "dof",
    "units",
    "form",
  }
  new = {"sigma", "method", "n_emerged", "cov", "range", "n_grid_points", "study_r"}
  assert set(law) == old | new | {"emerged_only", "lack_of_fit", "separability", "held_out"}
  assert set(law["emerged_only"]) == old | new
  assert law["method"] == "censored log-normal MLE" and law["emerged_only"]["method"] == law_fit.LSQ
  assert law["range"] == {"batch_size": [4, 128], "context_size": [16, 512]}
  assert set(law["ci"]) == {"log_T", "T", "alpha", "beta", "sigma"}
  matrix = np.array(law["cov"]["matrix"])
  assert law["cov"]["names"] == ["log_T", "alpha", "beta"] and law["cov"]["t_dof"] == 35
  assert matrix.shape == (3, 3) and np.allclose(matrix, matrix.T)
  # the covariance's ± t·sd matches the percentile intervals' width to within 15%
  for j, k in enumerate(["log_T", "alpha", "beta"]):
    lo, hi = fit.ci[k]
    assert 2 * 2.03 * math.sqrt(matrix[j, j]) == pytest.approx(hi - lo, rel=0.15), k
  json.dumps(law, allow_nan=False)  # standard JSON
  median, lo, hi = fit.predict_interval(np.array([4.0, 128.0]), 64)
  assert np.allclose(median, fit.predict_updates(np.array([4.0, 128.0]), 64))
  assert np.all(lo < median) and np.all(median < hi)
  _, clo, chi = fit.predict_interval(np.array([4.0, 128.0]), 64, cell=True)
  assert np.all(clo < lo) and np.all(hi < chi)  # a single cell scatters by sigma besides
  # ±t·sigma alone, where the law's own uncertainty is smallest (the grid's centre)
  _, c_lo, c_hi = fit.predict_interval(np.sqrt(4 * 128), np.sqrt(16 * 512), cell=True)
  assert math.log(c_hi / c_lo) / 2 == pytest.approx(2.03 * fit.sigma, rel=0.2)


def test_r_and_intervals_are_withheld_below_three_degrees_of_freedom():
  pts = _grid(seed=3, budget=1e9).iloc[[0, 14, 27, 40, 60]]  # 5 cells, 3 coefficients
  fit = scaling.fit_law(pts, n_boot=500)
  law = fit.to_dict()
  assert fit.dof == 2 and law["r"] is None and "2 residual degree(s)" in law["r_note"]
  assert law["ci"] == {} and "cov" not in law and law["emerged_only"]["r"] is None
  assert "2 residual degree(s)" in law["ci_note"]
  with pytest.raises(ValueError, match="no interval"):
    fit.predict_interval(8, 64)
  # 12 cells at 2 grid points, alpha fixed: every resample that identifies beta is the grid
  # itself, so a bootstrap over points would give zero-width intervals; none are given.
  pts = _grid(seed=3, seeds=6, budget=1e9)
  two = scaling.fit_law(
    pts[(pts["batch_size"] == 32) & pts["context_size"].isin([64, 128])], fixed={"alpha": 0.37}
  )
  assert two.dof == 10 and two.r > 0 and two.ci == {} and two.n_boot == 0
  assert two.ci_note.startswith("2 grid point(s) with emerged cells for 2 coefficient(s)")


def test_fixed_coefficients_hold_in_both_fits():
  pts = _grid(seed=3)
  pts = pts[pts["batch_size"] == 32]  # C varies only; the budget censors one cell at C 16
  with pytest.raises(
    law_points.FitError, match="only C varies: hold alpha fixed.*--fix alpha=0.37"
  ):
    scaling.fit_law(pts)
  fit = scaling.fit_law(pts, fixed={"alpha": 0.37}, n_boot=300)
  assert fit.n_censored > 0
  for f in (fit, fit.emerged_only):
    assert f.alpha == 0.37 and "alpha" not in f.ci and f.fixed == {"alpha": 0.37}
    assert f.cov[1].tolist() == [0.0, 0.0, 0.0] and f.dof == f.n_emerged - 2
  assert fit.ci["beta"][0] <= TRUE["beta"] <= fit.ci["beta"][1]


def test_a_fix_is_suggested_only_where_that_fit_succeeds():
  two = pd.DataFrame(
    {"batch_size": [8, 16], "context_size": [64, 64], "emergence_step": [1200.0, 900.0]}
  )
  with pytest.raises(law_points.FitError) as e:
    scaling.fit_law(two)
  assert "--fix" not in str(e.value)  # fixing beta leaves 2 coefficients for 2 cells
  three = pd.concat(
    [two, pd.DataFrame({"batch_size": [32], "context_size": [64], "emergence_step": [700.0]})]
  )
  with pytest.raises(law_points.FitError, match="only B varies: hold beta fixed.*--fix beta=0.62"):
    scaling.fit_law(three)
  assert scaling.fit_law(three, fixed={"beta": 0.62}).alpha > 0  # the suggested fit works
  censored = three.assign(emergence_step=[1200.0, np.nan, np.nan], censor_step=[np.nan, 2e3, 2e3])
  with pytest.raises(law_points.FitError, match=r"train the 2 censored cell\(s\) longer"):
    scaling.fit_law(censored)


def test_a_censored_row_needs_its_censor_step(tmp_path):
  f = tmp_path / "points.csv"
  f.write_text(
    "batch_size,context_size,emergence_step,censor_step\n8,16,1200,\n16,16,900,\n8,32,,\n"
  )
  with pytest.raises(
    law_points.FitError, match="censor_step: line 4 is censored .* has no censor_step"
  ):
    scaling.fit_law(law_points.read_points(str(f)))
  f.write_text("batch_size,context_size,emergence_step\n8,16,1200\n16,16,\n")
  with pytest.raises(
    law_points.FitError, match="column censor_step is missing: line 3 is censored"
  ):
    scaling.fit_law(law_points.read_points(str(f)))
  f.write_text("batch_size,context_size,emergence_step,censored,censor_step\n8,16,1200,true,0\n")
  with pytest.raises(law_points.FitError, match="censor_step must be positive.*line 2 has 0.0"):
    scaling.fit_law(law_points.read_points(str(f)))


def test_ihsweep_predict_gives_the_fitted_law_s_interval_and_warns_outside_its_range(tmp_path):
  fit = scaling.fit_law(_grid(seed=3), n_boot=500)
  path = tmp_path / "law.json"
  path.write_text(json.dumps(fit.to_dict()))
  law = Law.from_json(str(path))
  assert law.interval(8, 64) == pytest.approx(fit.predict_interval(8, 64)[1:], rel=1e-9)
  assert law.interval(8, 64, cell=True) == pytest.approx(
    fit.predict_interval(8, 64, cell=True)[1:], rel=1e-9
  )
  assert law.range_warnings(8, 64) == []

  def predict(*flags):
    r = subprocess.run(
      [sys.executable, "-m", "ihsweep.cli", "predict", *flags],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r

  r = predict("--batch_size=8", "--context_size=1024", f"--law={path}", "--json")
  out = json.loads(r.stdout)
  lo, hi = out["interval"]["updates"]
  assert lo < out["updates"] < hi and out["interval"]["tokens"][0] == pytest.approx(lo * 8 * 1024)
  assert (lo, hi) == pytest.approx(law.interval(8, 1024))
  p_lo, p_hi = out["prediction_interval"]["updates"]
  assert p_lo < lo and hi < p_hi and out["prediction_interval"]["sigma"] == fit.sigma
  warning = "fitted on C 16–512; 1024 is 2× beyond"
  assert len(out["warnings"]) == 1 and warning in out["warnings"][0] and warning in r.stderr
  r = predict("--batch_size=2", "--context_size=64", f"--law={path}")
  assert "95% interval of the law's median" in r.stdout and "prediction interval" in r.stdout
  assert "fitted on B 4–128; 2 is 2× below" in r.stderr
  r = predict("--batch_size=8", "--context_size=1024", "--json")  # the study's law: no interval
  out = json.loads(r.stdout)
  assert out["interval"] is None and "published without intervals" in out["interval_note"]
  assert out["warnings"] == [] and r.stderr == ""
  old = {k: v for k, v in fit.to_dict().items() if k in ("log_T", "alpha", "beta", "r", "ci")}
  path.write_text(json.dumps(old))  # a law file from before the censored fit
  r = predict("--batch_size=8", "--context_size=1024", f"--law={path}")
  assert "no interval:" in r.stdout and "stores no coefficient covariance" in r.stdout


def test_fit_law_cli_prints_both_fits_sigma_and_the_censored_cells(tmp_path, capsys):
  from analysis import __main__ as cli

  csv = tmp_path / "emergence.csv"
  pts = _grid(seed=3)
  pts.to_csv(csv, index=False)
  assert cli.main(["fit-law", "--csv", str(csv), "--n_boot", "300"]) == 0
  out, err = capsys.readouterr()
  law = json.loads(out)  # stdout stays one JSON object
  assert (
    law["n_censored"] == int(pts["censored"].sum()) and law["emerged_only"]["n"] == law["n_emerged"]
  )
  lines = err.splitlines()
  assert lines[0].startswith(
    "law: ln UPT = ln T - alpha ln B - beta ln C (updates); 95% "
    "intervals from 300 bootstrap resamples of 36 grid points"
  )
  assert lines[1].split() == ["ln", "T", "alpha", "(B)", "beta", "(C)", "sigma", "r", "cells"]
  mle, only, study = lines[2].split(), lines[3].split(), lines[4].split()
  assert mle[:2] == ["censored", "MLE"] and mle[2] == f"{law['log_T']:.2f}"
  assert mle[-3:] == ["72", f"({law['n_censored']}", "censored)"]
  assert only[:2] == ["emerged", "only"] and only[2] == f"{law['emerged_only']['log_T']:.2f}"
  assert only[-4:] == [str(law["n_emerged"]), f"(+{law['n_censored']}", "left", "out)"]
  assert study[:3] == ["study", "(published)", "13.26"]
  assert f"{law['n_censored']} of 72 cells censored" in lines[5]
  assert lines[6].startswith(f"sigma = {law['sigma']:.3f}")
  assert [line.split(":")[0] for line in lines if line.startswith("lack of fit")] == [
    "lack of fit in C",
    "lack of fit in B",
  ]  # a power law: none found
  few = tmp_path / "few.csv"
  pts.iloc[[40, 45, 50, 55, 60]].to_csv(few, index=False)  # 5 emerged cells: 2 dof
  assert cli.main(["fit-law", "--csv", str(few)]) == 0
  out, err = capsys.readouterr()
  assert json.loads(out)["r"] is None
  assert "r not reported: 2 residual degree(s) of freedom (fewer than 3)" in err
  assert err.splitlines()[2].split()[-2:] == ["-", "5"]  # no r in the table


def test_study_r_scores_the_published_law_on_these_cells():
  """law.json's study_r: the study's published law (ln T 13.26, α 0.37, β 0.62) scored on the
  fit's emerged cells — about 1 on cells that follow it (1% scatter: an exact law leaves the
  fit's sigma at 0), compare()'s 'study v2' r on any, and not the published 0.98 (which is on
  the study's own cells)."""
  b, c = np.meshgrid([8.0, 16, 32, 64], [64.0, 128, 256, 512])
  b, c = b.ravel(), c.ravel()
  rng = np.random.default_rng(0)
  study = np.exp(law_lib.STUDY["log_T"] - 0.37 * np.log(b) - 0.62 * np.log(c))
  close = study * np.exp(rng.normal(0, 0.01, b.size))
  noisy = study * np.exp(rng.normal(0, 0.3, b.size)) * (b / 8) ** 0.3  # a different law
  for steps, want in ((close, 1.0), (noisy, None)):
    pts = pd.DataFrame({"batch_size": b, "context_size": c, "emergence_step": steps})
    fit = scaling.fit_law(pts, n_boot=0)
    law = fit.to_dict()
    row = scaling.compare(fit).set_index("law").loc["study v2 (published)"]
    assert law["study_r"] == pytest.approx(row["r"], abs=1e-12)
    if want is not None:
      assert law["study_r"] == pytest.approx(want, abs=2e-3)
    else:
      assert law["study_r"] < 0.95


def test_censor_turns_rows_censored_at_their_last_checkpoint():
  """``censor``: the sensitivity of the law to models that emerged just before their cap — the
  rows of a mask become censored at their ``last_step``, and the fit treats them as any other
  censored cell."""
  pts = _grid(seed=3).assign(last_step=BUDGET)
  em = np.flatnonzero(~pts["censored"].to_numpy())[:2]
  mask = np.zeros(len(pts), bool)
  mask[em] = True
  out = law_points.censor(pts, mask)
  assert out["censored"].sum() == pts["censored"].sum() + 2
  assert out.loc[mask, "censor_step"].tolist() == [BUDGET, BUDGET]
  assert out.loc[mask, "emergence_step"].isna().all()
  pd.testing.assert_frame_equal(out[~mask], pts[~mask], check_dtype=False)
  by_hand = pts.copy()
  by_hand.loc[mask, ["censored", "emergence_step", "censor_step"]] = [True, np.nan, BUDGET]
  a, b = scaling.fit_law(out, n_boot=0), scaling.fit_law(by_hand, n_boot=0)
  assert (a.alpha, a.beta, a.log_T, a.n_censored) == (b.alpha, b.beta, b.log_T, b.n_censored)
  assert a.n_censored == pts["censored"].sum() + 2
  with pytest.raises(law_points.FitError, match="no such column"):
    law_points.censor(pts.drop(columns="last_step"), mask)


def test_the_scatters_interval_stays_at_or_above_zero():
  """The small-sample widening moves an interval's ends away from the estimate; σ's interval,
  on ln σ, cannot cross 0 (a linear one went to -0.02 on five grid points), and where 2.5% or
  more of the resamples fitted a law exactly (σ* = 0) its high end is unbounded."""
  from analysis.censored_fit import percentile_intervals as _percentiles

  sigmas = np.array([0.001, 0.01, 0.02, 0.2, 0.21])
  lo, hi = _percentiles(np.zeros((5, 0)), [], {}, sigmas, 0.15, factor=2.0)["sigma"]
  # basic interval on ln σ: ln 0.15 ∓ 2 (ln q − ln 0.15), q the 97.5% / 2.5% quantiles
  assert lo == pytest.approx(0.15 * (0.15 / 0.209) ** 2, rel=1e-9) and lo > 0
  assert hi == pytest.approx(0.15 * (0.15 / 0.0019) ** 2, rel=1e-9)
  zeros = np.array([0.0, 0.0, 0.1, 0.2, 0.21])
  assert _percentiles(np.zeros((5, 0)), [], {}, zeros, 0.15, 2.0)["sigma"][1] == math.inf


def _exact_u(b, c):  # an exact U in C (no noise): σ is the law's lack of fit alone
  return 9.0 - 0.8 * np.log(b) + 0.6 * (np.log(c / 32) / np.log(2)) ** 2


def test_the_scatters_interval_contains_it_on_an_exact_u():
  """Issue 58: on an exact U in C every resample's σ* fell below σ̂ (a repeated grid point adds
  no lack of fit), and the percentile interval printed σ = 0.60 beside [0.33, 0.59]. The basic
  interval on ln σ starts at σ̂ there (every σ* below it) and reaches above it; so does the
  emerged-only fit's."""
  rows = [
    dict(batch_size=b, context_size=c, seed=s, emergence_step=float(np.exp(_exact_u(b, c))))
    for b in (8, 16, 32, 64)
    for c in (16, 32, 64, 128)
    for s in range(2)
  ]
  fit = scaling.fit_law(pd.DataFrame(rows), held_out=False, shape_tests=False)  # 2000
  assert fit.sigma == pytest.approx(0.600, abs=5e-4)
  lo, hi = fit.ci["sigma"]
  assert lo == fit.sigma and hi == pytest.approx(1.05, abs=0.03), (lo, hi)
  only = fit.emerged_only
  assert only.ci["sigma"][0] <= only.sigma < only.ci["sigma"][1], (only.sigma, only.ci)


def test_a_count_no_counter_holds_is_refused(tmp_path):
  """An emergence_step of 1e300 was fitted (α −36.6, exit 0)."""
  f = tmp_path / "points.csv"
  f.write_text(
    "batch_size,context_size,emergence_step\n8,64,1000\n16,64,800\n8,128,700\n16,128,1e300\n"
  )
  with pytest.raises(
    law_points.FitError, match=r"emergence_step: line 5 has 1e\+300, more than any"
  ):
    scaling.fit_law(law_points.read_points(str(f)))


def _shaped_grid(shape, rng, seeds=2, sigma=0.1, censor_above=None):
  """Cells of a 3 × 3 grid, B 8–32 × C 16–64, ln UPT = shape(B, C) + N(0, σ²); with
  ``censor_above``, cells past it censored there."""
  rows = []
  for b in (8, 16, 32):
    for c in (16, 32, 64):
      for s in range(seeds):
        step = float(np.exp(shape(b, c) + rng.normal(0, sigma)))
        row = {"batch_size": b, "context_size": c, "seed": s, "emergence_step": step}
        row.update(censored=False, censor_step=np.nan)
        if censor_above and step > censor_above:
          row.update(emergence_step=np.nan, censored=True, censor_step=censor_above)
        rows.append(row)
  return pd.DataFrame(rows)


def _power(b, c):
  return 9.0 - 0.8 * np.log(b) - 0.3 * np.log(c)


def _u_in_c(b, c):  # C = 32 fastest at every B: 0.6 ln units slower one octave either side
  return 9.0 - 0.8 * np.log(b) + 0.6 * (np.log(c / 32) / np.log(2)) ** 2


def test_lack_of_fit_flags_a_u_in_c_and_not_a_power_law():
  """Known answers: a U-shaped truth in C is flagged with the words the summary uses, B (a
  power law there) is not; data from the power law are not flagged in either axis, at 20
  noise draws (a 1% test: a false flag would be a 1-in-100 event per axis and draw) and with
  censored cells."""
  rng = np.random.default_rng(0)
  fit = scaling.fit_law(_shaped_grid(_u_in_c, rng), n_boot=0)
  by = {t.symbol: t for t in fit.lack_of_fit}
  # 9 grid points, 4 coefficients of the free model: F(1, 5) on the points (seeds averaged)
  assert by["C"].lacks_fit and (by["C"].dof, by["C"].dof_resid) == (1, 5)
  assert by["C"].p_value < 1e-3 and by["C"].n_points == 9
  assert by["C"].fastest == {8.0: 32.0, 16.0: 32.0, 32.0: 32.0}
  assert (
    by["C"]
    .sentence()
    .startswith("C = 32 is fastest at every B: the power law in C does not describe this grid")
  )
  assert by["C"].offsets[1] < -0.3 < 0.1 < by["C"].offsets[0]  # the U, against the law's line
  assert not by["B"].lacks_fit
  law = fit.to_dict()
  assert [t["lacks_fit"] for t in law["lack_of_fit"]] == [True, False]
  # 40 tests of a 1% test on power-law data: 4 or more flags has binomial probability 8e-4
  # (its level over 1,000 such draws: 1.0% in C, 1.2% in B; benchmarks/calibration.py)
  flags = 0
  for draw in range(20):
    power = scaling.fit_law(_shaped_grid(_power, np.random.default_rng(100 + draw)), n_boot=0)
    flags += sum(t.lacks_fit for t in power.lack_of_fit)
  assert flags <= 3, flags
  censored = _shaped_grid(_u_in_c, np.random.default_rng(1), censor_above=np.exp(7.6))
  assert censored["censored"].eq(True).sum() >= 2
  flagged = {t.symbol: t.lacks_fit for t in scaling.fit_law(censored, n_boot=0).lack_of_fit}
  assert flagged == {"C": True, "B": False}


def test_the_summary_says_the_law_does_not_fit_instead_of_no_clear_dependence():
  from analysis import summary

  rng = np.random.default_rng(0)
  points = _shaped_grid(_u_in_c, rng)
  law = scaling.fit_law(points, n_boot=200).to_dict()
  em = points.assign(censored=False)
  text = " ".join(summary._law_finding(law, em))
  assert "C = 32 is fastest at every B: the power law in C does not describe this grid" in text
  assert "no clear dependence on C" not in text
  law.pop("lack_of_fit")
  assert "C = 32 is fastest" not in " ".join(summary._law_finding(law, em))


def test_the_law_figure_shows_where_c_lacks_fit():
  """The U in C drawn: each C panel gets the law moved to its own cells (dashed, by the mean ln
  residual there) and says by how much; the title and legend carry the test. A power-law grid
  gets neither."""

  points = _shaped_grid(_u_in_c, np.random.default_rng(0))
  fit = scaling.fit_law(points, n_boot=50)
  fig = law_figure.figure_law(fit, points)
  assert "the power law does not describe C here (p < 1e-4)" in fig._suptitle.get_text()
  titles = [ax.get_title() for ax in fig.axes[1:]]
  res = fit.residuals
  for ax, c, title in zip(fig.axes[1:], (16, 32, 64), titles):
    shift = res.loc[res["context_size"] == c, "residual_ln"].mean()
    assert title == f"C = {c}: {math.exp(shift) - 1:+.0%} against the law", titles
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"][0].get_ydata()
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"][0].get_ydata()
    np.testing.assert_allclose(dashed, solid * math.exp(shift), rtol=1e-9)
  assert titles[1].startswith("C = 32: -") and titles[0].startswith("C = 16: +")
  legend = " ".join(t.get_text() for t in fig.axes[1].get_legend().get_texts())
  assert "lack of fit in C: F(1, 5) = " in legend.replace("\n", " ")
  power = scaling.fit_law(_shaped_grid(_power, np.random.default_rng(100)), n_boot=50)
  plain = law_figure.figure_law(power, None)
  assert "does not describe" not in plain._suptitle.get_text()
  assert [ax.get_title() for ax in plain.axes[1:]] == ["C = 16", "C = 32", "C = 64"]
  assert not any(ln.get_linestyle() == "--" for ax in plain.axes[1:] for ln in ax.get_lines())


def test_a_late_censored_cell_beside_near_exact_points_finds_the_maximum():
  """Integer-rounded points of a law (scatter ~1e-5) and one cell censored at 5x its
  prediction: the Newton start has sigma ~1e-5, where the censored term's curvature h(h - u)
  cancelled to a negative number, the decrement went negative and the start was taken for the
  maximum (alpha 0.37 [0.37, 0.37], sigma 1.6e-5). The log-likelihood is concave (Olsen 1978):
  the fit must reach the maximum a sensible start (sigma 0.3) finds."""
  from analysis.censored_fit import fit_mle, log_likelihood

  rows = [
    {"batch_size": b, "context_size": c, "seed": s, "emergence_step": round(_study(b, c))}
    for b in (8, 16, 32)
    for c in (64, 128, 256)
    for s in (0, 1)
  ]
  late = {"batch_size": 8, "context_size": 64, "seed": 2, "emergence_step": np.nan}
  points = pd.DataFrame(rows + [{**late, "censor_step": 5 * _study(8, 64)}])
  fit = scaling.fit_law(points, n_boot=0)
  x = np.column_stack(
    [np.ones(len(points)), -np.log(points.batch_size), -np.log(points.context_size)]
  )
  emerged = points.emergence_step.notna().to_numpy()
  v = np.log(points.emergence_step.fillna(points.censor_step).to_numpy(float))
  a = np.concatenate([-x, v[:, None]], axis=1)
  ones = np.ones((1, len(v)))
  coef0 = np.linalg.lstsq(x[emerged], v[emerged], rcond=None)[0]
  best, ok = fit_mle(a, emerged, ones, np.append(coef0 / 0.3, 1 / 0.3)[None])
  assert ok[0]
  got = np.append(np.array([fit.log_T, fit.alpha, fit.beta]) / fit.sigma, 1 / fit.sigma)[None]
  assert (
    log_likelihood(got, a, emerged, ones)[0] >= log_likelihood(best, a, emerged, ones)[0] - 1e-6
  )
  assert fit.sigma > 0.1 and fit.alpha > 0.45  # the late cell pulls the law: not the start


def _study(b, c):
  return math.exp(13.26 - 0.37 * math.log(b) - 0.62 * math.log(c))


def test_lack_of_fit_grid_points_are_b_and_c_whatever_other_columns_say():
  """An n_params column (several model sizes, or empty values) does not split or drop grid
  points: the test's unit is the (B, C) point, the bootstrap's cluster without the n_params
  term. Before, two model sizes per point doubled the points (F(1, 14), p = 0.0014 on a power
  law) and empty values dropped every row ('C has 0 value(s)')."""
  base = _shaped_grid(_power, np.random.default_rng(7))
  plain = scaling.fit_law(base, n_boot=0).to_dict()["lack_of_fit"]
  for n_params in ([1e5, 1e6] * (len(base) // 2), [np.nan] * len(base)):
    other = scaling.fit_law(base.assign(n_params=n_params), n_boot=0).to_dict()["lack_of_fit"]
    assert [(t["n_points"], t["p_value"]) for t in other] == [
      (t["n_points"], t["p_value"]) for t in plain
    ]
    assert all(t["n_points"] == 9 for t in other)


def test_too_few_resamples_give_no_interval_and_a_negative_seed_is_refused(tmp_path):
  few = scaling.fit_law(_shaped_grid(_power, np.random.default_rng(8)), n_boot=2)
  assert few.ci == {} and few.cov is None and "cannot place a 95% interval" in few.ci_note
  csv = tmp_path / "points.csv"
  _shaped_grid(_power, np.random.default_rng(8)).to_csv(csv, index=False)
  r = subprocess.run(
    [sys.executable, "-m", "analysis", "fit-law", "--csv", str(csv), "--seed", "-1"],
    capture_output=True, text=True, cwd=ROOT,
  )  # fmt: skip
  assert r.returncode == 2 and r.stderr.strip().endswith(
    "--seed -1: must be >= 0 (numpy's generator seeds)"
  )
  assert "Traceback" not in r.stderr
