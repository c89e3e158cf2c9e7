"""Whether the power law describes the grid along B and along C: a lack-of-fit test whose unit is
the grid point.

The law ln UPT = ln T − α ln B − β ln C puts every value of C on one line. The alternative gives
C a free level per value, ln UPT = a_C − α ln B, and keeps the power law in B; the same for B. A
small p (below ``FLAG_P``) says the levels differ from the power law by more than the grid
points scatter about it: the fitted exponent then averages a shape the law cannot take (e.g. a
U: a middle C fastest), and its "no clear dependence" would be wrong.

**The grid point is the unit.** Seeds of one (B, C) point share whatever makes that point
deviate from a power law (its data order, its checkpoints, its budget): they are subsamples of
one experimental unit, not independent evidence about the law's shape (pseudoreplication:
Hurlbert 1984, Ecol. Monogr. 54:187; the F test of a nested design against the experimental
units' error: Montgomery, *Design and Analysis of Experiments*, 8th ed., §14.1). A test on cells
counts one point's deviation once per seed and, with 2–3 seeds a point and point deviations as
large as the seed scatter, flagged power-law grids at 7–30% at its stated 1% (18% on exp1's 5 ×
5 grid; docs/benchmarks.md, "Calibration of the report's verdicts"). So each point enters once,
as the mean ln UPT of its cells (ȳ_i = x_i·θ + u_i + mean seed noise: independent across points,
variance σ_p² + σ_s²/m for m seeds); a point with a censored cell is right-censored at the mean
with its censored cells at their ``censor_step`` (a lower bound of its mean, since each censored
cell's ln UPT exceeds it).

**The statistic.** Both models are fitted to the points by the censored log-normal maximum
likelihood of the law (``analysis.censored_fit``; without censored points, least squares). The
likelihood ratio is read as an F statistic, F = (exp(LR / G) − 1) · (G − k₁) / q, referred to
F(q, G − k₁) (G points, k₁ coefficients of the free model, q = levels − 2): for uncensored
normal data this is exactly the classical F test of the extra levels (LR = G ln(RSS₀/RSS₁);
Draper & Smith, *Applied Regression Analysis*, 3rd ed., §2.1 and §6.1), which holds its level at
any G, where χ²(q) on the LR runs liberal with few points. With censored points it is an
approximation: a censored point carries less information than an observed one, so in the F
reading it counts as half a point (``CENSORED_WEIGHT``: G is replaced by emerged points + ½ ×
censored points, a fractional residual dof). Measured (``benchmarks/calibration.py``, 600
power-law 5 × 5 grids, half of the cells past a token budget): counting censored points whole
flagged 1.7% (C) and 1.8% (B) at the 1% level, as half 0.8% and 1.3%, not at all 0.2% and 0.8%.

**Zero scatter.** Emergence points are located between checkpoints; differences in ln UPT below
``SCATTER_FLOOR`` (0.1%) are not evidence. Both models' residual scatter is floored there (added
in quadrature), so points exactly on a power law (or integer-rounded from one) give F ≈ 0 and an
exact U gives a very large F, instead of 0/0.

**Separability** (``separability_test``): the law against the law plus an ln B · ln C term,
on the same points and with the same F reading (q = 1).

**Words graded by evidence** (``evidence``): p < ``FLAG_P`` rejects the law along the axis; from
there to ``SOME_P`` is "some evidence against", said with what the free levels show; above,
"no evidence against". ``caution`` marks an exponent whose axis (or form) is rejected.

Levels of the axis with no grid point whose cells all emerged are left out of both models (only
a bound on their level is known). An axis is not tested, with the reason in one line
(``AxisTest.reason``), where it has fewer than 3 values (with a known level), where the grid
points leave no residual degree of freedom for the free model, or where the emerged points do
not identify a level per value.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from .censored_fit import fit_mle, fit_ols, identifiable, log_likelihood

FLAG_P = 0.01  # below it the power law is said not to describe the axis (rejected)
SOME_P = 0.1  # from FLAG_P to here: some evidence against the law, short of the report's level
SCATTER_FLOOR = 1e-3  # ln units: differences between grid points below this are not evidence
AXES = (("context_size", "C", "batch_size", "B"), ("batch_size", "B", "context_size", "C"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Verdict:
  """What a test of the law's form says, shared by ``AxisTest`` and ``SeparabilityTest``: why
  it was not tested (``reason``, None where it was), F (``statistic``) on (``dof``,
  ``dof_resid``), its ``p_value``, and the grid points it read (``n_points``, of them
  ``n_censored_points``)."""

  reason: str | None = None
  statistic: float | None = None
  dof: int | None = None
  dof_resid: float | None = None
  p_value: float | None = None
  n_points: int = 0
  n_censored_points: int = 0

  @property
  def tested(self) -> bool:
    return self.reason is None

  @property
  def lacks_fit(self) -> bool:
    return self.tested and self.p_value < FLAG_P

  @property
  def evidence(self) -> str | None:
    """'rejected', 'some' or 'none' (``evidence``); None where not tested."""
    return evidence(self.p_value) if self.tested else None

  def numbers(self) -> str:
    """'F(3, 19) = 12.3, p < 1e-4'."""
    return f"F({self.dof}, {self.dof_resid:g}) = {self.statistic:.1f}, p {p_text(self.p_value)}"

  def censored_note(self) -> str:
    """Where a ``CENSORED_SHARE`` or more of the tested grid points are censored: that the
    test's level is then approximate, with what the bench measured; '' otherwise."""
    if not self.n_points or self.n_censored_points < CENSORED_SHARE * self.n_points:
      return ""
    return (
      f"; {self.n_censored_points} of them censored, where the test's level is approximate: "
      f"{CENSORED_LEVEL} at its 1% on the calibration bench's grids with half the cells past a "
      f"token budget"
    )

  def _verdict_dict(self, test: str) -> dict:
    """The JSON fields every test shares (law.json's ``lack_of_fit`` and ``separability``)."""
    return {
      "tested": self.tested,
      "reason": self.reason,
      "test": test if self.tested else None,
      "statistic": self.statistic,
      "dof": self.dof,
      "dof_resid": self.dof_resid,
      "p_value": self.p_value,
      "numbers": self.numbers() if self.tested else None,
      "n_points": self.n_points,
      "n_censored_points": self.n_censored_points,
      "lacks_fit": self.lacks_fit,
      "evidence": self.evidence,
      "sentence": self.sentence(),
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class AxisTest(_Verdict):
  """The lack-of-fit test of one axis (module docstring), or why it was not tested.

  axis, symbol: ``context_size``/C or ``batch_size``/B. levels: its values tested, ascending;
    left_out: those without a grid point whose cells all emerged (not in either model).
  reason: why the axis was not tested (one line), None where it was; the fields below are
    then None (or empty).
  statistic: F (module docstring); dof: q = levels − 2; dof_resid: G − k₁, the grid points'
    residual degrees of freedom; p_value: the F tail; n_points: grid points G; n_censored_points:
    those with a censored cell.
  offsets: per level, the free model's ln-UPT level minus the law's at that value (ln units;
    centred: their mean is 0), so a U shows as negative offsets in the middle.
  fastest: per value of the other axis, the level of this axis whose emerged cells took the
    fewest updates (their mean ln UPT; values with no emerged cell left out).
  """

  axis: str
  symbol: str
  levels: tuple
  left_out: tuple = ()
  offsets: tuple = ()
  fastest: dict = dataclasses.field(default_factory=dict)

  def sentence(self) -> str:
    """The words for the summary, fit-law and the report: what the levels do that a power law
    cannot (where it lacks fit), that it is not rejected, or why it was not tested."""
    s, other = self.symbol, "B" if self.symbol == "C" else "C"
    if not self.tested:
      return f"lack of fit in {s} not tested: {self.reason}"
    test = f"lack-of-fit {self.numbers()} over {self.n_points} grid points{self.censored_note()}"
    if self.left_out:
      test += (
        f"; {s} = {', '.join(_num(lv) for lv in self.left_out)} not compared: no grid point "
        f"there has all its cells emerged"
      )
    if self.evidence == "none":
      return f"no evidence against the power law in {s} ({test})"
    shape = self.shape()
    if self.evidence == "some":
      return (
        f"some evidence against the power law in {s}, short of the report's "
        f"{FLAG_P:.0%} level ({test}): {shape}"
      )
    best = self.fastest_everywhere()
    if best is not None and best not in (self.levels[0], self.levels[-1]):
      return (
        f"{s} = {_num(best)} is fastest at every {other}: the power law in {s} does not "
        f"describe this grid ({test})"
      )
    return f"the updates do not follow a power law in {s} ({shape}; {test})"

  def fastest_everywhere(self):
    """The level of this axis that is fastest at every value of the other axis (at least two
    of them), or None."""
    winners = set(self.fastest.values())
    if None in winners:  # a tie for fastest at some value of the other axis: no one level
      return None
    return next(iter(winners)) if len(self.fastest) > 1 and len(winners) == 1 else None

  def shape(self) -> str:
    """What the free levels show, in words: each level against the law's line and, where one
    level is fastest at every value of the other axis, that level."""
    s, other = self.symbol, "B" if self.symbol == "C" else "C"
    text = "each level against the law's line, " + ", ".join(
      f"{s} = {_num(lv)}: {math.exp(o) - 1:+.0%}" for lv, o in zip(self.levels, self.offsets)
    )
    best = self.fastest_everywhere()
    if best is not None:
      text += f"; {s} = {_num(best)} is fastest at every {other}"
    return text

  def to_dict(self) -> dict:
    return {
      "axis": self.axis,
      "symbol": self.symbol,
      "levels": [float(v) for v in self.levels],
      "left_out": [float(v) for v in self.left_out],
      **self._verdict_dict("F on grid points"),
      "offsets": list(self.offsets),
      "fastest": {str(_num(k)): None if v is None else float(v) for k, v in self.fastest.items()},
    }


def evidence(p: float) -> str:
  """The words' grade of a test's p-value: 'rejected' below ``FLAG_P`` (the report's 1% level),
  'some' from there to ``SOME_P`` (evidence against the law, short of the report's level: said
  with its effect size, never as "fits no better"), 'none' above."""
  if p < FLAG_P:
    return "rejected"
  return "some" if p < SOME_P else "none"


def p_text(p: float) -> str:
  """A p-value in words after "p": '= 0.21', or '< 1e-4' below 1e-4; never rounded up to a
  threshold of the words (p = 0.009996 is '< 0.01', not '= 0.01', beside "rejected")."""
  if p < 1e-4:
    return "< 1e-4"
  for edge in (FLAG_P, SOME_P):
    if p < edge and float(f"{p:.2g}") >= edge:
      return f"< {edge:g}"
  return f"= {p:.2g}"


def _num(v) -> str:
  return f"{float(v):g}"


@dataclasses.dataclass(frozen=True)
class _Points:
  """The grid points as the test reads them: B and C per point (G,), the mean ln UPT ``v`` (G,)
  (or its lower bound where ``censored``), and G."""

  batch_size: np.ndarray
  context_size: np.ndarray
  v: np.ndarray
  censored: np.ndarray

  @property
  def n(self) -> int:
    return len(self.v)

  def subset(self, keep: np.ndarray) -> "_Points":
    return _Points(*(getattr(self, f.name)[keep] for f in dataclasses.fields(self)))


def _without_censored_if_exact(p: _Points) -> _Points:
  """``p`` without its censored points where its emerged points lie on a power law in B and C
  within ``SCATTER_FLOOR`` (exact or integer-rounded data): there the censored likelihood
  drives σ to 0 (a fit that does not converge, or an LR that reads rounding as evidence), while
  a censored point's bound says nothing about the shape that the exact points do not; the
  floored least squares on the emerged points decides. ``p`` itself otherwise."""
  emerged = ~p.censored
  if not p.censored.any() or emerged.sum() < 4:
    return p
  x = np.column_stack([np.ones(p.n), np.log(p.batch_size), np.log(p.context_size)])[emerged]
  ones = np.ones((1, int(emerged.sum())))
  if not identifiable(x, ones)[0]:
    return p
  scale = float(fit_ols(x, p.v[emerged], ones)[1][0])
  return p.subset(emerged) if scale <= 10 * SCATTER_FLOOR else p


def grid_points(pts: pd.DataFrame, censored: np.ndarray, v: np.ndarray) -> _Points:
  """One row per grid point (distinct ``batch_size`` and ``context_size``: the bootstrap's
  clusters of a fit without terms beyond B and C, which is when the test runs) of the cells
  ``pts``: its mean ``v`` over its cells, censored where any cell is (module docstring)."""
  keys = ["batch_size", "context_size"]
  frame = pts[keys].assign(_v=v, _c=np.asarray(censored, bool))
  by = frame.groupby(keys, sort=True, dropna=False)
  agg = by.agg(_v=("_v", "mean"), _c=("_c", "any")).reset_index()
  return _Points(
    batch_size=agg["batch_size"].to_numpy(float),
    context_size=agg["context_size"].to_numpy(float),
    v=agg["_v"].to_numpy(float),
    censored=agg["_c"].to_numpy(bool),
  )


def _fit(x: np.ndarray, p: _Points) -> tuple[float, float, np.ndarray] | None:
  """``(log-likelihood, σ, coefficients (k,))`` of design ``x`` (G, k) for the points: without
  censored points, least squares' profile log-likelihood −G ln σ up to a constant, σ =
  sqrt(ML scale² + ``SCATTER_FLOOR``²); else the censored MLE. None where the emerged points
  do not identify it or the MLE does not converge."""
  emerged = ~p.censored
  ones = np.ones((1, p.n))
  if not identifiable(x[emerged], ones[:, emerged])[0]:
    return None
  coef, s = fit_ols(x[emerged], p.v[emerged], ones[:, emerged])
  n_em = int(emerged.sum())
  s_ml = math.sqrt(max(float(s[0]) ** 2 * (n_em - x.shape[1]) / n_em, 0.0))
  if not p.censored.any():  # the profile log-likelihood, its scatter floored
    sigma = math.hypot(s_ml, SCATTER_FLOOR)
    return -p.n * math.log(sigma), sigma, coef[0]
  s0 = max(s_ml, SCATTER_FLOOR)
  a = np.concatenate([-x, p.v[:, None]], axis=1)
  par, ok = fit_mle(a, emerged, ones, np.append(coef[0] / s0, 1.0 / s0)[None])
  if not ok[0]:
    return None
  # Olsen's parameters: ln τ per emerged point is the Jacobian of v, so both models' values
  # are log-likelihoods of the same data and their difference is the likelihood ratio.
  tau = float(par[0, -1])
  return float(log_likelihood(par, a, emerged, ones)[0]), 1.0 / tau, par[0, :-1] / tau


# What a censored grid point counts for in the F reading's sample size (module docstring).
CENSORED_WEIGHT = 0.5
# From this share of censored grid points the words say the level is approximate, with the
# bench's measurement (docs/benchmarks.md, "Calibration of the report's verdicts").
CENSORED_SHARE = 0.3
CENSORED_LEVEL = "0.8–2.3% (C), 0.3–1.5% (B), 0.5–1.5% (B × C)"


def _f_test(half_lr: float, p: _Points, k1: int, q: int) -> tuple[float, float, float]:
  """``(F, residual dof, p-value)`` from half the likelihood ratio of the free model (k1
  coefficients) against the law (q fewer) on the points ``p``: F = (exp(LR / n) − 1)·(n −
  k1)/q on F(q, n − k1), n = emerged points + ``CENSORED_WEIGHT`` × censored points (module
  docstring); the residual dof is an int where no point is censored."""
  n = float((~p.censored).sum() + CENSORED_WEIGHT * p.censored.sum())
  dof_resid = n - k1
  if dof_resid <= 0:  # censored points leave the free model no residual: no evidence either way
    return 0.0, dof_resid, 1.0
  f_stat = math.expm1(max(0.0, 2.0 * half_lr) / n) * dof_resid / q
  dof_out = int(dof_resid) if dof_resid.is_integer() else dof_resid
  return f_stat, dof_out, float(stats.f.sf(f_stat, q, dof_resid))


def axis_tests(pts: pd.DataFrame, censored: np.ndarray, v: np.ndarray) -> list[AxisTest]:
  """The lack-of-fit test of C and of B, or why each was not tested, for cells ``pts``
  (``batch_size``, ``context_size``, optional ``n_params``), ``censored`` (bool per cell) and
  ``v`` (ln UPT, or ln censor_step where censored), as ``scaling.fit_law`` has them. Levels of
  the axis without a grid point whose cells all emerged are left out of both models (their
  level is only bounded; the others' test is unaffected, points being independent) and named
  in ``AxisTest.left_out``.

  Returns: two ``AxisTest``s, C first."""
  every = _without_censored_if_exact(grid_points(pts, censored, v))
  out = []
  for axis, symbol, other, other_symbol in AXES:
    all_levels = tuple(sorted(set(getattr(every, axis))))
    known = {lv for lv in all_levels if (~every.censored & (getattr(every, axis) == lv)).any()}
    p = every.subset(np.isin(getattr(every, axis), sorted(known)))
    levels = tuple(sorted(known))
    common = dict(
      axis=axis,
      symbol=symbol,
      levels=levels,
      left_out=tuple(lv for lv in all_levels if lv not in known),
      n_points=p.n,
      n_censored_points=int(p.censored.sum()),
    )
    free_x, law_x = _designs(getattr(p, axis), getattr(p, other), levels)
    q, dof_resid = len(levels) - 2, p.n - free_x.shape[1]
    reason = _untestable(p, symbol, other_symbol, levels, common["left_out"], dof_resid, free_x)
    law = free = None
    if reason is None:
      law, free = _fit(law_x, p), _fit(free_x, p)
      if law is None or free is None:
        reason = (
          f"the censored fit of the {p.n} grid points ({int(p.censored.sum())} censored) did "
          f"not converge{'' if law is not None else ' for the power law itself'}"
        )
    if reason is not None:
      out.append(AxisTest(reason=reason, **common))
      continue
    f_stat, dof_resid, p_value = _f_test(free[0] - law[0], p, free_x.shape[1], q)
    out.append(
      AxisTest(
        statistic=f_stat,
        dof=q,
        dof_resid=dof_resid,
        p_value=p_value,
        offsets=_offsets(pts, censored, v, axis, other, levels),
        fastest=_fastest(pts, ~np.asarray(censored, bool), v, axis, other, levels),
        **common,
      )
    )
  return out


def _untestable(p, symbol, other_symbol, levels, left_out, dof_resid, free_x) -> str | None:
  """Why an axis cannot be tested (one line), or None."""
  nums = lambda lvs: ", ".join(_num(lv) for lv in lvs)  # noqa: E731
  gone = (
    f"; {symbol} = {nums(left_out)} left out, no grid point there has all its cells emerged"
    if left_out
    else ""
  )
  if len(levels) + len(left_out) < 3:
    return (
      f"{symbol} has {len(levels) + len(left_out)} value(s) in the grid: a power law passes "
      f"through any 2 levels"
    )
  if len(levels) < 3:
    return (
      f"{len(levels)} value(s) of {symbol} with a known level ({nums(levels) or 'none'}{gone}): "
      f"a power law passes through any 2 levels"
    )
  if dof_resid < 1:
    return (
      f"{p.n} grid points leave no residual degree of freedom for a level per value of "
      f"{symbol} ({len(levels)}) and the slope in {other_symbol}{gone}"
    )
  emerged = ~p.censored
  if not identifiable(free_x[emerged], np.ones((1, int(emerged.sum()))))[0]:
    return (
      f"the {int(emerged.sum())} grid points whose cells all emerged do not identify a level "
      f"per value of {symbol} and the slope in {other_symbol} ({int(p.censored.sum())} of "
      f"{p.n} points have a censored cell{gone})"
    )
  return None


def _designs(values: np.ndarray, other: np.ndarray, levels: tuple) -> tuple:
  """The two models' designs for rows with the tested axis at ``values`` and the other at
  ``other`` (n,): the free model (a 0/1 column per level, then ln other) and the law (1, ln
  value, ln other); float64 (n, len(levels) + 1) and (n, 3)."""
  ln_other = np.log(other)
  free_x = np.column_stack([values[:, None] == np.asarray(levels)[None], ln_other]).astype(float)
  return free_x, np.column_stack([np.ones(len(values)), np.log(values), ln_other])


def _offsets(pts, censored, v, axis, other, levels) -> tuple:
  """Per level, the ln-UPT level of a free fit minus the law's line there (least squares on the
  emerged cells at the tested ``levels``: a description; the test is on the grid points),
  centred: the other axis enters both with one slope each, a constant across levels that the
  centring removes."""
  values = pts[axis].to_numpy(float)
  cells = ~np.asarray(censored, bool) & np.isin(values, levels)
  free_x, law_x = _designs(values[cells], pts[other].to_numpy(float)[cells], levels)
  ones = np.ones((1, int(cells.sum())))
  free = fit_ols(free_x, v[cells], ones)[0][0]
  law = fit_ols(law_x, v[cells], ones)[0][0]
  off = free[: len(levels)] - law[1] * np.log(np.asarray(levels, float))
  return tuple(float(o) for o in off - off.mean())


def _fastest(pts, emerged, v, axis, other, levels) -> dict:
  """Per value of ``other``: the value of ``axis`` among ``levels`` (those tested) with the
  lowest mean ln UPT of its emerged cells; None where two or more tie for it (within
  ``TIE_LN``)."""
  keep = emerged & np.isin(pts[axis].to_numpy(float), levels)
  em = pts.loc[keep, [axis, other]].assign(v=v[keep])
  out = {}
  for o, rows in em.groupby(other):
    means = rows.groupby(axis)["v"].mean()
    if len(means) > 1:
      tied = int((means <= means.min() + TIE_LN).sum()) > 1
      out[float(o)] = None if tied else float(means.idxmin())
  return out


# Mean ln UPT this close count as a tie for fastest: float rounding of equal updates, not data.
TIE_LN = 1e-9


@dataclasses.dataclass(frozen=True, kw_only=True)
class SeparabilityTest(_Verdict):
  """The test of the law's separable form (``separability_test``), or why it was not tested.

  reason: why not tested (one line), None where it was; the fields below are then None.
  statistic: F; dof: 1; dof_resid: G − 4; p_value: the F tail; n_points: grid points G;
    n_censored_points: those with a censored cell.
  interaction: λ, the fitted coefficient of (ln B − m_B)(ln C − m_C) in ln UPT (m: the grid
    points' means); drift: how much the exponent in B changes from the smallest to the largest
    C of the grid, −λ·ln(C_max / C_min) (positive: UPT falls faster with B at large C).
  """

  interaction: float | None = None
  drift: float | None = None
  context_range: tuple = ()

  def shape(self) -> str:
    """The interaction as an exponent in B that drifts with C, in words."""
    lo, hi = self.context_range
    return f"the exponent in B changes by {self.drift:+.2f} from C = {_num(lo)} to C = {_num(hi)}"

  def sentence(self) -> str:
    if not self.tested:
      return f"separability not tested: {self.reason}"
    test = (
      f"an added ln B · ln C term, {self.numbers()} over {self.n_points} grid points"
      f"{self.censored_note()}"
    )
    if self.evidence == "none":
      return f"no evidence against the law's separable form ({test})"
    if self.evidence == "some":
      return (
        f"some evidence against the law's separable form, short of the report's "
        f"{FLAG_P:.0%} level ({test}): {self.shape()}"
      )
    return (
      f"the law's separable form does not describe this grid: {self.shape()}, where the law "
      f"gives one α at every C ({test})"
    )

  def to_dict(self) -> dict:
    return {
      **self._verdict_dict("F on grid points, + ln B · ln C"),
      "interaction": self.interaction,
      "drift": self.drift,
    }


def separability_test(pts: pd.DataFrame, censored: np.ndarray, v: np.ndarray) -> SeparabilityTest:
  """Whether the exponent in B is the same at every C, as the law's separable form
  UPT = T / (B^α · C^β) says: the law against the law plus an interaction λ (ln B − m_B)(ln C −
  m_C), on the grid points (module docstring: each point once, its cells' mean ln UPT,
  censored where any cell is; the same censored likelihood and F reading as the axis tests,
  with q = 1 and G − 4 residual degrees of freedom).

  Why this alternative: it is Tukey's one-degree-of-freedom test for non-additivity (Tukey
  1949, Biometrics 5:232), whose interaction is the product of the two main effects; under the
  law the main effects are α ln B and β ln C, so Tukey's term is ∝ ln B · ln C: an exponent in
  B that changes linearly in ln C (and one in C that changes in ln B). One degree of freedom
  spends the grid's points on the drift a researcher would suspect (the B effect weakening or
  strengthening with C) instead of a free exponent per C (n_C − 1 dof), which catches any
  pattern but has less power for this one. On a complete grid the centred term is orthogonal
  to any function of B alone or C alone, so a shape an axis test flags (a U in C) does not
  enter λ; it only adds to the residual, making the test conservative there.

  Args: as ``axis_tests``.

  Returns: a ``SeparabilityTest`` (``reason`` set where it cannot be tested: fewer than 2
    values of B or C, or fewer than 5 grid points whose emerged points identify the term)."""
  p = _without_censored_if_exact(grid_points(pts, censored, v))
  common = dict(n_points=p.n, n_censored_points=int(p.censored.sum()))
  lb, lc = np.log(p.batch_size), np.log(p.context_size)
  n_b, n_c = len(set(lb)), len(set(lc))
  if n_b < 2 or n_c < 2:
    return SeparabilityTest(
      reason=f"the grid has {n_b} value(s) of B and {n_c} of C: an interaction needs both varied",
      **common,
    )
  law_x = np.column_stack([np.ones(p.n), lb, lc])
  free_x = np.column_stack([law_x, (lb - lb.mean()) * (lc - lc.mean())])
  dof_resid = p.n - free_x.shape[1]
  emerged = ~p.censored
  if dof_resid < 1 or not identifiable(free_x[emerged], np.ones((1, int(emerged.sum()))))[0]:
    return SeparabilityTest(
      reason=(
        f"{int(emerged.sum())} of {p.n} grid points with all their cells emerged: too few to "
        f"identify an interaction of B and C with a residual left"
      ),
      **common,
    )
  law, free = _fit(law_x, p), _fit(free_x, p)
  if law is None or free is None:
    return SeparabilityTest(
      reason=f"the censored fit of the {p.n} grid points did not converge", **common
    )
  f_stat, dof_resid, p_value = _f_test(free[0] - law[0], p, free_x.shape[1], 1)
  lam = free[2][-1]
  c_lo, c_hi = float(p.context_size.min()), float(p.context_size.max())
  return SeparabilityTest(
    statistic=f_stat,
    dof=1,
    dof_resid=dof_resid,
    p_value=p_value,
    interaction=lam,
    drift=-lam * math.log(c_hi / c_lo),
    context_range=(c_lo, c_hi),
    **common,
  )


# The exponent whose axis a lack-of-fit test reads (law.json's lack_of_fit symbols).
EXPONENT_AXIS = {"alpha": "B", "beta": "C"}


def caution(law: dict, name: str) -> str:
  """A mark for an exponent that averages a shape the law cannot take: ' (B lacks fit)' where
  its axis's lack-of-fit test rejects the power law, ' (not separable)' where the separability
  test rejects the law's form (law.json's ``lack_of_fit`` and ``separability``); '' otherwise."""
  marks = [
    f"{t['symbol']} lacks fit"
    for t in law.get("lack_of_fit") or []
    if t.get("lacks_fit") and EXPONENT_AXIS.get(name) == t.get("symbol")
  ]
  if name in EXPONENT_AXIS and (law.get("separability") or {}).get("lacks_fit"):
    marks.append("not separable")
  return f" ({', '.join(marks)})" if marks else ""
