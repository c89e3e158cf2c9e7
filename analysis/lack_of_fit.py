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
approximation whose level is measured by simulation (``benchmarks/calibration.py``).

**Zero scatter.** Emergence points are located between checkpoints; differences in ln UPT below
``SCATTER_FLOOR`` (0.1%) are not evidence. Both models' residual scatter is floored there (added
in quadrature), so points exactly on a power law (or integer-rounded from one) give F ≈ 0 and an
exact U gives a very large F, instead of 0/0.

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

FLAG_P = 0.01  # below it the power law is said not to describe the axis
SCATTER_FLOOR = 1e-3  # ln units: differences between grid points below this are not evidence
AXES = (("context_size", "C", "batch_size", "B"), ("batch_size", "B", "context_size", "C"))


@dataclasses.dataclass(frozen=True)
class AxisTest:
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
  reason: str | None = None
  left_out: tuple = ()
  statistic: float | None = None
  dof: int | None = None
  dof_resid: int | None = None
  p_value: float | None = None
  n_points: int = 0
  n_censored_points: int = 0
  offsets: tuple = ()
  fastest: dict = dataclasses.field(default_factory=dict)

  @property
  def tested(self) -> bool:
    return self.reason is None

  @property
  def lacks_fit(self) -> bool:
    return self.tested and self.p_value < FLAG_P

  def numbers(self) -> str:
    """'F(3, 19) = 12.3, p < 1e-4'."""
    return f"F({self.dof}, {self.dof_resid}) = {self.statistic:.1f}, p {p_text(self.p_value)}"

  def sentence(self) -> str:
    """The words for the summary, fit-law and the report: what the levels do that a power law
    cannot (where it lacks fit), that it is not rejected, or why it was not tested."""
    s, other = self.symbol, "B" if self.symbol == "C" else "C"
    if not self.tested:
      return f"lack of fit in {s} not tested: {self.reason}"
    test = f"lack-of-fit {self.numbers()} over {self.n_points} grid points"
    if self.left_out:
      test += (
        f"; {s} = {', '.join(_num(lv) for lv in self.left_out)} not compared: no grid point "
        f"there has all its cells emerged"
      )
    if not self.lacks_fit:
      return (
        f"the power law in {s} is not rejected (a free level per value of {s} fits the grid "
        f"points no better: {test})"
      )
    winners = set(self.fastest.values())
    ends = {self.levels[0], self.levels[-1]}
    if len(self.fastest) > 1 and len(winners) == 1 and not winners <= ends:
      (best,) = winners
      return (
        f"{s} = {_num(best)} is fastest at every {other}: the power law in {s} does not "
        f"describe this grid ({test})"
      )
    shape = ", ".join(
      f"{s} = {_num(lv)}: {math.exp(o) - 1:+.0%}" for lv, o in zip(self.levels, self.offsets)
    )
    return (
      f"the updates do not follow a power law in {s} (each level against the law's line, "
      f"{shape}; {test})"
    )

  def to_dict(self) -> dict:
    return {
      "axis": self.axis,
      "symbol": self.symbol,
      "levels": [float(v) for v in self.levels],
      "left_out": [float(v) for v in self.left_out],
      "tested": self.tested,
      "reason": self.reason,
      "test": "F on grid points" if self.tested else None,
      "statistic": self.statistic,
      "dof": self.dof,
      "dof_resid": self.dof_resid,
      "p_value": self.p_value,
      "numbers": self.numbers() if self.tested else None,
      "n_points": self.n_points,
      "n_censored_points": self.n_censored_points,
      "offsets": list(self.offsets),
      "fastest": {str(_num(k)): float(v) for k, v in self.fastest.items()},
      "lacks_fit": self.lacks_fit,
      "sentence": self.sentence(),
    }


def p_text(p: float) -> str:
  """A p-value in words after "p": '= 0.21', or '< 1e-4' below 1e-4."""
  return f"= {p:.2g}" if p >= 1e-4 else "< 1e-4"


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


def grid_points(pts: pd.DataFrame, censored: np.ndarray, v: np.ndarray) -> _Points:
  """One row per grid point (distinct ``batch_size`` and ``context_size``: the bootstrap's
  clusters of a fit without the n_params term, which is when the test runs) of the cells
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


def _fit(x: np.ndarray, p: _Points) -> tuple[float, float] | None:
  """``(log-likelihood, σ)`` of design ``x`` (G, k) for the points: without censored points,
  least squares' profile log-likelihood −G ln σ up to a constant, σ = sqrt(ML scale² +
  ``SCATTER_FLOOR``²); else the censored MLE. None where the emerged points do not identify
  it or the MLE does not converge."""
  emerged = ~p.censored
  ones = np.ones((1, p.n))
  if not identifiable(x[emerged], ones[:, emerged])[0]:
    return None
  coef, s = fit_ols(x[emerged], p.v[emerged], ones[:, emerged])
  n_em = int(emerged.sum())
  s_ml = math.sqrt(max(float(s[0]) ** 2 * (n_em - x.shape[1]) / n_em, 0.0))
  if not p.censored.any():  # the profile log-likelihood, its scatter floored
    sigma = math.hypot(s_ml, SCATTER_FLOOR)
    return -p.n * math.log(sigma), sigma
  s0 = max(s_ml, SCATTER_FLOOR)
  a = np.concatenate([-x, p.v[:, None]], axis=1)
  par, ok = fit_mle(a, emerged, ones, np.append(coef[0] / s0, 1.0 / s0)[None])
  if not ok[0]:
    return None
  # Olsen's parameters: ln τ per emerged point is the Jacobian of v, so both models' values
  # are log-likelihoods of the same data and their difference is the likelihood ratio.
  return float(log_likelihood(par, a, emerged, ones)[0]), 1.0 / float(par[0, -1])


def axis_tests(pts: pd.DataFrame, censored: np.ndarray, v: np.ndarray) -> list[AxisTest]:
  """The lack-of-fit test of C and of B, or why each was not tested, for cells ``pts``
  (``batch_size``, ``context_size``, optional ``n_params``), ``censored`` (bool per cell) and
  ``v`` (ln UPT, or ln censor_step where censored), as ``scaling.fit_law`` has them. Levels of
  the axis without a grid point whose cells all emerged are left out of both models (their
  level is only bounded; the others' test is unaffected, points being independent) and named
  in ``AxisTest.left_out``.

  Returns: two ``AxisTest``s, C first."""
  every = grid_points(pts, censored, v)
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
    lr = max(0.0, 2.0 * (free[0] - law[0]))
    f_stat = math.expm1(lr / p.n) * dof_resid / q
    out.append(
      AxisTest(
        statistic=f_stat,
        dof=q,
        dof_resid=dof_resid,
        p_value=float(stats.f.sf(f_stat, q, dof_resid)),
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
  lowest mean ln UPT of its emerged cells."""
  keep = emerged & np.isin(pts[axis].to_numpy(float), levels)
  em = pts.loc[keep, [axis, other]].assign(v=v[keep])
  out = {}
  for o, rows in em.groupby(other):
    means = rows.groupby(axis)["v"].mean()
    if len(means) > 1:
      out[float(o)] = float(means.idxmin())
  return out
