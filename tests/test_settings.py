"""Every setting a user gives reaches every group or is refused, by one rule (issue 44): for each
field of the schema (``ihsweep.base.schema``), a valid non-default value, given as ``--config.X=V``
(set on the config) and as a sweep axis where the field can be one, either ends in every group's
config (what ``ihsweep run`` writes as groups/gNNN/config.json: ``grid.make_plan``'s group config
after ``runner.resolve_memory``) or the plan refuses it with one ConfigError naming the field
(``axes.check_settings``). Nothing trains here but the one end-to-end run of the reported case."""

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import CPU_COMPILE_FLAGS, tiny_config

from ihsweep.base import schema
from ihsweep.configuration import axes as axes_lib
from ihsweep.configuration import fields
from ihsweep.configuration import grid as grid_lib
from ihsweep.configuration.fields import ConfigError
from ihsweep.data.errors import DataError
from ihsweep.training import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fields with no generic non-default value, and why.
NOT_GENERATED = {
  "data.synthetic": "a section: its fields are tested one by one",
  "sweep.grid": "a section of axes: every field is tested as an axis below",
  "sweep.zip": "a section of axes, as sweep.grid",
  "data.matrix_file": "a path to a [V, V] .npy matrix, read only by data.transitions 'file'",
  "sweep.placement": "one choice, 'worker'",
}
# Values where a generic one would not pass the field's own check.
VALUES = {
  "ensemble.peak_lrs": (2e-3, 4e-3),
  "ensemble.seeds": (5, 6),
  "ensemble.cell_ids": (7, 8),
  "data.frequencies": (0.25, 0.75),
  "data.reliabilities": (0.25, 0.75),
  "data.cache_dir": "{tmp}/cache",
  "checkpoint.law_file": "{tmp}/law.json",
  "sweep.law_file": "{tmp}/law.json",
  "sweep.stop_metric": "ps_mean",
}
# Fields the tiny sweep (budget 'updates', markov_chain data) refuses whatever their value, and
# the words of the refusal: the rule's other side.
REFUSED = {
  "ensemble.peak_lrs": "empty in a sweep",
  "ensemble.seeds": "empty in a sweep",
  "ensemble.cell_ids": "empty in a sweep",
  "data.frequencies": "empty in a sweep",
  "data.reliabilities": "empty in a sweep",
  "sweep.tokens": "only sweep.budget 'tokens' or sweep.schedule_horizon 'tokens' reads it",
  "sweep.schedule_horizon": "sweep.tokens",  # 'tokens' needs sweep.tokens
  "sweep.law_multiple": "only sweep.budget 'law' or 'emergence' reads it",
  "sweep.stop_metric": "only sweep.budget 'emergence' reads it",
  "sweep.stop_threshold": "only sweep.budget 'emergence' reads it",
  "sweep.stop_margin": "only sweep.budget 'emergence' reads it",
}
DATA_UNREAD = "data.source"  # a data field markov_chain does not read: "does not read" / "source"


def base():
  """The tiny config with the fields the rule reads at their defaults (train.num_steps)."""
  return tiny_config(**{"train.num_steps": schema.field("train.num_steps").default})


def _candidates(f, current, tmp) -> list:
  if f.path in VALUES:
    v = VALUES[f.path]
    return [v.format(tmp=tmp) if isinstance(v, str) else v]
  if f.kind == "choice":
    return [c for c in f.choices if c != current]
  if f.kind == "bool":
    return [not current]
  if f.kind == "str":
    return ["other" if not f.default else f"{f.default}2"]
  if f.kind not in ("int", "float"):
    return []
  lo = f.lo if isinstance(f.lo, (int, float)) else 0
  hi = f.hi if isinstance(f.hi, (int, float)) else math.inf
  if f.kind == "int":
    raw = [current + 1, current * 2, current - 1, lo, 1, 2, 8, (current or 100) * 10]
  else:
    raw = [current * 2, current / 2, (lo + min(hi, 1.0)) / 2, current + 0.1, 0.5]
  cast = int if f.kind == "int" else float
  out = []
  for v in map(cast, raw):
    if lo <= v <= hi and v != current and v not in out:
      out.append(v)
  return out


def _set(cfg, path, value):
  *parents, name = path.split(".")
  node = cfg
  for part in parents:
    node = node[part]
  with cfg.unlocked():
    node[name] = value


def _groups(cfg):
  """The group configs ``ihsweep run`` would write (resolve_memory's, as the worker's)."""
  plan = grid_lib.make_plan(cfg)
  out = []
  for g in plan.groups:
    resolved, _ = runner.resolve_memory(g.cfg, runner.group_devices(g.cfg, None, True))
    out.append((g, resolved))
  return out


def _value(cfg, path):
  try:
    return axes_lib.get_field(cfg, path)
  except (KeyError, AttributeError):
    return None


def _refused(e: Exception, path: str) -> None:
  """A refusal is one line naming the field (or the axis over it)."""
  text = str(e)
  assert "\n" not in text and path.split(".")[0] in text, (path, text)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
  d = tmp_path_factory.mktemp("settings")
  (d / "law.json").write_text(json.dumps({"log_T": 20.0, "alpha": 0.5, "beta": 0.5}))
  return str(d)


def test_every_field_set_reaches_every_group_or_is_refused(tmp):
  """``--config.X=V`` for each schema field: its groups hold V, or the plan refuses it in one
  line naming the field; a field in REFUSED is refused at every value tried, any other reaches
  the groups at one of them (a value whose refusal is a rule between fields, e.g. heads not
  dividing d_model, is followed by the next)."""
  reached, refused = [], {}
  for f in schema.FIELDS:
    if f.path in NOT_GENERATED:
      continue
    current = _value(base(), f.path)
    if current is None:
      current = f.default
    candidates = [v for v in _candidates(f, current, tmp) if v != f.default]
    assert candidates, f"{f.path}: no candidate value; add it to VALUES or NOT_GENERATED"
    why = []
    for value in candidates:
      cfg = base()
      _set(cfg, f.path, value)
      try:
        groups = _groups(cfg)
      except (ConfigError, DataError) as e:
        _refused(e, f.path)
        why.append(str(e))
        continue
      if f.section != "sweep":  # a group's config has no sweep section (the run's does)
        for g, resolved in groups:
          assert _value(g.cfg, f.path) == value, (f.path, value, _value(g.cfg, f.path))
          assert _value(resolved, f.path) == value, (f.path, value, _value(resolved, f.path))
      reached.append(f.path)
      break
    else:
      refused[f.path] = why
  for path, why in refused.items():
    words = REFUSED.get(path) or (DATA_UNREAD if path.startswith("data.") else None)
    assert words, f"{path} is refused at every value tried: {why}"
    assert all(path in w or words in w for w in why), (path, why)
    assert any(words in w for w in why), (path, words, why)
  assert not set(REFUSED) - set(refused), set(REFUSED) - set(refused)
  assert "train.schedule_steps" in reached and "train.num_steps" in reached


def _axis_fields():
  planner = set(axes_lib.PLANNER_FIELDS) | set(fields.EXECUTION_FIELDS)
  for f in schema.FIELDS:
    if f.section == "sweep" or f.path in planner or f.kind in ("section", "tuple"):
      continue
    if f.path in NOT_GENERATED:
      continue
    yield f


def test_every_axis_value_reaches_its_cells_group_or_is_refused(tmp):
  """``--grid=X=current,V``: each cell's group holds its coordinate (a vmapped field: in the
  per-model tuple at the cell's place), or the plan refuses the axis in one line naming it."""
  reverse = grid_lib.VALUE_FIELDS
  n_reached = 0
  for f in _axis_fields():
    current = _value(base(), f.path)
    current = f.default if current is None else current
    for value in _candidates(f, current, tmp):
      cfg = base()
      try:
        axes_lib.add_axes(cfg, [f"{f.path}={current!r},{value!r}"])
        groups = _groups(cfg)
      except (ConfigError, DataError) as e:
        _refused(e, f.path)
        continue
      for g, resolved in groups:
        for i, cell in enumerate(g.cells):
          want = cell.coords[f.path]
          if f.path in reverse:
            got = _value(resolved, reverse[f.path])[i]
          else:
            got = _value(resolved, f.path)
          assert got == want, (f.path, cell.id, want, got)
      n_reached += 1
      break
  assert n_reached >= 35  # most fields can be an axis of this sweep


def test_the_schedule_rule_in_the_plan():
  """train.schedule_steps: the user's value is every group's horizon and the plan says so; a
  value that ends before a group's budget, or beside sweep.schedule_horizon 'tokens', is
  refused; a budget that sets train.num_steps refuses the user's."""
  from ihsweep.planning import placement

  cfg = base()
  cfg.train.schedule_steps = 500
  axes_lib.add_axes(cfg, ["train.batch_size=4,8"])
  plan = grid_lib.make_plan(cfg)
  assert [g.cfg.train.schedule_steps for g in plan.groups] == [500, 500]
  note = placement.schedule_note(cfg, plan)
  assert "horizon 500 updates per group: train.schedule_steps" in note
  cfg.sweep.update(budget="tokens", tokens=8 * 32 * 600)  # B 4: 1,200 updates > 500
  with pytest.raises(ConfigError, match="at least its 1,200 updates .*B = 4"):
    grid_lib.make_plan(cfg)
  cfg.sweep.update(budget="updates", schedule_horizon="tokens")
  with pytest.raises(ConfigError, match="train.schedule_steps = 500 .*schedule_horizon = 'tokens'"):
    grid_lib.make_plan(cfg)
  cfg.train.schedule_steps = 0
  plan = grid_lib.make_plan(cfg)  # the tokens' horizon: 1,200 and 600 updates, past 200
  assert sorted(g.cfg.train.schedule_steps for g in plan.groups) == [600, 1200]
  assert "horizon 600–1,200 updates per group: the experiment's" in placement.schedule_note(
    cfg, plan
  )
  cfg.train.num_steps = 700  # the user's updates past the B 8 schedule's end: refused, not cut
  with pytest.raises(ConfigError, match="train.num_steps = 700 .*at most 600 at B = 8"):
    grid_lib.make_plan(cfg)
  cfg.sweep.budget = "law"
  with pytest.raises(ConfigError, match="train.num_steps = 700 .*sweep.budget = 'law' sets"):
    grid_lib.make_plan(cfg)


def _ihsweep(*args):
  env = {**os.environ, "XLA_FLAGS": CPU_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "ihsweep.cli", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


TINY = [
  "--config=configs/default.py",
  "--config.model.n_layers=1",
  "--config.model.d_mlp=0",
  "--config.model.d_model=32",
  "--config.model.n_heads=2",
  "--config.model.vocab_size=64",
  "--config.model.max_context=32",
  "--config.model.dtype=float32",
  "--config.train.batch_size=8",
  "--config.train.context_size=32",
  "--config.train.steps_per_call=10",
  "--config.train.lr=3e-3",
  "--config.ensemble.size=1",
  "--config.eval.every_steps=0",
  "--config.checkpoint.params_schedule=none",
]


def test_plan_refuses_a_setting_the_sweep_would_overwrite_in_one_line():
  r = _ihsweep(
    "plan",
    *TINY,
    "--config.train.schedule_steps=100",
    "--config.sweep.schedule_horizon=tokens",
    "--config.sweep.tokens=100000",
    "--devices=1",
    "--flops_per_s=1e12",
  )
  assert r.returncode == 2, r.stderr
  assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
  assert "config.train.schedule_steps = 100 is not allowed" in r.stderr
  r = _ihsweep("plan", *TINY, "--config.train.num_steps=30", "--grid=train.num_steps=20,40",
               "--devices=1", "--flops_per_s=1e12")  # fmt: skip
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  axis = ["--config.train.warmup_frac=0.05", "--grid=train.warmup_frac=0.01,0.02"]
  r = _ihsweep("plan", *TINY, *axis, "--devices=1", "--flops_per_s=1e12")
  assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
  assert "--config.train.warmup_frac=0.05 would be ignored: the sweep's axis" in r.stderr


def test_run_trains_each_groups_schedule_as_given(tmp_path):
  """The report (issue 44): --config.train.schedule_steps and a --grid over it reached no group.
  Now the groups of --grid=train.schedule_steps=0,100 (20 updates each, one seed) hold 0 and
  100 in their config.json and train differently from the same start."""
  work = tmp_path / "run"
  r = _ihsweep(
    "run",
    *TINY,
    "--config.train.num_steps=20",
    "--grid=train.schedule_steps=0,100",
    f"--workdir={work}",
    "--noprogress",
  )
  assert r.returncode == 0, r.stderr[-2000:]
  groups = {}
  for g in sorted(os.listdir(work / "groups")):
    cfg = json.loads((work / "groups" / g / "config.json").read_text())
    assert cfg["train"]["num_steps"] == 20
    rows = (work / "groups" / g / "train_log.jsonl").read_text().splitlines()
    groups[cfg["train"]["schedule_steps"]] = json.loads(rows[-1])["loss"]
  assert set(groups) == {0, 100}
  assert groups[0] != groups[100]
  top = json.loads((work / "config.json").read_text())
  assert top["sweep"]["grid"]["train"]["schedule_steps"] == [0, 100]
