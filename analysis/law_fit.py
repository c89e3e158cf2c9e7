"""The fitted emergence law as a record (``LawFit``: coefficients, intervals, residuals,
predictions) and the study's published law (``STUDY``), for ``analysis.scaling.fit_law``, the
report and ``ihsweep predict --law``; the formulas are ``analysis.scaling``'s docstring."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ihsweep.base import law as law_lib
from ihsweep.base.law import STUDY

V1_LOG10_T_TOKENS = 5.7  # version 1: N_PT = T·sqrt(B·C) tokens with T ≈ 10^5.7


# Fewer residual degrees of freedom than this: the fit is reported without intervals and r.
MIN_DOF_FOR_INTERVALS = 3


MLE = "censored log-normal MLE"


LSQ = "least squares on emerged cells"


@dataclasses.dataclass
class LawFit:
  """A fitted law (module docstring).

  Attributes:
    log_T, alpha, beta: the coefficients of ln T − α ln B − β ln C.
    terms: the columns x_k of the terms + γ_k ln x_k beyond B and C (``fit_law(terms=...)``),
      in order; () without. gammas: {column: γ_k}. gamma (read-only): the n_params term's γ,
      None without one.
    r: correlation of predicted and observed ln UPT over the emerged cells; NaN when withheld
      (``r_note`` says why: fewer than ``MIN_DOF_FOR_INTERVALS`` residual dof).
    n: cells in the fit — emerged + censored for the MLE, emerged only for ``LSQ``.
    n_emerged, n_censored: emerged cells; censored cells (in the MLE by their survival term,
      excluded from ``LSQ``).
    dof: residual degrees of freedom, emerged cells − free coefficients.
    sigma: scatter of ln UPT about the law (MLE: the ML estimate; LSQ: sqrt(RSS / dof)).
    ci: 95% percentile bootstrap intervals ``[lo, hi]`` of each free coefficient, ``T`` and
      ``sigma`` (empty without a bootstrap; ``ci_note`` then says why).
    n_boot: bootstrap resamples used (0: none). boot_note: the resamples redrawn because
      their fit was singular or did not converge, where any were (None otherwise).
    draws: float64 array (n_boot, len(names)) of the bootstrap's coefficients, fixed ones
      constant; None without a bootstrap. ``cov``: their covariance times G/(G − 1) (G =
      ``n_grid_points``; see ``small_sample_factor``), float64 (len(names), len(names)); None
      without. ``names``: log_T, alpha, beta, then ``gamma[COLUMN]`` per term.
    range: {"batch_size": [min, max], "context_size": [min, max], and each term's column} over
      the cells in the fit.
    n_grid_points: distinct (B, C, term values) points among all cells: the bootstrap's
      clusters G.
    residuals: one row per emerged cell (batch_size, context_size, …, observed/predicted UPT in
      updates, residual in ln units).
    emerged_only: the ``LSQ`` fit on the same cells and resamples (None on that fit itself).
    fixed: coefficients held at given values.
    lack_of_fit: ``analysis.lack_of_fit.AxisTest``s of C and B (axes with ≥ 3 values; none
      with fixed coefficients or terms beyond B and C): whether a free level per value fits
      better than the power law.
    separability: ``analysis.lack_of_fit.SeparabilityTest`` (when the axes are tested):
      whether the exponent in B drifts with C.
    held_out: ``analysis.held_out.HeldOut``: each grid point predicted by the law refitted
      without it (None on the refits themselves).
  """

  log_T: float
  alpha: float
  beta: float
  r: float
  n: int
  ci: dict
  residuals: pd.DataFrame
  terms: tuple = ()
  gammas: dict = dataclasses.field(default_factory=dict)
  n_censored: int = 0
  n_boot: int = 0
  fixed: dict = dataclasses.field(default_factory=dict)
  dof: int = 0
  sigma: float = math.nan
  method: str = MLE
  n_emerged: int = 0
  r_note: str | None = None
  ci_note: str | None = None
  boot_note: str | None = None
  names: list = dataclasses.field(default_factory=lambda: ["log_T", "alpha", "beta"])
  draws: np.ndarray | None = None
  cov: np.ndarray | None = None
  range: dict = dataclasses.field(default_factory=dict)
  n_grid_points: int = 0
  emerged_only: "LawFit | None" = None
  lack_of_fit: list = dataclasses.field(default_factory=list)
  separability: object | None = None
  held_out: object | None = None

  def _by(self) -> tuple:
    """``(B, C, ln observed UPT)`` of the emerged cells (``residuals``), as ``score`` takes."""
    res = self.residuals
    return (
      res["batch_size"].to_numpy(float),
      res["context_size"].to_numpy(float),
      np.log(res["observed_updates"].to_numpy(float)),
    )

  @property
  def T(self) -> float:
    return math.exp(self.log_T)

  @property
  def gamma(self) -> float | None:
    """The n_params term's γ; None without one (the readers from before ``terms``)."""
    return self.gammas.get("n_params")

  @property
  def coef(self) -> np.ndarray:
    """The coefficients in ``names`` order (float64, len(names))."""
    column = law_lib.term_column
    return np.array(
      [self.gammas[column(n)] if column(n) else getattr(self, n) for n in self.names], float
    )

  def _x(self, batch_size, context_size, terms=None) -> np.ndarray:
    """The design (..., len(names)): 1, −ln B, −ln C, ln x_k per term, broadcast together."""
    if terms is not None and not isinstance(terms, Mapping):
      terms = {"n_params": terms}  # n_params' values alone, as before terms
    terms = dict(terms or {})
    missing = [t for t in self.terms if t not in terms]
    unknown = [t for t in terms if t not in self.terms]
    if missing or unknown:
      raise ValueError(
        f"this law's terms are {list(self.terms)}: give the values of each of them "
        f"(missing {missing}, not a term {unknown})"
      )
    cols = [
      np.ones(np.broadcast(batch_size, context_size).shape),
      -np.log(batch_size),
      -np.log(context_size),
      *(np.log(terms[t]) for t in self.terms),
    ]
    return np.stack(np.broadcast_arrays(*cols), axis=-1)

  def predict_updates(self, batch_size, context_size, terms=None) -> np.ndarray:
    """Predicted UPT (updates; the median of the log-normal) for arrays of B, C and, for a law
    with terms, ``terms`` = {column: values} (or n_params' values alone), broadcast together.

    Raises:
      ValueError: ``terms`` lacks one of the law's terms or names a column that is none.
    """
    return np.exp(self._x(batch_size, context_size, terms) @ self.coef)

  def predict_interval(
    self, batch_size, context_size, terms=None, *, level: float = 0.95, cell: bool = False
  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(median, lo, hi)`` in updates, arrays broadcast over B, C (and ``terms``, as
    ``predict_updates`` takes them): the predicted UPT and its ``level`` interval — of the
    law's median (the fit's uncertainty), or with ``cell`` the prediction interval for one new
    cell (adds the scatter σ²). On ln UPT:
    ln UPT ± q·sqrt(xᵀ·cov·x (+ σ²)), q the t(G − 1) quantile
    (``ihsweep.base.law.log_half_width``;
    ``ihsweep predict`` computes the same from law.json). E.g. the band over B at one C for a
    figure: ``predict_interval(np.geomspace(8, 32, 50), 64)``.

    Raises:
      ValueError: no bootstrap (``cov`` None: ``n_boot`` 0 or too few dof), a level outside
        (0, 1), or ``terms`` as ``predict_updates``.
    """
    if self.cov is None:
      raise ValueError(
        "no interval: the fit has no bootstrap (n_boot = 0 or fewer than "
        f"{MIN_DOF_FOR_INTERVALS} residual degrees of freedom)"
      )
    x = self._x(batch_size, context_size, terms)
    mean = x @ self.coef
    half = law_lib.log_half_width(
      x, self.cov, self.sigma if cell else 0.0, level, self.n_grid_points - 1
    )
    return np.exp(mean), np.exp(mean - half), np.exp(mean + half)

  def to_dict(self) -> dict:
    """The JSON of ``python -m analysis fit-law`` and the report's law.json (docs/analysis.md),
    read by ``ihsweep.base.law.Law.from_json``. Keys: log_T, T, alpha, beta, with terms
    ``terms`` (columns) and ``gammas`` ({column: γ}; and ``gamma`` too where the only term is
    n_params, as laws from before terms had it), r (null when
    withheld, with ``r_note``), n, n_emerged, n_censored, dof, sigma, method, ci (empty with
    ``ci_note``), study_r (the study's published law's r on the same emerged cells, with r),
    n_boot, units, form,
    range, n_grid_points, fixed (if any), cov (``{"names": [...], "matrix": [[...]], "t_dof":
    G − 1}``, with a bootstrap) and, for the main fit, ``emerged_only``: this dict for the
    least-squares fit (always there: the MLE needs what least squares needs — emerged cells
    that identify the coefficients)."""
    out = {
      "log_T": self.log_T,
      "T": self.T,
      "alpha": self.alpha,
      "beta": self.beta,
      "r": None if math.isnan(self.r) else self.r,
      "n": self.n,
      "ci": self.ci,
    }
    if self.r_note:
      out["r_note"] = self.r_note
    if out["r"] is not None:  # the study's published law scored on the same emerged cells
      study_r = score("study", STUDY["log_T"], STUDY["alpha"], STUDY["beta"], *self._by(), 0)["r"]
      out["study_r"] = None if math.isnan(study_r) else study_r
    if self.ci_note:
      out["ci_note"] = self.ci_note
    if self.boot_note:
      out["boot_note"] = self.boot_note
    if self.terms:
      out["terms"], out["gammas"] = list(self.terms), dict(self.gammas)
      if self.terms == ("n_params",):
        out["gamma"] = self.gamma
    out.update(
      n_emerged=self.n_emerged,
      n_censored=self.n_censored,
      n_boot=self.n_boot,
      dof=self.dof,
      sigma=self.sigma,
      method=self.method,
      units="updates",
      form="ln UPT = ln T - alpha ln B - beta ln C"
      + "".join(f" + {law_lib.term_name(t)} ln {t}" for t in self.terms),
      range=self.range,
      n_grid_points=self.n_grid_points,
    )
    if self.lack_of_fit:
      out["lack_of_fit"] = [t.to_dict() for t in self.lack_of_fit]
    if self.separability is not None:
      out["separability"] = self.separability.to_dict()
    if self.held_out is not None:
      out["held_out"] = self.held_out.to_dict()
    if self.fixed:
      out["fixed"] = self.fixed
    if self.cov is not None:
      out["cov"] = {
        "names": list(self.names),
        "matrix": self.cov.tolist(),
        "t_dof": self.n_grid_points - 1,
      }
    if self.method == MLE:
      out["emerged_only"] = self.emerged_only.to_dict() if self.emerged_only else None
    return out


def score(name, log_T, alpha, beta, b, c, y, free: int) -> dict:
  pred = log_T - alpha * np.log(b) - beta * np.log(c)
  resid = y - pred
  r = float(np.corrcoef(pred, y)[0, 1]) if len(y) > 2 and np.std(pred) > 0 else math.nan
  return {
    "law": name,
    "log_T": float(log_T),
    "alpha": alpha,
    "beta": beta,
    "free_parameters": free,
    "r": r,
    "rmse_ln": float(np.sqrt(np.mean(resid**2))),
    "mean_residual_ln": float(np.mean(resid)),
  }
