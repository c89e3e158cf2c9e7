"""The emergence law's domain: law files and predictions that are no number a run can use."""

import json
import math

import pytest

from ihsweep.base.law import Law, LawError


def _law_file(tmp_path, text):
  f = tmp_path / "law.json"
  f.write_text(text)
  return str(f)


@pytest.mark.parametrize(
  "text,words",
  [
    ('{"log_T": 1e308, "alpha": 0.37, "beta": 0.62}', ["log_T = 1e+308", "<= 700"]),
    ('{"T": 1e308, "alpha": 0.37, "beta": 0.62}', ["log_T = 709.2"]),
    ('{"log_T": NaN, "alpha": 0.37, "beta": 0.62}', ["'log_T' = nan", "finite"]),
    ('{"log_T": 13, "alpha": Infinity, "beta": 0.62}', ["'alpha' = inf", "finite"]),
    ('{"log_T": 13, "alpha": "0.37", "beta": 0.62}', ["'alpha' = '0.37'", "finite"]),
    ('{"log_T": 13, "alpha": 0.37, "beta": true}', ["'beta' = True", "finite"]),
    (
      '{"log_T": 1' + "0" * 400 + ', "alpha": 0.37, "beta": 0.62}',
      ["'log_T' = an integer of 401 digits"],
    ),
    ('{"T": 1' + "0" * 400 + ', "alpha": 0.37, "beta": 0.62}', ["T = an integer of 401 digits"]),
    ('{"log_T": 10, "alpha": 0.3, "beta": 0.6, "gamma": 0.2}', ["gamma = 0.2", "model size"]),
  ],
)
def test_law_files_outside_the_domain_are_refused_in_one_short_line(tmp_path, text, words):
  with pytest.raises(LawError) as e:
    Law.from_json(_law_file(tmp_path, text))
  msg = str(e.value)
  assert msg.startswith(f"law file {tmp_path}") and len(msg) < 250 and "\n" not in msg, msg
  for w in words:
    assert w in msg


def test_negative_exponents_and_a_null_gamma_are_a_law(tmp_path):
  law = Law.from_json(
    _law_file(tmp_path, json.dumps({"log_T": 10.0, "alpha": -0.3, "beta": -0.6, "gamma": None}))
  )
  assert law.updates(8, 64) == pytest.approx(math.exp(10 + 0.3 * math.log(8) + 0.6 * math.log(64)))


@pytest.mark.parametrize(
  "law,b,c,words",
  [
    (Law(log_T=13.26, alpha=1e308, beta=0.0), 8, 64, ["e^-inf updates", "fewer than one update"]),
    (Law(log_T=100.0, alpha=0.0, beta=-1.0), 8, 64, ["e^104.2 updates", "more than e^100"]),
    (Law(), 10**15, 10**15, ["e^-20.93 updates", "fewer than one update"]),
    (Law(), 10**400, 64, ["batch_size = an integer of 401 digits", "positive finite"]),
    (Law(), 8, math.nan, ["context_size = nan", "positive finite"]),
  ],
)
def test_predictions_outside_any_run_are_refused(law, b, c, words):
  with pytest.raises(LawError) as e:
    law.tokens(b, c)
  msg = str(e.value)
  assert len(msg) < 250, msg
  for w in words:
    assert w in msg


def test_tokens_that_overflow_a_float_are_refused():
  law = Law(log_T=0.0, alpha=0.0, beta=0.0)
  assert law.tokens(1e150, 1e150) == pytest.approx(1e300)
  with pytest.raises(LawError, match="tokens overflow a float"):
    law.tokens(1e200, 1e200)


def test_a_law_is_checked_however_it_is_made():
  with pytest.raises(LawError, match="log_T = -800"):
    Law(log_T=-800.0)
  with pytest.raises(LawError, match="beta = nan"):
    Law(beta=math.nan)


def test_the_studys_law_is_kept_in_one_place():
  """The study's published numbers live in ihsweep.base.law alone: the default Law, the
  analysis' comparison and the report's words all read them there."""
  import ast
  import pathlib

  from ihsweep.base import law as law_lib

  # Nowhere else a dict with the study's ln T: every reader imports it from ihsweep.base.law.
  root = pathlib.Path(__file__).resolve().parents[1]
  for path in [*root.glob("ihsweep/**/*.py"), *root.glob("analysis/**/*.py")]:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Dict) and path.name != "law.py":
        values = [v.value for v in node.values if isinstance(v, ast.Constant)]
        assert 13.26 not in values, (
          f"{path}:{node.lineno}: the study's law outside ihsweep.base.law"
        )
  assert law_lib.STUDY == {"log_T": 13.26, "alpha": 0.37, "beta": 0.62, "r": 0.98}
  assert (Law().log_T, Law().alpha, Law().beta) == (13.26, 0.37, 0.62)
