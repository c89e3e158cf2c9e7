"""Online evaluation of an ensemble and what it decides: the compiled metric program with a
run's probes on the mesh (``Evaluator``, also what the analysis recomputes metrics with), its
``metrics.jsonl`` rows, and the 'until emergence + margin' budget (``EmergenceStop``)."""

from __future__ import annotations

import logging
import math

import jax
import numpy as np

from ihsweep.base import sharding
from ihsweep.compute import metrics as metrics_lib
from ihsweep.compute import train
from ihsweep.data import probes as probes_lib
from ihsweep.training import memory

log = logging.getLogger("ihsweep")


# A model whose final training loss exceeds ln V (a uniform guess over the vocabulary) by more
# than this many nats is named as not learning: 1 nat is a likelihood e times worse than
# guessing, a margin no model that trains at all stays above (a healthy run starts near ln V and
# falls below it in its first updates), while a diverging one ends far above (lr = 10 on the
# tiny config: thousands of nats).
NOT_LEARNING_NATS = 1.0


def not_learning(losses, vocab_size: int) -> list[int]:
  """The indices of the models whose final loss is finite and above ln V + ``NOT_LEARNING_NATS``
  (NaN/inf losses are the divergence rule's: ``diverged_at``)."""
  limit = math.log(vocab_size) + NOT_LEARNING_NATS
  return [i for i, x in enumerate(np.asarray(losses, float)) if math.isfinite(x) and x > limit]


def not_learning_line(losses, vocab_size: int, ids=None) -> tuple[str | None, list]:
  """(one line naming each model ``not_learning`` finds with its loss, their ids); (None, [])
  if none."""
  bad = not_learning(losses, vocab_size)
  if not bad:
    return None, []
  ids = list(range(len(losses))) if ids is None else list(ids)
  named = [ids[i] for i in bad]
  ln_v = math.log(vocab_size)
  which = ", ".join(f"{ids[i]} (final loss {float(losses[i]):.4g})" for i in bad)
  n = f"{len(bad)} of {len(losses)} models" if len(bad) < len(losses) else "every model"
  return (
    f"{n} diverged or did not learn: final loss > ln V + {NOT_LEARNING_NATS:g} = "
    f"{ln_v + NOT_LEARNING_NATS:.3g} (ln V = {ln_v:.3g}, a uniform guess over the "
    f"{vocab_size} tokens): {which}; lower train.lr or raise train.warmup_frac",
    named,
  )


def json_value(x):
  """numpy values to JSON values, nested lists for arrays (NaN and ±inf -> None)."""
  x = np.asarray(x)
  if x.ndim:
    return [json_value(v) for v in x]
  v = x.item()
  return None if isinstance(v, float) and not math.isfinite(v) else v


EVAL_MEMORY_SHARE = 1 / 8  # of a device's usable memory for one micro-batch's logits
EVAL_DEFAULT_BUDGET = 16 << 20  # bytes, where the device's memory is unknown (a CPU)


def eval_budget_bytes(mesh, capacity_bytes: int | None = None) -> int:
  """Bytes one evaluation micro-batch's float32 logits ``[m, T, V]`` may take on a device:
  ``EVAL_MEMORY_SHARE`` of its usable memory (``capacity_bytes``, else the mesh's first
  device's, ``memory.device_capacity``; less ``memory.HEADROOM``), or
  ``EVAL_DEFAULT_BUDGET`` (16 MiB) where it is unknown. The evaluation runs beside the
  resident train state, and ``runner.resolve_memory`` checks that both fit."""
  if capacity_bytes is None:
    capacity_bytes = memory.device_capacity(mesh.devices.flat[0])
  if not capacity_bytes:
    return EVAL_DEFAULT_BUDGET
  return max(EVAL_DEFAULT_BUDGET, int(memory.usable(capacity_bytes) * EVAL_MEMORY_SHARE))


class Evaluator:
  """The compiled ensemble evaluation (``metrics.make_eval_fn``) with the run's probes on the
  mesh; ``rows`` turns one result into ``metrics.jsonl`` rows. Micro-batches are sized by the
  device's memory (``eval_budget_bytes``), and the probes and the held-out sequences are each
  split over the mesh's 'data' axis when it divides their count (``split_probes``,
  ``split_sequences``).

  Args:
    cfg: the run's config (its ``eval`` section); mcfg: ``ModelConfig``; probes: the run's
      ``Probes`` (numpy), or None for an evaluator of the shapes ``cfg`` gives them, whose
      inputs are ``jax.ShapeDtypeStruct`` (only for ``lower``: ahead-of-time compilation);
      mesh: the ensemble's mesh; capacity_bytes: a device's memory when the mesh's devices
      cannot say (compile-only devices: the target's).
    programs: a dict in which the jitted metric program is kept and found again by its layout
      (a runner group's: the evaluator of its probes then reuses the trace and executable that
      an ahead-of-time compile of the abstract evaluator made).
  """

  def __init__(
    self,
    cfg,
    mcfg,
    probes: probes_lib.Probes | None,
    mesh,
    capacity_bytes: int | None = None,
    programs: dict | None = None,
  ):
    ens_sh, repl = sharding.ensemble_sharding(mesh), sharding.replicated(mesh)
    if probes is None:
      self.inputs = abstract_probes(cfg, mesh)
      n, t = self.inputs[0].shape
      block_len, _ = probes_lib.eval_layout(cfg.eval, cfg.train.context_size)
    else:
      n, t = probes.repeated.shape
      block_len = probes.block_len
      self.inputs = probes_lib.as_device_arrays(probes, ens_sh, repl)
    s, cp1 = self.inputs[1].shape[1:]
    context = cp1 - 1
    early, late = metrics_lib.icl_positions(context, cfg.eval.icl_early, cfg.eval.icl_late)
    # The probes and the sequences each split over the data axis when it divides their count,
    # else repeated on each of its devices (the model's batch is split there either way).
    d = mesh.shape["data"]
    self.split_probes, self.split_sequences = d > 1 and n % d == 0, d > 1 and s % d == 0
    self.budget_bytes = eval_budget_bytes(mesh, capacity_bytes)
    self.probe_batch = metrics_lib.microbatch(
      n // (d if self.split_probes else 1), t, mcfg.vocab_size, self.budget_bytes
    )
    self.sequence_batch = metrics_lib.microbatch(
      s // (d if self.split_sequences else 1), context, mcfg.vocab_size, self.budget_bytes
    )
    layout = dict(
      block_len=block_len,
      icl_early=early,
      icl_late=late,
      probe_batch=self.probe_batch,
      sequence_batch=self.sequence_batch,
      split_probes=self.split_probes,
      split_sequences=self.split_sequences,
    )
    programs = {} if programs is None else programs
    key = ("eval", mcfg, mesh, tuple(sorted(layout.items())))
    if key not in programs:
      programs[key] = metrics_lib.make_eval_fn(mcfg, out_sharding=ens_sh, mesh=mesh, **layout)
    self.fn = programs[key]

  def __call__(self, params) -> dict:
    return self.fn(params, *self.inputs)

  def lower(self, params) -> jax.stages.Lowered:
    """The evaluation lowered for ``params`` (arrays or ``jax.ShapeDtypeStruct`` with the
    ensemble sharding); ``.compile()`` it ahead of time."""
    return self.fn.lower(params, *self.inputs)

  @staticmethod
  def rows(
    host: dict, step: int, tokens_per_step: int, cfg, train_loss, diverged_at=None
  ) -> list[dict]:
    """One ``metrics.jsonl`` row per model: ``cell`` (its id: ``ensemble.cell_ids``, default
    the index in the ensemble), ``seed``, ``step``, ``tokens``, ``train_loss`` (mean over the
    updates since the previous evaluation; null at step 0), ``val_loss``, ``ps``/``la``/``dla``
    ``[n_layers][n_heads]``, their ``*_max`` and ``*_argmax`` ([layer, head]), ``ar_acc``,
    ``ar_rank``, ``ar_data_acc``, ``ar_data_rank``, ``ar_data_n``, ``icl_score``, ``diverged``
    (bool). A diverged model's row has ``diverged_step`` (updates done when its loss first
    turned NaN/inf) and null metrics. NaN is written as null."""
    n_models = len(host["ps_max"])
    ids, seeds = train.cell_ids(cfg), train.model_seeds(cfg)
    diverged_at = np.full(n_models, -1) if diverged_at is None else np.asarray(diverged_at)
    out = []
    for i in range(n_models):
      row = {
        "cell": ids[i],
        "seed": seeds[i],
        "step": step,
        "tokens": step * tokens_per_step,
        "train_loss": None if train_loss is None else json_value(train_loss[i]),
      }
      bad = diverged_at[i] >= 0
      row.update({k: None if bad else json_value(v[i]) for k, v in sorted(host.items())})
      row["diverged"] = bool(bad)
      if bad:
        row["diverged_step"] = int(diverged_at[i])
      out.append(row)
    return out


def abstract_probes(cfg, mesh) -> tuple:
  """``(repeated, sequences, recall)`` as ``jax.ShapeDtypeStruct`` on ``mesh``, with the shapes
  and dtypes ``probes.make_probes`` gives them for ``cfg``: int32 ``[eval.n_probes, T]`` (T = 2L
  or C: ``probes.probe_layout``) replicated, int32 ``[E, eval.n_sequences, C + 1]`` and bool
  ``[E, eval.n_sequences, C]`` split over 'ensemble'."""
  ens_sh, repl = sharding.ensemble_sharding(mesh), sharding.replicated(mesh)
  e, c, s = cfg.ensemble.size, cfg.train.context_size, cfg.eval.n_sequences
  _, length = probes_lib.eval_layout(cfg.eval, c)
  return (
    jax.ShapeDtypeStruct((cfg.eval.n_probes, length), np.int32, sharding=repl),
    jax.ShapeDtypeStruct((e, s, c + 1), np.int32, sharding=ens_sh),
    jax.ShapeDtypeStruct((e, s, c), np.bool_, sharding=ens_sh),
  )


class EmergenceStop:
  """The 'until emergence + margin' budget: a model is done once its online ``metric`` has
  reached ``threshold`` at some evaluation step s and training has reached ``margin · s``
  updates; a diverged model is done. ``done(step)`` is true when every model is.

  A model counts as reaching the threshold only after an evaluation has seen it below: one
  already at or above it at its first evaluation (update 0, untrained) says nothing about
  emergence, and a warning names ``sweep.stop_threshold`` and the measured baseline (that
  model then trains to its cap unless it drops below and rises again).

  Args:
    metric: a per-model ``metrics.jsonl`` field (e.g. ``ps_max``); threshold: its emergence
      level; margin: factor (>= 1) on the first step at which it was reached; n_models: E.
  """

  def __init__(self, metric: str, threshold: float, margin: float, n_models: int):
    self.metric, self.threshold, self.margin = metric, threshold, margin
    self.crossed: list[int | None] = [None] * n_models
    self.below = np.zeros(n_models, bool)  # seen below the threshold at some evaluation
    self.first = True
    self.diverged = np.zeros(n_models, bool)

  def observe(self, step: int, values, diverged) -> None:
    """One evaluation: ``values`` [E] of the metric (NaN/None ignored), ``diverged`` [E] bool."""
    self.diverged |= np.asarray(diverged, bool)
    finite = [v is not None and math.isfinite(v) for v in values]
    above = [i for i, v in enumerate(values) if finite[i] and v >= self.threshold]
    if self.first and above:
      log.warning(
        "sweep.stop_threshold = %g is already reached before emergence: %s at update %d is "
        "%s for model(s) %s; those crossings are not counted (a model must first be seen "
        "below the threshold); raise sweep.stop_threshold above this baseline",
        self.threshold,
        self.metric,
        step,
        ", ".join(f"{values[i]:.4f}" for i in above),
        ", ".join(map(str, above)),
      )
    self.first = False
    for i, v in enumerate(values):
      if not finite[i]:
        continue
      if v < self.threshold:
        self.below[i] = True
      elif self.crossed[i] is None and self.below[i]:
        self.crossed[i] = step

  def done(self, step: int) -> bool:
    return all(
      d or (c is not None and step >= self.margin * c) for c, d in zip(self.crossed, self.diverged)
    )


def replay(stop_rule: EmergenceStop, rows: list[dict], metric: str) -> None:
  """Feeds a resumed run's logged evaluations (``metrics.jsonl`` rows) to its stop rule, in
  step order."""
  by_step: dict[int, list[dict]] = {}
  for r in rows:
    by_step.setdefault(r["step"], []).append(r)
  for step in sorted(by_step):
    group = by_step[step]
    stop_rule.observe(
      step, [r.get(metric) for r in group], [bool(r.get("diverged")) for r in group]
    )
