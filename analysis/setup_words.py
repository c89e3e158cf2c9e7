"""The setup paragraph of the report's opening words (``summary.summary``): the data, the
models, the budget and the grid, in words generated from a run's config and its cells, and the
small wording helpers the other paragraphs share (counts of models, large numbers, emerged models
per value of a grid axis)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ihsweep.compute import metric_registry

from .prose import config_field, number, seeds_per_point

METHOD_WORDS = {
  "threshold": "the update at which {metric} first crosses halfway between its early and "
  "late plateau",
  "max_slope": "the middle of the steepest rise of {metric}",
  "breakpoint": "the centre of the ramp of a flat-ramp-flat fit to {metric}",
}


def models_words(n: int, what: str = "model") -> str:
  """'1 model', '3 models'."""
  return f"{n} {what}{'' if n == 1 else 's'}"


def _values(values) -> str:
  vals = sorted({float(v) for v in values})
  return "{" + ", ".join(f"{v:g}" for v in vals) + "}"


def big_number(v: float) -> str:
  """1.2M, 53.6M, 1B: large counts in words."""
  for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
    if abs(v) >= div:
      return f"{v / div:.3g}{unit}"
  return f"{v:.3g}"


def data_words(cfg) -> str:
  """The data source of a run config in words (its ``data`` section)."""
  source = config_field(cfg, "data.source", "?")
  corpus = (
    config_field(cfg, "data.corpus")
    or config_field(cfg, "data.tfds_name")
    or config_field(cfg, "data.files")
    or "a corpus"
  )
  vocab = config_field(cfg, "model.vocab_size")
  if source == "natural":
    return f"natural text ({corpus}, a BPE vocabulary of {number(vocab)} types)"
  if source == "markov":
    knobs = (
      f"induction patterns A B … A → B injected at frequency "
      f"{config_field(cfg, 'data.frequency'):g} and reliability "
      f"{config_field(cfg, 'data.reliability'):g}"
    )
    transitions = config_field(cfg, "data.transitions", "bigram")
    if transitions == "bigram":
      smoothing = config_field(cfg, "data.smoothing", 0.0)
      mixed = ""
      if vocab and smoothing and smoothing * vocab > 0.1:
        share = smoothing * vocab / (1 + smoothing * vocab)
        mixed = f", each row mixed {share:.0%} with uniform (smoothing {smoothing:g})"
      return (
        f"semi-natural Markov data: the bigram statistics of {corpus} over its {number(vocab)} "
        f"most frequent types{mixed}, with {knobs}"
      )
    if transitions == "synthetic":
      return (
        f"synthetic Markov data (a {number(vocab)}-type transition matrix optimised to a "
        f"{config_field(cfg, 'data.synthetic.marginal', '?')} marginal, categoriality "
        f"{config_field(cfg, 'data.synthetic.categoriality', '?')}), with {knobs}"
      )
    if transitions == "iid":
      return f"i.i.d. tokens from a fixed marginal ({number(vocab)} types), with {knobs}"
    return f"Markov data from a given transition matrix ({number(vocab)} types), with {knobs}"
  if source == "repeated_blocks":
    return (
      f"the classic induction task: uniform random tokens ({number(vocab)} types) with a "
      f"repeated block"
    )
  if source == "markov_chain":
    return (
      f"a fixed sparse Markov chain ({number(vocab)} types, "
      f"{config_field(cfg, 'data.n_successors', '?')} successors per token)"
    )
  if source == "uniform":
    return f"uniform random tokens ({number(vocab)} types)"
  return f"data source {source!r}"


def _model_field(cfg, points: pd.DataFrame, path: str):
  """``(value, varied)``: a grid axis's values ('{1, 2}', varied True) where the cells vary
  ``path``, else the run config's value (the groups' default, not theirs when it is an axis)."""
  if path in points and points[path].nunique() > 1:
    return axis_values(points, path), True
  if path in points and points[path].notna().any():  # a grid axis of one value
    v = points[path].dropna().iloc[0]
    return (int(v) if isinstance(v, (float, np.floating)) and float(v).is_integer() else v), False
  return config_field(cfg, path), False


def model_words(cfg, points: pd.DataFrame) -> str:
  (layers, vl), (heads, vh) = (
    _model_field(cfg, points, f"model.{f}") for f in ("n_layers", "n_heads")
  )
  (d, vd), (mlp, vm) = (_model_field(cfg, points, f"model.{f}") for f in ("d_model", "d_mlp"))
  if vm:
    kind = f"with MLPs of d_mlp ∈ {mlp} (0: attention-only)"
  else:
    kind = "attention-only" if mlp == 0 else f"with MLPs (d_mlp {mlp})"
  layer_words = f"{layers} layers," if vl else f"{layers}-layer"
  text = (
    f"{layer_words} {kind} transformers, {heads} head{'s' if vh or heads != 1 else ''} per "
    f"layer, d_model {'∈ ' if vd else ''}{d}"
  )
  if "n_params" in points and points["n_params"].notna().any():
    sizes = sorted(points["n_params"].dropna().astype(int).unique())
    text += (
      f" ({sizes[0]:,} parameters)"
      if len(sizes) == 1
      else f" ({len(sizes)} sizes, {sizes[0]:,}–{sizes[-1]:,} parameters)"
    )
  return text


def budget_words(cfg, points: pd.DataFrame) -> str:
  """How long each cell trained and when it stopped (``sweep.budget``), with the updates each
  cell's curve reached (``last_step``, else ``budget_updates``)."""
  budget = config_field(cfg, "sweep.budget", "updates")
  law = "the study's law" if not config_field(cfg, "sweep.law_file") else "a fitted law"
  mult = config_field(cfg, "sweep.law_multiple", 1.0)
  if budget == "emergence":
    text = (
      f"each group stopped once every model's online {config_field(cfg, 'sweep.stop_metric')} "
      f"had passed {config_field(cfg, 'sweep.stop_threshold'):g} and training had gone on to "
      f"{config_field(cfg, 'sweep.stop_margin'):g}× that update, or at a cap of {mult:g}× "
      f"{law}'s predicted updates for the cell"
    )
  elif budget == "law":
    text = f"each cell trained for {mult:g}× {law}'s predicted updates"
  elif budget == "tokens":
    text = f"each cell trained on {number(config_field(cfg, 'sweep.tokens'))} tokens per model"
  else:
    text = f"each cell trained for {number(config_field(cfg, 'train.num_steps'))} updates"
  reach = None
  for col in ("last_step", "budget_updates"):
    if col in points and points[col].notna().any():
      reach = points[col].dropna().astype(float)
      break
  if reach is not None:
    lo, hi = reach.min(), reach.max()
    text += (
      f" (curves reach update {number(lo)})"
      if lo == hi
      else f" (curves reach updates {number(lo)}–{number(hi)})"
    )
  return text


def _other_axes(points: pd.DataFrame, axes) -> list[str]:
  """Grid axes besides B and C that take more than one value in ``points``."""
  return [a for a in axes if a in points and points[a].nunique() > 1]


def _show(v) -> str:
  return f"{v:g}" if isinstance(v, (int, float, np.number)) else str(v)


def axis_values(points: pd.DataFrame, axis: str) -> str:
  if pd.api.types.is_numeric_dtype(points[axis]):
    return _values(points[axis])
  return "{" + ", ".join(sorted(points[axis].dropna().astype(str).unique())) + "}"


def by_axis_words(points: pd.DataFrame, axes, max_values: int = 8) -> str:
  """How many models emerged at each value of each other grid axis: a count per value, no
  trend claimed ('data.reliability: 0.5 → 0 of 4, 1 → 3 of 4')."""
  out = []
  for a in _other_axes(points, axes)[:3]:
    counts = points.assign(emerged=~points["censored"].astype(bool)).groupby(a)["emerged"]
    values = list(counts)
    if len(values) > max_values:
      continue
    out.append(f"{a}: " + ", ".join(f"{_show(v)} → {int(g.sum())} of {len(g)}" for v, g in values))
  return (
    ("Emerged models per value of the other grid axes — " + "; ".join(out) + ".") if out else ""
  )


def setup_paragraph(points, cfg, keys, axes, metric, method, n_runs: int) -> str:
  lo, hi = seeds_per_point(points, keys)
  seeds = f"{lo} seed{'s' if lo != 1 else ''}" if lo == hi else f"{lo}–{hi} seeds"
  others = _other_axes(points, axes)
  if points["batch_size"].nunique() == 1 and points["context_size"].nunique() == 1:
    grid = (
      f"B {points['batch_size'].iloc[0]:g} sequences per update and C "
      f"{points['context_size'].iloc[0]:g} tokens per sequence"
    )
    varied = " × ".join(f"{a} ∈ {axis_values(points, a)}" for a in others)
    grid += f" throughout, over {varied}" if others else " (one grid point)"
  else:
    grid = (
      f"B ∈ {_values(points['batch_size'])} sequences per update × C ∈ "
      f"{_values(points['context_size'])} tokens per sequence"
    )
    if others:
      grid += " × " + " × ".join(f"{a} ∈ {axis_values(points, a)}" for a in others)
  lr = config_field(cfg, "train.lr")
  schedule = config_field(cfg, "train.schedule", "")
  opt = ""
  if lr is not None:
    opt = (
      f"; AdamW, peak learning rate {lr:g}, {schedule} schedule after "
      f"{config_field(cfg, 'train.warmup_frac', 0):.0%} warmup"
    )
  runs = f" ({n_runs} run directories; the setup is the first's)" if n_runs > 1 else ""
  words = METHOD_WORDS.get(method, "the emergence point of {metric} by " + method).format(
    metric=metric_registry.description(metric)
  )
  return (
    f"**Setup.** {len(points)} models{runs}: {model_words(cfg, points)}, trained on "
    f"{data_words(cfg)}{opt}. Grid: {grid}, {seeds} per grid point (the models of a grid "
    f"point differ only in their seed). Budget: {budget_words(cfg, points)}. A model's "
    f"emergence point is {words} ({metric}, {method}); a model whose curve never jumps is "
    f"right-censored at its last checkpoint."
  )
