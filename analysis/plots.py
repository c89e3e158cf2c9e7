"""Figures (matplotlib, Agg backend), each written as PNG (for the report) and PDF (for papers).

* ``plot_curves``: one panel per grid point, a metric against updates on a log axis (symlog, so
  step 0 is shown), seeds as lines, emergence points marked (dots; censored curves end in an x);
* ``plot_law``: observed vs predicted UPT on log-log axes for the fitted and the study's laws,
  and UPT against B per C with the fitted law's lines;
* ``plot_emergence_map``: the frequency × reliability heat map of emergence rates with the
  frontier;
* ``plot_factorial``: emergence rate per condition of the factorial, median step annotated.
"""

from __future__ import annotations

import math
import os
import textwrap

import numpy as np
import pandas as pd


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(fig, out_base: str) -> list[str]:
  os.makedirs(os.path.dirname(out_base) or ".", exist_ok=True)
  paths = []
  for ext in ("png", "pdf"):
    path = f"{out_base}.{ext}"
    fig.savefig(path, dpi=150 if ext == "png" else None, bbox_inches="tight")
    paths.append(path)
  _plt().close(fig)
  return paths


LABELS = {"ps_max": "prefix-matching score (best head)",
          "la_max": "logit attribution, study (best head)",
          "dla_max": "direct logit attribution (best head, nats)",
          "ar_acc": "associative recall accuracy (probes)",
          "ar_rank": "associative recall mean rank (probes)",
          "ar_data_acc": "associative recall accuracy (data)",
          "icl_score": "ICL score (nats)", "val_loss": "validation loss (nats/token)"}


def panel_keys(curves: pd.DataFrame, axes: list[str]) -> list[str]:
  """Columns that identify a grid point (everything per cell except the seed)."""
  keys = ["run"] + [a for a in axes if a in curves] + ["batch_size", "context_size"]
  return list(dict.fromkeys(k for k in keys if k in curves))


def _panel_title(key, names) -> str:
  key = key if isinstance(key, tuple) else (key,)
  short = {"batch_size": "B", "context_size": "C"}
  parts = [f"{short.get(n, n.split('.')[-1])}={v:g}" if isinstance(v, (int, float, np.number))
           else f"{short.get(n, n.split('.')[-1])}={v}" for n, v in zip(names, key)
           if n != "run"]
  # Wrapped: with many grid axes (Experiment 3 has five) one line overflows into the next panel.
  return textwrap.fill(", ".join(parts), width=48)


def plot_curves(curves: pd.DataFrame, emergence: pd.DataFrame | None, out_base: str, *,
                metric: str = "ps_max", method: str = "threshold", axes: list[str] = (),
                max_panels: int = 36) -> list[str]:
  """Metric curves per grid point (module docstring). Returns the PNG and PDF paths.

  Args:
    curves: ``analysis.curves`` rows; emergence: ``analysis.emergence.emergence_table`` rows
      (points of ``metric``/``method`` are marked) or None.
    axes: the grid's axis columns (panels are grid points).
  """
  plt = _plt()
  keys = panel_keys(curves, list(axes))
  panels = list(curves.groupby(keys, sort=True, dropna=False))
  if len(curves["run"].unique()) == 1:
    keys_shown = [k for k in keys if k != "run"]
  else:
    keys_shown = keys
  shown = panels[:max_panels]
  n = len(shown)
  cols = min(5, math.ceil(math.sqrt(n))) or 1
  rows = math.ceil(n / cols) or 1
  fig, axs = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False,
                          sharey=True)
  points = None
  if emergence is not None and not emergence.empty:
    points = emergence[(emergence["metric"] == metric) & (emergence["method"] == method)]
    points = points.set_index(["run", "cell"])
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (key, panel) in zip(axs.flat, shown):
    for j, (cell, line) in enumerate(panel.groupby("cell", sort=True)):
      line = line.sort_values("step")
      color = colors[j % len(colors)]
      seed = line["seed"].iloc[0] if "seed" in line else cell
      ax.plot(line["step"], line[metric], color=color, lw=1.2, label=f"seed {seed}")
      if points is None or (line["run"].iloc[0], cell) not in points.index:
        continue
      e = points.loc[(line["run"].iloc[0], cell)]
      if not bool(e["censored"]):
        y = np.interp(np.log(e["emergence_step"]),
                      np.log(np.maximum(line["step"].to_numpy(float), 0.5)),
                      line[metric].to_numpy(float))
        ax.plot([e["emergence_step"]], [y], "o", color=color, ms=6, mec="black", mew=0.6)
      else:
        last = line.dropna(subset=[metric]).iloc[-1] if line[metric].notna().any() else None
        if last is not None:
          ax.plot([last["step"]], [last[metric]], "x", color=color, ms=7, mew=1.5)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_title(_panel_title(key, keys) if keys_shown else "", fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
  for ax in list(axs.flat)[n:]:
    ax.set_visible(False)
  for ax in axs[-1]:
    ax.set_xlabel("updates", fontsize=8)
  for ax in axs[:, 0]:
    ax.set_ylabel(LABELS.get(metric, metric), fontsize=8)
  handles, labels = axs.flat[0].get_legend_handles_labels()
  if handles:
    axs.flat[0].legend(handles[:8], labels[:8], fontsize=6, loc="best")
  note = f" (first {max_panels} of {len(panels)} grid points)" if len(panels) > max_panels else ""
  fig.suptitle(f"{LABELS.get(metric, metric)} per grid point; o = emergence ({method}), "
               f"x = censored{note}", fontsize=9)
  fig.tight_layout()
  return _save(fig, out_base)


def plot_law(fit, out_base: str) -> list[str]:
  """Observed vs predicted UPT (log-log) for the fitted law and the study's, and UPT vs B per C
  with the fitted law's lines. ``fit``: ``analysis.scaling.LawFit``."""
  from analysis.scaling import STUDY
  plt = _plt()
  res = fit.residuals
  b, c = res["batch_size"].to_numpy(float), res["context_size"].to_numpy(float)
  obs = res["observed_updates"].to_numpy(float)
  pred = res["predicted_updates"].to_numpy(float)
  study = np.exp(STUDY["log_T"] - STUDY["alpha"] * np.log(b) - STUDY["beta"] * np.log(c))
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
  ax1.loglog(pred, obs, "o", label=f"fitted: ln T={fit.log_T:.2f}, α={fit.alpha:.2f}, "
             f"β={fit.beta:.2f} (r={fit.r:.3f})", alpha=0.8)
  ax1.loglog(study, obs, "s", mfc="none", label="study: ln T=13.26, α=0.37, β=0.62", alpha=0.8)
  lo = min(obs.min(), pred.min(), study.min()) / 1.5
  hi = max(obs.max(), pred.max(), study.max()) * 1.5
  ax1.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="observed = predicted")
  ax1.set_xlabel("predicted updates to the transition")
  ax1.set_ylabel("observed updates to the transition")
  ax1.legend(fontsize=7)
  ax1.grid(alpha=0.3, which="both")
  cmap = plt.get_cmap("viridis")
  cs = np.unique(c)
  bs = np.geomspace(b.min(), b.max(), 50) if b.max() > b.min() else np.array([b.min()])
  for k, cv in enumerate(cs):
    color = cmap(k / max(len(cs) - 1, 1))
    m = c == cv
    ax2.loglog(b[m], obs[m], "o", color=color, label=f"C={cv:g}", alpha=0.8)
    ax2.loglog(bs, fit.T * bs ** -fit.alpha * cv ** -fit.beta
               * (1 if fit.gamma is None else np.exp(fit.gamma * np.log(
                   res["n_params"].to_numpy(float)[m].mean()))), "-", color=color, lw=1)
  ax2.set_xlabel("batch size B (sequences per update)")
  ax2.set_ylabel("updates to the transition")
  ax2.legend(fontsize=7)
  ax2.grid(alpha=0.3, which="both")
  fig.suptitle(f"Emergence law fitted to {fit.n} emerged cells ({fit.n_censored} censored)",
               fontsize=10)
  fig.tight_layout()
  return _save(fig, out_base)


def plot_emergence_map(emap: pd.DataFrame, frontier: pd.DataFrame | None, out_base: str, *,
                       x: str = "data.frequency", y: str = "data.reliability") -> list[str]:
  """Heat map of the emergence rate over the x × y grid, each cell annotated with the rate and
  median emergence step; the frontier (``analysis.frontier.pareto_frontier``) drawn on top."""
  plt = _plt()
  xs, ys = np.sort(emap[x].unique()), np.sort(emap[y].unique())
  rate = emap.pivot(index=y, columns=x, values="rate").reindex(index=ys, columns=xs)
  med = emap.pivot(index=y, columns=x, values="median_step").reindex(index=ys, columns=xs)
  fig, ax = plt.subplots(figsize=(1.1 * len(xs) + 2.5, 0.9 * len(ys) + 1.8))
  im = ax.imshow(rate.to_numpy(float), origin="lower", cmap="magma", vmin=0, vmax=1,
                 aspect="auto")
  for i in range(len(ys)):
    for j in range(len(xs)):
      r, s = rate.iat[i, j], med.iat[i, j]
      text = "" if np.isnan(r) else f"{r:.2f}" + ("" if np.isnan(s) else f"\n{s:,.0f}")
      ax.text(j, i, text, ha="center", va="center", fontsize=7,
              color="white" if (np.isnan(r) or r < 0.6) else "black")
  if frontier is not None and not frontier.empty:
    f = frontier[(frontier["along"] == "y") & frontier[y].notna()].sort_values(x)
    if len(f):
      ax.plot(np.interp(f[x], xs, np.arange(len(xs))), np.interp(f[y], ys, np.arange(len(ys))),
              "c-o", lw=2, ms=4, label="frontier (rate 0.5)")
      ax.legend(fontsize=7, loc="upper left")
  ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
  ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
  ax.set_xlabel(f"{x.split('.')[-1]}")
  ax.set_ylabel(f"{y.split('.')[-1]}")
  fig.colorbar(im, ax=ax, label="emergence rate (share of seeds)")
  ax.set_title("Emergence rate (median emergence step below)", fontsize=9)
  fig.tight_layout()
  return _save(fig, out_base)


def plot_factorial(table: pd.DataFrame, out_base: str) -> list[str]:
  """Bar chart of the emergence rate per condition (``analysis.frontier.factorial_table``),
  the median emergence step written above each bar."""
  plt = _plt()
  conds = [c for c in table.columns if c not in ("n", "emerged", "rate", "median_step")]
  labels = [" / ".join(str(row[c]) for c in conds) for _, row in table.iterrows()]
  fig, ax = plt.subplots(figsize=(max(4, 0.7 * len(table) + 1.5), 3.6))
  bars = ax.bar(range(len(table)), table["rate"], color="tab:blue")
  for bar, (_, row) in zip(bars, table.iterrows()):
    text = f"n={int(row['n'])}" + ("" if pd.isna(row["median_step"]) else
                                   f"\n{row['median_step']:,.0f}")
    ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.02, text, ha="center",
            va="bottom", fontsize=7)
  ax.set_xticks(range(len(table)), labels, rotation=45, ha="right", fontsize=7)
  ax.set_ylim(0, 1.25)
  ax.set_ylabel("emergence rate")
  ax.set_title(" × ".join(conds) + " (median emergence step above bars)", fontsize=9)
  fig.tight_layout()
  return _save(fig, out_base)
