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
    ('{"log_T": 10, "alpha": 0.3, "beta": 0.6, "gammas": {"x": "1"}}', ["gammas['x'] = '1'"]),
    (
      '{"log_T": 10, "alpha": 0.3, "beta": 0.6, "terms": ["y"], "gammas": {"x": 1}}',
      ["terms = ['y'] and gammas (of x) disagree"],
    ),
    (
      '{"log_T": 10, "alpha": 0.3, "beta": 0.6, "gammas": {"x": 1}, "cov": '
      '{"names": ["log_T", "alpha", "beta"], "matrix": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}}',
      ["cov: need", "with log_T, alpha, beta, gamma[x]"],
    ),
    ('{"log_T": 10, "alpha": 0.3, "beta": 0.6, "gammas": {"batch_size": 1}}', ["batch_size"]),
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


# A law as `python -m analysis fit-law --terms=data.frequency,n_params` writes it (the keys Law
# reads): ln UPT = ln T − α ln B − β ln C + γ[data.frequency] ln f + γ[n_params] ln N.
TERMS_LAW = {
  "log_T": 10.0,
  "alpha": 0.4,
  "beta": 0.6,
  "terms": ["data.frequency", "n_params"],
  "gammas": {"data.frequency": 0.5, "n_params": -0.1},
  "sigma": 0.2,
  "cov": {
    "names": ["log_T", "alpha", "beta", "gamma[data.frequency]", "gamma[n_params]"],
    "matrix": [
      [0.3, 0.01, 0.02, 0.0, -0.01],
      [0.01, 0.004, 0.0, 0.0, 0.0],
      [0.02, 0.0, 0.005, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.01, 0.0],
      [-0.01, 0.0, 0.0, 0.0, 0.002],
    ],
    "t_dof": 9,
  },
  "range": {
    "batch_size": [4, 64],
    "context_size": [16, 256],
    "data.frequency": [0.25, 1.0],
    "n_params": [1e5, 1e7],
  },
}


def test_a_law_with_terms_round_trips_and_needs_each_terms_value(tmp_path):
  from scipy import stats

  law = Law.from_json(_law_file(tmp_path, json.dumps(TERMS_LAW)))
  assert law.terms == ("data.frequency", "n_params")
  at = {"data.frequency": 0.5, "n_params": 1e6}
  x = [1.0, -math.log(8), -math.log(64), math.log(0.5), math.log(1e6)]
  coef = [10.0, 0.4, 0.6, 0.5, -0.1]
  ln_upt = sum(a * b for a, b in zip(x, coef))
  assert law.updates(8, 64, **at) == pytest.approx(math.exp(ln_upt), rel=1e-12)
  assert law.tokens(8, 64, **at) == pytest.approx(math.exp(ln_upt) * 8 * 64, rel=1e-12)
  cov = TERMS_LAW["cov"]["matrix"]
  var = sum(x[i] * cov[i][j] * x[j] for i in range(5) for j in range(5))
  half = stats.t.ppf(0.975, 9) * math.sqrt(var + 0.2**2)  # one cell: + sigma²
  lo, hi = law.interval(8, 64, cell=True, **at)
  assert (lo, hi) == pytest.approx((math.exp(ln_upt - half), math.exp(ln_upt + half)), rel=1e-9)
  # written back (Law.to_dict) and read again: the same law
  assert Law.from_json(_law_file(tmp_path, json.dumps(law.to_dict()))) == law
  assert law.range_warnings(8, 64, **{**at, "data.frequency": 2.0}) == [
    "data.frequency = 2 is outside the law's fitted range: fitted on data.frequency 0.25–1; "
    "2 is 2× beyond"
  ]
  for given, words in (
    ({"data.frequency": 0.5}, "this law also depends on n_params (+ gamma[n_params] ln "
     "n_params): give its value"),
    ({**at, "train.lr": 1e-3}, "train.lr is not a term of this law (its terms: data.frequency, "
     "n_params)"),
    ({**at, "data.frequency": 0.0}, "data.frequency = 0.0: the law needs a positive finite number"),
  ):  # fmt: skip
    with pytest.raises(LawError) as e:
      law.updates(8, 64, **given)
    assert str(e.value) == words


def test_an_older_law_s_gamma_is_its_n_params_term(tmp_path):
  """fit-law --with_params wrote ``gamma`` (and ``gamma`` in cov's names) before terms: read as
  the term in n_params."""
  old = {
    "log_T": 10.0,
    "alpha": 0.3,
    "beta": 0.6,
    "gamma": 0.2,
    "cov": {"names": ["log_T", "alpha", "beta", "gamma"], "matrix": [[0.1] * 4] * 4, "t_dof": 5},
  }
  law = Law.from_json(_law_file(tmp_path, json.dumps(old)))
  assert law.gammas == (("n_params", 0.2),) and len(law.cov) == 4
  expected = math.exp(10 - 0.3 * math.log(8) - 0.6 * math.log(64) + 0.2 * math.log(1e6))
  assert law.updates(8, 64, n_params=1e6) == pytest.approx(expected, rel=1e-12)
  with pytest.raises(LawError, match=r"also depends on n_params"):
    law.updates(8, 64)
