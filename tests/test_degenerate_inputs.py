"""Inputs that are legal by kind and range but do nothing or break silently (issue 58, Why 5):
each is refused in one line naming the field, the value and what is allowed."""

import pytest

from ihsweep.configuration.config import validate
from ihsweep.configuration.fields import ConfigError


def main(argv) -> int:
  """``cli.main(argv)`` in this process, absl's flags cleared before and after (it keeps the
  last call's values otherwise)."""
  from ihsweep import cli
  from ihsweep.commands import flags as flags_lib

  flags_lib.FLAGS.unparse_flags()
  try:
    return cli.main(argv)
  finally:
    flags_lib.FLAGS.unparse_flags()


@pytest.mark.parametrize(
  "field,value,words",
  [
    ("train.eps", 1e-300, ["train.eps = 1e-300", "normal float32 range", "0/0 = NaN"]),
    ("train.eps", 1e-40, ["train.eps = 1e-40", "subnormal"]),
    ("train.eps", 1e39, ["train.eps = 1e+39", "infinite"]),
    ("train.b2", 0.9999999999, ["train.b2 = 0.9999999999", "[0, 0.99999994]", "is 1.0"]),
    ("train.b1", 0.99999999, ["train.b1 = 0.99999999", "bias correction 1 - b1^t is 0"]),
    ("train.lr", 1e30, ["train.lr = 1e+30", "[1.18e-38, 10]", "500 times its initial scale"]),
    ("train.lr", 1e-50, ["train.lr = 1e-50", "[1.18e-38, 10]", "no float32 parameter changes"]),
    ("train.lr", 1e-39, ["subnormal", "half its float32 spacing", "9.3e-10"]),
  ],
)
def test_values_degenerate_in_float32_are_refused(tiny, field, value, words):
  cfg = tiny()
  section, name = field.split(".")
  with cfg.unlocked():
    cfg[section][name] = value
  with pytest.raises(ConfigError) as err:
    validate(cfg)
  assert err.value.field == field
  for w in words:
    assert w in str(err.value), str(err.value)


def test_a_per_model_learning_rate_is_held_to_the_same_range(tiny):
  cfg = tiny()
  with cfg.unlocked():
    cfg.ensemble.peak_lrs = (1e-3,) * (cfg.ensemble.size - 1) + (1e-50,)
  with pytest.raises(ConfigError) as err:
    validate(cfg)
  assert err.value.field == f"ensemble.peak_lrs[{cfg.ensemble.size - 1}]"


@pytest.mark.parametrize(
  "field,value",
  [("train.eps", 1.2e-38), ("train.b2", 0.99999994), ("train.lr", 1e-9), ("train.lr", 1.2e-38)],
)
def test_the_edges_of_the_float32_ranges_are_accepted(tiny, field, value):
  cfg = tiny()
  section, name = field.split(".")
  with cfg.unlocked():
    cfg[section][name] = value
  validate(cfg)


def test_the_refusal_names_the_true_float32_half_spacing_and_a_moving_lr_is_allowed(tiny):
  """The 0.02 weight's half-spacing is np.spacing's (9.3e-10, not 1.2e-9); an lr of 1e-10 moves
  the zero-initialized biases and the small initial weights, so it is not refused."""
  import numpy as np

  from ihsweep.configuration import config as config_lib

  assert f"{np.spacing(np.float32(0.02)) / 2:.2g}" == "9.3e-10"
  assert config_lib.check_lr("train.lr", 1e-10) == 1e-10
  with pytest.raises(ConfigError) as err:
    config_lib.check_lr("train.lr", 1e-39)
  assert "9.3e-10" in str(err.value) and "1.2e-9" not in str(err.value)


def test_the_not_learning_line_names_models_above_a_uniform_guess():
  import math

  from ihsweep.training.evaluation import not_learning_line

  ln_v = math.log(64)
  assert not_learning_line([ln_v, ln_v + 0.9, float("nan")], 64) == (None, [])
  line, ids = not_learning_line([3.0, 8618.7, float("nan")], 64, ids=[4, 5, 6])
  assert ids == [5] and line.startswith("1 of 3 models diverged or did not learn"), line
  assert "ln V + 1 = 5.16" in line and "5 (final loss 8619)" in line, line


def test_train_at_lr_10_names_every_model_as_not_learning_and_fails(tmp_path, capsys):
  """A real tiny train at lr = 10 for 30 updates: finite losses thousands of nats above ln V
  (issue 58) are named, and with every model so the exit status is 1."""

  small = "n_layers=1 n_heads=2 d_model=32 d_mlp=64 vocab_size=64 max_context=32".split()
  argv = ["ihsweep", "train", "--config=configs/default.py:tiny", f"--workdir={tmp_path / 'r'}"]
  argv += ["--noprogress", "--config.train.lr=10", "--config.train.num_steps=30"]
  argv += [f"--config.model.{x}" for x in small] + ["--config.ensemble.size=2"]
  argv += ["--config.train.batch_size=8", "--config.train.context_size=32"]
  assert main(argv) == 1
  err = capsys.readouterr().err
  assert "ihsweep: error: every model diverged or did not learn: final loss > ln V + 1" in err, err


def test_the_divergence_line_names_the_models_and_whether_all_diverged():
  from ihsweep.commands.train import divergence

  assert divergence([-1, -1]) == (None, False)
  line, every = divergence([-1, 12])
  assert not every and "1 of 2 models diverged" in line and "1 at update 12" in line
  line, every = divergence([3, 1200], ids=[7, 9])
  assert every and line.startswith("every model diverged") and "9 at update 1,200" in line


@pytest.mark.parametrize("diverged_at,code", [((-1, 5), 0), ((4, 5), 1)])
def test_train_warns_of_diverged_models_and_fails_when_all_did(
  tmp_path, capsys, monkeypatch, diverged_at, code
):
  """``ihsweep train`` as ``ihsweep run``: a warning naming each diverged model, exit status 1
  when every model diverged (training stubbed: the command's words only)."""
  import types

  import numpy as np

  from ihsweep.training import memory, runner

  out = types.SimpleNamespace(
    losses=np.array([2.5, np.nan]), tokens_per_s=1e3, diverged_at=np.array(diverged_at)
  )
  monkeypatch.setattr(memory, "check_possible", lambda *a, **k: None)
  monkeypatch.setattr(runner, "resolve", lambda cfg, **k: cfg)
  monkeypatch.setattr(runner, "fit", lambda *a, **k: out)
  argv = ["ihsweep", "train", "--config=configs/default.py", f"--workdir={tmp_path / 'r'}"]
  assert main(argv) == code
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "1 at update 5" in err[0], err
  assert err[0].startswith("ihsweep: error: every model" if code else "ihsweep: warning: 1 of 2")


@pytest.mark.parametrize("diverged,stuck,code", [(1, 0, 0), (2, 0, 1), (1, 1, 1)])
def test_run_fails_when_every_cell_diverged(tmp_path, capsys, monkeypatch, diverged, stuck, code):
  """``ihsweep run`` counts diverged cells in its summary; all of them: exit status 1."""
  import types

  from ihsweep.workers import sweep

  summary = {
    "cells": 2,
    "groups": [],
    "cells_by_state": {"done": 2},
    "diverged_cells": diverged,
    "not_learning_cells": stuck,
    "budget": "updates",
  }
  result = types.SimpleNamespace(groups={}, summary=summary, interrupted=False)
  monkeypatch.setattr(sweep, "run", lambda *a, **k: result)
  argv = ["ihsweep", "run", "--config=configs/default.py", f"--workdir={tmp_path / 'r'}"]
  assert main(argv) == code
  captured = capsys.readouterr()
  assert f"diverged cells (loss NaN/inf, frozen): {diverged}" in captured.out
  assert ("every one of the sweep's 2 cells diverged" in captured.err) == bool(code)
  assert ("did not learn (final loss > ln V + 1" in captured.out) == bool(stuck)


def _points_csv(rows=None):
  """25 emerged cells on a 5 × 5 (B, C) grid from a law, as a hand-made fit-law CSV."""
  import math

  rows = rows or [
    {
      "batch_size": b,
      "context_size": c,
      "emergence_step": round(math.exp(13.26) / (b**0.37 * c**0.62) * (1 + 0.01 * i)),
    }
    for i, (b, c) in enumerate(
      (b, c) for b in (4, 8, 16, 32, 64) for c in (64, 128, 256, 512, 1024)
    )
  ]
  return rows


def _write(path, rows, extra=""):
  cols = list(rows[0])
  lines = [",".join(cols)] + [",".join(str(r[k]) for k in cols) for r in rows]
  path.write_text("\n".join(lines) + "\n" + extra)
  return str(path)


def test_fit_law_refuses_a_nan_step_unless_the_row_is_censored(tmp_path, capsys):
  from analysis import __main__ as cli

  rows = _points_csv()
  rows[3]["emergence_step"] = "NaN"
  csv = _write(tmp_path / "nan.csv", rows)
  assert cli.main(["fit-law", "--csv", csv, "--n_boot", "0"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert "column emergence_step: line 5 has 'NaN', not a number" in err, err
  assert "set censored true" in err
  for r in rows:  # the censored column says so: 'NaN' is the censored cell's missing step
    r["censored"], r["censor_step"] = "false", ""
  rows[3]["censored"], rows[3]["censor_step"] = "true", 400
  csv = _write(tmp_path / "censored.csv", rows)
  assert cli.main(["fit-law", "--csv", csv, "--n_boot", "0"]) == 0
  out = capsys.readouterr().out
  assert '"n_censored": 1' in out


def test_fit_law_warns_of_rows_repeated_in_every_column(tmp_path, capsys):
  from analysis import __main__ as cli

  rows = _points_csv()
  csv = _write(tmp_path / "twice.csv", rows + rows)
  assert cli.main(["fit-law", "--csv", csv, "--n_boot", "0"]) == 0
  err = capsys.readouterr().err
  assert "warning: 25 of 50 rows repeat an earlier row in every column (line 27, line 28" in err
  assert "and 20 more); each is fitted as a cell of its own" in err
  csv = _write(tmp_path / "once.csv", rows)
  assert cli.main(["fit-law", "--csv", csv, "--n_boot", "0"]) == 0
  assert "repeat an earlier row" not in capsys.readouterr().err


def test_a_sweeps_negative_seed_is_named_as_the_user_gave_it(tiny, no_compile):
  from ihsweep.configuration import grid as grid_lib

  with pytest.raises(ConfigError) as err:
    grid_lib.make_plan(tiny(**{"seed": -1}))
  assert err.value.field == "seed" and "config.seed = -1" in str(err.value)


@pytest.mark.parametrize(
  "spec,words",
  [
    ("train.batch_size=2,abc", "batch_size = 'abc' is not allowed: an int, the type of "),
    ("train.batch_size=2,2.5", "batch_size = 2.5 is not allowed: an int, the type of "),
    ("model.pos_encoding=rotary,3", "pos_encoding = 3 is not allowed: a str, the type of "),
  ],
)
def test_a_grid_value_of_the_wrong_type_is_one_line(tiny, no_compile, spec, words):
  from ihsweep.configuration import axes, grid

  cfg = axes.add_axes(tiny(), [spec])
  with pytest.raises(ConfigError) as err:
    grid.make_plan(cfg)
  path = spec.split("=")[0]
  assert err.value.field == f"sweep.grid.{path}"
  assert words in str(err.value) and "TypeError" not in str(err.value), str(err.value)


@pytest.mark.parametrize("command", ["train", "run"])
def test_an_override_without_config_names_the_missing_flag(tmp_path, capsys, command):

  argv = ["ihsweep", command, f"--workdir={tmp_path / 'r'}", "--config.train.eps=1e-3"]
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("ihsweep: --config.train.eps needs --config=FILE[:VARIANT]"), err
  assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()


def test_a_report_of_no_models_exits_1_saying_why(tmp_path, capsys, monkeypatch):
  """A run directory whose groups/ is gone: the report is written but the command exits 1 with
  the first warning (report.report stubbed: test_analysis_safety checks it sets no_models)."""
  from analysis import __main__ as cli
  from analysis import report

  why = "group g000 (2 cells) is skipped: cells.csv lists it as done, but its directory is missing"
  written = {
    "out_dir": str(tmp_path),
    "report_md": str(tmp_path / "report.md"),
    "no_models": True,
    "warnings": [why, "group g001 ..."],
  }
  monkeypatch.setattr(report, "report", lambda *a, **k: written)
  assert cli.main(["report", str(tmp_path), "--noprogress"]) == 1
  err = capsys.readouterr().err.strip()
  assert err.endswith(f"no model could be read: {why} (and 1 more warning(s) in the report)")
  assert len(err.splitlines()) == 1
  written["no_models"] = False
  assert cli.main(["report", str(tmp_path), "--noprogress"]) == 0


@pytest.mark.parametrize("state", ["interrupted", "pending"])
def test_a_stop_before_any_group_started_says_nothing_was_saved(
  tmp_path, capsys, monkeypatch, state
):
  import types

  from ihsweep.workers import sweep

  summary = {"cells": 2, "groups": [], "cells_by_state": {state: 2}, "diverged_cells": 0}
  summary["budget"] = "updates"
  groups = {"g000": {"state": state}}
  result = types.SimpleNamespace(groups=groups, summary=summary, interrupted=True)
  monkeypatch.setattr(sweep, "run", lambda *a, **k: result)
  work = tmp_path / "r"
  assert main(["ihsweep", "run", "--config=configs/default.py", f"--workdir={work}"]) == 143
  last = capsys.readouterr().err.strip().splitlines()[-1]
  if state == "interrupted":
    assert last == f"interrupted: state saved; rerun the same command to resume ({work})"
  else:
    assert last.startswith("interrupted before any group started training: nothing to save")


def test_levels_that_tie_for_fastest_are_not_called_fastest():
  """An exact U in C whose minimum lies between C = 32 and 64: they tie at every B, so no one
  level is said to be fastest (was: 'C = 32 is fastest', the first of the tie)."""
  import numpy as np
  import pandas as pd

  from analysis import scaling

  rows = [
    {"batch_size": b, "context_size": c, "seed": s, "censored": False, "censor_step": np.nan}
    | {"emergence_step": float(np.exp(9.0 - 0.8 * np.log(b) + 0.6 * (np.log2(c) - 5.5) ** 2))}
    for b in (8, 16, 32)
    for c in (16, 32, 64, 128)
    for s in range(2)
  ]
  fit = scaling.fit_law(pd.DataFrame(rows), n_boot=0)
  by = {t.symbol: t for t in fit.lack_of_fit}
  assert by["C"].fastest == {8.0: None, 16.0: None, 32.0: None}
  assert by["C"].lacks_fit and "is fastest" not in by["C"].sentence()
  assert fit.to_dict()["lack_of_fit"][0]["fastest"] == {"8": None, "16": None, "32": None}
