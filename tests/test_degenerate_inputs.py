"""Inputs that are legal by kind and range but do nothing or break silently (issue 58, Why 5):
each is refused in one line naming the field, the value and what is allowed."""

import pytest

from ihsweep.configuration.config import validate
from ihsweep.configuration.fields import ConfigError


@pytest.mark.parametrize(
  "field,value,words",
  [
    ("train.eps", 1e-300, ["train.eps = 1e-300", "normal float32 range", "0/0 = NaN"]),
    ("train.eps", 1e-40, ["train.eps = 1e-40", "subnormal"]),
    ("train.eps", 1e39, ["train.eps = 1e+39", "infinite"]),
    ("train.b2", 0.9999999999, ["train.b2 = 0.9999999999", "[0, 0.99999994]", "is 1.0"]),
    ("train.b1", 0.99999999, ["train.b1 = 0.99999999", "bias correction 1 - b1^t is 0"]),
    ("train.lr", 1e30, ["train.lr = 1e+30", "[1e-09, 10]", "overflows"]),
    ("train.lr", 1e-50, ["train.lr = 1e-50", "[1e-09, 10]", "no float32 weight"]),
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
  "field,value", [("train.eps", 1.2e-38), ("train.b2", 0.99999994), ("train.lr", 1e-9)]
)
def test_the_edges_of_the_float32_ranges_are_accepted(tiny, field, value):
  cfg = tiny()
  section, name = field.split(".")
  with cfg.unlocked():
    cfg[section][name] = value
  validate(cfg)
