"""The shipped configs (demo and the study's three experiments) plan the grids their docstrings
describe. Planning validates every group's run config but compiles and trains nothing; the
corpus is replaced by a small text file made here (no download)."""

import importlib

import pytest

from ihsweep.configuration import axes as axes_lib
from ihsweep.configuration import grid as grid_lib
from ihsweep.configuration.fields import ConfigError

# (config, argument) → (cells, groups, models per group)
EXPECTED = {
  ("demo", ""): (18, 9, 2),
  ("exp1_natural", ""): (50, 25, 2),
  ("exp1_natural", "scale=cpu"): (18, 9, 2),
  ("exp2_seminatural", ""): (98, 1, 98),
  ("exp2_seminatural", "scale=cpu"): (16, 1, 16),
  ("exp2_seminatural", "scale=cpu_law"): (18, 1, 18),
  ("exp3_synthetic", ""): (72, 9, 8),
  ("exp3_synthetic", "scale=cpu"): (36, 9, 4),
}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "text.txt"
  path.write_text("the quick brown fox jumps over the lazy dog. " * 200)
  return str(path)


@pytest.mark.parametrize("name, arg", sorted(EXPECTED))
def test_config_plans_its_grid(name, arg, text_file):
  cfg = importlib.import_module(f"configs.{name}").get_config(arg)
  if cfg.data.source in ("natural", "markov") and cfg.data.transitions != "synthetic":
    cfg.data.update(corpus="", tfds_name="", files=text_file)
  cfg.mesh.num_devices = 2  # the test session has 4 fake devices; every grid fits on 2
  plan = grid_lib.make_plan(cfg)
  n_cells, n_groups, per_group = EXPECTED[(name, arg)]
  assert (len(plan.cells), len(plan.groups)) == (n_cells, n_groups)
  assert {g.cfg.ensemble.size for g in plan.groups} == {per_group}


@pytest.mark.parametrize("name, arg", sorted(EXPECTED))
def test_sweep_seeds_alone_sets_the_models_per_grid_point(name, arg, text_file):
  """--config.sweep.seeds=3 is taken by every shipped config (issue 58: exp2 and exp3 set
  ensemble.size = sweep.seeds, so it was refused as "config.ensemble.size = 2 is not allowed:
  4 (its default) or 3", a field the user never set): 3 cells per grid point."""
  cfg = importlib.import_module(f"configs.{name}").get_config(arg)
  seeds = cfg.sweep.seeds
  if cfg.data.source in ("natural", "markov") and cfg.data.transitions != "synthetic":
    cfg.data.update(corpus="", tfds_name="", files=text_file)
  cfg.mesh.num_devices = 2
  cfg.sweep.seeds = 3  # as --config.sweep.seeds=3 sets it
  axes_lib.check_settings(cfg)
  n_points = EXPECTED[(name, arg)][0] // seeds
  assert len(axes_lib.grid_points(cfg)[1]) == n_points
  if "cpu" in arg or name == "demo":  # the small grids planned whole (validates every group)
    assert len(grid_lib.make_plan(cfg).cells) == 3 * n_points


def test_exp1_model_size_axis():
  cfg = importlib.import_module("configs.exp1_natural").get_config("scale=study,models=3")
  names, points = axes_lib.grid_points(cfg)  # the grid only: validating 75 groups takes ~12 s
  assert len(points) == 75 and "model.d_model" in names
  assert sorted({p["model.d_model"] for p in points}) == [256, 512, 768]


def test_demo_grid_and_budget():
  cfg = importlib.import_module("configs.demo").get_config()
  assert cfg.sweep.grid.train.batch_size == (8, 16, 32)
  assert cfg.sweep.grid.train.context_size == (16, 32, 64)
  assert cfg.sweep.budget == "emergence" and cfg.sweep.seeds == 2


@pytest.mark.parametrize(
  "name, arg",
  [
    ("exp1_natural", "scale=gpu"),
    ("exp1_natural", "x=1"),
    ("exp1_natural", "scale=cpu,models=3"),
    ("exp2_seminatural", "scale=tpu"),
    ("exp2_seminatural", "bogus"),
    ("exp1_natural", "cpu"),
    ("exp3_synthetic", "models=3"),
    ("demo", "cpu"),
  ],
)
def test_bad_config_arguments_are_refused(name, arg):
  with pytest.raises(ValueError, match="allowed|no argument|study-scale"):
    importlib.import_module(f"configs.{name}").get_config(arg)


def test_exp1s_early_stop_keeps_the_studys_schedule(text_file):
  """exp1 under the emergence budget (its recommended cheap rerun): every group's schedule spans
  the study's token budget, ceil(tokens / (B·C)) updates, and training stops at the cap within
  it; under its own 'tokens' budget the schedule is the budget (train.schedule_steps 0, as
  runs made before the field)."""
  from ihsweep.planning import placement

  cfg = importlib.import_module("configs.exp1_natural").get_config()  # study scale, 1B tokens
  cfg.data.update(corpus="", tfds_name="", files=text_file)
  cfg.mesh.num_devices = 2
  tokens = cfg.sweep.tokens
  for g in grid_lib.make_plan(cfg).groups:
    assert g.cfg.train.schedule_steps == 0 and g.num_steps == -(-tokens // (
      g.cfg.train.batch_size * g.cfg.train.context_size))  # fmt: skip
  cfg.sweep.update(budget="emergence", law_multiple=3.0)
  plan = grid_lib.make_plan(cfg)
  for g in plan.groups:
    b, c = g.cfg.train.batch_size, g.cfg.train.context_size
    horizon = -(-tokens // (b * c))
    assert g.cfg.train.schedule_steps in (horizon, 0)
    assert g.num_steps <= horizon
    assert (g.cfg.train.schedule_steps or g.num_steps) == horizon
  assert any(g.cfg.train.schedule_steps == -(-tokens // (g.cfg.train.batch_size *
             g.cfg.train.context_size)) for g in plan.groups)  # fmt: skip
  note = placement.schedule_note(cfg, plan)
  assert f"the experiment's {tokens:,} tokens per model" in note and "only ends training" in note
  with pytest.raises(ConfigError, match="sweep.tokens = 1000000000 .*only sweep.budget 'tokens'"):
    cfg.sweep.schedule_horizon = "budget"  # nothing reads sweep.tokens then
    grid_lib.make_plan(cfg)
  cfg.sweep.tokens = 0  # the schedule of the cap, as before the field
  assert all(g.cfg.train.schedule_steps == 0 for g in grid_lib.make_plan(cfg).groups)
