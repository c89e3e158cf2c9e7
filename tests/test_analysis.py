"""Analysis: known-answer emergence points and law fits, frontier and factorial tables, curves
recomputed from checkpoints (== the online metrics), cache, report, partial and bad input."""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis import __main__ as cli
from analysis import curves as curves_lib
from analysis import emergence, frontier, law_points, scaling
from ihsweep.compute import schedule
from ihsweep.runs import rundir
from ihsweep.runs.reader import NotARun, load_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = np.asarray(schedule.params_steps(4096, 1, points_per_octave=4))  # 0, 1, …, 4096


# ---------------------------------------------------------------- emergence points (known answers)


@pytest.mark.parametrize("method", emergence.METHODS)
def test_a_step_curve_yields_its_step(method):
  k = int(np.searchsorted(STEPS, 300))
  step = STEPS[k]  # 304: the first checkpoint at the late plateau
  values = np.where(STEPS >= step, 0.8, 0.03)
  e = emergence.emergence_point(STEPS, values, method=method, metric="ps_max")
  assert not e.censored
  assert e.step_after == step and e.step_before == STEPS[k - 1]
  assert STEPS[k - 1] < e.emergence_step <= step  # the step lies in this interval, no finer
  assert e.early == pytest.approx(0.03) and e.late == pytest.approx(0.8)
  assert e.jump == pytest.approx(0.77)


@pytest.mark.parametrize("method", emergence.METHODS)
def test_a_flat_curve_is_censored_at_its_last_step(method):
  rng = np.random.default_rng(0)
  values = 0.03 + 0.01 * rng.standard_normal(len(STEPS))
  e = emergence.emergence_point(STEPS, values, method=method, metric="ps_max")
  assert e.censored and math.isnan(e.emergence_step)
  assert e.censor_step == 4096 and abs(e.jump) < 0.05


@pytest.mark.parametrize("method", emergence.METHODS)
@pytest.mark.parametrize("midpoint", [77.0, 300.0, 1234.0])
def test_a_sigmoid_in_log_steps_yields_its_midpoint_within_one_checkpoint(method, midpoint):
  x = np.log(np.maximum(STEPS, 0.5))
  values = 0.05 + 0.75 / (1 + np.exp(-(x - np.log(midpoint)) / 0.15))
  e = emergence.emergence_point(STEPS, values, method=method, metric="ps_max")
  i = int(np.searchsorted(STEPS, midpoint))  # STEPS[i - 1] < midpoint <= STEPS[i]
  assert STEPS[i - 1] <= e.emergence_step <= STEPS[min(i + 1, len(STEPS) - 1)]
  assert abs(np.log(e.emergence_step) - np.log(midpoint)) <= np.log(STEPS[i] / STEPS[i - 1])


def test_falling_metrics_and_thresholds():
  x = np.log(np.maximum(STEPS, 0.5))
  icl = -3.0 / (1 + np.exp(-(x - np.log(500.0)) / 0.1))  # 0 → −3 nats
  e = emergence.emergence_point(STEPS, icl, metric="icl_score")
  assert not e.censored and abs(np.log(e.emergence_step / 500.0)) < 0.1
  assert e.early == pytest.approx(0.0, abs=1e-6) and e.late == pytest.approx(-3.0, abs=1e-3)
  # An absolute level instead of the midpoint: ps_max = 0.2 is crossed before the midpoint.
  ps = 0.05 + 0.75 / (1 + np.exp(-(x - np.log(500.0)) / 0.3))
  low = emergence.emergence_point(STEPS, ps, metric="ps_max", level=0.2)
  mid = emergence.emergence_point(STEPS, ps, metric="ps_max")
  assert low.emergence_step < mid.emergence_step
  # Too small a jump is censored; a lower min_jump accepts it.
  small = 0.05 + 0.1 * (STEPS >= 300)
  assert emergence.emergence_point(STEPS, small, metric="ps_max").censored
  assert not emergence.emergence_point(STEPS, small, metric="ps_max", min_jump=0.05).censored
  with pytest.raises(ValueError, match="method = 'x'"):
    emergence.emergence_point(STEPS, ps, method="x")


def test_a_jump_at_the_end_of_a_curve_is_flagged():
  """A jump with fewer than 3 checkpoints after it, or in the last checkpoint interval (before a
  final stub such as a cap just past a scheduled checkpoint), is flagged: a slightly shorter run
  would have censored it."""
  assert list(STEPS[-3:]) == [2896, 3444, 4096]
  # 3 checkpoints on the late side (2,896, 3,444, 4,096): no caution
  ok = emergence.emergence_point(STEPS, np.where(STEPS >= 2896, 0.8, 0.03))
  assert (ok.step_after, ok.late_points, ok.last_interval, ok.last_step) == (2896, 3, False, 4096)
  assert emergence.caution(ok.late_points, ok.last_interval) == ""
  # jumped between 2,896 and 3,444: the late plateau rests on 3,444 and 4,096
  e = emergence.emergence_point(STEPS, np.where(STEPS >= 3444, 0.8, 0.03))
  assert not e.censored and (e.step_before, e.step_after) == (2896, 3444)
  assert (e.late_points, e.last_interval) == (2, False)
  assert emergence.caution(e.late_points, e.last_interval) == "plateau on 2 checkpoints"
  # a cap at 4,300, just past the checkpoint at 4,096: the jump between 3,444 and 4,096 is in
  # the last interval before it (as 4,096 → 4,871 with a cap at 5,044)
  capped = np.append(STEPS, 4300)
  e = emergence.emergence_point(capped, np.where(capped >= 4096, 0.8, 0.03))
  assert (e.step_before, e.step_after, e.last_step) == (3444, 4096, 4300)
  assert (e.late_points, e.last_interval) == (2, True)
  assert emergence.caution(e.late_points, e.last_interval) == (
    "last interval, plateau on 2 checkpoints"
  )
  # a jump seen at the last checkpoint alone is censored (the late plateau, the median of the
  # last 3 checkpoints, is still the early level); max_slope puts it in the last interval
  only_last = np.where(STEPS >= 4096, 0.8, 0.03)
  assert emergence.emergence_point(STEPS, only_last).censored
  e = emergence.emergence_point(STEPS, only_last, method="max_slope", min_jump=0.0, level=0.3)
  assert not e.censored and e.step_after == 4096 == e.last_step
  assert (e.late_points, e.last_interval) == (1, True)
  assert emergence.caution(1, True) == "last interval, plateau on 1 checkpoint"
  # censored: nothing to flag
  flat = emergence.emergence_point(STEPS, np.full(len(STEPS), 0.03))
  assert flat.censored and flat.late_points == 0 and not flat.last_interval
  assert emergence.caution(flat.late_points, flat.last_interval) == ""
  # the table carries the columns; cautions() reads them ('' for censored or missing columns)
  curves = _synthetic_curves({0: 256, 1: 3444, 2: None})
  table = emergence.primary(emergence.emergence_table(curves))
  assert list(table["late_points"]) == [int((STEPS >= 256).sum()), 2, 0]
  assert list(emergence.cautions(table)) == ["", "plateau on 2 checkpoints", ""]
  old = table.drop(columns=["late_points", "last_interval"])
  assert list(emergence.cautions(old)) == ["", "", ""]


def _synthetic_curves(steps_by_cell: dict, extra=None) -> pd.DataFrame:
  rows = []
  for cell, step in steps_by_cell.items():
    for s in STEPS:
      jumped = step is not None and s >= step
      rows.append(
        {
          "run": "r",
          "cell": cell,
          "seed": cell % 2,
          "batch_size": 8,
          "context_size": 32,
          "step": int(s),
          "ps_max": 0.8 if jumped else 0.02,
          "ar_acc": 0.9 if jumped else 0.01,
          **(extra or {}).get(cell, {}),
        }
      )
  return pd.DataFrame(rows)


def test_emergence_table_and_agreement():
  curves = _synthetic_curves({0: 128, 1: 512, 2: 2048, 3: None})
  table = emergence.emergence_table(curves, metrics=("ps_max", "ar_acc"))
  assert len(table) == 4 * 2 * 3
  ps = emergence.primary(table)
  assert list(ps["censored"]) == [False, False, False, True]
  assert list(ps["step_after"][:3]) == [128, 512, 2048]
  assert ps["emergence_tokens"][0] == pytest.approx(ps["emergence_step"][0] * 8 * 32)
  agree = emergence.agreement(table).set_index(["metric", "method"])
  same = agree.loc[("ar_acc", "threshold")]  # same jumps → same steps
  assert same["same_status"] == 1.0 and same["both"] == 3
  assert same["median_log10_ratio"] == pytest.approx(0.0, abs=1e-9)
  assert same["pearson_r"] == pytest.approx(1.0)


# ---------------------------------------------------------------- the law (known answers)


def _law_points(sigma=0.1, seed=0, log_t=13.26, alpha=0.37, beta=0.62, gamma=0.0, n_params=None):
  rng = np.random.default_rng(seed)
  rows = []
  for b in (4, 8, 16, 32, 64):
    for c in (64, 128, 256, 512, 1024):
      n = 1e6 if n_params is None else float(rng.choice(n_params))
      upt = math.exp(log_t + gamma * math.log(n) + sigma * rng.standard_normal()) / (
        b**alpha * c**beta
      )
      rows.append({"batch_size": b, "context_size": c, "emergence_step": upt, "n_params": n})
  return pd.DataFrame(rows)


def test_median_over_all_seeds_bounds_a_censored_median():
  from analysis.report import _median_all

  def cells(*seeds):  # (emergence_step or None if censored, censor_step)
    return pd.DataFrame(
      {
        "censored": [e is None for e, _ in seeds],
        "emergence_step": [np.nan if e is None else e for e, _ in seeds],
        "censor_step": [c for _, c in seeds],
      }
    )

  assert _median_all(cells((394, 1200), (581, 1200))) == "488"
  # One of two seeds censored at 1,200: the median exceeds (394 + 1,200) / 2, not 1,200.
  assert _median_all(cells((394, 1200), (None, 1200))) == "> 797"
  assert _median_all(cells((100, 900), (None, 800), (None, 900))) == "> 800"
  assert _median_all(cells((100, 900), (300, 900), (None, 900))) == "300"


def test_law_fit_recovers_the_exponents_with_covering_intervals():
  fit = scaling.fit_law(_law_points(), n_boot=1000)
  assert abs(fit.alpha - 0.37) <= 0.05 and abs(fit.beta - 0.62) <= 0.05
  assert abs(fit.log_T - 13.26) <= 0.3
  for name, truth in (("alpha", 0.37), ("beta", 0.62), ("log_T", 13.26)):
    lo, hi = fit.ci[name]
    assert lo <= truth <= hi, (name, lo, hi)
    assert hi - lo < {"log_T": 1.0}.get(name, 0.2)  # informative, not vacuous
  assert fit.ci["T"][0] <= math.exp(13.26) <= fit.ci["T"][1]
  assert fit.r > 0.95 and fit.n == 25 and fit.n_boot == 1000
  assert fit.residuals["residual_ln"].std() == pytest.approx(0.1, abs=0.05)
  law = fit.to_dict()
  assert set(law) >= {"log_T", "T", "alpha", "beta", "r", "n", "ci"}
  table = scaling.compare(fit).set_index("law")
  assert table.loc["study v2 (published)", "rmse_ln"] < 0.2  # the points follow the study's law
  assert table.loc["v1 form sqrt(BC), T fitted", "rmse_ln"] > 0.2  # α = β = 0.5 does not


def test_law_fit_model_size_fixed_coefficients_and_errors():
  sized = scaling.fit_law(
    _law_points(gamma=0.2, n_params=[1e5, 1e6, 1e7]), with_params=True, n_boot=300
  )
  lo, hi = sized.ci["gamma[n_params]"]
  assert abs(sized.gamma - 0.2) < 0.05 and lo <= 0.2 <= hi
  flat = scaling.fit_law(_law_points(n_params=[1e5, 1e6, 1e7]), with_params=True, n_boot=300)
  assert flat.ci["gamma[n_params]"][0] <= 0.0 <= flat.ci["gamma[n_params]"][1]  # no size effect
  one_b = _law_points()
  one_b = one_b[one_b["batch_size"] == 8]
  with pytest.raises(
    law_points.FitError, match="cannot identify log_T, alpha, beta.*only C varies: hold alpha fixed"
  ) as info:
    scaling.fit_law(one_b, csv="runs/my sweep/analysis/emergence.csv")
  message = str(info.value)  # words and the user's own file, no Python dict, no placeholder
  assert "with 1 batch size(s) and 5 context size(s) among them" in message, message
  assert "--csv 'runs/my sweep/analysis/emergence.csv' --fix alpha=" in message, message
  assert "{" not in message and "DIR" not in message, message
  one_c = _law_points()
  with pytest.raises(law_points.FitError, match="only B varies: hold beta fixed"):
    scaling.fit_law(one_c[one_c["context_size"] == 64])
  few = scaling.fit_law(_law_points().iloc[[0, 7, 11, 18, 24]], n_boot=200)  # 2 dof
  assert few.dof == 2 and few.ci == {} and few.n_boot == 0
  fixed = scaling.fit_law(one_b, fixed={"alpha": 0.37}, n_boot=200)
  assert abs(fixed.beta - 0.62) < 0.1 and fixed.alpha == 0.37 and "alpha" not in fixed.ci
  censored = _law_points().assign(censored=False, censor_step=np.nan)
  censored.loc[:4, "emergence_step"] = np.nan  # B = 4: the law predicts 3,600-10,000 updates
  censored.loc[:4, "censored"] = True
  censored.loc[:4, "censor_step"] = [1e5, 5e4, 1e3, 1e3, 1e3]
  cfit = scaling.fit_law(censored, n_boot=0)
  assert cfit.n_censored == 5
  check = scaling.censored_check(cfit, censored)
  # The true law predicts 3,600-10,000 updates for B = 4 (sigma 0.1). Stopped at 100,000:
  # contradicts the law refitted without its point (p 0.0016 < 0.01 / 5, its prediction
  # interval's t; the fit with both far cells widens sigma from 0.1 to 0.33); at 50,000, past
  # the median too, but the refit without it keeps the 100,000 cell, whose sigma excuses it
  # (p 0.023: one outlier can mask another, as in any leave-one-out check); stopped at 1,000,
  # before the median: no evidence either way.
  assert check["before_median"].tolist() == [True, True, False, False, False]
  assert check["contradicts"].tolist() == [True, False, False, False, False]
  assert check["left_out"].all()
  with pytest.raises(law_points.FitError, match="column batch_size must be positive"):
    scaling.fit_law(_law_points().assign(batch_size=0), n_boot=0)
  with pytest.raises(law_points.FitError, match="missing context_size"):
    scaling.fit_law(_law_points().drop(columns="context_size"))


def test_fit_law_cli_json_is_read_by_ihsweep_predict(tmp_path, capsys):
  csv = tmp_path / "points.csv"
  _law_points().to_csv(csv, index=False)
  assert cli.main(["fit-law", "--csv", str(csv), "--n_boot", "200"]) == 0
  law = json.loads(capsys.readouterr().out)
  assert abs(law["alpha"] - 0.37) <= 0.05 and law["n"] == 25 and len(law["ci"]["beta"]) == 2
  path = tmp_path / "law.json"
  path.write_text(json.dumps(law))
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "ihsweep.cli",
      "predict",
      "--batch_size=8",
      "--context_size=1024",
      f"--law={path}",
      "--json",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr
  predicted = json.loads(out.stdout)["updates"]
  assert predicted == pytest.approx(law["T"] / (8 ** law["alpha"] * 1024 ** law["beta"]))
  bad = tmp_path / "bad.csv"
  bad.write_text("batch_size,context_size\n8,32\n")
  assert cli.main(["fit-law", "--csv", str(bad)]) == 2
  assert "missing emergence_step" in capsys.readouterr().err
  for fix, message in (
    ("gamma=0.1", "allowed log_T, alpha, beta (a term's gamma[COLUMN] only with that term"),
    ("alpha=nan", "must be a finite number"),
  ):
    assert cli.main(["fit-law", "--csv", str(csv), "--fix", fix]) == 2
    assert message in capsys.readouterr().err
  text = _law_points().astype({"emergence_step": object})
  text.loc[3, "emergence_step"] = "abc"
  text.to_csv(bad, index=False)
  assert cli.main(["fit-law", "--csv", str(bad)]) == 2
  # the fourth data row: line 5 of the file, counting the header as line 1
  assert "column emergence_step: line 5 has 'abc', not a number" in capsys.readouterr().err


def test_empty_flag_values_are_refused(tmp_path, capsys):
  csv = tmp_path / "points.csv"
  _law_points().to_csv(csv, index=False)
  run = tmp_path / "run"
  run.mkdir()
  for argv, message in (
    (["report", str(run), "--out=", "--noprogress"], "--out= is empty"),
    (["report", "", "--noprogress"], "an empty DIR"),
    (["fit-law", "--csv="], "--csv= is empty"),
    (["fit-law", f"--csv={csv}", "--metric="], "--metric= is empty"),
  ):
    assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, (argv, err)
  assert os.listdir(run) == []


def test_a_coefficient_fixed_twice_is_refused(tmp_path, capsys):
  csv = tmp_path / "points.csv"
  _law_points().to_csv(csv, index=False)
  assert cli.main(["fit-law", "--csv", str(csv), "--fix", "alpha=0.3", "--fix", "alpha=0.5"]) == 2
  err = capsys.readouterr().err
  assert (
    err == "python -m analysis: --fix 'alpha=0.5': alpha is already fixed (--fix "
    "alpha=0.3); give each coefficient once\n"
  )


# ---------------------------------------------------------------- terms beyond B and C


def _terms_points(seed=0, sigma=0.1, gammas=(0.5, -0.8)) -> pd.DataFrame:
  """Two seeds per (B, C, frequency, reliability) point of the law ln T 12, α 0.4, β 0.6, +
  0.5 ln data.frequency − 0.8 ln data.reliability, with scatter ``sigma`` (a seed-wide shift
  of 0.05 besides), n_params constant."""
  rng = np.random.default_rng(seed)
  rows = []
  for s in (0, 1):
    shift = 0.05 * rng.standard_normal()
    for b in (4, 16, 64):
      for c in (64, 256):
        for f in (0.25, 0.5, 1.0):
          for r in (0.5, 0.75, 1.0):
            ln_upt = 12 - 0.4 * math.log(b) - 0.6 * math.log(c) + gammas[0] * math.log(f)
            ln_upt += gammas[1] * math.log(r) + shift + sigma * rng.standard_normal()
            rows.append(
              {
                "seed": s,
                "batch_size": b,
                "context_size": c,
                "data.frequency": f,
                "data.reliability": r,
                "n_params": 1e6,
                "emergence_step": math.exp(ln_upt),
              }
            )
  return pd.DataFrame(rows)


def test_terms_n_params_is_with_params():
  points = _law_points(gamma=0.2, n_params=[1e5, 1e6, 1e7])
  old = scaling.fit_law(points, with_params=True, n_boot=300, seed=0)
  new = scaling.fit_law(points, terms=("n_params",), n_boot=300, seed=0)
  assert new.names == old.names == ["log_T", "alpha", "beta", "gamma[n_params]"]
  assert new.terms == ("n_params",) and new.gammas == old.gammas == {"n_params": old.gamma}
  np.testing.assert_allclose(new.coef, old.coef, rtol=0, atol=1e-12)
  np.testing.assert_allclose(new.cov, old.cov, rtol=0, atol=1e-12)
  assert new.ci.keys() == old.ci.keys()
  for k in old.ci:
    np.testing.assert_allclose(new.ci[k], old.ci[k], rtol=0, atol=1e-12)
  law = new.to_dict()
  assert law["terms"] == ["n_params"] and law["gamma"] == law["gammas"]["n_params"] == new.gamma
  assert law["form"] == "ln UPT = ln T - alpha ln B - beta ln C + gamma[n_params] ln n_params"
  assert law["cov"]["names"] == new.names and law["range"]["n_params"] == [100000, 10000000]
  with pytest.raises(law_points.FitError, match="with_params .* beside the terms n_params, x"):
    scaling.fit_law(points, terms=("n_params", "x"), with_params=True)


def test_a_law_with_two_covariates_recovers_their_gammas(tmp_path, capsys):
  from ihsweep.base.law import Law

  truth = {
    "alpha": 0.4,
    "beta": 0.6,
    "gamma[data.frequency]": 0.5,
    "gamma[data.reliability]": -0.8,
  }
  points = _terms_points()
  fit = scaling.fit_law(points, terms=("data.frequency", "data.reliability"), n_boot=300)
  assert fit.names == ["log_T", "alpha", "beta", *list(truth)[2:]]
  assert fit.n_grid_points == 54 and fit.n == 108  # clusters: distinct (B, C, f, r) points
  for name, value in truth.items():
    estimate = dict(zip(fit.names, fit.coef))[name]
    lo, hi = fit.ci[name]
    assert lo <= value <= hi and hi - lo < 0.3 and abs(estimate - value) < 0.1, (name, lo, hi)
  assert fit.range["data.frequency"] == [0.25, 1] and fit.range["data.reliability"] == [0.5, 1]
  assert {"data.frequency", "data.reliability"} <= set(fit.residuals)
  # law.json as ihsweep predict reads it: the same median and interval
  law_file = tmp_path / "law.json"
  law_file.write_text(json.dumps(fit.to_dict()))
  law = Law.from_json(str(law_file))
  at = {"data.frequency": 0.3, "data.reliability": 0.6}
  median, lo, hi = fit.predict_interval(8.0, 128.0, at, cell=True)
  assert law.updates(8, 128, **at) == pytest.approx(float(median), rel=1e-9)
  assert law.interval(8, 128, cell=True, **at) == pytest.approx((float(lo), float(hi)), rel=1e-9)
  # the same through the command line, --terms=a,b and --terms a,b alike
  csv = tmp_path / "points.csv"
  points.to_csv(csv, index=False)
  both = "data.frequency,data.reliability"
  for terms in ([f"--terms={both}"], ["--terms", both]):
    assert cli.main(["fit-law", "--csv", str(csv), "--n_boot", "300", *terms]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert got["terms"] == ["data.frequency", "data.reliability"] and "gamma" not in got
    assert got["gammas"] == fit.gammas and got["ci"] == fit.ci
    assert got["cov"]["names"] == fit.names
    assert got["form"].endswith(
      " + gamma[data.frequency] ln data.frequency + gamma[data.reliability] ln data.reliability"
    )
    header = out.err.splitlines()[1].split()  # the table: a column per term
    assert header[6:9] == ["gamma[data.frequency]", "gamma[data.reliability]", "sigma"]
  fixed = ["--terms=data.frequency", "--fix", "gamma[data.frequency]=0.5", "--n_boot", "0"]
  assert cli.main(["fit-law", "--csv", str(csv), *fixed]) == 0
  got = json.loads(capsys.readouterr().out)
  assert got["fixed"] == {"gamma[data.frequency]": 0.5} and got["gammas"]["data.frequency"] == 0.5


def test_terms_that_cannot_enter_the_law_are_refused_in_one_line(tmp_path, capsys):
  points = _terms_points()
  points["data.source"] = "markov"
  points.loc[2, "data.reliability"] = 0.0
  csv = tmp_path / "points.csv"
  points.to_csv(csv, index=False)
  numeric = "numeric columns that could serve: data.frequency, n_params"  # seed has 0
  for terms, words in (
    ("data.freq", f"{csv}: no column 'data.freq' for a term; {numeric}"),
    ("data.source", f"{csv}: term column data.source is not numeric (line 2 has 'markov'): a "
     f"term enters as ln data.source; {numeric}"),
    ("data.reliability", f"{csv}: column data.reliability must be positive and finite (a term "
     "enters as ln data.reliability); line 4 has 0.0"),
    ("n_params", f"{csv}: term n_params does not vary among the emerged cells (all 1e+06): its "
     "coefficient gamma[n_params] cannot be told from ln T"),
    ("context_size", "--terms=context_size: term context_size: in the law already (beta ln C); "
     "a term is a column beyond B and C"),
    ("data.frequency,data.frequency", "--terms=data.frequency,data.frequency: term "
     "data.frequency: given twice; give each column once"),
    ("data.frequency,", "--terms=data.frequency,: a term with an empty column name"),
  ):  # fmt: skip
    assert cli.main(["fit-law", "--csv", str(csv), f"--terms={terms}"]) == 2, terms
    assert capsys.readouterr().err == f"python -m analysis: {words}\n", terms
  assert cli.main(["fit-law", "--csv", str(csv), "--terms=data.frequency", "--with_params"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "with_params (the n_params term alone) beside" in err, err
  # a term that varies only among censored cells tells nothing about emergence
  censored = _terms_points().assign(censored=False, censor_step=np.nan)
  censored.loc[censored["data.frequency"] == 1.0, ["censored", "censor_step"]] = [True, 1e9]
  with pytest.raises(law_points.FitError, match=r"data.frequency does not vary .* \(all 0.25\)"):
    scaling.fit_law(censored[censored["data.frequency"] != 0.5], terms=("data.frequency",))


def test_the_report_refits_the_law_with_its_terms(tmp_path, capsys):
  from analysis import law_section, report

  said = []
  doc = type("Doc", (), {"p": staticmethod(said.append)})
  points = _terms_points()
  both = ("data.frequency", "data.reliability")
  law_section._terms_refit(doc, points, report.Options(terms=both, n_boot=50))
  fit = scaling.fit_law(points, terms=both, n_boot=50)
  f, r = (f"{fit.gammas[t]:.3f} (95% CI {fit.ci[f'gamma[{t}]'][0]:.3f} …" for t in both)
  assert said[0].startswith("With + γ ln x for data.frequency, data.reliability: γ[data.freq")
  assert f"γ[data.frequency] = {f}" in said[0] and f"γ[data.reliability] = {r}" in said[0]
  # refused before any run is read: --terms with B, or beside --with_params
  for flags, words in (
    (["--terms=batch_size"], "--terms=batch_size: term batch_size: in the law already"),
    (["--terms=data.frequency", "--with_params"], "with_params (the n_params term alone)"),
  ):
    assert cli.main(["report", str(tmp_path / "none"), "--noprogress", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


# ---------------------------------------------------------------- frontier and factorial


def test_pareto_frontier_and_factorial():
  rows = []
  for f in (0.1, 0.3, 0.5, 0.7):
    for r in (0.2, 0.4, 0.6, 0.8):
      for seed in range(4):
        emerged = f + 2 * r + 0.1 * seed >= 1.25  # more sensitive to reliability
        rows.append(
          {
            "data.frequency": f,
            "data.reliability": r,
            "censored": not emerged,
            "emergence_step": 100.0 / (f * r) if emerged else np.nan,
          }
        )
  points = pd.DataFrame(rows)
  emap = frontier.emergence_map(points)
  assert len(emap) == 16
  at = emap.set_index(["data.frequency", "data.reliability"])
  assert at.loc[(0.3, 0.4), "rate"] == 0.5 and at.loc[(0.1, 0.4), "rate"] == 0.0
  assert at.loc[(0.7, 0.8), "median_step"] == pytest.approx(100 / 0.56)
  front = frontier.pareto_frontier(emap)
  along_y = front[front["along"] == "y"].set_index("data.frequency")
  # f = 0.1: rate 0 at r = 0.4, 1 at r = 0.6 → 0.5; f = 0.7: already 0.5 at the grid's 0.2.
  assert along_y["data.reliability"].tolist() == pytest.approx([0.5, 0.4, 0.3, 0.2])
  assert along_y["bound"].tolist() == ["interpolated"] * 3 + ["at or below the grid"]
  with pytest.raises(ValueError, match="did not vary"):
    frontier.emergence_map(points.drop(columns="data.reliability"))

  conds = []
  for ld in ("iid", "synthetic"):
    for cat in ("high", "low"):
      for marg in ("zipf", "uniform"):
        for seed in range(2):
          emerged = ld == "synthetic" and (marg == "zipf" or seed == 0)
          conds.append(
            {
              "data.transitions": ld,
              "data.synthetic.categoriality": cat,
              "data.synthetic.marginal": marg,
              "censored": not emerged,
              "emergence_step": 1000.0 if emerged else np.nan,
            }
          )
  fact = frontier.factorial_table(pd.DataFrame(conds))
  assert len(fact) == 8 and set(fact.columns) >= {
    "local_dependency",
    "categoriality",
    "marginal",
    "rate",
    "median_step",
  }
  assert (fact[fact["local_dependency"] == "none"]["rate"] == 0).all()
  zipf = fact[(fact["local_dependency"] == "yes") & (fact["marginal"] == "zipf")]
  assert (zipf["rate"] == 1).all() and (zipf["median_step"] == 1000).all()


# ---------------------------------------------------------------- real checkpoints

ONE_LAYER = {
  "model.n_layers": 1,
  "model.d_mlp": 0,
  "train.num_steps": 40,
  "train.steps_per_call": 10,
  "train.lr": 1e-2,
  "eval.every_steps": 20,
  "eval.n_probes": 10,
  "eval.n_sequences": 8,
  "checkpoint.params_schedule": "log",
  "checkpoint.law_points_per_octave": 0,
  "checkpoint.state_every_steps": 0,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """One small `ihsweep train` run: 2 models, params checkpoints at 0, 1, 2, 3, 4, 6, … 40."""
  from conftest import tiny_config

  from ihsweep.training.runner import fit

  workdir = str(tmp_path_factory.mktemp("analysis") / "run")
  fit(tiny_config(**ONE_LAYER), workdir, progress=False)
  return workdir


def test_curves_from_checkpoints_equal_the_online_metrics_and_are_cached(
  trained, tmp_path, monkeypatch
):
  workdir = str(tmp_path / "run")
  shutil.copytree(trained, workdir)
  run = load_run(workdir)
  assert run.kind == "train" and [g.id for g in run.groups] == ["run"]
  assert run.groups[0].steps() == [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 40]
  table = curves_lib.compute_curves(run, n_probes=None, n_sequences=None, progress=False)
  assert len(table) == 2 * 12 and (table["source"] == "checkpoint").all()
  assert set(table.columns) >= {
    "run",
    "cell",
    "seed",
    "batch_size",
    "context_size",
    "step",
    "tokens",
    *curves_lib.METRICS,
    "ps_layer",
    "ps_head",
  }
  online = run.groups[0].online_metrics().set_index(["cell", "step"])
  both = table.set_index(["cell", "step"]).loc[
    online.index.intersection(table.set_index(["cell", "step"]).index)
  ]
  assert sorted({s for _, s in both.index}) == [0, 40]  # evaluated online and checkpointed
  for metric in ("ps_max", "la_max", "dla_max", "ar_acc", "ar_rank", "val_loss", "icl_score"):
    np.testing.assert_allclose(
      both[metric], online.loc[both.index, metric], rtol=2e-5, atol=1e-6, err_msg=metric
    )
  assert os.path.exists(os.path.join(workdir, "analysis", "curves.parquet"))

  def boom(*a, **k):
    raise AssertionError("the cache should have made this unnecessary")

  monkeypatch.setattr(curves_lib, "evaluate_group", boom)
  again = curves_lib.compute_curves(
    load_run(workdir), n_probes=None, n_sequences=None, progress=False
  )
  pd.testing.assert_frame_equal(again, table)
  monkeypatch.undo()
  # Other probe counts are recomputed (and differ a little); online-only reading needs no
  # checkpoints.
  subset = curves_lib.compute_curves(load_run(workdir), n_probes=4, n_sequences=2, progress=False)
  assert (subset["n_probes"] == 4).all() and len(subset) == len(table)
  assert not np.allclose(subset["ps_max"], table["ps_max"])
  monkeypatch.setattr(curves_lib, "evaluate_group", boom)  # both settings are cached now
  pd.testing.assert_frame_equal(
    curves_lib.compute_curves(load_run(workdir), n_probes=None, n_sequences=None, progress=False),
    table,
  )
  monkeypatch.undo()
  online_only = curves_lib.compute_curves(load_run(workdir), source="online", progress=False)
  assert (online_only["source"] == "online").all() and sorted(online_only["step"].unique()) == [
    0,
    20,
    40,
  ]


def _fake_sweep(trained: str, root) -> str:
  """A sweep directory made of copies of the trained run: g000 done, g001 missing, g002 running
  with a half-written and a damaged checkpoint."""
  sweep = root / "sweep"
  groups = sweep / "groups"
  groups.mkdir(parents=True)
  shutil.copy(os.path.join(trained, "config.json"), sweep / "config.json")
  rows = []
  for g, (b, c) in enumerate([(8, 32), (8, 16), (4, 32), (4, 16)]):
    for i in range(2):
      diverged = g == 0 and i == 1  # marked as diverged at update 8: no metrics from 8 on
      rows.append(
        {
          "cell": 2 * g + i,
          "group": f"g00{g}",
          "seed": i,
          "batch_size": b,
          "context_size": c,
          "peak_lr": 1e-2,
          "n_params": 1000,
          "status": "done",
          "diverged": diverged,
          "diverged_step": 8 if diverged else None,
        }
      )
  pd.DataFrame(rows).to_csv(sweep / "cells.csv", index=False)
  for g, state in (("g000", "done"), ("g002", "running"), ("g003", "done")):
    shutil.copytree(trained, groups / g, ignore=shutil.ignore_patterns("analysis"))
    cfg = json.loads((groups / g / "config.json").read_text())
    cfg["ensemble"]["cell_ids"] = {"g000": [0, 1], "g002": [4, 5], "g003": [6, 7]}[g]
    (groups / g / "config.json").write_text(json.dumps(cfg))
    last = rundir.last_step(str(groups / g / "train_log.jsonl"))  # a done group's evidence
    (groups / g / "status.json").write_text(
      json.dumps({"state": state, "step": last, "num_steps": last})
    )
  params = groups / "g002" / "checkpoints" / "params"
  (params / "64.orbax-checkpoint-tmp-1234").mkdir()  # a save cut short: never listed
  shutil.rmtree(params / "16" / "params")  # damaged by hand: restoring it fails
  (groups / "g003" / "probes.npz").write_bytes(b"PK\x03\x04 not a zip")
  (sweep / "analysis").mkdir()
  (sweep / "analysis" / "law.json").write_text("{}")  # stale, from an earlier report
  return str(sweep)


def test_report_on_partial_input_warns_and_writes_everything(trained, tmp_path):
  from analysis import report

  sweep = _fake_sweep(trained, tmp_path)
  single = str(tmp_path / "single")  # a plain `ihsweep train` run beside the sweep
  shutil.copytree(trained, single)
  out = report.report([sweep, single, sweep], None, report.Options(progress=False, n_boot=50))
  warnings = " ".join(out["warnings"])
  assert (
    "group g001 (2 cells) is skipped: cells.csv lists it as done, but its directory" in warnings
  )
  assert "group g003: " in warnings and "probes.npz cannot be used" in warnings
  assert "1 cell(s) diverged" in " ".join(open(out["report_md"]).read().split())
  assert "group g002 is running" in warnings
  assert "g002: the checkpoint at update 16 cannot be restored" in warnings
  table = pd.read_csv(out["emergence_csv"])
  assert sorted(table[table["run"] == "sweep"]["cell"].unique()) == [0, 1, 4, 5]
  assert sorted(table[table["run"] == "single"]["cell"].unique()) == [0, 1]  # read once
  assert set(table["method"]) == set(emergence.METHODS)
  curves = pd.read_csv(os.path.join(sweep, "analysis", "curves.csv"))
  assert 16 not in set(curves[curves["group"] == "g002"]["step"])
  assert 16 in set(curves[curves["group"] == "g000"]["step"])
  cell1 = curves[(curves["run"] == "sweep") & (curves["cell"] == 1)]
  assert cell1[cell1["step"] >= 8]["ps_max"].isna().all()
  assert cell1[cell1["step"] < 8]["ps_max"].notna().all()
  md = open(out["report_md"]).read()
  assert "## Emergence points" in md and "## Warnings" in md and "figures/curves_ps_max.png" in md
  assert "| single " in md and "| sweep " in md  # both runs in the per-grid-point table
  # Where the heads work: every readable model with params and probes, once per run.
  assert "## Where the heads work" in md
  where = pd.read_csv(os.path.join(sweep, "analysis", "positions.csv"))
  assert set(zip(where["run"], where["cell"])) >= {("single", 0), ("single", 1), ("sweep", 0)}
  assert where[[f"ps_{p}" for p in ("start", "middle", "end")]].stack().between(0, 1).all()
  assert "no law.json is written" in md
  assert not os.path.exists(os.path.join(sweep, "analysis", "law.json"))
  page = open(out["report_html"]).read()
  assert page.count("data:image/png;base64,") >= 2 and "<table" in page
  for name in ("curves_ps_max", "curves_ar_acc"):
    for ext in ("png", "pdf"):
      assert os.path.getsize(os.path.join(sweep, "analysis", "figures", f"{name}.{ext}")) > 1000
  # One layer: no head below the last, so no previous-token score, and the report says why.
  words = " ".join(md.split())
  assert "No previous-token score where every model has one layer" in words
  assert "pt_max" not in set(table["metric"]) and curves["pt_max"].isna().all()
  assert "figures/attention.png" in md and "(a one-layer model: no head lies below its" in words
  assert "best previous-token head below the last layer" not in words
  # 40 updates of a 1-layer model do not form induction heads: the law cannot be fitted, and the
  # report says why instead of failing.
  assert out["law"] is None and "cannot identify" in out["law_error"]


def test_not_a_run_directory_gets_a_clear_error(tmp_path, capsys):
  (tmp_path / "notes.txt").write_text("hello")
  with pytest.raises(NotARun, match="is not a run directory: it has no cells.csv"):
    load_run(str(tmp_path))
  assert cli.main(["report", str(tmp_path / "missing"), "--noprogress"]) == 2
  assert "is not a directory" in capsys.readouterr().err
  (tmp_path / "cells.csv").write_text("garbage\n")
  assert cli.main(["report", str(tmp_path), "--noprogress"]) == 2
  assert "cannot be read as a sweep's cells table" in capsys.readouterr().err
  # a sweep whose top-level config.json is gone: one line before any work (was a traceback)
  (tmp_path / "groups").mkdir()
  assert cli.main(["report", str(tmp_path), "--noprogress"]) == 2
  err = capsys.readouterr().err
  assert "config.json is missing: the sweep's config" in err and len(err.splitlines()) == 1
  (tmp_path / "config.json").write_text("{not json")
  assert cli.main(["report", str(tmp_path), "--noprogress"]) == 2
  assert "config.json cannot be read (" in capsys.readouterr().err


def test_the_old_flag_spellings_still_work_and_say_the_new_ones(tmp_path, capsys):
  """report and fit-law take the flags as every ihsweep command spells them (--noprogress,
  --n_boot); the argparse spellings they had (--no-progress, --n-boot) still work, each named
  once with its new spelling, and nothing after -- is rewritten."""
  from analysis.commands.common import modern_spellings

  assert cli.main(["report", str(tmp_path / "missing"), "--no-progress", "--n-boot=5"]) == 2
  err = capsys.readouterr().err
  assert "--no-progress is now spelled --noprogress" in err
  assert "--n-boot is now spelled --n_boot" in err and "is not a directory" in err
  argv = ["--n-boot", "3", "--no-cache", "--no-cache", "--", "--no-cache"]
  assert modern_spellings(argv, "x") == [
    "--n_boot",
    "3",
    "--nocache",
    "--nocache",
    "--",
    "--no-cache",
  ]
  assert capsys.readouterr().err.count("--no-cache is now spelled --nocache") == 1


def test_cli_prints_the_fitted_law_beside_the_study():
  from analysis.commands.report import law_lines as _law_lines

  law = {
    "log_T": 9.674,
    "alpha": 0.842,
    "beta": -0.074,
    "r": 0.943,
    "study_r": 0.431,
    "n": 18,
    "n_censored": 2,
    "ci": {"log_T": [8.95, 10.31], "alpha": [0.681, 0.982], "beta": [-0.218, 0.086]},
  }
  header, columns, fitted, study = _law_lines(law, "runs/demo/analysis").splitlines()
  assert header.endswith("-> runs/demo/analysis/law.json")
  assert columns.split() == ["ln", "T", "alpha", "(B)", "beta", "(C)", "r", "cells"]
  assert fitted.split() == [
    "fitted",
    "9.67",
    "[8.95,",
    "10.31]",
    "0.84",
    "[0.68,",
    "0.98]",
    "-0.07",
    "[-0.22,",
    "0.09]",
    "0.94",
    "18",
    "(+2",
    "censored)",
  ]
  # the r column is r on these cells for every row: the study's law scores 0.43 here; its
  # published 0.98 (on the study's own cells) is labelled as such
  assert study.split() == (
    "study (published) 13.26 0.37 0.62 0.43 (published r 0.98 on the study's cells)".split()
  )
  no_ci = _law_lines({**law, "ci": {}, "n_censored": 0}, "out").splitlines()[2]
  assert "[" not in no_ci and no_ci.split()[-1] == "18"


def _sums(root) -> dict:
  """SHA-256 of every file under ``root``, by path relative to it."""
  import hashlib

  return {
    os.path.relpath(os.path.join(d, f), root): hashlib.sha256(
      open(os.path.join(d, f), "rb").read()
    ).hexdigest()
    for d, _, files in os.walk(root)
    for f in files
  }


def test_report_replaces_only_its_own_files(trained, tmp_path, capsys):
  from analysis import report

  opts = report.Options(progress=False, n_boot=0, source="online")
  run = str(tmp_path / "run")
  shutil.copytree(trained, run, ignore=shutil.ignore_patterns("analysis"))
  # A user's directory with files under names the report writes: refused, nothing touched.
  docs = tmp_path / "docs"
  (docs / "figures").mkdir(parents=True)
  (docs / "figures" / "curves_ps_max.png").write_bytes(b"\x89PNG the user's figure")
  (docs / "report.md").write_text("# my notes\n")
  before = _sums(docs)
  assert cli.main(["report", run, "--out", str(docs), "--source", "online", "--noprogress"]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1
  assert f"{docs}/report.md exists and was not written by this report" in err
  assert _sums(docs) == before
  from analysis import outputs

  # Other files of the user's survive a report and its rerun; the rerun replaces the report's
  # own outputs and removes those it no longer writes.
  (docs / "report.md").unlink()
  (docs / "figures" / "curves_ps_max.png").rename(docs / "figures" / "mine.png")
  (docs / "notes.md").write_text("keep me\n")
  mine = _sums(docs)
  out = report.report([run], str(docs), opts)
  manifest = json.loads((docs / outputs.MANIFEST).read_text())
  assert {"report.md", "report.html", "curves.csv", "figures/curves_ps_max.png"} <= set(
    manifest["files"]
  )
  assert "notes.md" not in manifest["files"] and "figures/mine.png" not in manifest["files"]
  stale = docs / "law.json"  # as if an earlier report had fitted a law
  stale.write_text("{}")
  manifest["files"]["law.json"] = outputs._sha256(str(stale))
  (docs / outputs.MANIFEST).write_text(json.dumps(manifest))
  (docs / "curves.csv").write_text("old")  # the report's own file, yet changed by hand: refused
  with pytest.raises(outputs.OutputError, match="curves.csv was changed since the report"):
    report.report([run], str(docs), opts)
  (docs / "curves.csv").unlink()
  out = report.report([run], str(docs), opts)
  assert not stale.exists() and os.path.getsize(out["report_md"]) > 100
  assert {k: _sums(docs)[k] for k in mine} == mine
  # A manifest that lists files outside the report's names removes nothing of them.
  manifest = json.loads((docs / outputs.MANIFEST).read_text())
  manifest["files"]["notes.md"] = None
  (docs / outputs.MANIFEST).write_text(json.dumps(manifest))
  report.report([run], str(docs), opts)
  assert (docs / "notes.md").read_text() == "keep me\n"


def test_a_group_given_beside_its_sweep_is_counted_once(trained, tmp_path):
  from ihsweep.runs.reader import load_runs

  sweep = _fake_sweep(trained, tmp_path)
  os.symlink(os.path.join(sweep, "groups", "g000"), tmp_path / "link")
  runs = load_runs([sweep, os.path.join(sweep, "groups", "g000"), str(tmp_path / "link")])
  assert [r.kind for r in runs] == ["sweep"]
  assert any("it is this sweep's group g000" in w for w in runs[0].warnings)
  alone = load_runs([os.path.join(sweep, "groups", "g000")])  # on its own it is read as a run
  assert alone[0].kind == "train" and list(alone[0].cells["cell"]) == [0, 1]


def test_damaged_lines_of_metrics_jsonl_are_reported(trained, tmp_path):
  from analysis import report

  run = str(tmp_path / "run")
  shutil.copytree(trained, run, ignore=shutil.ignore_patterns("analysis"))
  path = os.path.join(run, "metrics.jsonl")
  lines = open(path).read().splitlines(keepends=True)
  lines[1] = lines[1][:20] + "\n"  # a hand edit gone wrong
  open(path, "w").write("".join(lines[:-1]) + lines[-1][:30])  # and a write cut short
  out = report.report(
    [run], str(tmp_path / "out"), report.Options(progress=False, n_boot=0, source="online")
  )
  warning = f"{path}: 2 damaged line(s) skipped (line(s) 2, {len(lines)}; a write cut short?)"
  assert warning in out["warnings"]
  assert warning in open(out["report_md"]).read()
  table = pd.read_csv(out["emergence_csv"])
  assert sorted(table["cell"].unique()) == [0, 1]  # the other lines are read


def test_a_truncated_cells_table_is_rebuilt_from_the_groups(trained, tmp_path):
  sweep = _fake_sweep(trained, tmp_path)
  full = pd.read_csv(os.path.join(sweep, "cells.csv"))
  text = open(os.path.join(sweep, "cells.csv")).read()
  lines = text.splitlines(keepends=True)
  # Cut short in the middle of cell 4's row (group g002): cells 4-7 are gone.
  cut = "".join(lines[:5]) + lines[5][:9]
  open(os.path.join(sweep, "cells.csv"), "w").write(cut)
  broken = os.path.join(sweep, "groups", "g004")
  os.makedirs(broken)
  open(os.path.join(broken, "config.json"), "w").write("{not json")
  run = load_run(sweep)
  warnings = " ".join(run.warnings)
  assert "cells.csv rows [6] (file lines) are cut short" in warnings
  assert "cells.csv lacks 4 cell(s) of group(s) g002, g003" in warnings
  assert (
    "group g004 is skipped: cells.csv has no rows for it, and its config.json cannot be "
    "read" in warnings
  )
  assert sorted(run.cells["cell"]) == [0, 1, 2, 3, 4, 5, 6, 7]
  assert [g.id for g in run.groups] == ["g000", "g002", "g003"]
  rebuilt = run.cells.set_index("cell").loc[[4, 5, 6, 7]]
  assert list(rebuilt["group"]) == list(full.set_index("cell").loc[[4, 5, 6, 7], "group"])
  assert list(rebuilt["seed"]) == [0, 1, 0, 1]
  assert list(rebuilt["status"]) == ["running", "running", "done", "done"]
  # An empty cells.csv (cut at 0 bytes): every group's cells rebuilt.
  open(os.path.join(sweep, "cells.csv"), "w").close()
  run = load_run(sweep)
  assert sorted(run.cells["cell"]) == [0, 1, 4, 5, 6, 7]
  assert [g.id for g in run.groups] == ["g000", "g002", "g003"]


def test_a_damaged_checkpoint_is_one_warning_not_a_traceback_storm(trained, tmp_path):
  """Truncated array files make orbax's read fail; its abandoned sibling reads used to print ~90
  'Event loop is closed' / 'Exception ignored in <coroutine ...>' tracebacks with tensorstore
  specs."""
  run = tmp_path / "run"
  shutil.copytree(trained, run, ignore=shutil.ignore_patterns("analysis"))
  data = run / "checkpoints" / "params" / "4" / "params" / "ocdbt.process_0" / "d"
  for f in data.iterdir():
    os.truncate(f, 7)
  out = subprocess.run(
    [sys.executable, "-m", "analysis", "report", str(run), "--noprogress"],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "the checkpoint at update 4 cannot be restored" in out.stderr
  assert "TensorStore details" not in out.stderr
  assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-3000:]


def test_a_damaged_checkpoint_metadata_file_is_one_counted_warning(trained, tmp_path, caplog):
  """Issue 58: a checkpoint whose _CHECKPOINT_METADATA is not JSON printed orbax's "ERROR ...
  Failed to json parse Metadata file: ..., file content: ..." four times mid-output, and the
  report counted no warning. Orbax restores its params without the file: the report uses them
  and says so in one warning naming the group, the update, the file and what was wrong."""
  from analysis import report

  run = tmp_path / "run"
  shutil.copytree(trained, run, ignore=shutil.ignore_patterns("analysis"))
  meta = run / "checkpoints" / "params" / "4" / "_CHECKPOINT_METADATA"
  meta.write_text(meta.read_text()[:10])  # a write cut short
  out = report.report([str(run)], None, report.Options(progress=False, n_boot=0))
  line = (
    "group run: the checkpoint at update 4 has a damaged metadata file "
    "checkpoints/params/4/_CHECKPOINT_METADATA (JSONDecodeError: Unterminated string starting "
    "at: line 1 column 2 (char 1)); its params were read without it"
  )
  assert out["warnings"].count(line) == 1, out["warnings"]
  logged = [r.getMessage() for r in caplog.records]
  assert not [m for m in logged if "Failed to json parse" in m], logged
  assert [m for m in logged if "damaged metadata file" in m] == [line]
  curves = pd.read_csv(os.path.join(run, "analysis", "curves.csv"))
  assert 4 in set(curves.loc[curves["source"] == "checkpoint", "step"])  # its params were used


def test_out_inside_a_run_is_refused_except_its_analysis_folder(trained, tmp_path, capsys):
  run = tmp_path / "run"
  shutil.copytree(trained, run, ignore=shutil.ignore_patterns("analysis"))
  before = _sums(run)
  for inside in (run / "checkpoints", run / "checkpoints" / "new", run):
    assert (
      cli.main(["report", str(run), "--out", str(inside), "--source", "online", "--noprogress"])
      == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is inside the run directory" in err, err
  assert _sums(run) == before and not (run / "checkpoints" / "new").exists()
  assert (
    cli.main(
      [
        "report",
        str(run),
        "--out",
        str(run / "analysis"),
        "--source",
        "online",
        "--noprogress",
        "--n_boot",
        "0",
      ]
    )
    == 0
  )


def test_probes_at_the_end_of_the_context_are_saved_and_rescored_alike(tmp_path):
  """``eval.probe_position = 'end'``: the run saves C-token probes (filler, then the blocks),
  and the analysis rescoring them from checkpoints reproduces the online metrics."""
  from conftest import tiny_config

  from ihsweep.data.probes import Probes
  from ihsweep.training.runner import fit

  workdir = str(tmp_path / "run")
  end = {"eval.probe_position": "end", "eval.probe_len": 4, "train.num_steps": 20}
  fit(tiny_config(**{**ONE_LAYER, **end}), workdir, progress=False)
  saved = Probes.load(os.path.join(workdir, "probes.npz"))
  assert saved.repeated.shape == (10, 32) and saved.block_len == 4
  np.testing.assert_array_equal(saved.repeated[:, 24:28], saved.repeated[:, 28:])
  run = load_run(workdir)
  table = curves_lib.compute_curves(run, n_probes=None, n_sequences=None, progress=False)
  online = run.groups[0].online_metrics().set_index(["cell", "step"])
  both = table.set_index(["cell", "step"]).loc[online.index]
  for metric in ("ps_max", "la_max", "dla_max", "ar_acc", "ar_rank"):
    np.testing.assert_allclose(both[metric], online[metric], rtol=2e-5, atol=1e-6, err_msg=metric)
  # Uniform-ish attention of an untrained model is spread over ~C positions, not ~2L.
  assert online.xs(0, level="step")["ps_max"].max() < 0.1
