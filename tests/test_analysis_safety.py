"""Analysis of `ihsweep train` runs that went wrong: a model that diverged reads as diverged (its
metrics masked from the divergence on), a run too short for probes (C = 1) is skipped with the
reason instead of crashing."""

import json
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from analysis import curves as curves_lib
from analysis import report
from ihsweep.configuration import config as config_lib
from ihsweep.runs.reader import load_run

FAST = {
  "model.n_layers": 1,
  "model.d_mlp": 0,
  "train.steps_per_call": 5,
  "checkpoint.params_schedule": "log",
  "checkpoint.law_points_per_octave": 0,
  "checkpoint.state_every_steps": 0,
}


@pytest.fixture(scope="module")
def diverged_run(tmp_path_factory):
  """An `ihsweep train` run of 2 models over 20 updates; model 1 (lr 1e30) diverges early."""
  from conftest import tiny_config

  from ihsweep.training.runner import fit

  workdir = str(tmp_path_factory.mktemp("diverged") / "run")
  with pytest.MonkeyPatch.context() as mp:  # validation refuses lr > LR_MAX: let 1e30 through
    mp.setattr(config_lib, "LR_MAX", math.inf)
    _fit_diverging(fit, tiny_config, workdir)
  return workdir


def _fit_diverging(fit, tiny_config, workdir):
  fit(
    tiny_config(
      **FAST,
      **{
        "train.num_steps": 20,
        "eval.every_steps": 10,
        "eval.n_probes": 4,
        "eval.n_sequences": 4,
        "ensemble.peak_lrs": (1e-2, 1e30),
      },
    ),
    workdir,
    progress=False,
  )


def test_a_diverged_model_of_a_single_run_reads_as_diverged(diverged_run, tmp_path):
  rows = [json.loads(line) for line in open(os.path.join(diverged_run, "metrics.jsonl"))]
  logged = {r["diverged_step"] for r in rows if r["cell"] == 1 and r["diverged"]}
  assert len(logged) == 1  # the trainer's own record of the update at which it diverged
  step = logged.pop()
  run = load_run(diverged_run)
  assert list(run.cells["diverged"]) == [False, True]
  assert pd.isna(run.cells["diverged_step"][0]) and run.cells["diverged_step"][1] == step
  table = curves_lib.compute_curves(run, n_probes=4, n_sequences=2, cache=False, progress=False)
  one = table[table["cell"] == 1]
  assert (one["step"] >= step).any()
  assert one[one["step"] >= step][list(curves_lib.METRICS)].isna().all().all()
  assert one[one["step"] < step]["ps_max"].notna().all()
  assert table[table["cell"] == 0]["ar_acc"].notna().all()
  out = report.report(
    [diverged_run], str(tmp_path / "out"), report.Options(progress=False, n_boot=0, source="online")
  )
  assert "1 cell(s) diverged (loss NaN/inf)" in open(out["report_md"]).read()
  # Without the evaluations (eval off): the training log's NaN loss tells, at the start of the
  # host call (5 updates) in which it diverged.
  bare = str(tmp_path / "bare")
  shutil.copytree(diverged_run, bare)
  os.remove(os.path.join(bare, "metrics.jsonl"))
  cells = load_run(bare).cells
  assert list(cells["diverged"]) == [False, True]
  assert step - 5 < cells["diverged_step"][1] <= step


def test_a_run_too_short_for_probes_is_skipped_with_the_reason(tmp_path):
  from conftest import tiny_config

  from ihsweep.training.runner import fit

  workdir = str(tmp_path / "c1")
  fit(
    tiny_config(**FAST, **{"train.context_size": 1, "train.num_steps": 4}), workdir, progress=False
  )
  assert os.listdir(os.path.join(workdir, "checkpoints", "params"))
  out = report.report([workdir], str(tmp_path / "out"), report.Options(progress=False, n_boot=0))
  warnings = " ".join(out["warnings"])
  assert "block of L = 0" in warnings and "C >= 6" in warnings
  assert "cannot be computed for group run; the group is skipped" in warnings
  assert "No curves could be read" in open(out["report_md"]).read()
  assert out["no_models"]  # the command exits 1 (test_degenerate_inputs)
  assert np.isnan(out.get("n_cells", np.nan))  # nothing was computed, nothing made up


def test_a_copy_of_a_run_beside_it_is_refused(diverged_run, tmp_path):
  """`cp -a` keeps the run's id (its run marker): analysed together, every model would count
  twice; the report refuses before it writes anything."""
  from ihsweep.runs import ownership, reader

  copy = str(tmp_path / "copy")
  shutil.copytree(diverged_run, copy, symlinks=True)
  assert ownership.run_identity(copy) == ownership.run_identity(diverged_run) is not None
  with pytest.raises(reader.NotARun, match="are copies of one run"):
    report.report([diverged_run, copy], str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()
