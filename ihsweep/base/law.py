"""The emergence law: updates and tokens until induction heads form, from (B, C).

Aoyama, Wilcox & Schneider, "Predicting the Emergence of Induction Heads in Language Model
Pretraining" (arXiv 2511.16893 v2, experiment 1):

    UPT = T / (B^α · C^β),   ln T = 13.26, α = 0.37, β = 0.62

UPT is the number of updates (optimizer steps) at the transition for batch size B (sequences per
update) and context size C (tokens per sequence); the tokens seen by then are UPT · B · C. A law
fitted by ``python -m analysis fit-law`` (JSON with ``log_T``, ``alpha``, ``beta``) replaces the
study's constants via ``Law.from_json``.

A fitted law may carry its uncertainty (``python -m analysis fit-law`` writes it): ``cov``, the
bootstrap covariance of (log_T, alpha, beta) with ``t_dof`` (grid points − 1), and ``sigma``, the
cell-to-cell scatter of ln UPT about the law; from them ``Law.interval`` gives the interval of the
predicted median and a prediction interval for one cell (``log_half_width``). Its ``range`` (the
B and C it was fitted on) lets ``Law.range_warnings`` say when a prediction extrapolates. The
study's law is published without intervals, so the default ``Law()`` has none.

A law fitted with ``fit-law --terms=COLUMN,...`` has terms beyond B and C: ln UPT gains
+ γ_k ln x_k for each column x_k (e.g. ``n_params``, ``data.frequency``), its coefficient named
``gamma[COLUMN]`` (``term_name``); its predictions need each term's value
(``Law.updates(B, C, **{"data.frequency": 0.8})``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from numbers import Real

from ihsweep.base.errors import IhsweepError

MAX_LOG_UPDATES = 100  # e^100 updates: a prediction past this is a broken law, not a plan
MAX_LOG_T = 700  # T = e^log_T must be a float (e^709.8 overflows); the study's ln T is 13.26


class LawError(IhsweepError, ValueError):
  """A law file that cannot be read, or a (B, C) outside the law's domain."""


def term_name(column: str) -> str:
  """The name of the coefficient of a law's term + γ ln ``column``: ``gamma[column]``."""
  return f"gamma[{column}]"


def term_column(name: str) -> str | None:
  """The column of a term's coefficient name (``gamma[data.frequency]`` → ``data.frequency``);
  None for any other name (log_T, alpha, beta)."""
  return name[6:-1] if name.startswith("gamma[") and name.endswith("]") else None


def log_half_width(x, cov, sigma: float = 0.0, level: float = 0.95, t_dof: float | None = None):
  """Half-width of a ``level`` interval of ln UPT: q·sqrt(xᵀ·cov·x + σ²) — σ = 0: the interval
  of the law's median (its coefficients' uncertainty); σ > 0: a prediction interval for one new
  cell, whose ln UPT also scatters by σ about the law. q is the (1 + level)/2 quantile of
  Student's t with ``t_dof`` degrees of freedom (a fit's grid points − 1, as its coefficient
  intervals use), or of the standard normal without ``t_dof``: a normal approximation to the
  bootstrap distribution of the predicted ln UPT.

  Args:
    x: array-like (..., k): the design row(s) (1, −ln B, −ln C, ln x_1, ...: one per term).
    cov: (k, k) covariance of the coefficients (log_T, alpha, beta, gamma[x_1], ...).
  Returns:
    float or ndarray (...,), in ln units.
  Raises:
    ValueError: level outside (0, 1), or t_dof not positive.
  """
  import numpy as np

  if not 0 < level < 1:
    raise ValueError(f"level = {level!r}: need a number in (0, 1)")
  if t_dof is None:
    q = statistics.NormalDist().inv_cdf((1 + level) / 2)
  elif t_dof > 0:
    from scipy.special import stdtrit  # what scipy.stats.t.ppf calls, without its 1 s import

    q = float(stdtrit(t_dof, (1 + level) / 2))
  else:
    raise ValueError(f"t_dof = {t_dof!r}: need a positive number")
  x = np.asarray(x, float)
  var = np.einsum("...i,ij,...j->...", x, np.asarray(cov, float), x)
  return q * np.sqrt(np.maximum(var, 0.0) + sigma**2)


def _finite(v) -> bool:
  """A real number (not a bool) that is finite as a float (a huge int is not)."""
  if isinstance(v, bool) or not isinstance(v, Real):
    return False
  try:
    return math.isfinite(float(v))
  except OverflowError:
    return False


def _show(v) -> str:
  """``repr(v)``, but a short phrase for an integer too long to read."""
  if isinstance(v, int) and len(str(abs(v))) > 20:
    return f"an integer of {len(str(abs(v)))} digits"
  return repr(v)


# The study's published law (Aoyama, Wilcox & Schneider, arXiv 2511.16893 v2, Experiment 1;
# docs/study.md) and its r on the study's own cells: the one place these numbers are kept.
STUDY = {"log_T": 13.26, "alpha": 0.37, "beta": 0.62, "r": 0.98}
# Our count (ihsweep.configuration.grid.n_params) of the study's reference model: 2 layers, 8 heads,
# d_model 768, d_mlp 3072, GPT-2 vocabulary 50,257, 1,024 positions, tied embeddings.
STUDY_N_PARAMS = 53_561_088
STUDY_TOKENS = 1_000_000_000  # training tokens per model in the study's Experiment 1

# The B and C of the study's experiment 1 grid (reproduced by configs/exp1_natural.py at study
# scale): where its published law was fitted, so where ``ihsweep predict`` with it interpolates.
STUDY_BATCH_RANGE = (8, 128)
STUDY_CONTEXT_RANGE = (64, 1024)


@dataclasses.dataclass(frozen=True)
class Law:
  """``UPT = exp(log_T) / (B^alpha · C^beta)`` (natural log; the study's values by default),
  times ``x_k^gamma_k`` for each term beyond B and C (``gammas``; none by default)."""

  log_T: float = STUDY["log_T"]
  alpha: float = STUDY["alpha"]
  beta: float = STUDY["beta"]
  source: str = "Aoyama et al. 2025 (arXiv 2511.16893), experiment 1"
  # A fitted law's uncertainty and domain (None: not known, as for the study's law).
  cov: tuple | None = None  # covariance of (log_T, alpha, beta, gamma[x_k]...), tuples of floats
  t_dof: float | None = None  # degrees of freedom of the interval's t quantile (None: normal)
  sigma: float | None = None  # scatter of ln UPT of one cell about the law
  batch_range: tuple | None = None  # (min, max) B the law was fitted on
  context_range: tuple | None = None  # (min, max) C the law was fitted on
  # Terms beyond B and C, in the law's order: ((column, gamma), ...) (a dict is taken too).
  gammas: tuple = ()
  term_ranges: tuple = ()  # ((column, (min, max)), ...): the term values the law was fitted on

  def __post_init__(self):
    """Raises LawError for a coefficient that is not a finite number, |log_T| > MAX_LOG_T, or a
    term in B or C (or without a column name)."""
    object.__setattr__(self, "gammas", tuple(dict(self.gammas).items()))  # frozen: hashable
    object.__setattr__(self, "term_ranges", tuple(dict(self.term_ranges).items()))
    for key in ("log_T", "alpha", "beta"):
      v = getattr(self, key)
      if not _finite(v):
        raise LawError(f"{key} = {_show(v)}: need a finite number")
    for column, v in self.gammas:
      if not isinstance(column, str) or column in ("", "batch_size", "context_size"):
        raise LawError(f"a term in {column!r}: need a column other than batch_size, context_size")
      if not _finite(v):
        raise LawError(f"{term_name(column)} = {_show(v)}: need a finite number")
    if abs(self.log_T) > MAX_LOG_T:
      raise LawError(
        f"log_T = {self.log_T:.4g}: need |log_T| <= {MAX_LOG_T} (T = e^log_T "
        f"must be a float; the study's ln T = 13.26)"
      )

  @property
  def T(self) -> float:
    return math.exp(self.log_T)

  @property
  def terms(self) -> tuple:
    """The columns of the law's terms beyond B and C, in order (() for the study's law)."""
    return tuple(column for column, _ in self.gammas)

  def term_problems(self, terms) -> tuple[list, list]:
    """``(missing, unknown)``: the law's terms without a value in ``terms`` (columns), and the
    columns of ``terms`` that are no term of the law."""
    return [k for k in self.terms if k not in terms], [k for k in terms if k not in self.terms]

  def _x(self, batch_size: float, context_size: float, terms: dict) -> tuple:
    """The design row (1, −ln B, −ln C, ln x_k...) of the coefficients (log_T, alpha, beta,
    gamma[x_k]...).

    Raises:
      LawError: a term of the law without a value, a value for a term the law does not have,
        or B, C or a term's value that is not a positive finite number.
    """
    missing, unknown = self.term_problems(terms)
    if unknown:
      has = ", ".join(self.terms) if self.terms else "none: it takes B and C only"
      raise LawError(f"{unknown[0]} is not a term of this law (its terms: {has})")
    if missing:
      raise LawError(
        f"this law also depends on {', '.join(missing)} ("
        + " ".join(f"+ {term_name(k)} ln {k}" for k in missing)
        + f"): give {'its value' if len(missing) == 1 else 'their values'}"
      )
    given = (("batch_size", batch_size), ("context_size", context_size), *terms.items())
    for name, v in given:
      if not _finite(v) or not v > 0:
        raise LawError(f"{name} = {_show(v)}: the law needs a positive finite number")
    logs = (math.log(terms[k]) for k in self.terms)
    return (1.0, -math.log(batch_size), -math.log(context_size), *logs)

  def interval(
    self,
    batch_size: float,
    context_size: float,
    *,
    level: float = 0.95,
    cell: bool = False,
    **terms: float,
  ) -> tuple[float, float]:
    """``(lo, hi)`` updates: the ``level`` interval of the predicted median UPT (the law's own
    uncertainty), or with ``cell`` the prediction interval for one cell (adds ``sigma``²):
    exp(ln UPT ± q·sqrt(xᵀ·cov·x (+ σ²))), x = (1, −ln B, −ln C, ln x_k...)
    (``log_half_width``). ``terms``: each term's value, as ``updates`` takes them. Times B·C
    for tokens.

    Raises:
      LawError: as ``updates``; or the law has no ``cov`` (or, with ``cell``, no ``sigma``).
    """
    median = self.updates(batch_size, context_size, **terms)
    if self.cov is None or (cell and self.sigma is None):
      raise LawError(
        f"{self.source}: no interval (the law stores no {'cov' if self.cov is None else 'sigma'})"
      )
    x = self._x(batch_size, context_size, terms)
    half = float(log_half_width(x, self.cov, self.sigma if cell else 0.0, level, self.t_dof))
    return median * math.exp(-half), median * math.exp(half)

  def range_warnings(self, batch_size: float, context_size: float, **terms: float) -> list[str]:
    """One sentence per B, C or term value (``terms``: column → value) outside the range the
    law was fitted on, e.g. "C = 1024 is outside the law's fitted range: fitted on C 16–64;
    1024 is 16× beyond"; [] inside it or when the range is not known."""
    out = []
    for name, v, span in (
      ("B", batch_size, self.batch_range),
      ("C", context_size, self.context_range),
      *((column, terms.get(column), span) for column, span in self.term_ranges),
    ):
      if span is None or not _finite(v) or v <= 0:
        continue
      lo, hi = span
      if v > hi:
        where = f"{v:g} is {v / hi:.3g}× beyond"
      elif v < lo:
        where = f"{v:g} is {lo / v:.3g}× below"
      else:
        continue
      out.append(
        f"{name} = {v:g} is outside the law's fitted range: fitted on {name} {lo:g}–{hi:g}; {where}"
      )
    return out

  def updates(self, batch_size: float, context_size: float, **terms: float) -> float:
    """Predicted updates at the transition (float, in [1, e^MAX_LOG_UPDATES]); ``terms``: the
    value of each of the law's terms beyond B and C, by column (a dotted column by
    ``**{"data.frequency": 0.8}``).

    Raises:
      LawError: if B, C or a term's value is not a positive finite number, a term of the law
        is not given or one it does not have is, or the prediction is below one update or
        above e^MAX_LOG_UPDATES (a law or (B, C) far outside any run).
    """
    x = self._x(batch_size, context_size, terms)
    coef = (self.log_T, self.alpha, self.beta, *(g for _, g in self.gammas))
    log_upt = sum(c * v for c, v in zip(coef, x))  # ln T − α ln B − β ln C + Σ γ_k ln x_k
    if not 0 <= log_upt <= MAX_LOG_UPDATES:  # NaN too (inf - inf)
      bound = (
        f"more than e^{MAX_LOG_UPDATES}"
        if log_upt > 0
        else "fewer than one update"
        if log_upt < 0
        else "not a number"
      )
      raise LawError(
        f"the law (log_T = {self.log_T:.4g}, alpha = {self.alpha:.4g}, beta = "
        f"{self.beta:.4g}) predicts e^{log_upt:.4g} updates for B = {batch_size:g}, "
        f"C = {context_size:g}"
        + "".join(f", {k} = {v:g}" for k, v in terms.items())
        + f": outside any run ({bound})"
      )
    return math.exp(log_upt)

  def tokens(self, batch_size: float, context_size: float, **terms: float) -> float:
    """Predicted tokens per model at the transition: UPT · B · C (``terms`` as ``updates``).

    Raises:
      LawError: as ``updates``, or when UPT · B · C is not a finite float.
    """
    upt = self.updates(batch_size, context_size, **terms)
    tokens = upt * float(batch_size) * float(context_size)
    if not math.isfinite(tokens):
      raise LawError(
        f"B = {batch_size:g}, C = {context_size:g}: the predicted tokens overflow a float"
      )
    return tokens

  def to_dict(self) -> dict:
    out = {
      "log_T": self.log_T,
      "T": self.T,
      "alpha": self.alpha,
      "beta": self.beta,
      "source": self.source,
    }
    if self.gammas:
      out["terms"], out["gammas"] = list(self.terms), dict(self.gammas)
    if self.sigma is not None:
      out["sigma"] = self.sigma
    if self.cov is not None:
      out["cov"] = {
        "names": ["log_T", "alpha", "beta", *map(term_name, self.terms)],
        "matrix": [list(r) for r in self.cov],
        "t_dof": self.t_dof,
      }
    spans = (("batch_size", self.batch_range), ("context_size", self.context_range))
    spans += self.term_ranges
    if any(v for _, v in spans):
      out["range"] = {k: list(v) for k, v in spans if v}
    return out

  @classmethod
  def from_json(cls, path: str) -> "Law":
    """Reads a law JSON: ``{"log_T": …, "alpha": …, "beta": …}`` (or ``T`` instead of ``log_T``;
    other keys, e.g. a fit's ``r`` and ``ci``, ignored) — the format of the analysis package's
    fitted law.

    Also read when present (fit-law writes them; older files without them still load):
    ``terms`` and ``gammas`` (``fit-law --terms``: ``["data.frequency", ...]`` and
    ``{"data.frequency": gamma, ...}``; an older file's ``gamma`` is the n_params term),
    ``sigma`` (a number >= 0), ``cov`` (``{"names": [...], "matrix": [[...]], "t_dof": n}``
    with log_T, alpha, beta and each term's ``gamma[COLUMN]`` among the names) and ``range``
    (``{"batch_size": [min, max], "context_size": [min, max]}``, and each term's column).

    Raises:
      LawError: unreadable file, not a JSON object, missing/non-numeric/non-finite fields,
        |log_T| > MAX_LOG_T, ``T`` and ``log_T`` that disagree, or malformed terms, gammas,
        sigma, cov or range (naming the field).
    """
    try:
      with open(path, encoding="utf-8-sig") as f:  # a BOM, as fit-law reads CSVs
        obj = json.load(f)
    except (OSError, ValueError) as e:
      raise LawError(f"law file {path}: cannot read a JSON law ({e})") from None
    if not isinstance(obj, dict):
      raise LawError(f"law file {path}: expected a JSON object with log_T, alpha, beta")
    if "T" in obj:
      t = obj["T"]
      if not _finite(t) or not t > 0:
        raise LawError(f"law file {path}: T = {_show(t)} must be a positive finite number")
      if "log_T" not in obj:
        obj = {**obj, "log_T": math.log(t)}
      elif _finite(obj["log_T"]) and not math.isclose(
        math.log(t), obj["log_T"], rel_tol=1e-6, abs_tol=1e-9
      ):
        raise LawError(
          f"law file {path}: T = {t!r} and log_T = {obj['log_T']!r} disagree "
          f"(ln T = {math.log(t):.6g}); give one of them"
        )
    values = {}
    for key in ("log_T", "alpha", "beta"):
      if key not in obj:
        raise LawError(
          f"law file {path}: missing field {key!r}"
          + (" (or 'T')" if key == "log_T" else "")
          + "; a law JSON needs log_T (or T), alpha and beta"
        )
      v = obj[key]
      if not _finite(v):
        raise LawError(f"law file {path}: field {key!r} = {_show(v)}; need a finite number")
      values[key] = float(v)
    try:
      values["gammas"] = _gammas(obj)
      values.update(_uncertainty(obj, tuple(k for k, _ in values["gammas"])))
    except LawError as e:
      raise LawError(f"law file {path}: {e}") from None
    try:
      return cls(**values, source=path)
    except LawError as e:
      raise LawError(f"law file {path}: {e}") from None


def _gammas(obj: dict) -> tuple:
  """A law JSON's terms beyond B and C as ``((column, gamma), ...)`` in the order of ``terms``:
  ``gammas`` ({column: gamma}), or an older file's ``gamma`` (the n_params term); () without.

  Raises:
    LawError: gammas not an object of finite numbers, terms that name other columns, or a
      ``gamma`` that disagrees with ``gammas["n_params"]``.
  """
  gammas, terms, gamma = obj.get("gammas"), obj.get("terms"), obj.get("gamma")
  if gammas is None and gamma is not None:
    gammas = {"n_params": gamma}  # a law from before terms: gamma is the model-size term
  if gammas is None:
    if terms:
      raise LawError(f"terms = {_show(terms)} without gammas: need {{column: gamma}} for each")
    return ()
  if not isinstance(gammas, dict):
    raise LawError(f'gammas = {_show(gammas)}: need {{"COLUMN": gamma, ...}}')
  order = list(gammas) if terms is None else terms
  if (
    not isinstance(order, list)
    or not all(isinstance(column, str) for column in order)
    or sorted(order) != sorted(gammas)
  ):
    raise LawError(f"terms = {_show(terms)} and gammas (of {', '.join(gammas)}) disagree")
  for column in order:
    if not _finite(gammas[column]):
      raise LawError(f"gammas[{column!r}] = {_show(gammas[column])}: need a finite number")
  if gamma is not None and gamma != gammas.get("n_params"):
    raise LawError(f"gamma = {_show(gamma)} and gammas disagree (gamma is the n_params term)")
  return tuple((column, float(gammas[column])) for column in order)


def _uncertainty(obj: dict, terms: tuple = ()) -> dict:
  """The ``Law`` fields cov, t_dof, sigma, batch_range, context_range and term_ranges from a
  law JSON's ``cov``, ``sigma`` and ``range`` (absent or null: not set), for a law with the
  terms ``terms`` (columns).

  Raises:
    LawError: a field of the wrong shape or with a value that is not a finite number (negative
      variances and sigma, a range whose ends are not 0 < min <= max).
  """
  out = {}
  sigma = obj.get("sigma")
  if sigma is not None:
    if not _finite(sigma) or sigma < 0:
      raise LawError(f"sigma = {_show(sigma)}: need a finite number >= 0 (the scatter of ln UPT)")
    out["sigma"] = float(sigma)
  cov = obj.get("cov")
  if cov is not None:
    want = ["log_T", "alpha", "beta", *map(term_name, terms)]
    names = cov.get("names") if isinstance(cov, dict) else None
    if isinstance(names, list):  # an older file's gamma: the n_params term
      names = [term_name("n_params") if n == "gamma" else n for n in names]
    matrix = cov.get("matrix") if isinstance(cov, dict) else None
    if (
      not isinstance(names, list)
      or not all(n in names for n in want)
      or not isinstance(matrix, list)
      or len(matrix) != len(names)
      or not all(isinstance(row, list) and len(row) == len(names) for row in matrix)
    ):
      raise LawError(
        f'cov: need {{"names": [...] with {", ".join(want)}, "matrix": a square list '
        "of lists, one row per name}"
      )
    idx = [names.index(n) for n in want]
    sub = tuple(tuple(matrix[i][j] for j in idx) for i in idx)
    bad = [v for row in sub for v in row if not _finite(v)]
    if bad or any(sub[i][i] < 0 for i in range(len(want))):
      raise LawError(
        f"cov: {_show(bad[0]) if bad else 'a negative variance'}: need finite "
        f"numbers and variances >= 0"
      )
    out["cov"] = tuple(tuple(float(v) for v in row) for row in sub)
    t_dof = cov.get("t_dof")
    if t_dof is not None:
      if not _finite(t_dof) or t_dof <= 0:
        raise LawError(f"cov.t_dof = {_show(t_dof)}: need a number > 0 (grid points - 1)")
      out["t_dof"] = float(t_dof)
  span = obj.get("range")
  if span is not None:
    if not isinstance(span, dict):
      raise LawError('range: need {"batch_size": [min, max], "context_size": [min, max]}')
    term_ranges = []
    fields = [("batch_size", "batch_range"), ("context_size", "context_range")]
    for key, field in fields + [(column, None) for column in terms]:
      v = span.get(key)
      if v is None:
        continue
      if (
        not isinstance(v, list)
        or len(v) != 2
        or not all(_finite(e) for e in v)
        or not 0 < v[0] <= v[1]
      ):
        raise LawError(f"range.{key} = {_show(v)}: need [min, max] with 0 < min <= max")
      if field:
        out[field] = (float(v[0]), float(v[1]))
      else:
        term_ranges.append((key, (float(v[0]), float(v[1]))))
    if term_ranges:
      out["term_ranges"] = tuple(term_ranges)
  return out
