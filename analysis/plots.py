"""Figures (matplotlib, Agg backend), each written as PNG (for the report) and PDF (for papers).

* ``plot_curves``: one panel per grid point, a metric against updates on a log axis from the
  last checkpoint before any curve departs from its start (``curve_start``; never before the
  first non-zero checkpoint: update 0 cannot be shown on it) to the last, the same x range in
  every panel, seeds as lines, emergence points marked (dots; censored curves end in an x);
* ``plot_law``: observed vs predicted UPT on log-log axes for the fitted and the study's laws,
  and UPT against B, one panel per C (a shared y axis), with the fitted law's line and its 95%
  band (``law_band``), B ticks at the grid's values;
* ``plot_emergence_heatmap``: the B × C grid coloured by the median emergence update over seeds
  (``seed_median``), censored grid points hatched and labelled '> s';
* ``plot_emergence_map``: the frequency × reliability heat map of emergence rates with the
  frontier;
* ``plot_factorial``: emergence rate per condition of the factorial, median step annotated.

Each ``plot_*`` saves the figure that the matching ``figure_*`` function builds; tests inspect
the ``figure_*`` objects (axis scales, limits, tick labels, patches).
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd

from ihsweep.compute import metric_registry

from .figure_axes import log_updates_axis, pyplot, save, tick_number


def __getattr__(name: str):
  # LABELS: metric → axis label, from ihsweep.compute.metric_registry at access time.
  if name == "LABELS":
    return {n: metric_registry.label(n) for n in metric_registry.names()}
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def panel_keys(curves: pd.DataFrame, axes: list[str]) -> list[str]:
  """Columns that identify a grid point (everything per cell except the seed)."""
  keys = ["run"] + [a for a in axes if a in curves] + ["batch_size", "context_size"]
  return list(dict.fromkeys(k for k in keys if k in curves))


def _panel_title(key, names) -> str:
  key = key if isinstance(key, tuple) else (key,)
  short = {"batch_size": "B", "context_size": "C"}
  parts = [
    f"{short.get(n, n.split('.')[-1])}={v:g}"
    if isinstance(v, (int, float, np.number))
    else f"{short.get(n, n.split('.')[-1])}={v}"
    for n, v in zip(names, key)
    if n != "run"
  ]
  # Wrapped: with many grid axes (Experiment 3 has five) one line overflows into the next panel.
  return textwrap.fill(", ".join(parts), width=48)


# A curve has started to change once it departs from its first value by more than this share of
# the metric's range over all the curves drawn (so a flat, noisy curve does not count).
CHANGE_FRACTION = 0.05


def curve_start(curves: pd.DataFrame, metric: str, fraction: float = CHANGE_FRACTION) -> float:
  """Where a curve figure's log x axis starts (updates): the last checkpoint before the first
  one at which any curve (one per ``run``, ``cell``) departs from its first value (update 0's,
  where logged) by more than ``fraction`` of the metric's range over all of ``curves``, so the
  flat stretch before anything changes is not drawn; never before the first checkpoint after 0.
  With no curve changing, that first checkpoint after 0.

  Raises:
    ValueError: no checkpoint after update 0.
  """
  have = curves[curves[metric].notna()] if metric in curves else curves.iloc[:0]
  positive = have.loc[have["step"] > 0, "step"]
  if positive.empty:
    raise ValueError(
      f"curves of {metric}: no checkpoint after update 0, nothing to draw on a log axis of updates"
    )
  first = float(positive.min())
  values = have[metric].to_numpy(float)
  span = float(values.max() - values.min())
  if not span > 0:
    return first
  starts = []
  for _, line in have.groupby(["run", "cell"] if "run" in have else ["cell"], sort=False):
    line = line.sort_values("step")
    v, steps = line[metric].to_numpy(float), line["step"].to_numpy(float)
    moved = np.flatnonzero(np.abs(v - v[0]) > fraction * span)
    if len(moved):
      starts.append(steps[max(int(moved[0]) - 1, 0)])
  return max(first, min(starts)) if starts else first


def figure_curves(
  curves: pd.DataFrame,
  emergence: pd.DataFrame | None,
  *,
  metric: str = "ps_max",
  method: str = "threshold",
  axes: list[str] = (),
  max_panels: int = 36,
  mark: str | None = None,
  label: str | None = None,
):
  """The figure of ``plot_curves`` (a matplotlib Figure; its visible axes are the panels).

  ``mark``: the metric whose emergence points are marked on the curves (default ``metric``:
  e.g. ``ps_max``'s points on the training loss); ``label``: the y label (default the
  registry's label of ``metric``).

  Every panel has a log x axis from ``curve_start`` (the last checkpoint before any curve shown
  changes, at least the first non-zero checkpoint) to the last checkpoint of all panels shown
  (one range for all), so panels compare by eye and the flat start takes no room; update 0 is
  left out (a log axis has no 0).

  Raises:
    ValueError: ``curves`` has no row with step > 0 (nothing to draw on a log axis).
  """
  plt = pyplot()
  keys = panel_keys(curves, list(axes))
  panels = list(curves.groupby(keys, sort=True, dropna=False))
  if len(curves["run"].unique()) == 1:
    keys_shown = [k for k in keys if k != "run"]
  else:
    keys_shown = keys
  shown = panels[:max_panels]
  n = len(shown)
  drawn = pd.concat([p for _, p in shown]) if n else curves.iloc[:0]
  lo = curve_start(drawn, metric)
  hi = float(drawn["step"].max())
  hi = hi if hi > lo else lo * 2
  cols = min(5, math.ceil(math.sqrt(n))) or 1
  rows = math.ceil(n / cols) or 1
  fig, axs = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
  points = None
  mark = mark or metric
  label = label or metric_registry.label(metric)
  if emergence is not None and not emergence.empty:
    points = emergence[(emergence["metric"] == mark) & (emergence["method"] == method)]
    points = points.set_index(["run", "cell"])
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (key, panel) in zip(axs.flat, shown):
    _draw_seeds(ax, panel, points, metric, colors)
    log_updates_axis(ax, lo, hi)
    ax.set_title(_panel_title(key, keys) if keys_shown else "", fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
  for ax in list(axs.flat)[n:]:
    ax.set_visible(False)
  for ax in axs[-1]:
    ax.set_xlabel("updates (log)", fontsize=8)
  for ax in axs[:, 0]:
    ax.set_ylabel(label, fontsize=8)
  handles, labels = axs.flat[0].get_legend_handles_labels()
  if handles:
    axs.flat[0].legend(handles[:8], labels[:8], fontsize=6, loc="best")
  note = f" (first {max_panels} of {len(panels)} grid points)" if len(panels) > max_panels else ""
  marked = "emergence" if mark == metric else f"emergence of {mark}"
  fig.suptitle(
    f"{label} per grid point; o = {marked} ({method}), x = censored{note}",
    fontsize=9,
  )
  fig.tight_layout()
  return fig


def _draw_seeds(ax, panel: pd.DataFrame, points, metric: str, colors) -> None:
  """One panel's seeds as lines (from the first non-zero update), each marked at its emergence
  point (o) or, censored, at its last point (x); ``points``: emergence rows by (run, cell)."""
  for j, (cell, line) in enumerate(panel.groupby("cell", sort=True)):
    line = line[line["step"] > 0].sort_values("step")  # left of the axis' start: clipped
    color = colors[j % len(colors)]
    seed = line["seed"].iloc[0] if "seed" in line and len(line) else cell
    ax.plot(line["step"], line[metric], color=color, lw=1.2, label=f"seed {seed}")
    if points is None or not len(line) or (line["run"].iloc[0], cell) not in points.index:
      continue
    e = points.loc[(line["run"].iloc[0], cell)]
    if not bool(e["censored"]):
      y = np.interp(
        np.log(e["emergence_step"]),
        np.log(line["step"].to_numpy(float)),
        line[metric].to_numpy(float),
      )
      ax.plot(
        [e["emergence_step"]], [y], "o", color=color, ms=6, mec="black", mew=0.6, clip_on=False
      )
    else:
      last = line.dropna(subset=[metric]).iloc[-1] if line[metric].notna().any() else None
      if last is not None:
        ax.plot([last["step"]], [last[metric]], "x", color=color, ms=7, mew=1.5, clip_on=False)


def plot_curves(
  curves: pd.DataFrame,
  emergence: pd.DataFrame | None,
  out_base: str,
  *,
  metric: str = "ps_max",
  method: str = "threshold",
  axes: list[str] = (),
  max_panels: int = 36,
  mark: str | None = None,
  label: str | None = None,
) -> list[str]:
  """Metric curves per grid point (``figure_curves``). Returns the PNG and PDF paths.

  Args:
    curves: ``analysis.curves`` rows; emergence: ``analysis.emergence.emergence_table`` rows
      (points of ``metric``/``method`` are marked) or None.
    axes: the grid's axis columns (panels are grid points).
  """
  return save(
    figure_curves(
      curves,
      emergence,
      metric=metric,
      method=method,
      axes=axes,
      max_panels=max_panels,
      mark=mark,
      label=label,
    ),
    out_base,
  )


# ---------------------------------------------------------------- B × C heat map


def seed_median(steps, censored, censor_steps) -> tuple[float, bool]:
  """The median emergence update over the seeds of one grid point, a censored seed counting as
  later than its last checkpoint.

  Args:
    steps: emergence updates per seed (NaN where censored); censored: bools; censor_steps: the
      last checkpoint per seed (read where censored).

  Returns:
    ``(value, is_bound)``: the median, or — when the median falls on a censored seed — a lower
    bound on it (the mean of the middle values, a censored one counting at its last
    checkpoint; with 2 seeds, one emerged at a and one censored at c: the median exceeds
    (a + c) / 2) and True. (NaN, False) for no seeds.
  """
  censored = np.asarray(censored, bool)
  if not len(censored):
    return math.nan, False
  at = np.where(censored, np.inf, np.asarray(steps, float))
  order = np.argsort(at, kind="stable")
  n = len(at)
  mid = order[(n - 1) // 2 : n // 2 + 1]  # one (odd n) or two (even n) middle seeds
  if censored[mid].any():
    bound = np.where(censored[mid], np.asarray(censor_steps, float)[mid], at[mid])
    return float(bound.mean()), True
  return float(np.median(at[mid])), False


def emergence_grid(points: pd.DataFrame, by: list[str] = ()) -> pd.DataFrame:
  """Per (``by`` …, batch_size, context_size): ``n`` seeds, ``emerged``, ``median_updates`` and
  ``censored`` from ``seed_median`` (a censored median is a lower bound), ``censor_step`` (the
  latest last checkpoint of its seeds). ``points``: one row per cell
  (``analysis.emergence.primary``)."""
  keys = [*by, "batch_size", "context_size"]
  rows = []
  for key, g in points.groupby(keys, sort=True, dropna=False):
    value, bound = seed_median(
      g["emergence_step"],
      g["censored"].astype(bool),
      g["censor_step"] if "censor_step" in g else g["emergence_step"],
    )
    row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
    row.update(
      n=len(g),
      emerged=int((~g["censored"].astype(bool)).sum()),
      median_updates=value,
      censored=bound,
      censor_step=float(g["censor_step"].max()) if "censor_step" in g else math.nan,
    )
    rows.append(row)
  return pd.DataFrame(
    rows, columns=[*keys, "n", "emerged", "median_updates", "censored", "censor_step"]
  )


def figure_emergence_heatmap(points: pd.DataFrame, by: list[str] = (), max_panels: int = 12):
  """The figure of ``plot_emergence_heatmap``: one panel per value of ``by`` (e.g. the run or a
  model-size axis), rows B and columns C at the grid's values, colour = log10 of the median
  emergence update over seeds (one colour scale for all panels). A grid point whose median is
  censored is hatched ('//') and labelled '> s' (s the lower bound); points where only some
  seeds emerged say how many ('1/2 seeds').

  Raises:
    ValueError: ``points`` lacks batch_size, context_size, emergence_step or censored.
  """
  need = {"batch_size", "context_size", "emergence_step", "censored"}
  if not need <= set(points):
    raise ValueError(
      f"emergence points need columns {sorted(need)}; missing {sorted(need - set(points))}"
    )
  from matplotlib.colors import LogNorm

  plt = pyplot()
  by = [k for k in by if k in points and points[k].nunique(dropna=False) > 1]
  grid = emergence_grid(points, by)
  panels = list(grid.groupby(by, sort=True, dropna=False)) if by else [((), grid)]
  shown = panels[:max_panels]
  bs = np.sort(grid["batch_size"].unique())
  cs = np.sort(grid["context_size"].unique())

  values = _positive(grid["median_updates"])
  finite = values[np.isfinite(values)]
  lo, hi = (finite.min(), finite.max()) if len(finite) else (1.0, 10.0)
  norm = LogNorm(lo, hi if hi > lo else lo * 1.01)
  cols = min(3, len(shown))
  rows = math.ceil(len(shown) / cols)
  w, h = 0.9 * len(cs) + 1.8, 0.6 * len(bs) + 1.4
  fig, axs = plt.subplots(
    rows, cols, figsize=(w * cols + 1, h * rows), squeeze=False, layout="constrained"
  )
  cmap = plt.get_cmap("viridis")
  im = None
  for ax, (key, panel) in zip(axs.flat, shown):
    med = panel.pivot(index="batch_size", columns="context_size", values="median_updates").reindex(
      index=bs, columns=cs
    )
    im = ax.imshow(
      _positive(med.to_numpy(float)), origin="lower", cmap=cmap, norm=norm, aspect="auto"
    )
    _label_cells(ax, panel, bs, cs, norm)
    ax.set_xticks(range(len(cs)), [tick_number(v) for v in cs])
    ax.set_yticks(range(len(bs)), [tick_number(v) for v in bs])
    ax.set_xlabel("context size C (tokens per sequence)", fontsize=8)
    ax.set_ylabel("batch size B (sequences per update)", fontsize=8)
    key = key if isinstance(key, tuple) else (key,)
    title = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(by, key))
    ax.set_title(textwrap.fill(title, 40), fontsize=8)
  for ax in list(axs.flat)[len(shown) :]:
    ax.set_visible(False)
  if im is not None:
    _median_colorbar(fig, im, axs, lo, hi)
  note = f" (first {max_panels} of {len(panels)} panels)" if len(panels) > max_panels else ""
  fig.suptitle(
    f"Median emergence update over seeds; hatched '> s': median censored, later than s{note}",
    fontsize=9,
  )
  return fig


def _positive(v):
  """``v`` with values <= 0 as NaN: on the log colour scale a bound of 0 (censored at update 0)
  gets no colour."""
  v = np.asarray(v, float)
  return np.where(v > 0, v, np.nan)


def _label_cells(ax, panel: pd.DataFrame, bs, cs, norm) -> None:
  """Each grid point's median ('> s' and hatched where censored; 'k/n seeds' where only some
  emerged), in black on light colours."""
  from matplotlib.patches import Rectangle

  for _, row in panel.iterrows():
    i = int(np.searchsorted(bs, row["batch_size"]))
    j = int(np.searchsorted(cs, row["context_size"]))
    v = row["median_updates"]
    if not np.isfinite(v):
      continue
    text = f"{v:,.0f}"
    if bool(row["censored"]):
      text = f"> {v:,.0f}"
      ax.add_patch(
        Rectangle(
          (j - 0.5, i - 0.5),
          1,
          1,
          fill=False,
          hatch="//",
          edgecolor="white",
          lw=0.8,
          label="censored",
        )
      )
    if 0 < row["emerged"] < row["n"]:
      text += f"\n{int(row['emerged'])}/{int(row['n'])} seeds"
    light = v <= 0 or norm(v) > 0.6  # no colour (a bound of 0): black text
    ax.text(j, i, text, ha="center", va="center", fontsize=7, color="black" if light else "white")


def _median_colorbar(fig, im, axs, lo: float, hi: float) -> None:
  """The heat map's colour bar: median updates, log scale, minor labels at 2, 3, 5 within a
  decade."""
  from matplotlib import ticker

  bar = fig.colorbar(im, ax=axs.ravel().tolist(), shrink=0.9)
  bar.set_label("median updates to emergence (log scale)", fontsize=8)
  bar.ax.yaxis.set_major_formatter(ticker.FuncFormatter(tick_number))
  bar.ax.yaxis.set_minor_formatter(
    ticker.FuncFormatter(
      lambda v, _p: (
        tick_number(v)
        if hi / lo < 10 and round(v / 10 ** math.floor(math.log10(v))) in (2, 3, 5)
        else ""
      )
    )
  )


def plot_emergence_heatmap(points: pd.DataFrame, out_base: str, by: list[str] = ()) -> list[str]:
  """The B × C heat map of median emergence updates (``figure_emergence_heatmap``). Returns the
  PNG and PDF paths."""
  return save(figure_emergence_heatmap(points, by), out_base)


def plot_emergence_map(
  emap: pd.DataFrame,
  frontier: pd.DataFrame | None,
  out_base: str,
  *,
  x: str = "data.frequency",
  y: str = "data.reliability",
) -> list[str]:
  """Heat map of the emergence rate over the x × y grid, each cell annotated with the rate and
  median emergence step; the frontier (``analysis.frontier.pareto_frontier``) drawn on top."""
  plt = pyplot()
  xs, ys = np.sort(emap[x].unique()), np.sort(emap[y].unique())
  rate = emap.pivot(index=y, columns=x, values="rate").reindex(index=ys, columns=xs)
  med = emap.pivot(index=y, columns=x, values="median_step").reindex(index=ys, columns=xs)
  fig, ax = plt.subplots(figsize=(1.1 * len(xs) + 2.5, 0.9 * len(ys) + 1.8))
  im = ax.imshow(rate.to_numpy(float), origin="lower", cmap="magma", vmin=0, vmax=1, aspect="auto")
  for i in range(len(ys)):
    for j in range(len(xs)):
      r, s = rate.iat[i, j], med.iat[i, j]
      text = "" if np.isnan(r) else f"{r:.2f}" + ("" if np.isnan(s) else f"\n{s:,.0f}")
      ax.text(
        j,
        i,
        text,
        ha="center",
        va="center",
        fontsize=7,
        color="white" if (np.isnan(r) or r < 0.6) else "black",
      )
  if frontier is not None and not frontier.empty:
    f = frontier[(frontier["along"] == "y") & frontier[y].notna()].sort_values(x)
    if len(f):
      ax.plot(
        np.interp(f[x], xs, np.arange(len(xs))),
        np.interp(f[y], ys, np.arange(len(ys))),
        "c-o",
        lw=2,
        ms=4,
        label="frontier (rate 0.5)",
      )
      ax.legend(fontsize=7, loc="upper left")
  ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
  ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
  ax.set_xlabel(f"{x.split('.')[-1]}")
  ax.set_ylabel(f"{y.split('.')[-1]}")
  fig.colorbar(im, ax=ax, label="emergence rate (share of seeds)")
  ax.set_title("Emergence rate (median emergence step below)", fontsize=9)
  fig.tight_layout()
  return save(fig, out_base)


def plot_factorial(table: pd.DataFrame, out_base: str) -> list[str]:
  """Bar chart of the emergence rate per condition (``analysis.frontier.factorial_table``),
  the median emergence step written above each bar."""
  plt = pyplot()
  conds = [c for c in table.columns if c not in ("n", "emerged", "rate", "median_step")]
  labels = [" / ".join(str(row[c]) for c in conds) for _, row in table.iterrows()]
  fig, ax = plt.subplots(figsize=(max(4, 0.7 * len(table) + 1.5), 3.6))
  bars = ax.bar(range(len(table)), table["rate"], color="tab:blue")
  for bar, (_, row) in zip(bars, table.iterrows()):
    text = f"n={int(row['n'])}" + (
      "" if pd.isna(row["median_step"]) else f"\n{row['median_step']:,.0f}"
    )
    ax.text(
      bar.get_x() + bar.get_width() / 2,
      bar.get_height() + 0.02,
      text,
      ha="center",
      va="bottom",
      fontsize=7,
    )
  ax.set_xticks(range(len(table)), labels, rotation=45, ha="right", fontsize=7)
  ax.set_ylim(0, 1.25)
  ax.set_ylabel("emergence rate")
  ax.set_title(" × ".join(conds) + " (median emergence step above bars)", fontsize=9)
  fig.tight_layout()
  return save(fig, out_base)
