"""Emergence points: the step at which a metric curve jumps from its early to its late plateau.

The study defines no threshold (docs/study.md, "Where ihsweep differs"); ihsweep reports
three estimators, all in log-steps (checkpoints are log-spaced and the transition is abrupt on a
log axis), and how well they agree:

* ``threshold`` (default): the first crossing of the level ``early + fraction · (late − early)``
  (``fraction`` = 0.5: the midpoint between the plateaus), linearly interpolated in log-step
  between the two checkpoints that bracket it;
* ``max_slope``: the geometric midpoint of the pair of consecutive checkpoints with the largest
  rise per unit log-step, within the rise from the early to the late plateau;
* ``breakpoint``: a continuous flat–ramp–flat piecewise-linear fit in log-step (breakpoint
  regression, as the study's dependencies suggest), reported as the centre of the ramp in
  log-step; the ramp's start ``onset_step`` is given too. Breakpoints are found by exhaustive
  search over a grid, then refined with ``scipy.optimize.least_squares``.

The plateaus are the medians of the first and last ``plateau_points`` checkpoints. A curve whose
jump ``direction · (late − early)`` is smaller than the metric's ``min_jump`` (ps_max 0.2,
la_max 0.1, dla_max 1 nat, ar_acc 0.2, icl_score 1.5 nats, …; each metric's direction, minimum
jump and transform are defined in ``ihsweep.compute.metric_registry``), or that never crosses the
level, has **not emerged**: it is right-censored at its last checkpoint
(``censored = True``, ``emergence_step`` NaN, ``censor_step`` = last step), never dropped.
Curves that fall (validation loss, ICL score, mean rank) are handled by ``direction = −1``;
``ar_rank`` is analysed as log10(1 + rank).

An emerged point close to the end of its curve is flagged, not dropped (``caution``): its jump
lies in the **last interval** (the upper checkpoint bracketing it is the curve's last, or the last
before a short final stub such as a cap just past a scheduled checkpoint), or its late plateau
rests on fewer than ``MIN_LATE_POINTS`` checkpoints (``late_points``: the checkpoints from the
bracket's upper end on). A slightly earlier end of training would have censored such a point.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ihsweep.compute import metric_registry

METHODS = ("threshold", "max_slope", "breakpoint")
# An emerged point whose late side has fewer checkpoints than this is flagged (``caution``): the
# late plateau is the median of the last 3, so with fewer the jump is seen at the curve's end only.
MIN_LATE_POINTS = 3


# How each metric's curve is read (direction, min_jump, transform) and which metrics the table
# has by default: ihsweep.compute.metric_registry, the one home of every metric.
MetricSpec = metric_registry.Metric


def __getattr__(name: str):
  # Read from the registry at access time, so a metric registered later is included.
  if name == "SPECS":
    return dict(metric_registry.REGISTRY)
  if name == "DEFAULT_METRICS":
    return metric_registry.emergence_names()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass
class Emergence:
  """One curve's emergence point. Steps are in updates; ``emergence_step`` is NaN when the curve
  has not emerged (``censored``), and then ``censor_step`` is its last checkpoint.
  ``step_before``/``step_after``: the checkpoints that bracket the estimate. ``early``/``late``:
  the plateaus, ``jump`` = direction · (late − early) (after the metric's transform).
  ``last_step``: the curve's last checkpoint (updates). ``late_points``: checkpoints from
  ``step_after`` to ``last_step`` (the late side of the jump; 0 when censored).
  ``last_interval``: the point lies in the curve's last checkpoint interval (module docstring;
  False when censored)."""

  emergence_step: float
  censored: bool
  censor_step: float
  step_before: float
  step_after: float
  early: float
  late: float
  jump: float
  onset_step: float = math.nan
  last_step: float = math.nan
  late_points: int = 0
  last_interval: bool = False


def _plateaus(v: np.ndarray, points: int) -> tuple[float, float]:
  k = max(1, min(points, len(v) // 3 or 1))
  return float(np.median(v[:k])), float(np.median(v[-k:]))


def _censored(steps, early, late, jump) -> Emergence:
  last = float(steps[-1])
  return Emergence(math.nan, True, last, math.nan, math.nan, early, late, jump, last_step=last)


def _last_upper(steps: np.ndarray) -> float:
  """The upper end of a curve's last checkpoint interval: its last checkpoint, or the one before
  it when the final interval is a stub — shorter in log-updates than half the interval before
  (a cap or end of training just past a scheduled checkpoint: 4,096, 4,871, cap 5,044)."""
  if len(steps) >= 3:
    x = _log(steps[-3:])
    if x[2] - x[1] < 0.5 * (x[1] - x[0]):
      return float(steps[-2])
  return float(steps[-1])


def _emerged(steps: np.ndarray, step, before, after, signed, jump, onset=math.nan) -> Emergence:
  """An emerged point with its position among the checkpoints (``late_points``,
  ``last_interval``)."""
  return Emergence(
    float(step),
    False,
    math.nan,
    float(before),
    float(after),
    *signed,
    jump,
    onset,
    last_step=float(steps[-1]),
    late_points=int((steps >= after).sum()),
    last_interval=bool(after >= _last_upper(steps)),
  )


def caution(late_points, last_interval) -> str:
  """Why an emerged point is uncertain, in a few words ('' if it is not): 'last interval' and/or
  'plateau on N checkpoints' (fewer than ``MIN_LATE_POINTS``). Arguments as in ``Emergence``;
  NaN or None (a censored point, an old table without the columns) reads as no caution."""
  reasons = []
  if last_interval is not None and not pd.isna(last_interval) and bool(last_interval):
    reasons.append("last interval")
  if late_points is not None and not pd.isna(late_points) and 0 < late_points < MIN_LATE_POINTS:
    n = int(late_points)
    reasons.append(f"plateau on {n} checkpoint{'' if n == 1 else 's'}")
  return ", ".join(reasons)


def cautions(points: pd.DataFrame) -> pd.Series:
  """``caution`` of each row of ``points`` (``primary`` rows: ``censored``, ``late_points``,
  ``last_interval``), '' for censored rows and where the columns are missing (a table written
  before they existed). Returns strings indexed like ``points``."""
  if points.empty or not {"late_points", "last_interval"} & set(points):
    return pd.Series("", index=points.index, dtype=object)
  late = points["late_points"] if "late_points" in points else pd.Series(None, points.index)
  last = points["last_interval"] if "last_interval" in points else pd.Series(None, points.index)
  cens = points["censored"].astype(bool) if "censored" in points else pd.Series(False, points.index)
  out = [
    "" if c else caution(n, li)
    for c, n, li in zip(cens.to_numpy(), late.to_numpy(), last.to_numpy())
  ]
  return pd.Series(out, index=points.index, dtype=object)


def flagged(points: pd.DataFrame) -> pd.DataFrame:
  """The emerged rows of ``points`` with a caution: its ``caution`` column, or ``cautions``
  computed where the table has none."""
  why = points["caution"].fillna("").astype(str) if "caution" in points else cautions(points)
  return points[(why != "") & ~points["censored"].astype(bool)]


def _log(steps: np.ndarray) -> np.ndarray:
  # Step 0 sits half a step before step 1 on the log axis (log 0 is undefined).
  return np.log(np.maximum(steps, 0.5))


def threshold_crossing(steps: np.ndarray, v: np.ndarray, level: float) -> tuple[float, int] | None:
  """First crossing of ``level`` by an increasing-direction curve ``v`` at ``steps`` (sorted):
  ``(step, i)`` with the step interpolated linearly in log-step between checkpoints ``i − 1`` and
  ``i``; ``(steps[0], 0)`` if the first point is already at the level; None if never reached."""
  above = np.nonzero(v >= level)[0]
  if not len(above):
    return None
  i = int(above[0])
  if i == 0:
    return float(steps[0]), 0
  x = _log(steps)
  t = (level - v[i - 1]) / (v[i] - v[i - 1])
  return float(np.exp(x[i - 1] + t * (x[i] - x[i - 1]))), i


def max_slope(
  steps: np.ndarray, v: np.ndarray, early: float | None = None, late: float | None = None
) -> tuple[float, int]:
  """``(step, i)``: the geometric midpoint of the checkpoints ``i − 1, i`` with the largest rise
  of an increasing-direction curve per unit log-step. With the plateaus given, only segments
  within the rise are considered — from the last checkpoint at or below 10% of the jump before
  the curve first reaches 90% of it, to that checkpoint — so noise on a plateau, magnified by a
  short last interval (e.g. 1,448 → 1,500), is not mistaken for the transition."""
  x = _log(steps)
  slopes = np.diff(v) / np.diff(x)
  lo, hi = 1, len(steps) - 1
  if early is not None and late is not None and late > early:
    top = np.nonzero(v >= early + 0.9 * (late - early))[0]
    if len(top) and top[0] > 0:
      hi = int(top[0])
      below = np.nonzero(v[:hi] <= early + 0.1 * (late - early))[0]
      lo = int(below[-1]) + 1 if len(below) else 1
  i = lo + int(np.argmax(slopes[lo - 1 : hi]))
  return float(np.exp((x[i - 1] + x[i]) / 2)), i


def _ramp(x: np.ndarray, b1: float, b2: float) -> np.ndarray:
  return np.clip((x - b1) / max(b2 - b1, 1e-9), 0.0, 1.0)


def breakpoint_fit(
  steps: np.ndarray, v: np.ndarray, grid: int = 96
) -> tuple[float, float, float, float]:
  """Least-squares fit of ``v ≈ a + h · clip((log s − b1) / (b2 − b1), 0, 1)`` (flat, ramp, flat;
  continuous): exhaustive search of (b1, b2) over ``grid`` points spanning the log-steps (a and h
  in closed form for each pair), then ``scipy.optimize.least_squares`` on all four parameters.

  Returns:
    ``(centre_step, onset_step, end_step, h)``: exp of (b1 + b2)/2, b1, b2, and the fitted rise.
  """
  from scipy.optimize import least_squares

  x = _log(steps)
  cand = np.linspace(x[0], x[-1], grid)
  b1, b2 = np.meshgrid(cand, cand, indexing="ij")
  ok = b2 > b1
  b1, b2 = b1[ok], b2[ok]
  r = np.clip((x[None, :] - b1[:, None]) / (b2 - b1)[:, None], 0.0, 1.0)  # [P, n]
  rm, vm = r.mean(axis=1), v.mean()
  var_r = ((r - rm[:, None]) ** 2).sum(axis=1)
  h = np.where(
    var_r > 0, ((r - rm[:, None]) * (v - vm)[None]).sum(axis=1) / np.maximum(var_r, 1e-30), 0.0
  )
  a = vm - h * rm
  sse = ((a[:, None] + h[:, None] * r - v[None]) ** 2).sum(axis=1)
  best = int(np.argmin(sse))
  p0 = np.array([a[best], h[best], b1[best], b2[best]])

  def resid(p):
    return p[0] + p[1] * _ramp(x, p[2], p[3]) - v

  fit = least_squares(
    resid, p0, bounds=([-np.inf, -np.inf, x[0], x[0]], [np.inf, np.inf, x[-1], x[-1]])
  )
  p = fit.x if fit.success and fit.cost <= 0.5 * sse[best] + 1e-12 else p0
  lo, hi = sorted((p[2], p[3]))
  return float(np.exp((lo + hi) / 2)), float(np.exp(lo)), float(np.exp(hi)), float(p[1])


def emergence_point(
  steps,
  values,
  *,
  method: str = "threshold",
  metric: str = "ps_max",
  fraction: float = 0.5,
  level: float | None = None,
  min_jump: float | None = None,
  plateau_points: int = 3,
) -> Emergence:
  """The emergence point of one curve (module docstring).

  Args:
    steps: updates of the checkpoints ``[n]`` (any order; NaN values are dropped).
    values: the metric at those steps ``[n]``.
    method: 'threshold', 'max_slope' or 'breakpoint'.
    metric: a registered metric (``ihsweep.compute.metric_registry``: direction, default
      ``min_jump``, transform).
    fraction: threshold level between the plateaus (0.5 = midpoint).
    level: an absolute threshold (in the metric's units) instead of ``fraction``.
    min_jump: overrides the metric's minimal jump.

  Raises:
    ValueError: unknown method or metric.
  """
  if method not in METHODS:
    raise ValueError(f"method = {method!r}: allowed {', '.join(METHODS)}")
  spec = metric_registry.get(metric)
  steps, values = np.asarray(steps, float), np.asarray(values, float)
  order = np.argsort(steps, kind="stable")
  steps, values = steps[order], spec.apply(values[order])
  keep = np.isfinite(values)
  steps, values = steps[keep], values[keep]
  if len(steps) < 3:
    last = float(steps[-1]) if len(steps) else math.nan
    return Emergence(
      math.nan, True, last, math.nan, math.nan, math.nan, math.nan, math.nan, last_step=last
    )
  v = spec.direction * values  # rises at emergence
  early, late = _plateaus(v, plateau_points)
  jump = late - early
  threshold = (
    early + fraction * jump
    if level is None
    else spec.direction * float(spec.apply(np.asarray([level]))[0])
  )
  signed = (spec.direction * early, spec.direction * late)
  need = spec.min_jump if min_jump is None else min_jump
  crossing = threshold_crossing(steps, v, threshold)
  if jump < need or crossing is None:
    return _censored(steps, *signed, jump)
  if method == "threshold":
    step, i = crossing
  elif method == "max_slope":
    step, i = max_slope(steps, v, early, late)
  else:
    step, onset, _, _ = breakpoint_fit(steps, v)
    i = int(np.searchsorted(steps, step))
    before = steps[i - 1] if i > 0 else steps[0]
    after = steps[min(i, len(steps) - 1)]
    return _emerged(steps, step, before, after, signed, jump, onset)
  return _emerged(steps, step, steps[max(i - 1, 0)], steps[i], signed, jump)


def cell_columns(curves: pd.DataFrame) -> list[str]:
  """The columns of ``analysis.curves`` rows that are a cell's coordinates (run, cell, seed, B,
  C, grid axes, …): all but the step, its tokens, the curve's source, the metrics and the best
  heads' layer and head."""
  return [
    c
    for c in curves.columns
    if c not in ("step", "tokens", "source")
    and c not in metric_registry.REGISTRY
    and not c.endswith(("_layer", "_head"))
  ]


def emergence_table(
  curves: pd.DataFrame,
  *,
  metrics=None,
  methods=METHODS,
  fraction: float = 0.5,
  levels: dict | None = None,
  min_jumps: dict | None = None,
) -> pd.DataFrame:
  """Emergence points of every cell, metric and method (a long table).

  Args:
    curves: ``analysis.curves`` rows (``run``, ``cell``, ``step``, metric columns, cell
      coordinates).
    metrics: registered metric names (None: ``metric_registry.emergence_names()``, those with
      ``emergence=True``); those without a column in ``curves`` are left out.
    levels / min_jumps: per-metric absolute thresholds / minimal jumps overriding the defaults.

  Returns:
    One row per (run, cell, metric, method): the cell's coordinates (every curves column that is
    constant per cell), ``metric``, ``method``, ``emergence_step``, ``emergence_tokens``
    (``emergence_step · B · C``), ``censored``, ``censor_step``, ``step_before``,
    ``step_after``, ``onset_step`` (breakpoint only), ``early``, ``late``, ``jump``,
    ``last_step``, ``late_points``, ``last_interval`` (``Emergence``), ``n_points``.
  """
  levels, min_jumps = levels or {}, min_jumps or {}
  metrics = [
    m for m in (metric_registry.emergence_names() if metrics is None else metrics) if m in curves
  ]
  if curves.empty or not metrics:
    return pd.DataFrame()
  per_cell = cell_columns(curves)
  rows = []
  for key, cell in curves.groupby(["run", "cell"], sort=True):
    coords = cell.iloc[0][per_cell].to_dict()
    for metric in metrics:
      for method in methods:
        e = emergence_point(
          cell["step"].to_numpy(),
          cell[metric].to_numpy(),
          method=method,
          metric=metric,
          fraction=fraction,
          level=levels.get(metric),
          min_jump=min_jumps.get(metric),
        )
        row = dict(
          coords,
          metric=metric,
          method=method,
          **dataclasses.asdict(e),
          n_points=int(cell[metric].notna().sum()),
        )
        row["emergence_tokens"] = (
          e.emergence_step
          * coords.get("batch_size", math.nan)
          * coords.get("context_size", math.nan)
        )
        rows.append(row)
  return pd.DataFrame(rows)


def primary(table: pd.DataFrame, metric: str = "ps_max", method: str = "threshold") -> pd.DataFrame:
  """One row per cell: the emergence point by one metric and method (the law's input)."""
  sel = table[(table["metric"] == metric) & (table["method"] == method)]
  if sel.empty:
    raise ValueError(
      f"no emergence points for metric {metric!r} and method {method!r}; "
      f"available: {sorted(set(zip(table['metric'], table['method'])))}"
    )
  return sel.reset_index(drop=True)


def agreement(
  table: pd.DataFrame, reference: tuple[str, str] = ("ps_max", "threshold")
) -> pd.DataFrame:
  """How every (metric, method) agrees with a reference (metric, method) over the same cells.

  Returns one row per (metric, method): ``n`` cells, ``emerged`` (how many emerged),
  ``same_status`` (share of cells where both emerged or both are censored), ``both`` (cells where
  both emerged), ``median_log10_ratio`` (median of log10(step / reference step) over those: 0 =
  same step, 0.3 = twice as late) and ``pearson_r`` of their log-steps (NaN for < 3 cells)."""
  if table.empty:
    return pd.DataFrame()
  key = ["run", "cell"]
  ref = primary(table, *reference).set_index(key)
  rows = []
  for (metric, method), sel in table.groupby(["metric", "method"], sort=False):
    sel = sel.set_index(key)
    common = sel.index.intersection(ref.index)
    a, b = sel.loc[common], ref.loc[common]
    both = (~a["censored"]) & (~b["censored"])
    la = np.log10(a.loc[both, "emergence_step"].astype(float).clip(lower=0.5))
    lb = np.log10(b.loc[both, "emergence_step"].astype(float).clip(lower=0.5))
    r = (
      float(np.corrcoef(la, lb)[0, 1])
      if both.sum() >= 3 and la.std() > 0 and lb.std() > 0
      else math.nan
    )
    rows.append(
      {
        "metric": metric,
        "method": method,
        "n": len(common),
        "emerged": int((~a["censored"]).sum()),
        "same_status": float((a["censored"] == b["censored"]).mean()) if len(common) else math.nan,
        "both": int(both.sum()),
        "median_log10_ratio": float(np.median(la - lb)) if both.any() else math.nan,
        "pearson_r": r,
      }
    )
  return pd.DataFrame(rows)
