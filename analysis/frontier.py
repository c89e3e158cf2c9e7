"""Experiments 2 and 3: where induction heads form in the data's property space.

* ``emergence_map``: for a frequency × reliability grid (semi-natural Markov data, Experiment 2),
  per grid point the emergence rate (share of its seeds that emerged) and the median emergence
  step of those that did.
* ``pareto_frontier``: the boundary between emerging and non-emerging points. Along each
  frequency, the reliability at which the emergence rate reaches ``rate`` (0.5), linearly
  interpolated between the two grid reliabilities that bracket it; and the same along each
  reliability over frequency. The study finds IH formation fails below such a frontier and that
  models are more sensitive to reliability than to frequency (Aoyama et al., Experiment 2;
  docs/study.md).
* ``factorial_table``: for the local dependency × categoriality × marginal factorial (synthetic
  Markov data, Experiment 3), emergence rate and median emergence step per condition.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

FREQUENCY, RELIABILITY = "data.frequency", "data.reliability"
# Config fields that define Experiment 3's conditions, with their short names.
FACTORS = {
  "data.transitions": "transitions",
  "data.synthetic.entropy_rate_bits": "local_dependency_bits",
  "data.synthetic.categoriality": "categoriality",
  "data.synthetic.marginal": "marginal",
}


def _rates(points: pd.DataFrame, by: list[str]) -> pd.DataFrame:
  emerged = ~points["censored"].astype(bool)
  g = points.assign(_emerged=emerged).groupby(by, sort=True, dropna=False)
  out = g.agg(n=("_emerged", "size"), emerged=("_emerged", "sum"))
  out["rate"] = out["emerged"] / out["n"]
  med = points[emerged].groupby(by, sort=True, dropna=False)["emergence_step"].median()
  out["median_step"] = med.reindex(out.index)
  return out.reset_index()


def emergence_map(points: pd.DataFrame, x: str = FREQUENCY, y: str = RELIABILITY) -> pd.DataFrame:
  """Per (x, y) grid point: ``n`` cells, ``emerged``, ``rate``, ``median_step`` (NaN if none
  emerged).

  Args:
    points: one row per cell (``analysis.emergence.primary``) with columns x, y, ``censored``,
      ``emergence_step``.

  Raises:
    ValueError: x or y is not a column (the run did not vary it).
  """
  for axis in (x, y):
    if axis not in points:
      raise ValueError(
        f"no column {axis!r}: the runs did not vary it (axes present: "
        f"{[c for c in points.columns if c.startswith('data.')]})"
      )
  return _rates(points, [x, y])


def _crossings(table: pd.DataFrame, along: str, across: str, rate: float) -> list[dict]:
  rows = []
  for value, line in table.groupby(across, sort=True):
    line = line.sort_values(along)
    a, r = line[along].to_numpy(float), line["rate"].to_numpy(float)
    hit = np.nonzero(r >= rate)[0]
    if not len(hit):
      rows.append({across: value, along: math.nan, "bound": "none emerge"})
      continue
    i = int(hit[0])
    if i == 0:
      rows.append({across: value, along: float(a[0]), "bound": "at or below the grid"})
      continue
    t = (rate - r[i - 1]) / (r[i] - r[i - 1])
    rows.append(
      {across: value, along: float(a[i - 1] + t * (a[i] - a[i - 1])), "bound": "interpolated"}
    )
  return rows


def pareto_frontier(
  emap: pd.DataFrame, x: str = FREQUENCY, y: str = RELIABILITY, rate: float = 0.5
) -> pd.DataFrame:
  """The frontier of an ``emergence_map``: rows ``(x, y, along, bound)`` where ``along`` says
  which axis was interpolated ('y' for "the least y at this x where the rate reaches ``rate``",
  'x' likewise) and ``bound`` is 'interpolated', 'at or below the grid' (already emerging at the
  grid's smallest value) or 'none emerge' (NaN coordinate). Assumes emergence is monotone in both
  axes (more frequent, more reliable patterns help), as the study reports."""
  along_y = pd.DataFrame(_crossings(emap, y, x, rate)).assign(along="y")
  along_x = pd.DataFrame(_crossings(emap, x, y, rate)).assign(along="x")
  return pd.concat([along_y, along_x], ignore_index=True)[[x, y, "along", "bound"]]


def factors_present(points: pd.DataFrame) -> list[str]:
  """The Experiment 3 factor columns (``FACTORS``) that the runs varied."""
  return [f for f in FACTORS if f in points and points[f].nunique(dropna=False) > 1]


def factorial_table(points: pd.DataFrame, factors: list[str] | None = None) -> pd.DataFrame:
  """Emergence rate and median emergence step per condition (a combination of the factor
  values); ``local_dependency`` is 'none' for i.i.d. data (``data.transitions = 'iid'`` or an
  entropy-rate target of 0) and 'yes' otherwise.

  Raises:
    ValueError: no factor column varies.
  """
  factors = factors or factors_present(points)
  if not factors:
    raise ValueError(f"none of {', '.join(FACTORS)} varies across these cells")
  pts = points.copy()
  ld = pd.Series("yes", index=pts.index)
  if "data.transitions" in pts:
    ld[pts["data.transitions"] == "iid"] = "none"
  if "data.synthetic.entropy_rate_bits" in pts:
    ld[pd.to_numeric(pts["data.synthetic.entropy_rate_bits"], errors="coerce") == 0] = "none"
  pts["local_dependency"] = ld
  by = ["local_dependency"] + [f for f in factors if f not in ("data.transitions",)]
  by = list(dict.fromkeys(by))
  table = _rates(pts, by)
  return table.rename(columns={f: FACTORS.get(f, f) for f in by})
