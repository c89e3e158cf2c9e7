"""The whole induction circuit: the previous-token head beside the induction head, the training
loss around their emergence, and the best heads' attention.

An induction head needs a head in an earlier layer that attends to the previous token: it writes
"the token before me was A" at the position after A, which the induction head's key matches
against the current token (Elhage et al. 2021, "A Mathematical Framework for Transformer
Circuits", two-layer attention-only models; Olsson et al. 2022, "In-context learning and induction
heads"). The report measures both halves — ``pt_max``, the best previous-token score of a head
below the last layer, and ``ps_max``, the best prefix-matching score
(``ihsweep.compute.metrics``) — and shows:

* ``one_layer_models`` / ``without_one_layer``: a one-layer model has no layer below its last,
  so no head that could feed an induction head; its ``pt_max`` (which the evaluation takes over
  its one layer) is not defined as the circuit's first half and is left out of the curves and
  emergence points;
* ``order``: per model, the emergence update of each (one method) and which came first;
  ``order_by_point`` their medians per grid point (``plots.emergence_grid``);
* ``loss_curves``: each model's training loss (``train_log.jsonl``, mean over each host call's
  updates) keyed like the curves, for the figure in which the loss's drop (the "bump" of Olsson
  et al. 2022, §"Phase change") is read against the emergence points;
* ``strongest`` and ``attention_example``: the model with the highest final prefix-matching
  score and its two best heads' attention on one of the run's repeated-token probes
  (``figure_attention``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ihsweep.compute import metric_registry

from . import emergence, plots
from .figure_axes import pyplot, save
from .prose import config_field

PREVIOUS, INDUCTION = "pt_max", "ps_max"
# Emergence updates within this factor of each other count as together: 4 checkpoints per
# octave are 2^(1/4) = 1.19× apart, and a threshold crossing is interpolated between two.
TOGETHER = 1.25
WIDER = ", or within the checkpoint interval around the points where that is wider"


def one_layer_models(runs) -> set[tuple[str, int]]:
  """``(run name, cell)`` of every model whose group's config has ``model.n_layers`` = 1.
  ``runs``: ``ihsweep.runs.reader.Run`` objects."""
  out = set()
  for run in runs:
    for group in run.groups:
      layers = config_field(group.config, "model.n_layers")
      if layers is not None and int(layers) == 1:
        out |= {(run.name, int(c)) for c in group.cells["cell"]}
  return out


def without_one_layer(frame: pd.DataFrame, models: set[tuple[str, int]]) -> pd.DataFrame:
  """``frame`` without ``pt_max`` for ``models`` (``one_layer_models``): curves (a ``pt_max``
  column) get NaN there; an emergence table (a ``metric`` column) loses their ``pt_max`` rows.
  Unchanged (the same object) where nothing is to be left out."""
  if not models or frame.empty:
    return frame
  keys = pd.MultiIndex.from_arrays([frame["run"].astype(str), frame["cell"].astype(int)])
  hit = keys.isin(list(models))
  if "metric" in frame:
    return frame[~(hit & (frame["metric"] == PREVIOUS).to_numpy())].reset_index(drop=True)
  if PREVIOUS not in frame or not hit.any():
    return frame
  out = frame.copy()
  out.loc[hit, PREVIOUS] = np.nan
  return out


def one_layer_words(n: int, n_all: int) -> str:
  """Why ``n`` of ``n_all`` models (one layer each) have no previous-token score: one sentence."""
  which = "every model has" if n == n_all else f"{n} of the {n_all} models have"
  return (
    f"No previous-token score where {which} one layer: a previous-token head feeds an "
    f"induction head only from a layer below it, and a one-layer model has none below its "
    f"last, so pt_max is left out for {'them' if n > 1 else 'it'} (curves.csv, emergence.csv)."
  )


def order(table: pd.DataFrame, method: str) -> pd.DataFrame:
  """One row per model (``run``, ``cell`` and its coordinates) with ``pt_step`` and ``ps_step``
  (the emergence updates of ``pt_max`` and ``ps_max`` by ``method``; NaN where censored),
  ``pt_censored`` / ``ps_censored``, ``pt_censor_step`` / ``ps_censor_step`` and
  ``pt_interval`` / ``ps_interval`` (``step_after`` ÷ ``step_before``: the ratio of the
  checkpoints that bracket the point). ``table``: ``analysis.emergence.emergence_table`` rows.
  Empty when either metric is missing from the table."""
  if table.empty or not {PREVIOUS, INDUCTION} <= set(table["metric"]):
    return pd.DataFrame()
  rows = table[table["method"] == method]
  keys = ["run", "cell"]
  coords = [c for c in ("seed", "batch_size", "context_size") if c in rows]
  out = None
  for metric, short in ((PREVIOUS, "pt"), (INDUCTION, "ps")):
    part = rows[rows["metric"] == metric].set_index(keys)
    one = pd.DataFrame(
      {
        f"{short}_step": part["emergence_step"].where(~part["censored"].astype(bool)),
        f"{short}_censored": part["censored"].astype(bool),
        f"{short}_censor_step": part["censor_step"],
      }
    )
    if {"step_before", "step_after"} <= set(part):
      bracket = part["step_after"].astype(float) / part["step_before"].astype(float)
      one[f"{short}_interval"] = bracket.where(~one[f"{short}_censored"])
    out = one if out is None else out.join(one, how="inner")
    if short == "pt":
      out = out.join(part[coords])
  return out.reset_index()


def order_by_point(models: pd.DataFrame, by: list[str] = ()) -> pd.DataFrame:
  """``order`` per grid point (``by`` …, batch_size, context_size): ``models``, then for pt and
  ps the seeds that emerged and the median emergence update over seeds (``plots.seed_median``:
  a string '> s' where the median falls on a censored seed)."""
  keys = [k for k in by if k in models] + ["batch_size", "context_size"]
  rows = []
  for key, point in models.groupby(keys, sort=True, dropna=False):
    row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
    row["models"] = len(point)
    for short in ("pt", "ps"):
      value, bound = plots.seed_median(
        point[f"{short}_step"], point[f"{short}_censored"], point[f"{short}_censor_step"]
      )
      row[f"{short}_emerged"] = int((~point[f"{short}_censored"]).sum())
      row[f"{short}_median"] = f"> {value:,.0f}" if bound else value
    rows.append(row)
  return pd.DataFrame(rows)


def _tolerance(models: pd.DataFrame) -> pd.Series:
  """Per model, the ratio of updates within which the two points cannot be ordered: TOGETHER,
  or the wider of the two checkpoint intervals that bracket them where that is wider."""
  tol = pd.Series(TOGETHER, index=models.index, dtype=float)
  for short in ("pt", "ps"):
    if f"{short}_interval" in models:
      tol = np.fmax(tol, models[f"{short}_interval"].astype(float))
  return tol


def order_words(models: pd.DataFrame, method: str) -> str:
  """``order`` in a paragraph: how many models each head emerged in and, where both did, the
  median ratio of the updates (previous-token ÷ induction) and how many had the previous-token
  head measurably first, measurably after, or too close to order (``_tolerance``)."""
  n = len(models)
  n_pt = int((~models["pt_censored"]).sum())
  n_ps = int((~models["ps_censored"]).sum())
  text = (
    f"The previous-token score (pt_max: a head below the last layer attending from each "
    f"position to the one before it, on the probes) emerged in {n_pt} of {n} models, the "
    f"prefix-matching score (ps_max) in {n_ps} (method {method})."
  )
  both = models[~models["pt_censored"] & ~models["ps_censored"]]
  if len(both):
    ratio = both["pt_step"] / both["ps_step"]
    tol = _tolerance(both)
    first, after = int((ratio < 1 / tol).sum()), int((ratio > tol).sum())
    close = len(both) - first - after
    wider = bool((tol > TOGETHER).any())
    if close == len(both):
      reading = "the two form together."
    elif first == len(both):
      reading = "the previous-token head forms first and the induction head builds on it."
    elif after == len(both):
      reading = "the previous-token score completes its rise after the induction head's."
    elif after == 0:
      reading = "the previous-token head forms first or together with it, never measurably after."
    elif first == 0:
      reading = (
        "the previous-token score completes its rise after the induction head's or together "
        "with it, never measurably before."
      )
    else:
      reading = "the order differs between models."
    text += (
      f" Where both emerged ({len(both)} models) the previous-token head did so at "
      f"{ratio.median():.2f}× the induction head's update (median; range {ratio.min():.2f}–"
      f"{ratio.max():.2f}): before it in {first}, after it in {after}, and too close to order "
      f"in {close} (within {TOGETHER:g}× of each other, about the spacing of checkpoints at 4 "
      f"per octave{WIDER if wider else ''}): {reading}"
    )
  return text


def loss_curves(runs, curves: pd.DataFrame) -> pd.DataFrame:
  """Each model's training loss against updates: rows ``run``, ``cell``, ``step`` (updates done
  at a host call's end), ``train_loss`` (nats/token, mean over that call's updates) and the
  model's coordinates from ``curves`` (``seed``, ``batch_size``, ``context_size``, grid axes).
  ``runs``: ``ihsweep.runs.reader.Run`` objects. Empty when no run logged training."""
  from ihsweep.runs.notebook import Run as NotebookRun

  parts = []
  for run in runs:
    log = NotebookRun(run).train_log
    if not log.empty:
      parts.append(log.assign(run=run.name)[["run", "cell", "step", "loss"]])
  if not parts or curves.empty:
    return pd.DataFrame()
  loss = pd.concat(parts, ignore_index=True).rename(columns={"loss": "train_loss"})
  coords = curves[emergence.cell_columns(curves)].drop_duplicates(["run", "cell"])
  return loss.merge(coords, on=["run", "cell"], how="inner")


def strongest(curves: pd.DataFrame) -> tuple[str, int] | None:
  """``(run, cell)`` of the model whose ``ps_max`` at its last evaluation is the highest (None
  without any)."""
  have = curves.dropna(subset=[INDUCTION]) if INDUCTION in curves else curves.iloc[:0]
  if have.empty:
    return None
  last = have.sort_values("step").groupby(["run", "cell"]).tail(1)
  best = last.loc[last[INDUCTION].idxmax()]
  return str(best["run"]), int(best["cell"])


def attention_example(run, cell: int, n_probes: int = 16) -> dict:
  """The attention of model ``cell`` of ``run`` (``ihsweep.runs.reader.Run``), at its last saved
  update, on the run's repeated-token probes (``probes.npz``).

  Returns a dict: ``tokens`` int ``[T]`` (the first probe), ``attn`` float32 ``[n_layers,
  n_heads, T, T]`` on it, ``block_len`` L, ``step`` (updates), ``pt`` and ``ps`` float
  ``[n_layers, n_heads]`` over the first ``n_probes`` probes, ``pt_head`` / ``ps_head``
  (layer, head) of the best previous-token head below the last layer and the best
  prefix-matching head.

  Raises:
    ValueError: no probes (evaluation off) or no saved params for the cell
      (``ihsweep.runs.notebook.Run.model``'s errors).
  """
  from ihsweep.compute.metrics import prefix_matching_score, previous_token_score
  from ihsweep.runs.notebook import Run as NotebookRun

  nb = NotebookRun(run)
  saved = nb.probes(cell)
  model = nb.model(cell)
  tokens = saved.repeated[:n_probes]
  attn = np.asarray(model.attention(tokens))  # [n_layers, N, n_heads, T, T]
  pt = np.asarray(previous_token_score(attn, saved.block_len))
  ps = np.asarray(prefix_matching_score(attn, saved.block_len))
  below = metric_registry.feeding_heads(pt)
  return {
    "tokens": tokens[0],
    "attn": attn[:, 0],
    "block_len": saved.block_len,
    "step": model.step,
    "pt": pt,
    "ps": ps,
    "pt_head": tuple(int(v) for v in np.unravel_index(np.argmax(below), below.shape)),
    "ps_head": tuple(int(v) for v in np.unravel_index(np.argmax(ps), ps.shape)),
  }


def figure_attention(example: dict, title: str = ""):
  """Two panels: the attention of the best previous-token head and of the best prefix-matching
  head (``attention_example``) over the probe's two blocks (queries down, keys across, the last
  2L positions), with the previous-token diagonal (key = query − 1) and the induction diagonal
  (key = query − L + 1) drawn dashed where they fall."""
  plt = pyplot()
  block = example["block_len"]
  t = example["attn"].shape[-1]
  lo = t - 2 * block
  fig, axs = plt.subplots(1, 2, figsize=(8.4, 4.2), squeeze=False)
  for ax, (short, name, offset) in zip(
    axs[0], (("pt", "previous-token", 1), ("ps", "prefix-matching", block - 1))
  ):
    layer, head = example[f"{short}_head"]
    pattern = example["attn"][layer, head, lo:, lo:]
    im = ax.imshow(pattern, vmin=0.0, vmax=1.0, cmap="viridis", origin="upper")
    q = np.arange(offset, 2 * block)
    ax.plot(q - offset, q, "--", color="white", lw=0.8, alpha=0.7)
    ax.set_title(f"L{layer}H{head}: {name} score {example[short][layer, head]:.2f}", fontsize=9)
    ticks = np.arange(0, 2 * block, max(1, block // 4))
    ax.set_xticks(ticks, [str(lo + k) for k in ticks], fontsize=7)
    ax.set_yticks(ticks, [str(lo + k) for k in ticks], fontsize=7)
    ax.axhline(block - 0.5, color="white", lw=0.6)
    ax.axvline(block - 0.5, color="white", lw=0.6)
    ax.set_xlabel("key position (attended to)", fontsize=8)
    ax.set_ylabel("query position", fontsize=8)
  fig.colorbar(im, ax=axs[0].tolist(), shrink=0.8, label="attention probability")
  fig.suptitle(title, fontsize=9)
  return fig


def plot_attention(example: dict, out_base: str, title: str = "") -> list[str]:
  """``figure_attention`` saved as PNG and PDF; returns the paths."""
  return save(figure_attention(example, title), out_base)
