"""Whether the power law describes the grid along B and along C: a lack-of-fit test.

The law ln UPT = ln T − α ln B − β ln C puts every value of C on one line. The alternative
gives C a free level per value, ln UPT = μ + a_C − α ln B, and keeps the power law in B; the two
are nested, both are fitted by the same censored log-normal maximum likelihood as the law
(``analysis.censored_fit``: emerged cells by their density, censored ones by P(UPT >
censor_step)), and 2 (ℓ_free − ℓ_law) is referred to χ² with (levels − 2) degrees of freedom
(the likelihood-ratio test; the classical lack-of-fit test of a regression against a model
with a mean per level, Draper & Smith, "Applied Regression Analysis", §2.1). The same for B.
An axis with fewer than 3 values cannot be tested. A small p (below ``FLAG_P``) says the
levels differ from the power law by more than the cells' scatter about it: the fitted exponent
then averages a shape the law cannot take (e.g. a U: a middle C fastest), and its "no clear
dependence" would be wrong.

Caveat: the test treats cells as independent given the model; seeds of one grid point share
that point's deviation, which is what the free levels absorb, so this is the test's target,
not a bias.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from .censored_fit import fit_mle, fit_ols, identifiable, log_likelihood

FLAG_P = 0.01  # below it the power law is said not to describe the axis
AXES = (("context_size", "C", "batch_size", "B"), ("batch_size", "B", "context_size", "C"))


@dataclasses.dataclass(frozen=True)
class AxisTest:
  """The lack-of-fit test of one axis (module docstring).

  axis, symbol: ``context_size``/C or ``batch_size``/B. levels: its values, ascending.
  statistic: 2 (ℓ_free − ℓ_law); dof: levels − 2; p_value: χ² tail.
  offsets: per level, the free model's ln-UPT level minus the law's at that value (ln units;
    centred: their mean is 0), so a U shows as negative offsets in the middle.
  fastest: per value of the other axis, the level of this axis whose emerged cells took the
    fewest updates (their mean ln UPT; values with no emerged cell left out).
  """

  axis: str
  symbol: str
  levels: tuple
  statistic: float
  dof: int
  p_value: float
  offsets: tuple
  fastest: dict

  @property
  def lacks_fit(self) -> bool:
    return self.p_value < FLAG_P

  def sentence(self) -> str:
    """The summary's words: what the levels do that a power law cannot (only when it lacks
    fit), with the test's numbers."""
    s, other = self.symbol, "B" if self.symbol == "C" else "C"
    test = f"lack-of-fit χ²({self.dof}) = {self.statistic:.1f}, p {p_text(self.p_value)}"
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
      "statistic": self.statistic,
      "dof": self.dof,
      "p_value": self.p_value,
      "offsets": list(self.offsets),
      "fastest": {str(_num(k)): float(v) for k, v in self.fastest.items()},
      "lacks_fit": self.lacks_fit,
      "sentence": self.sentence() if self.lacks_fit else None,
    }


def p_text(p: float) -> str:
  """A p-value in words after "p": '= 0.21', or '< 1e-4' below 1e-4."""
  return f"= {p:.2g}" if p >= 1e-4 else "< 1e-4"


def _num(v) -> str:
  return f"{float(v):g}"


def _mle_loglik(x: np.ndarray, v: np.ndarray, emerged: np.ndarray) -> float | None:
  """The censored log-normal maximum log-likelihood of design ``x`` (n, k) for ``v`` (ln UPT
  or ln censor_step), or None where the emerged cells cannot identify it or it does not
  converge."""
  ones = np.ones((1, len(v)))
  if not identifiable(x[emerged], ones[:, emerged])[0]:
    return None
  coef, s = fit_ols(x[emerged], v[emerged], ones[:, emerged])
  n_em = int(emerged.sum())
  s0 = math.sqrt(max(float(s[0]) ** 2 * (n_em - x.shape[1]) / n_em, 1e-12))
  a = np.concatenate([-x, v[:, None]], axis=1)
  p, ok = fit_mle(a, emerged, ones, np.append(coef[0] / s0, 1.0 / s0)[None])
  if not ok[0]:
    return None
  # Olsen's parameters: ln τ per emerged cell is the Jacobian of v, so both models' values are
  # log-likelihoods of the same data and their difference is the likelihood ratio.
  return float(log_likelihood(p, a, emerged, ones)[0])


def axis_tests(pts: pd.DataFrame, censored: np.ndarray, v: np.ndarray) -> list[AxisTest]:
  """The lack-of-fit test of C and of B (each where it has ≥ 3 values), for cells ``pts``
  (``batch_size``, ``context_size``), ``censored`` (bool per cell) and ``v`` (ln UPT, or ln
  censor_step where censored), as ``scaling.fit_law`` has them."""
  emerged = ~censored
  out = []
  ln = {c: np.log(pts[c].to_numpy(float)) for c in ("batch_size", "context_size")}
  law_x = np.column_stack([np.ones(len(pts)), ln["batch_size"], ln["context_size"]])
  law_ll = _mle_loglik(law_x, v, emerged)
  if law_ll is None:
    return out
  for axis, symbol, other, _ in AXES:
    values = pts[axis].to_numpy(float)
    levels = tuple(sorted(set(values)))
    if len(levels) < 3:
      continue
    dummies = np.column_stack([(values == lv).astype(float) for lv in levels])
    free_x = np.column_stack([dummies, ln[other]])
    free_ll = _mle_loglik(free_x, v, emerged)
    if free_ll is None:
      continue
    statistic = max(0.0, 2.0 * (free_ll - law_ll))
    dof = len(levels) - 2
    out.append(
      AxisTest(
        axis=axis,
        symbol=symbol,
        levels=levels,
        statistic=statistic,
        dof=dof,
        p_value=float(stats.chi2.sf(statistic, dof)),
        offsets=_offsets(free_x, law_x, v, emerged, levels, 2 if axis == "context_size" else 1),
        fastest=_fastest(pts, emerged, v, axis, other),
      )
    )
  return out


def _offsets(free_x, law_x, v, emerged, levels, slope: int) -> tuple:
  """Per level, the free fit's ln-UPT level minus the law's line there (least squares on the
  emerged cells: a description; the test is the likelihood's), centred: the other axis enters
  both with one slope each, a constant across levels that the centring removes. ``slope``: the
  law's column of the tested axis."""
  ones = np.ones((1, int(emerged.sum())))
  free = fit_ols(free_x[emerged], v[emerged], ones)[0][0]
  law = fit_ols(law_x[emerged], v[emerged], ones)[0][0]
  k = len(levels)
  off = free[:k] - law[slope] * np.log(np.asarray(levels, float))
  return tuple(float(o) for o in off - off.mean())


def _fastest(pts, emerged, v, axis, other) -> dict:
  """Per value of ``other``: the value of ``axis`` with the lowest mean ln UPT of its emerged
  cells."""
  em = pts.loc[emerged, [axis, other]].assign(v=v[emerged])
  out = {}
  for o, rows in em.groupby(other):
    means = rows.groupby(axis)["v"].mean()
    if len(means) > 1:
      out[float(o)] = float(means.idxmin())
  return out
