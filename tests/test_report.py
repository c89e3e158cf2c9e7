"""The report's generated summary (analysis/summary.py) on synthetic tables — each sentence only
where the numbers support it — and the report that opens with it (a sweep directory written
without training: its groups' metrics.jsonl hold synthetic curves)."""

import json
import math
import os
import re
import sys

import numpy as np
import pandas as pd
import pytest

from analysis import setup_words, summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

B_GRID, C_GRID = (8, 16, 32), (16, 32, 64)


def _points(alpha=0.84, beta=-0.07, censored=(), seeds=2, scatter=0.05, seed=0):
  """One row per model over B_GRID × C_GRID × seeds: UPT = e^9.67 / (B^alpha C^beta) with
  log-normal scatter; (B, C, seed) in ``censored`` are censored at their last checkpoint 5,000.
  Checkpoints bracket each point a factor 2^(1/4) apart."""
  rng = np.random.default_rng(seed)
  rows, cell = [], 0
  for b in B_GRID:
    for c in C_GRID:
      for s in range(seeds):
        t = math.exp(9.67 - alpha * math.log(b) - beta * math.log(c) + rng.normal(0, scatter))
        cens = (b, c, s) in censored
        rows.append(
          {
            "run": "demo",
            "cell": cell,
            "seed": s,
            "batch_size": b,
            "context_size": c,
            "n_params": 70_528,
            "emergence_step": math.nan if cens else t,
            "censored": cens,
            "censor_step": 5000.0 if cens else math.nan,
            "step_before": t * 2**-0.125,
            "step_after": t * 2**0.125,
            "last_step": 5000.0 if cens else 2 * t,
          }
        )
        cell += 1
  return pd.DataFrame(rows)


def _law(alpha, alpha_ci, beta, beta_ci, **extra):
  law = {
    "log_T": 9.67,
    "alpha": alpha,
    "beta": beta,
    "n": 18,
    "n_censored": 0,
    "dof": 15,
    "ci": {"log_T": [9.0, 10.3], "alpha": list(alpha_ci), "beta": list(beta_ci)},
  }
  law.update(extra)
  return law


def _config(**changes):
  import configs.demo

  cfg = configs.demo.get_config()
  for path, value in changes.items():
    section, name = path.split(".")
    cfg[section][name] = value
  return cfg


def _text(paragraphs) -> str:
  return " ".join(" ".join(paragraphs).split())


def test_setup_words_come_from_the_config_and_the_grid():
  setup, *_ = summary.summary(
    _points(), _law(0.84, (0.68, 0.98), -0.07, (-0.22, 0.09)), config=_config()
  )
  setup = " ".join(setup.split())
  assert setup.startswith(
    "**Setup.** 18 models: 2-layer attention-only transformers, 1 head "
    "per layer, d_model 64 (70,528 parameters)"
  )
  assert (
    "semi-natural Markov data: the bigram statistics of python-docs over its 256 most "
    "frequent types" in setup
  )
  assert "frequency 1 and reliability 1" in setup
  assert (
    "B ∈ {8, 16, 32} sequences per update × C ∈ {16, 32, 64} tokens per sequence, 2 "
    "seeds per grid point" in setup
  )
  assert (
    "stopped once every model's online ps_max had passed 0.3 and training had gone on "
    "to 2× that update, or at a cap of 0.25× the study's law's predicted updates" in setup
  )
  assert "prefix-matching score first crosses halfway" in setup
  # another config, other words: natural text, a fixed update budget, 3 seeds
  other = _config(**{"data.source": "natural", "sweep.budget": "updates", "train.num_steps": 3000})
  setup = summary.summary(_points(seeds=3), None, config=other)[0]
  assert "natural text (python-docs, a BPE vocabulary of 256 types)" in setup
  assert "each cell trained for 3,000 updates" in setup and "3 seeds per grid point" in setup


def test_setup_words_give_a_model_axis_of_the_grid_its_values():
  """A sweep over model.n_heads=1,2 (the run's default 4): the grid's values, not the default."""
  points = _points()
  points["model.n_heads"] = [1, 2] * (len(points) // 2)
  cfg = _config(**{"model.n_heads": 4})
  setup = " ".join(summary.summary(points, None, config=cfg)[0].split())
  assert "2-layer attention-only transformers, {1, 2} heads per layer, d_model 64" in setup
  points["model.n_heads"] = 2  # one value: that value
  setup = " ".join(summary.summary(points, None, config=cfg)[0].split())
  assert "transformers, 2 heads per layer" in setup


def test_emergence_falls_with_b_only_where_alphas_interval_excludes_0():
  falls = _text(
    summary.summary(_points(), _law(0.84, (0.68, 0.98), -0.07, (-0.22, 0.09)), config=_config())
  )
  assert "emergence comes in fewer updates at larger B" in falls
  assert "doubling B saves 44% of the updates" in falls
  # α's interval includes 0: no direction with B is claimed
  flat = _text(
    summary.summary(
      _points(alpha=0.05), _law(0.05, (-0.2, 0.3), -0.07, (-0.22, 0.09)), config=_config()
    )
  )
  assert "fewer updates at larger B" not in flat and "more updates at larger B" not in flat
  assert "no clear dependence on B (α = 0.05, 95% interval -0.20 to 0.30, includes 0)" in flat
  # ... and then the sequences grow with B (B^0.95), not "roughly fixed"
  assert (
    "number of sequences (UPT·B; tokens at a given C) to emergence grows with B — about "
    "in proportion" in flat
  )
  assert "roughly fixed number of sequences" not in flat
  # no interval at all: no direction either
  none = _text(
    summary.summary(_points(), {**_law(0.84, (0, 0), -0.07, (0, 0)), "ci": {}}, config=_config())
  )
  assert "fewer updates" not in none and "α = 0.84, without an interval (too few cells)" in none
  note = _text(
    summary.summary(
      _points(), {**_law(0.84, (0, 0), -0.07, (0, 0)), "ci": {}, "n_boot": 0}, config=_config()
    )
  )
  assert "α = 0.84, without an interval (no bootstrap), so no direction with B" in note
  # a fixed alpha says nothing about B
  fixed = _text(
    summary.summary(
      _points(),
      {
        **_law(0.37, (0, 0), -0.07, (-0.22, 0.09)),
        "ci": {"beta": [-0.22, 0.09]},
        "fixed": {"alpha": 0.37},
      },
      config=_config(),
    )
  )
  assert "α was held at 0.37, not fitted" in fixed and "fewer updates at larger B" not in fixed


def test_a_roughly_fixed_number_of_sequences_only_when_the_numbers_say_so():
  demo = _text(
    summary.summary(_points(), _law(0.84, (0.68, 0.98), -0.07, (-0.22, 0.09)), config=_config())
  )
  assert (
    "to emergence is roughly fixed across B, growing only slightly: as B^0.16 (95% "
    "interval 0.02 to 0.32), 12% more per doubling of B" in demo
  )
  assert "the updates to emergence show no clear dependence on C" in demo
  assert (
    "tokens (UPT·B·C; at a given B) to emergence grows with C — about in proportion: as "
    "C^1.07" in demo
  )
  assert (
    "induction heads formed after a roughly fixed number of sequences, whatever B and C" in demo
  )
  # α's interval includes 1: the sequences' exponent 1 − α includes 0
  one = _text(
    summary.summary(
      _points(alpha=0.95), _law(0.95, (0.8, 1.1), -0.07, (-0.22, 0.09)), config=_config()
    )
  )
  assert (
    "to emergence is roughly fixed across B: it goes as B^0.05 (95% interval -0.10 to "
    "0.20, which includes 0)" in one
  )
  # the study's exponents: updates fall with B and C; sequences and tokens grow
  study = _text(
    summary.summary(
      _points(alpha=0.37, beta=0.62), _law(0.37, (0.3, 0.45), 0.62, (0.5, 0.75)), config=_config()
    )
  )
  assert "fewer updates at larger B" in study and "fewer updates at larger C" in study
  assert "roughly fixed" not in study
  assert "grows with B: as B^0.63" in study and "grows with C: as C^0.38" in study


def test_the_comparison_with_the_study_crosses_data_and_scale():
  text = _text(
    summary.summary(_points(), _law(0.84, (0.68, 0.98), -0.07, (-0.22, 0.09)), config=_config())
  )
  assert (
    "α = 0.84 (95% interval 0.68 to 0.98) against the study's 0.37, outside the interval" in text
  )
  assert "β = -0.07 (95% interval -0.22 to 0.09) against the study's 0.62, outside" in text
  assert (
    "This comparison crosses data and scale — semi-natural Markov data here against the "
    "study's natural web text (Common Crawl); models of 70.5k parameters against the "
    "study's about 53.6M (2 layers, d_model 768, with MLPs), 759× larger" in text
  )
  # the study's law scored on the emerged models: e^13.26 / (8^0.37 · 16^0.62) = 47,648 at the
  # slowest cell; they emerged ~10× earlier
  assert "the study's law predicts 12,078–47,648 updates" in text
  ratio = float(text.split("on average (geometric mean) ")[1].split("×")[0])
  pts = _points()
  pred = np.exp(13.26 - 0.37 * np.log(pts["batch_size"]) - 0.62 * np.log(pts["context_size"]))
  assert ratio == pytest.approx(np.exp(np.mean(np.log(pred / pts["emergence_step"]))), abs=0.05)
  inside = _text(
    summary.summary(
      _points(alpha=0.37, beta=0.62), _law(0.37, (0.3, 0.45), 0.62, (0.5, 0.75)), config=_config()
    )
  )
  assert "against the study's 0.37, inside the interval" in inside
  # Within 5% of the study's law on average: not '1.0× later'.
  close = _points(alpha=0.37, beta=0.62, scatter=0.0)
  close["emergence_step"] *= math.exp(13.26 - 9.67) / 1.02
  near = _text(summary.summary(close, _law(0.37, (0.3, 0.45), 0.62, (0.5, 0.75)), config=_config()))
  assert "on average (geometric mean) about when these models did (1.02×)" in near, near
  assert "1.0× later" not in near


def _flag(points, b=8, c=64, seed=1, late_points=2, last_interval=True):
  """``points`` with the emergence table's late_points/last_interval columns (5 checkpoints after
  every jump) and model (b, c, seed) jumping at 4,500 between 4,096 and 4,871, cap 5,044."""
  pts = points.assign(late_points=5, last_interval=False)
  at = (pts["batch_size"] == b) & (pts["context_size"] == c) & (pts["seed"] == seed)
  pts.loc[at, ["emergence_step", "step_before", "step_after", "last_step"]] = [
    4500.0,
    4096.0,
    4871.0,
    5044.0,
  ]
  pts.loc[at, ["late_points", "last_interval"]] = [late_points, last_interval]
  return pts


def test_a_model_that_emerged_at_the_end_of_its_curve_is_a_limitation():
  law = _law(0.84, (0.68, 0.98), -0.07, (-0.22, 0.09))
  law["T"], law["ci"]["T"] = 15_000.0, [9_000.0, 25_000.0]
  refit = _law(0.62, (0.41, 0.83), 0.05, (-0.2, 0.3))
  refit["T"], refit["ci"]["T"] = 12_000.0, [5_000.0, 30_000.0]
  # nothing flagged: the plain sentence, nothing more
  plain = _text(summary.summary(_points().assign(late_points=5, last_interval=False), law))
  assert "No model was censored. " in plain and "jumped so close" not in plain
  # flagged, nothing censored: never "No model was censored" alone
  text = _text(summary.summary(_flag(_points()), law, config=_config(), sensitivity=refit))
  assert "No model was censored." not in text
  assert (
    "No model was censored, but 1 of the 18 emerged models jumped so close to the end of "
    "training that a slightly shorter run would have censored it" in text
  )
  assert (
    "B 8/C 64 seed 1 (last interval, plateau on 2 checkpoints: jumped between updates 4,096 "
    "and 4,871, last checkpoint 5,044). B 8/C 64 seed 1 is the slowest emergence point in the "
    "fit." in text
  )
  assert (
    "with it censored at its last checkpoint (95% intervals in brackets): α 0.84 [0.68, 0.98] "
    "→ 0.62 [0.41, 0.83], β -0.07 [-0.22, 0.09] → 0.05 [-0.20, 0.30], T 15,000 [9,000, "
    "25,000] → 12,000 [5,000, 30,000]." in text
  )
  # a plateau on 2 checkpoints inside the run, beside censored models; the refit failed
  both = _flag(_points(censored=((32, 16, 0),)), last_interval=False)
  text = _text(summary.summary(both, law, sensitivity={"error": "too few cells"}))
  assert "1 of 18 models had not emerged by their last checkpoint (censored; B 32/C 16)" in text
  assert "Besides, 1 of the 17 emerged models jumped so close" in text
  assert "B 8/C 64 seed 1 (plateau on 2 checkpoints: jumped between" in text
  assert "With it censored the law cannot be fitted (too few cells)." in text
  # a table from before the columns existed: no caution
  old = _text(summary.summary(_points(), law))
  assert "No model was censored. " in old and "jumped so close" not in old
  # no law fitted: the flagged model is named, but not as a point "in the fit"
  unfitted = _text(summary.summary(_flag(_points()), None))
  assert "B 8/C 64 seed 1 (last interval" in unfitted and "in the fit" not in unfitted


def test_a_text_axis_missing_from_some_runs_is_listed_without_the_gaps():
  """A multi-run report where one run has a text-valued grid axis and the others lack it: the
  axis' values are listed, the missing ones left out (sorting str with NaN raised TypeError)."""
  points = _points().assign(**{"data.induction_start": "half"})
  points.loc[points.index[:6], "data.induction_start"] = np.nan
  assert setup_words.axis_values(points, "data.induction_start") == "{half}"


def test_limitations_count_censored_cells_seeds_and_checkpoint_spacing():
  cens = _points(censored=((8, 64, 0), (8, 64, 1), (16, 64, 1)))
  mle = _law(
    0.8,
    (0.6, 1.0),
    0.1,
    (-0.1, 0.3),
    method="censored log-normal MLE",
    n_emerged=15,
    n_censored=3,
    sigma=0.12,
    emerged_only={"alpha": 0.7, "beta": -0.05},
  )
  # the study's probes (the demo holds L = 8 at C/2): L follows C
  study_probes = _config(**{"eval.probe_len": 0, "eval.probe_position": "start"})
  text = _text(summary.summary(cens, mle, config=study_probes))
  assert "15 of 18 models emerged by their last checkpoint" in text
  assert "fitted by maximum likelihood to 15 emerged and 3 censored models" in text
  assert (
    "3 of 18 models had not emerged by their last checkpoint (censored; B 8/C 64 (2), "
    "B 16/C 64): their emergence points are lower bounds" in text
  )
  assert "fitted to the emerged models alone it would give α = 0.70, β = -0.05" in text
  assert "σ = 0.12 in ln UPT (a typical model within 1.13× of it)" in text
  assert "a factor 1.19 between neighbours" in text  # 2^(1/4): checkpoints 4 per octave
  assert "The probes' block length follows C (L = 8, 16, 32 at C = 16, 32, 64)" in text
  assert "One model size" in text
  # least squares on emerged cells: the bias is named
  lsq = _text(
    summary.summary(cens, _law(0.8, (0.6, 1.0), 0.1, (-0.1, 0.3), n_censored=3), config=_config())
  )
  assert "by least squares to the 18 emerged models (3 censored left out)" in lsq
  assert "leaves censored models out, which biases it towards early emergence" in lsq
  # fixed probes, one seed, none censored
  one = _text(
    summary.summary(
      _points(seeds=1),
      _law(0.8, (0.6, 1.0), 0.1, (-0.1, 0.3)),
      config=_config(**{"eval.probe_len": 8, "eval.probe_position": "start"}),
    )
  )
  assert "No model was censored" in one and "One seed per grid point" in one
  assert "one block length L = 8 at every C" in one and "follows C" not in one
  assert "at positions 0–15 of the input, however long C is" in one
  middle = _config(**{"eval.probe_len": 8, "eval.probe_position": "middle"})
  text = _text(
    summary.summary(_points(seeds=1), _law(0.8, (0.6, 1.0), 0.1, (-0.1, 0.3)), config=middle)
  )
  assert "L = 8 at every C, with the second block starting at position C/2" in text


def test_no_emergence_and_no_law_claim_nothing_about_b_or_c():
  pts = _points(censored=[(b, c, s) for b in B_GRID for c in C_GRID for s in (0, 1)])
  text = _text(
    summary.summary(
      pts, None, config=_config(), law_error="0 emerged cell(s) cannot identify log_T"
    )
  )
  assert (
    "0 of 18 models emerged" in text
    and "nothing is said here about how emergence moves with B or C" in text
  )
  assert (
    "None of the 18 censored models reached the update the study's law predicts for it "
    "(12,078–47,648; their last checkpoints 5,000), so their not emerging does not "
    "contradict it" in text
  )
  for claim in ("fewer updates", "more updates", "roughly fixed", "grows with", "outside the"):
    assert claim not in text
  some = _text(summary.summary(_points(), None, config=_config(), law_error="bad grid"))
  assert "No law was fitted (bad grid)" in some and "fewer updates" not in some
  with pytest.raises(ValueError, match="missing \\['censored'\\]"):
    summary.summary(_points().drop(columns="censored"))


# ---------------------------------------------------------------- the report that opens with it


def _sigmoid_sweep(
  root,
  last: int = 4096,
  cap: int | None = None,
  late: float | None = None,
  pt: bool = False,
  layers: int = 2,
) -> str:
  """conftest's sigmoid sweep over B {8, 16, 32} × C {32, 64}, UPT = e^9.5 / B^0.8, seed 1 of
  B 8 / C 64 never rising (censored at 4,096) or, with ``late``, jumping there; ``layers``:
  model.n_layers of every config written."""
  from conftest import write_sigmoid_sweep

  return write_sigmoid_sweep(
    str(root / "sweep"), (8, 16, 32), (32, 64), 0.0, (8, 64), last, cap, late, pt, layers
  )


def test_the_report_opens_with_the_summary_and_shows_the_b_by_c_heat_map(tmp_path, capsys):
  from analysis import report

  sweep = _sigmoid_sweep(tmp_path)
  out = report.report([sweep], None, report.Options(progress=True, n_boot=200, source="online"))
  # the steps after the metrics, named on stderr as each starts, then what each took
  said = capsys.readouterr().err.splitlines()
  assert [re.split(r" \(| \.\.\. ", line)[0] for line in said[:-1]] == [
    "report: emergence points of 12 models",
    "report: figures of the curves",
    "report: the circuit: previous-token and induction heads, loss and attention",
    "report: where the heads work",
    "report: agreement across metrics and methods",
    "report: fitting the law",
    "report: the summary",
    "report: writing report.md and report.html",
  ]
  assert all(re.search(r" \.\.\. \[\d+\.\d s\]$", line) for line in said[:-1]), said
  assert re.fullmatch(r"report: done \d+\.\d s after the metrics \(.*\)", said[-1]), said[-1]
  assert said[-1].count(" s,") == 7 and "law " in said[-1] and "curve figures " in said[-1]
  md = open(out["report_md"]).read()
  lines = md.splitlines()
  assert lines[0] == "# Induction-head emergence report" and lines[2] == "## Summary"
  body = " ".join(md.split("## Emergence points")[0].split())
  assert "**Setup.** 12 models: 2-layer attention-only transformers" in body
  assert "the classic induction task" in body and "each cell trained for 4,096 updates" in body
  assert "11 of 12 models emerged" in body
  assert "emergence comes in fewer updates at larger B" in body
  assert "1 of 12 models had not emerged by their last checkpoint (censored; B 8/C 64)" in body
  assert "**Against the study.**" in body and "crosses data and scale" in body
  assert "docs/study.md" in body
  assert md.index("## Summary") < md.index("## Emergence points") < md.index("## Emergence law")
  assert "figures/emergence_bc.png" in md
  for ext in ("png", "pdf"):
    assert os.path.getsize(os.path.join(sweep, "analysis", "figures", f"emergence_bc.{ext}")) > 1000
  page = open(out["report_html"]).read()
  assert "<b>Setup.</b>" in page and "**" not in page
  law = json.load(open(os.path.join(sweep, "analysis", "law.json")))
  assert 0.6 < law["alpha"] < 1.0  # the curves' UPT ∝ B^-0.8
  # every jump has at least 3 checkpoints after it: no caution anywhere, no refit
  assert out["cautions"] == [] and out["law_sensitivity"] is None
  assert "caution" not in md and "jumped so close" not in md


def test_a_sweep_evaluated_only_at_update_0_gets_words_and_no_curve_figure(tmp_path):
  from analysis import report

  sweep = _sigmoid_sweep(tmp_path, last=0)
  out = report.report([sweep], None, report.Options(progress=False, n_boot=0, source="online"))
  md = " ".join(open(out["report_md"]).read().split())
  assert "0 of 12 models emerged by their last checkpoint; none did" in md
  assert "No curve figures: every curve has only its update-0 point so far" in md
  assert "curves_ps_max.png" not in md


def test_a_frequency_by_reliability_grid_gets_counts_per_value_and_no_b_or_c_claim():
  rows = []
  for i, (f, r) in enumerate([(f, r) for f in (0.5, 1.0) for r in (0.5, 1.0)]):
    for s in range(2):
      emerged = r == 1.0 and (f == 1.0 or s == 0)
      rows.append(
        {
          "run": "exp2",
          "cell": 2 * i + s,
          "seed": s,
          "batch_size": 16,
          "context_size": 64,
          "data.frequency": f,
          "data.reliability": r,
          "emergence_step": 1500.0 if emerged else math.nan,
          "censored": not emerged,
          "censor_step": math.nan if emerged else 3000.0,
        }
      )
  pts = pd.DataFrame(rows)
  text = _text(
    summary.summary(
      pts,
      None,
      config=_config(),
      axes=["data.frequency", "data.reliability"],
      law_error="one batch size and one context size",
    )
  )
  assert (
    "B 16 sequences per update and C 64 tokens per sequence throughout, over "
    "data.frequency ∈ {0.5, 1} × data.reliability ∈ {0.5, 1}" in text
  )
  assert (
    "data.frequency: 0.5 → 1 of 4, 1 → 2 of 4; data.reliability: 0.5 → 0 of 4, 1 → 3 of 4" in text
  )
  assert "fewer updates" not in text and "No law was fitted (one batch size" in text


def test_a_model_that_emerged_in_the_last_interval_before_its_cap_is_flagged(
  tmp_path, capsys, monkeypatch
):
  """Seed 1 of B 8 / C 64 jumps between the checkpoints at 3,444 and 4,096, and training ends
  at a cap of 4,300: its late plateau rests on 4,096 and 4,300. It is flagged in the report's
  table, its limitations (with the law refitted with it censored at 4,300) and on the console."""
  from analysis import __main__ as cli
  from analysis import report, scaling

  sweep = _sigmoid_sweep(tmp_path, cap=4300, late=3800.0)
  written = {}
  run = report.report

  def keep(*args, **kwargs):
    written.update(run(*args, **kwargs))
    return written

  monkeypatch.setattr(report, "report", keep)
  argv = ["report", sweep, "--n_boot", "200", "--source", "online", "--noprogress"]
  assert cli.main(argv) == 0
  captured = capsys.readouterr()
  console = captured.out
  assert "report: " not in captured.err  # --noprogress: no step named
  md = open(written["report_md"]).read()
  text = " ".join(md.split())
  # the direct fit: the same points with that model censored at its last checkpoint
  table = pd.read_csv(os.path.join(sweep, "analysis", "emergence.csv"))
  pts = table[(table["metric"] == "ps_max") & (table["method"] == "threshold")]
  pts = pts.reset_index(drop=True)
  late = (pts["batch_size"] == 8) & (pts["context_size"] == 64) & (pts["seed"] % 2 == 1)
  row = pts[late].iloc[0]
  assert (row["step_before"], row["step_after"], row["last_step"]) == (3444, 4096, 4300)
  assert row["late_points"] == 2 and bool(row["last_interval"]) and not row["censored"]
  moved = pts.copy()
  moved.loc[late, ["censored", "emergence_step", "censor_step"]] = [True, math.nan, 4300.0]
  direct = scaling.fit_law(moved, n_boot=200, seed=0)
  refit = written["law_sensitivity"]
  assert refit["n_censored"] == 1
  for name in ("log_T", "T", "alpha", "beta", "sigma"):
    assert refit[name] == pytest.approx(getattr(direct, name), rel=1e-9), name
    assert refit["ci"][name] == pytest.approx(direct.ci[name], rel=1e-9), name
  assert [c["caution"] for c in written["cautions"]] == ["last interval, plateau on 2 checkpoints"]
  law = written["law"]

  def est(fit, name, f):
    return f"{f(fit[name])} [{f(fit['ci'][name][0])}, {f(fit['ci'][name][1])}]"

  two, n = "{:.2f}".format, "{:,.0f}".format
  d = direct.to_dict()
  assert (
    f"α {est(law, 'alpha', two)} → {est(d, 'alpha', two)}, β {est(law, 'beta', two)} → "
    f"{est(d, 'beta', two)}, T {est(law, 'T', n)} → {est(d, 'T', n)}." in text
  )
  assert (
    "No model was censored, but 1 of the 12 emerged models jumped so close to the end of "
    "training" in text
  )
  assert (
    "B 8/C 64 seed 1 (last interval, plateau on 2 checkpoints: jumped between updates 3,444 "
    "and 4,096, last checkpoint 4,300)" in text
  )
  # the per-grid-point table's caution column names the seed
  header = [line for line in md.splitlines() if line.startswith("| run ")][0]
  assert [c.strip() for c in header.split("|")][-2] == "caution"
  rows = [line for line in md.splitlines() if line.startswith("| sweep ")]
  flagged = [line for line in rows if "seed 1: last interval, plateau on 2 checkpoints" in line]
  assert len(flagged) == 1
  assert [c.strip() for c in flagged[0].split("|")[2:4]] == ["8", "64"]
  # the law's coefficient table has the refit beside the main fit
  law_header = [line for line in md.splitlines() if line.startswith("| coefficient ")][0]
  assert "flagged censored" in law_header
  column = [c.strip() for c in law_header.split("|")].index("flagged censored")
  alpha = [line for line in md.splitlines() if line.startswith("| alpha ")][0]
  assert float(alpha.split("|")[column]) == pytest.approx(d["alpha"], abs=1e-3)
  # the console: a caution table and the refitted law's row
  assert "caution: 1 cell emerged at the end of training" in console
  line = [x for x in console.splitlines() if "last interval, plateau on 2 checkpoints" in x]
  assert line[0].split()[:6] == ["8", "64", "1", n(row["emergence_step"]), "3,444-4,096", "4,300"]
  flagged_row = [x for x in console.splitlines() if x.strip().startswith("flagged censored")]
  assert flagged_row[0].split()[2:4] == [f"{d['log_T']:.2f}", f"[{d['ci']['log_T'][0]:.2f},"]
  assert (
    f"{d['alpha']:.2f} [{d['ci']['alpha'][0]:.2f}, {d['ci']['alpha'][1]:.2f}]" in (flagged_row[0])
  )


def test_the_reports_tables_write_numbers_one_way():
  """Counts of updates and tokens with thousands separators in every column (`median_step`
  3,937 beside `median_all` 3,937, not 3937); small numbers to 3 significant digits; B, C and
  counts of models as they are."""
  from analysis import report, report_doc

  pts = _points(alpha=0.3)  # emergence at 3,000–10,000 updates
  pts["emergence_tokens"] = pts["emergence_step"] * pts["batch_size"] * pts["context_size"]
  table = report_doc.fmt(report._per_point(pts, []))
  assert (table["median_step"] == table["median_all"]).all()
  assert all("," in v for v in table["median_step"]) and all(
    "," in v for v in table["median_tokens"]
  )
  other = report_doc.fmt(
    pd.DataFrame(
      {
        "step": [4096, 512],
        "batch_size": [1024, 8],
        "n": [2, 2],
        "r": [0.98765, 0.5],
        "x": [1234.5, 12.0],
      }
    )
  )
  assert list(other["step"]) == ["4,096", "512"]
  assert list(other["batch_size"]) == [1024, 8] and list(other["n"]) == [2, 2]
  assert list(other["r"]) == ["0.988", "0.5"] and list(other["x"]) == ["1,234", "12"]


def test_the_demo_docs_script_renders_every_block_from_a_report(tmp_path):
  """benchmarks/demo_docs.py: every number of the demo in README.md and docs/results.md comes
  from a block it renders from the report's output; here from a small sweep's, for the form of
  each block (the demo itself takes minutes)."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import demo_docs

  sweep = _sigmoid_sweep(tmp_path, pt=True)
  printed = demo_docs.run_report(sweep, "runs/demo", ["--n_boot", "200", "--source", "online"])
  demo = demo_docs.load(sweep, printed)
  demo.quick = "[16, 64] (2, 4, 1, 40, 40)"  # the quick example needs params: tests/test_notebook
  blocks = demo_docs.render(demo)
  assert set(blocks) == set(demo_docs.BLOCKS)
  for name, (doc, _) in demo_docs.BLOCKS.items():  # each block once in its file, filled
    text = open(os.path.join(ROOT, doc)).read()
    begin, end = doc_markers = demo_docs.doc_blocks.markers(demo_docs.TOOL, name)
    assert text.count(begin) == 1 and text.count(end) == 1, (doc, doc_markers)
    assert demo_docs.doc_blocks.read(os.path.join(ROOT, doc), demo_docs.TOOL, name).strip()
  assert "/tmp" not in blocks["readme-printed"] and str(tmp_path) not in blocks["readme-printed"]
  assert blocks["readme-printed"].startswith("```\nreport: runs/demo/analysis/report.md")
  assert "\nemergence: 11 of 12 cells emerged (ps_max, threshold)" in blocks["readme-printed"]
  assert "law: UPT = T / (B^alpha C^beta)" in blocks["readme-printed"]
  emergence = blocks["results-emergence"].splitlines()
  assert emergence[0] == "| B ↓ C → | 32 | 64 |" and [r.split(" |")[0] for r in emergence[2:]] == [
    "| 8",
    "| 16",
    "| 32",
  ]
  assert re.fullmatch(r"\| 8 \| [\d,]+ \| > [\d,]+ \|", emergence[2]), emergence[2]
  assert blocks["readme-finding"].startswith("11 of 12 models emerged (prefix-matching score")
  assert re.search(r"The fitted law: α = \d\.\d\d \[", blocks["readme-finding"])
  law = blocks["results-law"].splitlines()
  assert law[0].startswith("|") and "alpha (B)" in law[0]
  assert [r.split("|")[1].strip() for r in law[2:5]] == [
    "censored MLE",
    "emerged only",
    "study (published)",
  ]
  circuit = blocks["results-circuit"].split("\n\n")
  assert circuit[0].splitlines()[0] == "| B | C | previous-token (pt_max) | induction (ps_max) |"
  assert len(circuit[0].splitlines()) == 2 + 6
  assert "before it in 0, after it in 0, and too close to order in 11" in circuit[1], circuit[1]
  assert circuit[1].endswith(": the two form together.")
  assert blocks["readme-circuit"] == circuit[1]
  assert blocks["results-positions"].startswith("Not measured")  # no params in this sweep
  agreement = blocks["results-agreement"]
  assert "| pt_max | threshold | 12 of 12 | 92% | -0.045 |" in agreement, (
    agreement
  )  # B 8 × C 64 seed 1: pt only
  summary = blocks["results-summary"]
  assert summary.startswith("> **Finding.** 11 of 12 models emerged")
  assert "\n>\n> **Against the study.**" in summary
  assert blocks["readme-quick"].startswith("On the demo it prints `[16, 64] (2, 4, 1, 40, 40)`")
  assert "B 16 × C 64" in blocks["readme-quick"] and "T = 40 tokens" in blocks["readme-quick"]


def test_a_one_layer_model_has_no_previous_token_score_and_the_report_says_why(tmp_path):
  """pt_max is the previous-token score of a head below the last layer: a one-layer model has
  none, so its recorded pt_max is left out of the curves, the emergence points and the circuit
  section, which says why in one sentence."""
  from analysis import report

  sweep = _sigmoid_sweep(tmp_path, pt=True, layers=1)
  out = report.report([sweep], None, report.Options(progress=False, n_boot=0, source="online"))
  md = " ".join(open(out["report_md"]).read().split())
  section = md.split("## The circuit: previous-token and induction heads")[1].split("## ")[0]
  assert section.strip().startswith(
    "No previous-token score where every model has one layer: a previous-token head feeds an "
    "induction head only from a layer below it"
  ), section
  assert "below the last layer attending" not in md and "emerged in" not in section
  assert "curves_pt_max.png" not in md and "| pt_max |" not in md  # no figure, no agreement row
  table = pd.read_csv(out["emergence_csv"])
  assert "pt_max" not in set(table["metric"]) and "ps_max" in set(table["metric"])
  curves = pd.read_csv(os.path.join(sweep, "analysis", "curves.csv"))
  assert curves["pt_max"].isna().all() and curves["ps_max"].notna().all()
  assert not os.path.exists(os.path.join(sweep, "analysis", "circuit.csv"))


def test_a_two_layer_sweep_keeps_its_previous_token_score():
  """Only one-layer models lose pt_max: the same frames with no one-layer model are unchanged."""
  from analysis import circuit

  curves = pd.DataFrame({"run": ["a", "a"], "cell": [0, 1], "pt_max": [0.5, 0.6]})
  assert circuit.without_one_layer(curves, set()) is curves
  masked = circuit.without_one_layer(curves, {("a", 1)})
  assert list(masked["pt_max"].isna()) == [False, True]
  table = pd.DataFrame({"run": ["a"] * 4, "cell": [0, 0, 1, 1], "metric": ["pt_max", "ps_max"] * 2})
  kept = circuit.without_one_layer(table, {("a", 1)})
  assert list(zip(kept["cell"], kept["metric"])) == [(0, "pt_max"), (0, "ps_max"), (1, "ps_max")]


def _circuit_models(ratios, interval=2**0.25):
  """``circuit.order`` rows of models whose previous-token head emerged at ``ratio`` × the
  induction head's update (1,000), with checkpoints ``interval`` apart around both points."""
  n = len(ratios)
  return pd.DataFrame(
    {
      "run": ["r"] * n,
      "cell": range(n),
      "batch_size": [8] * n,
      "context_size": [64] * n,
      "pt_step": [1000.0 * r for r in ratios],
      "ps_step": [1000.0] * n,
      "pt_censored": [False] * n,
      "ps_censored": [False] * n,
      "pt_censor_step": [np.nan] * n,
      "ps_censor_step": [np.nan] * n,
      "pt_interval": [interval] * n,
      "ps_interval": [interval] * n,
    }
  )


def test_before_and_after_only_beyond_the_checkpoint_spacing():
  """A previous-token head at 0.9× or 1.1× the induction head's update is within the spacing
  of the checkpoints (1.19× at 4 per octave): neither before nor after it."""
  from analysis import circuit

  close = circuit.order_words(_circuit_models([0.9, 1.1, 1.01]), "threshold")
  assert "before it in 0, after it in 0, and too close to order in 3" in close, close
  assert close.endswith("the two form together.") and "where that is wider" not in close
  first = circuit.order_words(_circuit_models([0.5, 0.6, 0.95]), "threshold")
  assert "before it in 2, after it in 0, and too close to order in 1" in first, first
  assert first.endswith("forms first or together with it, never measurably after.")
  # Checkpoints 2× apart: 0.6× is within one interval, so not measurably before.
  sparse = circuit.order_words(_circuit_models([0.6, 0.7], interval=2.0), "threshold")
  assert "before it in 0, after it in 0, and too close to order in 2" in sparse, sparse
  assert "or within the checkpoint interval around the points where that is wider" in sparse


def test_a_table_column_of_numbers_and_censored_bounds_is_written_one_way(tmp_path):
  """The circuit table's median column holds floats beside '> 995' (a censored seed's bound):
  its floats are written like every other table's (3 significant digits, whole with separators
  from 1,000), the CSV behind it keeps full precision."""
  from analysis import circuit, report_doc

  models = _circuit_models([0.33982189325512286, 3.9374, 1.0])
  models.loc[2, ["pt_step", "pt_censored", "pt_censor_step"]] = [np.nan, True, 995.0]
  models["batch_size"] = [8, 16, 32]  # one model per grid point
  table = circuit.order_by_point(models)
  assert table["pt_median"].map(type).nunique() == 2  # floats and text in one column
  shown = report_doc.fmt(table)
  assert list(shown["pt_median"]) == ["340", "3,937", "> 995"], list(shown["pt_median"])
  doc = report_doc.Doc(str(tmp_path))
  doc.table(pd.DataFrame({"median": [339.82189325512286, "> 995", 3937.4, 0.123456]}))
  md = doc.markdown()
  assert "339.82" not in md and "0.123456" not in md
  assert [r.strip(" |") for r in md.splitlines()[2:]] == ["340", "> 995", "3,937", "0.123"]
  assert doc.blocks[0][3] == ("right",)  # still a column of numbers
  models.to_csv(tmp_path / "circuit.csv", index=False)
  assert pd.read_csv(tmp_path / "circuit.csv")["pt_step"][0] == 339.82189325512286
