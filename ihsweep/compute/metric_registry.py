"""The metric registry: the one place where ihsweep's per-model summary metrics are defined.

Each ``Metric`` says what the metric is (name, description, units, axis label), how it is
computed from ``ihsweep.compute.metrics.evaluate``'s per-model outputs, which way it moves when an
induction head forms (``direction``), how large that move must be to count as emergence
(``min_jump``), and whether and with which thresholds it may stop a group under the 'emergence'
budget (``stop``). Everything else reads ``REGISTRY`` at call time:

* ``ihsweep.compute.metrics.evaluate`` computes every metric that has a ``compute`` function,
  so it is in the online evaluation, ``metrics.jsonl`` and the analysis's recomputed curves;
* ``ihsweep.configuration.grid`` accepts ``sweep.stop_metric`` = any metric with a ``stop`` rule
  and checks ``sweep.stop_threshold`` against it (range, and the untrained model's level where
  known);
* ``analysis.curves`` keeps every registered metric as a column (``analysis.curves.METRICS``);
  ``analysis.emergence`` reads direction, ``min_jump`` and transform from here and tabulates
  the metrics with ``emergence=True`` by default; the report's axis labels and sentences come
  from ``label`` and ``description``.

Adding a metric is one entry in ``REGISTRY`` below (or ``register(Metric(...))`` from a
notebook, before the evaluation is compiled). This module imports no JAX: the planner and the
analysis read it without loading an accelerator runtime.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np

TRANSFORMS = ("none", "log1p10")
# The per-(layer, head) scores ``evaluate`` returns as ``[n_layers, n_heads]`` arrays, each with
# its best head's (layer, head) as ``<name>_argmax`` (the curves' ``<name>_layer``/``_head``).
HEAD_SCORES = ("ps", "pt", "la", "dla")
# Keys of evaluate's outputs and of the curves/metrics.jsonl rows that are not metrics: a
# metric may not take one of these names.
RESERVED = frozenset(
  {
    "ps",
    "pt",
    "la",
    "dla",
    "ps_argmax",
    "pt_argmax",
    "la_argmax",
    "dla_argmax",
    "ar_data_n",
    "run",
    "group",
    "cell",
    "seed",
    "step",
    "tokens",
    "train_loss",
    "diverged",
    "diverged_step",
    "source",
    "n_probes",
    "n_sequences",
    "batch_size",
    "context_size",
    "n_params",
    "law_updates",
    "ps_layer",
    "ps_head",
    "pt_layer",
    "pt_head",
    "la_layer",
    "la_head",
    "dla_layer",
    "dla_head",
  }
)


def uniform_ps(block_len: int, probe_tokens: int = 0) -> float:
  """The prefix-matching score of uniform causal attention on probes of block length L and T
  tokens (default 2L), the level of an untrained model: the mean of 1/(i + 1) over the
  second-block positions i ∈ [T − L, T) (``ihsweep.compute.metrics.prefix_matching_score``)."""
  probe_tokens = probe_tokens or 2 * block_len
  return float(np.mean(1.0 / (np.arange(probe_tokens - block_len, probe_tokens) + 1.0)))


def uniform_pt(block_len: int, probe_tokens: int = 0) -> float:
  """The previous-token score of uniform causal attention on probes of block length L and T
  tokens (default 2L): the mean of 1/(i + 1) over the positions i ∈ [T − 2L + 1, T)
  (``ihsweep.compute.metrics.previous_token_score``)."""
  probe_tokens = probe_tokens or 2 * block_len
  return float(np.mean(1.0 / (np.arange(probe_tokens - 2 * block_len + 1, probe_tokens) + 1.0)))


@dataclasses.dataclass(frozen=True)
class StopRule:
  """Which ``sweep.stop_threshold`` values a metric may stop a group at ('emergence' budget;
  ``ihsweep.training.evaluation.EmergenceStop`` stops once every model's metric has risen to the
  threshold). The threshold must be a finite number in the interval from ``lo`` to ``hi``
  (``lo_open``/``hi_open``: excluding that end). ``untrained``: the level an untrained model
  already reaches, as a function of the probes' block length L and length T in tokens
  (``ihsweep.data.probes.probe_layout``), or None when unknown; a threshold at or below it is
  refused per group, the error naming ``untrained_text`` (e.g. 'the ps_max of uniform
  attention')."""

  lo: float = -math.inf
  hi: float = math.inf
  lo_open: bool = False
  hi_open: bool = True
  untrained: Callable[[int, int], float] | None = None
  untrained_text: str = ""


# Scores and accuracies in [0, 1]: every model has at least 0 at update 0, so 0 stops nothing.
UNIT_INTERVAL = StopRule(0.0, 1.0, lo_open=True, hi_open=False)


@dataclasses.dataclass(frozen=True)
class Metric:
  """One per-model summary metric (a float32 scalar per model and evaluation).

  Attributes:
    name: the key in ``evaluate``'s outputs, ``metrics.jsonl`` rows and the curves' columns.
    description: words for sentences ("the best head's prefix-matching score").
    units: e.g. 'attention probability in [0, 1]', 'nats'.
    label: an axis label for plots.
    direction: +1 if the metric rises when an induction head forms, −1 if it falls.
    min_jump: the least ``direction · (late plateau − early plateau)``, after ``transform``, for
      a curve to count as emerged (``analysis.emergence``); in the metric's units.
    transform: 'none', or 'log1p10' (the curve is read as log10(1 + value), e.g. a mean rank).
    emergence: in the analysis's emergence table by default (``emergence_names``).
    stop: the thresholds at which it may stop a group (``sweep.stop_metric``), None if it may
      not. Only rising metrics (direction +1) may stop a group.
    compute: ``fn(out) -> float32 scalar`` from ``ihsweep.compute.metrics.evaluate``'s outputs
      for ONE model (traced inside the ensemble vmap and jit): ``ps``, ``la``, ``dla`` ``[n_layers,
      n_heads]``, ``ar_acc``, ``ar_rank``, ``ar_data_acc``, ``ar_data_rank``, ``ar_data_n``,
      ``val_loss``, ``icl_score``, ``pt`` and the metrics registered before it. None: ``evaluate``
      itself returns the value under ``name``.

  Raises:
    ValueError: a field out of its allowed values (named in the message).
  """

  name: str
  description: str
  units: str
  label: str
  direction: int
  min_jump: float
  transform: str = "none"
  emergence: bool = False
  stop: StopRule | None = None
  compute: Callable[[Mapping[str, Any]], Any] | None = None

  def __post_init__(self):
    def bad(field, value, allowed):
      raise ValueError(f"Metric {self.name!r}: {field} = {value!r}; allowed: {allowed}")

    if not isinstance(self.name, str) or not self.name.isidentifier():
      bad("name", self.name, "an identifier (it becomes a column and a JSON key)")
    if self.name in RESERVED:
      bad("name", self.name, f"not one of the reserved keys {sorted(RESERVED)}")
    if self.direction not in (1, -1):
      bad("direction", self.direction, "+1 (rises at emergence) or -1 (falls)")
    if not (
      isinstance(self.min_jump, (int, float))
      and math.isfinite(self.min_jump)
      and self.min_jump >= 0
    ):
      bad("min_jump", self.min_jump, "a finite number >= 0")
    if self.transform not in TRANSFORMS:
      bad("transform", self.transform, ", ".join(TRANSFORMS))
    if self.stop is not None and self.direction != 1:
      bad(
        "stop",
        self.stop,
        "None for a falling metric (the stop rule waits for a rise to the threshold)",
      )

  def apply(self, values) -> np.ndarray:
    """``values`` as float64 in the units ``min_jump`` is given in (after ``transform``)."""
    values = np.asarray(values, float)
    return np.log10(1 + values) if self.transform == "log1p10" else values


def _best_head(scores: str) -> Callable[[Mapping[str, Any]], Any]:
  def best(out):
    return out[scores].max()

  best.__doc__ = f"max over (layer, head) of ``{scores}``"
  return best


def feeding_heads(pt_LyxH):
  """The rows of a per-(layer, head) score for the heads of every layer but the last (all of
  them in a one-layer model): a previous-token head serves an induction head only from a layer
  below it. A one-layer model has none, so its ``pt_max`` (over its one layer) is no half of a
  circuit: the report leaves it out (``analysis.circuit.without_one_layer``). Works on NumPy and
  JAX arrays ``[n_layers, n_heads]``."""
  return pt_LyxH[:-1] if pt_LyxH.shape[0] > 1 else pt_LyxH


def _best_feeding_head(out):
  """max of ``pt`` over ``feeding_heads``."""
  return feeding_heads(out["pt"]).max()


# Minimum jumps chosen from the untrained baselines and the transitions measured in this
# project: ps_max ~0.02-0.1 before, 0.6-0.9 after (pt_max likewise); ar_acc ~1/V before;
# DLA 0 → several nats.
# The ICL score (loss late in the context minus early) falls by ~1 nat with ordinary learning
# on the induction task even where no induction head forms; the transition takes it down 3-4.
REGISTRY: dict[str, Metric] = {
  m.name: m
  for m in (
    Metric(
      "ps_max",
      "the best head's prefix-matching score",
      "attention probability in [0, 1]",
      "prefix-matching score (best head)",
      +1,
      0.2,
      emergence=True,
      compute=_best_head("ps"),
      stop=dataclasses.replace(
        UNIT_INTERVAL, untrained=uniform_ps, untrained_text="the ps_max of uniform attention"
      ),
    ),
    Metric(
      "pt_max",
      "the best previous-token score of a head below the last layer",
      "attention probability in [0, 1]",
      "previous-token score (best head below the last layer)",
      +1,
      0.2,
      emergence=True,
      compute=_best_feeding_head,
      stop=dataclasses.replace(
        UNIT_INTERVAL, untrained=uniform_pt, untrained_text="the pt_max of uniform attention"
      ),
    ),
    Metric(
      "la_max",
      "the best head's logit attribution",
      "share in [0, 1]",
      "logit attribution, study (best head)",
      +1,
      0.1,
      emergence=True,
      compute=_best_head("la"),
      stop=UNIT_INTERVAL,
    ),
    Metric(
      "dla_max",
      "the best head's direct logit attribution",
      "nats of logit",
      "direct logit attribution (best head, nats)",
      +1,
      1.0,
      emergence=True,
      compute=_best_head("dla"),
      stop=StopRule(),
    ),
    Metric(
      "ar_acc",
      "associative-recall accuracy on the probes",
      "share of positions in [0, 1]",
      "associative recall accuracy (probes)",
      +1,
      0.2,
      emergence=True,
      stop=UNIT_INTERVAL,
    ),
    Metric(
      "ar_rank",
      "the mean rank of the correct token on the probes",
      "rank among V (0 = top)",
      "associative recall mean rank (probes)",
      -1,
      0.5,
      transform="log1p10",
    ),
    Metric(
      "ar_data_acc",
      "associative-recall accuracy on prompts from the data",
      "share of positions in [0, 1]",
      "associative recall accuracy (data)",
      +1,
      0.2,
      stop=UNIT_INTERVAL,
    ),
    Metric(
      "ar_data_rank",
      "the mean rank of the correct token on prompts from the data",
      "rank among V (0 = top)",
      "associative recall mean rank (data)",
      -1,
      0.5,
      transform="log1p10",
    ),
    Metric("icl_score", "the ICL score", "nats", "ICL score (nats)", -1, 1.5, emergence=True),
    Metric(
      "val_loss", "the validation loss", "nats/token", "validation loss (nats/token)", -1, 0.2
    ),
  )
}


def register(metric: Metric, *, replace: bool = False) -> Metric:
  """Adds ``metric`` to ``REGISTRY`` (for a metric of one's own without editing this file; it
  reaches evaluations compiled after this call).

  Raises:
    ValueError: a metric of that name is registered and ``replace`` is False.
  """
  if metric.name in REGISTRY and not replace:
    raise ValueError(f"metric {metric.name!r} is already registered (replace=True to redefine it)")
  REGISTRY[metric.name] = metric
  return metric


def get(name: str) -> Metric:
  """The registered metric ``name``.

  Raises:
    ValueError: no metric of that name; the message lists the registered ones.
  """
  if name not in REGISTRY:
    raise ValueError(f"metric = {name!r}: allowed {', '.join(REGISTRY)}")
  return REGISTRY[name]


def names() -> tuple[str, ...]:
  """Every registered metric, in registry order (the curves' metric columns)."""
  return tuple(REGISTRY)


def emergence_names() -> tuple[str, ...]:
  """The metrics of the analysis's default emergence table (``emergence=True``)."""
  return tuple(n for n, m in REGISTRY.items() if m.emergence)


def stop_names() -> tuple[str, ...]:
  """The metrics ``sweep.stop_metric`` may name (those with a ``stop`` rule)."""
  return tuple(n for n, m in REGISTRY.items() if m.stop is not None)


def computed() -> tuple[Metric, ...]:
  """The metrics ``ihsweep.compute.metrics.evaluate`` computes from its outputs (``compute``
  set)."""
  return tuple(m for m in REGISTRY.values() if m.compute is not None)


def label(name: str) -> str:
  """A plot label for ``name`` (the name itself if it is not a registered metric)."""
  return REGISTRY[name].label if name in REGISTRY else name


def description(name: str) -> str:
  """Words for ``name`` in a sentence (the name itself if it is not a registered metric)."""
  return REGISTRY[name].description if name in REGISTRY else name
