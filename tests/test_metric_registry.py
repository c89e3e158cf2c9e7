"""The metric registry (ihsweep/compute/metric_registry.py), the one home of every metric: a metric
registered in one place is computed by the evaluation, written to metrics.jsonl, accepted (and
range-checked) by the stop rule, kept by the curves and tabulated by the emergence analysis."""

import contextlib
import dataclasses
import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from test_metrics import CFG, L, _evaluate, _probes, induction_circuit

from analysis import curves as curves_lib
from analysis import emergence, plots, setup_words
from ihsweep.compute import metric_registry, metrics
from ihsweep.configuration import fields
from ihsweep.configuration import grid as grid_lib
from ihsweep.configuration.fields import ConfigError
from ihsweep.data import probes
from ihsweep.training import evaluation
from ihsweep.training.evaluation import Evaluator

STEPS = np.asarray([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])


@pytest.fixture
def ps_mean(monkeypatch):
  """A metric added for the test's sake, in one place: the prefix-matching score averaged over
  every (layer, head), computed from evaluate's ``ps``; it may stop a group, with ps_max's
  rules (a threshold in (0, 1], above uniform attention's level)."""
  metric = metric_registry.Metric(
    "ps_mean",
    "the mean prefix-matching score over heads",
    "attention probability in [0, 1]",
    "prefix-matching score (mean over heads)",
    +1,
    0.05,
    emergence=True,
    stop=dataclasses.replace(
      metric_registry.UNIT_INTERVAL,
      untrained=metric_registry.uniform_ps,
      untrained_text="the ps_mean of uniform attention",
    ),
    compute=lambda out: out["ps"].mean(),
  )
  monkeypatch.setitem(metric_registry.REGISTRY, "ps_mean", metric)
  return metric


def test_the_registry_holds_the_metrics_and_rules_that_were_spread_over_four_files():
  reg = metric_registry.REGISTRY
  assert {n: reg[n].min_jump for n in ("ps_max", "la_max", "dla_max", "ar_acc", "icl_score")} == {
    "ps_max": 0.2,
    "la_max": 0.1,
    "dla_max": 1.0,
    "ar_acc": 0.2,
    "icl_score": 1.5,
  }
  assert [reg[n].direction for n in ("ps_max", "ar_rank", "icl_score", "val_loss")] == [
    1,
    -1,
    -1,
    -1,
  ]
  assert reg["ar_rank"].transform == "log1p10"
  np.testing.assert_allclose(reg["ar_rank"].apply([9.0, 99.0]), [1.0, 2.0])
  # The lists the metrics module, the planner and the analysis each held before.
  assert metric_registry.stop_names() == (
    "ps_max",
    "pt_max",
    "la_max",
    "dla_max",
    "ar_acc",
    "ar_data_acc",
  )
  assert emergence.DEFAULT_METRICS == (
    "ps_max",
    "pt_max",
    "la_max",
    "dla_max",
    "ar_acc",
    "icl_score",
  )
  assert (
    set(curves_lib.METRICS)
    == set(metrics.SUMMARY_KEYS)
    == {
      "ps_max",
      "pt_max",
      "la_max",
      "dla_max",
      "ar_acc",
      "ar_rank",
      "ar_data_acc",
      "ar_data_rank",
      "icl_score",
      "val_loss",
    }
  )
  assert reg["ps_max"].stop.untrained(16) == pytest.approx(0.0424, abs=5e-5)
  assert reg["ps_max"].stop.untrained(8, 64) == pytest.approx(0.0166, abs=5e-5)  # blocks at the end
  assert reg["pt_max"].stop.untrained(8, 64) == pytest.approx(0.0176, abs=5e-5)
  assert plots.LABELS["dla_max"] == "direct logit attribution (best head, nats)"


@pytest.mark.parametrize(
  "change, words",
  [
    ({"direction": 0}, "direction = 0"),
    ({"min_jump": -1.0}, "min_jump = -1.0"),
    ({"transform": "log"}, "transform = 'log'; allowed: none, log1p10"),
    ({"name": "ps"}, "name = 'ps'; allowed: not one of the reserved keys"),
    ({"name": "ps max"}, "an identifier"),
    ({"direction": -1}, "None for a falling metric"),
  ],
)
def test_a_bad_metric_is_refused_naming_the_field(ps_mean, change, words):
  with pytest.raises(ValueError, match="Metric '") as e:
    dataclasses.replace(ps_mean, **change)
  assert words in str(e.value)
  with pytest.raises(ValueError, match="'ps_mean' is already registered"):
    metric_registry.register(ps_mean)
  with pytest.raises(ValueError, match="metric = 'nope': allowed ps_max, pt_max, la_max"):
    metric_registry.get("nope")


def test_a_registered_metric_is_evaluated_written_and_read_by_the_stop_rule(ps_mean, tiny):
  out = jax.tree_util.tree_map(np.asarray, _evaluate(induction_circuit()))
  assert out["ps_mean"].dtype == np.float32
  np.testing.assert_allclose(out["ps_mean"], out["ps"].mean(), rtol=1e-6)
  assert out["ps"][1, 0] > 0.9 and 0.2 < out["ps_mean"] < 0.5  # one induction head of four
  # One metrics.jsonl row per model (an ensemble of one here), and the stop rule reads it.
  host = {k: v[None] for k, v in out.items()}
  rows = Evaluator.rows(host, 10, 256, tiny(**{"ensemble.size": 1}), None)
  assert rows[0]["ps_mean"] == pytest.approx(float(out["ps_mean"]))
  stop = evaluation.EmergenceStop("ps_mean", 0.2, 2.0, 1)
  stop.observe(0, [0.05], [False])
  stop.observe(10, [r["ps_mean"] for r in rows], [False])
  assert stop.crossed == [10] and stop.done(20) and not stop.done(19)
  # A metric is one scalar per model; one that is not is refused when the evaluation is traced.
  params, reps = induction_circuit(), jnp.asarray(_probes(4))
  seqs = jnp.concatenate([reps, reps[:, :1]], axis=1)
  inputs = (reps, seqs, jnp.asarray(probes.recall_positions(np.asarray(seqs))))
  kwargs = dict(
    cfg=CFG, block_len=L, icl_early=3, icl_late=2 * L - 1, probe_batch=4, sequence_batch=4
  )
  for name, compute, words in (
    ("ps_all", lambda out: out["ps"], "compute returned shape (2, 2)"),
    ("nowhere", None, "has no compute function"),
  ):
    metric = dataclasses.replace(ps_mean, name=name, compute=compute)
    with pytest.raises(ValueError, match=f"metric '{name}'.*{re.escape(words)}"):
      with _registered(metric):
        jax.eval_shape(functools.partial(metrics.evaluate, **kwargs), params, *inputs)
  # The analysis's row for the same evaluation, recomputed from checkpoints.
  group = _FakeGroup(pd.DataFrame({"cell": [0]}))
  row = curves_lib._rows_from_host(host, group, 10)[0]
  assert row["ps_mean"] == pytest.approx(float(out["ps_mean"])) and row["tokens"] == 10 * 8 * 32


@contextlib.contextmanager
def _registered(metric):
  metric_registry.register(metric)
  try:
    yield
  finally:
    del metric_registry.REGISTRY[metric.name]


def _sweep_config(tiny, **sweep):
  cfg = tiny(**{"eval.every_steps": 10, "model.n_layers": 1, "model.d_mlp": 0})
  with cfg.unlocked():
    cfg.sweep = fields.default_sweep()
  cfg.sweep.update(budget="emergence", law_multiple=0.5, **sweep)
  cfg.train.num_steps = 200  # its default: the budget sets each group's updates
  return cfg


def test_the_stop_rule_accepts_a_registered_metric_with_its_rules(ps_mean, tiny, no_compile):
  plan = grid_lib.make_plan(_sweep_config(tiny, stop_metric="ps_mean", stop_threshold=0.3))
  assert len(plan.groups) == 1 and plan.budget == "emergence"
  # C = 32: probe blocks of L = 16, where uniform attention scores 0.0424 (the untrained level).
  for threshold, words in (
    (0.04, "above 0.0424, the ps_mean of uniform attention on probe blocks of L = 16 (C = 32)"),
    (0.0, "a finite number in (0.0, 1.0]"),
    (1.5, "a finite number in (0.0, 1.0]"),
  ):
    with pytest.raises(ConfigError) as e:
      grid_lib.make_plan(_sweep_config(tiny, stop_metric="ps_mean", stop_threshold=threshold))
    assert e.value.field == "sweep.stop_threshold" and words in str(e.value), e.value
  # A falling metric has no stop rule; the error lists the registered metric among the allowed.
  with pytest.raises(ConfigError) as e:
    grid_lib.make_plan(_sweep_config(tiny, stop_metric="val_loss"))
  assert e.value.field == "sweep.stop_metric"
  assert "'ar_data_acc', 'ps_mean'" in str(e.value)


class _FakeGroup:
  """What the curves read of a group: its id, cells, B, C and online metrics."""

  def __init__(self, cells, online=None):
    self.id, self.cells, self.batch_size, self.context_size = "g000", cells, 8, 32
    self._online = pd.DataFrame() if online is None else online

  def online_metrics(self, warnings=None):
    return self._online


def test_the_curves_keep_a_registered_metric(ps_mean, tmp_path):
  assert "ps_mean" in curves_lib.METRICS
  # Online rows keep it; a model's values from the update it diverged at are masked.
  online = pd.DataFrame(
    {
      "cell": [0, 0, 1, 1],
      "step": [0, 10, 0, 10],
      "tokens": [0, 2560, 0, 2560],
      "ps_max": [0.1, 0.9, 0.1, 0.2],
      "ps_mean": [0.04, 0.3, 0.05, 0.07],
      "train_loss": [None, 1, None, 2],
      "ps_argmax": [[0, 1]] * 4,
    }
  )
  rows = curves_lib._online_rows(_FakeGroup(pd.DataFrame({"cell": [0, 1]}), online), [])
  assert list(rows["ps_mean"]) == [0.04, 0.3, 0.05, 0.07] and "train_loss" not in rows
  run = _FakeRun(
    pd.DataFrame(
      {
        "cell": [0, 1],
        "seed": [0, 1],
        "batch_size": [8, 8],
        "context_size": [32, 32],
        "diverged": [False, True],
        "diverged_step": [np.nan, 10],
      }
    )
  )
  table = curves_lib._with_cells(rows.assign(source="online"), run)
  assert table["ps_mean"].dtype == float
  assert np.isnan(table.loc[3, "ps_mean"]) and table.loc[1, "ps_mean"] == 0.3
  # A cache written before the metric was registered lacks its column: recomputed.
  cache = str(tmp_path / "curves.parquet")
  old = rows.drop(columns=["ps_mean"]).assign(group="g000", n_probes=4, n_sequences=4)
  for name in metric_registry.names():
    if name not in old:
      old[name] = 0.0
  old.drop(columns=["ps_mean"]).to_parquet(cache)
  notes = []
  assert curves_lib.read_cache(cache, notes).empty
  assert "no columns ['ps_mean']" in notes[0] and "recomputing" in notes[0]
  old.assign(ps_mean=0.1).to_parquet(cache)
  assert list(curves_lib.read_cache(cache, [])["ps_mean"]) == [0.1] * 4
  assert os.path.exists(cache)


class _FakeRun:
  def __init__(self, cells):
    self.cells, self.axes, self.name = cells, [], "r"


def test_the_emergence_table_reads_a_registered_metric_and_its_min_jump(ps_mean):
  from conftest import tiny_config

  rows = []
  for cell, (before, after) in enumerate(((0.03, 0.25), (0.03, 0.06))):
    for s in STEPS:
      rows.append(
        {
          "run": "r",
          "cell": cell,
          "seed": cell,
          "batch_size": 8,
          "context_size": 32,
          "step": int(s),
          "ps_max": 0.8 if s >= 64 else 0.02,
          "ps_mean": after if s >= 64 else before,
        }
      )
  table = emergence.emergence_table(pd.DataFrame(rows))  # the default metrics
  assert set(table["metric"]) == {"ps_max", "ps_mean"}
  assert "ps_mean" not in table.columns  # a metric, not a cell coordinate
  mean = emergence.primary(table, "ps_mean")
  # Cell 0 jumps 0.22 ≥ 0.05 at update 64; cell 1 only 0.03 < 0.05: censored at its last step.
  assert list(mean["censored"]) == [False, True]
  assert mean["step_after"][0] == 64 and mean["censor_step"][1] == 1024
  assert mean["jump"][1] == pytest.approx(0.03)
  # With its minimum jump overridden, cell 1's curve emerges halfway (in log-updates) between
  # the checkpoints 32 and 64 that bracket the midpoint between its plateaus.
  assert emergence.emergence_point(
    STEPS, np.where(STEPS >= 64, 0.06, 0.03), metric="ps_mean", min_jump=0.01
  ).emergence_step == pytest.approx(np.sqrt(32 * 64))
  assert emergence.SPECS["ps_mean"] is ps_mean
  assert plots.LABELS["ps_mean"] == "prefix-matching score (mean over heads)"
  assert metric_registry.description("ps_mean") == "the mean prefix-matching score over heads"
  text = setup_words.setup_paragraph(
    mean, tiny_config(), ["run", "batch_size", "context_size"], [], "ps_mean", "threshold", 1
  )
  assert "the update at which the mean prefix-matching score over heads first crosses" in text
