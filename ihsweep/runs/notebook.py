"""A run directory from a notebook: ``run = ihsweep.load_run(DIR)``.

One object per run directory — a sweep (``ihsweep run``: ``cells.csv``, ``groups/gNNN/``) or a
single run (``ihsweep train``) — that answers in the run's own terms, one model (cell) at a
time:

* ``run.cells``: one row per model (cell id, group, seed, grid axes, batch size B, context
  size C, peak lr, n_params, diverged, …), a pandas DataFrame;
* ``run.metrics``: the online evaluations (every group's ``metrics.jsonl``: one row per cell and
  evaluation step — prefix-matching score ``ps``/``ps_max``, ``la``, ``dla``, ``ar_acc``,
  ``val_loss``, ``icl_score``, …), ``run.train_log``: the training loss and gradient norm per
  cell and host call (``train_log.jsonl``);
* ``run.steps(cell)``: the updates at which params were saved; ``run.params(cell, step)``: that
  model's params (the ensemble checkpoint's slice, no ensemble axis); ``run.model(cell, step)``:
  a callable giving its logits and internals (attention patterns, each head's output) for
  tokens;
* ``run.probes(cell)``: the repeated-token probes and held-out sequences the run was measured
  on; ``run.tokenizer()``: the BPE of a natural-text run.

Everything is read-only: nothing is written into the run directory (checkpoints are opened
read-only, so a run still training can be read; only its complete checkpoints are listed).
Built on the run-directory reader ``ihsweep.runs.reader`` (which the analysis package uses too),
whose ``Run`` ``run.analysis`` exposes (for ``ihsweep_analysis.curves.compute_curves`` and the
rest of the report's machinery).

Errors are ``ValueError`` subclasses that say what is allowed: ``NotARun`` for a directory that
holds no run, ``UnknownCell`` naming the valid cell ids, ``StepNotSaved`` naming the saved
steps.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pandas as pd

from ihsweep.base.errors import IhsweepError
from ihsweep.runs import reader

NotARun = reader.NotARun


class UnknownCell(IhsweepError, ValueError):
  """A cell id that is not a model of this run (or whose group cannot be read)."""


class StepNotSaved(IhsweepError, ValueError):
  """An update at which the cell's params were not saved."""


class CheckpointUnreadable(IhsweepError, ValueError):
  """A params checkpoint listed as complete that cannot be read (a file damaged or cut short
  after it was written)."""


@dataclasses.dataclass(frozen=True)
class ModelProbes:
  """One model's evaluation inputs (``ihsweep.data.probes``, saved in ``probes.npz``).

  Attributes:
    repeated: int32 ``[N, T]`` repeated-token probes (a block of L distinct random ids, then the
      same block again, as the last 2L tokens, the first at ``T − 2L``; T = 2L with
      ``eval.probe_position = 'start'``, C/2 + L with ``'middle'`` and C with ``'end'``, after
      T − 2L filler ids), shared by every model of the run.
    sequences: int32 ``[S, C + 1]`` this model's held-out sequences of its own data source.
    recall: bool ``[S, C]`` positions of ``sequences`` whose next token repeats an earlier
      successor (the data-drawn associative-recall prompts ``… A B … A``).
    block_len: L, the repeated block's length (second copy at positions T − L … T − 1).
  """

  repeated: np.ndarray
  sequences: np.ndarray
  recall: np.ndarray
  block_len: int


class Model:
  """One model of a run at one saved step, as a function of tokens.

  ``model(tokens)`` with int ``tokens`` ``[T]`` (or a batch ``[B, T]``), ids in
  ``[0, vocab_size)`` and ``1 <= T <= max_context``, returns float32 numpy logits ``[T, V]``
  (``[B, T, V]``): the logit at position t predicts token t + 1. ``model(tokens,
  return_internals=True)`` returns ``(logits, internals)`` with float32 numpy arrays (for a
  batch, a B axis after the layer axis, as ``ihsweep.compute.model.Transformer`` documents):

    ``attn``        ``[n_layers, n_heads, T, T]`` attention probabilities (row t: where
                    position t attends; rows sum to 1, zero above the diagonal),
    ``head_out``    ``[n_layers, T, n_heads, d_model]`` each head's write into the residual
                    stream (z_h W_O^h, without the shared output bias),
    ``z``           ``[n_layers, T, n_heads, d_head]`` each head's attention-weighted values,
    ``resid_final`` ``[T, d_model]`` the residual stream before the final LayerNorm.

  The forward is ``Transformer(config).apply({"params": params}, tokens)``, jit-compiled once per
  token shape, with the params of this model alone (``Run.params``).

  Attributes:
    cell, step: which model (cell id) and when (updates done).
    config: its ``ihsweep.compute.model.ModelConfig``.
    params: its params (nested dict of jax arrays, no ensemble axis).
  """

  def __init__(self, cell: int, step: int, config, params):
    from ihsweep.compute.model import Transformer

    self.cell, self.step, self.config, self.params = cell, step, config, params
    self._module = Transformer(config)
    self._fns: dict[bool, Any] = {}

  def __repr__(self) -> str:
    c = self.config
    return (
      f"Model(cell={self.cell}, step={self.step}, n_layers={c.n_layers}, "
      f"n_heads={c.n_heads}, d_model={c.d_model}, d_mlp={c.d_mlp}, "
      f"vocab_size={c.vocab_size}, pos_encoding={c.pos_encoding!r})"
    )

  def _fn(self, return_internals: bool):
    if return_internals not in self._fns:
      import jax

      module = self._module
      self._fns[return_internals] = jax.jit(
        lambda p, t: module.apply({"params": p}, t, return_internals=return_internals)
      )
    return self._fns[return_internals]

  def _tokens(self, tokens) -> np.ndarray:
    x = np.asarray(tokens)
    cfg = self.config
    if x.dtype == bool or not np.issubdtype(x.dtype, np.integer):
      raise ValueError(f"tokens: integer token ids are needed, got dtype {x.dtype}")
    if x.ndim not in (1, 2) or x.shape[-1] < 1:
      raise ValueError(f"tokens: shape [T] or [B, T] with T >= 1 is needed, got {x.shape}")
    if x.shape[-1] > cfg.max_context:
      raise ValueError(
        f"tokens: T = {x.shape[-1]} is longer than model.max_context = {cfg.max_context}"
      )
    if x.size and (x.min() < 0 or x.max() >= cfg.vocab_size):
      raise ValueError(
        f"tokens: ids must be in [0, {cfg.vocab_size}) (model.vocab_size), got "
        f"min {x.min()}, max {x.max()}"
      )
    return x.astype(np.int32)

  def __call__(self, tokens, return_internals: bool = False):
    x = self._tokens(tokens)
    one = x.ndim == 1
    out = self._fn(bool(return_internals))(self.params, x[None] if one else x)
    if not return_internals:
      logits = np.asarray(out)
      return logits[0] if one else logits
    logits, internals = out
    internals = {k: np.asarray(v) for k, v in internals.items()}
    if one:  # drop the batch axis: after the layer axis, or leading for resid_final
      internals = {k: v[0] if k == "resid_final" else v[:, 0] for k, v in internals.items()}
    logits = np.asarray(logits)
    return (logits[0] if one else logits), internals

  def attention(self, tokens) -> np.ndarray:
    """float32 ``[n_layers, n_heads, T, T]`` attention probabilities for tokens ``[T]``
    (``[n_layers, B, n_heads, T, T]`` for ``[B, T]``)."""
    return self(tokens, return_internals=True)[1]["attn"]


class Run:
  """A run directory read for a notebook (the module docstring lists what it offers).

  Attributes:
    dir: the run directory (absolute).
    kind: ``'sweep'`` (``ihsweep run``) or ``'train'`` (``ihsweep train``).
    config: the resolved config (``config.json``; for a sweep the sweep's, each group's own with
      ``config_of(cell)``).
    warnings: what was skipped while reading (a group not started, a damaged file, …).
    analysis: the underlying ``ihsweep.runs.reader.Run`` (the run-directory reader).
  """

  def __init__(self, inner: reader.Run):
    self.analysis = inner
    self.dir, self.kind, self.config, self.warnings = (
      inner.dir,
      inner.kind,
      inner.config,
      inner.warnings,
    )
    self._groups = {g.id: g for g in inner.groups}
    self._where: dict[int, tuple[str, int]] = {}  # cell -> (group id, ensemble index)
    for g in inner.groups:
      for i, cell in enumerate(g.cells["cell"]):
        self._where[int(cell)] = (g.id, i)
    self._metrics = None
    self._train_log = None
    self._ensemble = None  # (group id, step, ensemble params): the last restored

  def __repr__(self) -> str:
    return (
      f"Run({self.dir!r}, kind={self.kind!r}, cells={len(self.cells)}, groups={len(self._groups)})"
    )

  def __enter__(self) -> "Run":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Closes the checkpoint readers (the Run can be used again: they reopen)."""
    self._ensemble = None
    self.analysis.close()

  # ------------------------------------------------------------------ tables

  @property
  def cells(self) -> pd.DataFrame:
    """One row per model: ``cell``, ``group``, ``seed``, the grid axes (e.g. ``data.frequency``),
    ``batch_size`` (B), ``context_size`` (C), ``peak_lr``, ``n_params``, ``diverged``,
    ``diverged_step``, … (sweeps: cells.csv's columns), sorted by cell."""
    return self.analysis.cells.sort_values("cell").reset_index(drop=True)

  @property
  def cell_ids(self) -> list[int]:
    """The cells whose group can be read (``params``/``model``/``probes`` accept these)."""
    return sorted(self._where)

  @property
  def axes(self) -> list[str]:
    """The grid's config-field columns of ``cells`` (e.g. ``['train.batch_size']``)."""
    return list(self.analysis.axes)

  @property
  def metrics(self) -> pd.DataFrame:
    """The online evaluations of every group (``metrics.jsonl``; docs/usage.md, "Online
    metrics"): one row per (cell, step) with ``group``, ``cell``, ``seed``, ``step`` (updates),
    ``tokens`` (per model), ``train_loss``, ``val_loss`` (nats/token), ``ps``
    (``[layer][head]`` lists), ``ps_max``, ``la_max``, ``dla_max``, ``ar_acc``, ``ar_rank``,
    ``icl_score``, …; sorted by cell and step. Empty if evaluation was off
    (``eval.every_steps = 0``)."""
    if self._metrics is None:
      frames = []
      for g in self._groups.values():
        df = g.online_metrics(self.warnings)
        if not df.empty:
          df.insert(0, "group", g.id)
          frames.append(df)
      df = (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(
          {
            "group": pd.Series(dtype=object),
            "cell": pd.Series(dtype=int),
            "step": pd.Series(dtype=int),
          }
        )
      )
      self._metrics = df.sort_values(["cell", "step"], kind="stable").reset_index(drop=True)
    return self._metrics.copy()

  @property
  def train_log(self) -> pd.DataFrame:
    """The training log (``train_log.jsonl``, one row per host call and model): ``group``,
    ``cell``, ``step`` (updates done at the call's end), ``tokens`` (per model), ``updates`` (in
    the call), ``loss`` (mean training loss over the call's updates, nats/token; NaN once the
    model diverged) and ``grad_norm``; sorted by cell and step."""
    if self._train_log is None:
      from ihsweep.runs import rundir

      rows = []
      for g in self._groups.values():
        order = [int(c) for c in g.cells["cell"]]
        for row in rundir.read_jsonl(os.path.join(g.dir, "train_log.jsonl")):
          try:
            losses, norms = row["loss"], row.get("grad_norm")
            losses = losses if isinstance(losses, list) else [losses]
            norms = norms if isinstance(norms, list) else [norms] * len(losses)
            base = {
              "group": g.id,
              "step": int(row["step"]),
              "tokens": row.get("tokens"),
              "updates": row.get("updates"),
            }
          except (KeyError, TypeError, ValueError):
            continue
          if len(losses) != len(order):
            continue
          for cell, loss, norm in zip(order, losses, norms):
            rows.append(
              {
                **base,
                "cell": cell,
                "loss": np.nan if loss is None else float(loss),
                "grad_norm": np.nan if norm is None else float(norm),
              }
            )
      cols = ["group", "cell", "step", "tokens", "updates", "loss", "grad_norm"]
      df = pd.DataFrame(rows, columns=cols)
      self._train_log = df.sort_values(["cell", "step"], kind="stable").reset_index(drop=True)
    return self._train_log.copy()

  # ------------------------------------------------------------------ one model

  def _locate(self, cell) -> tuple[reader.Group, int]:
    """(group, ensemble index) of ``cell``, or ``UnknownCell`` naming the valid ids."""
    valid = self.cell_ids
    shown = _ids(valid)
    if isinstance(cell, (bool, np.bool_)) or not isinstance(cell, (int, np.integer)):
      raise UnknownCell(f"cell = {cell!r}: a cell id (int) is needed; this run's cells are {shown}")
    cell = int(cell)
    if cell not in self._where:
      cells = self.analysis.cells
      listed = cells.loc[cells["cell"].astype(int) == cell, "group"].tolist()
      if listed:  # in the cells table, but its group was skipped: say why
        said = [w for w in self.warnings if w.startswith(f"group {listed[0]} ")]
        why = said[0] if said else f"group {listed[0]} cannot be read (see run.warnings)"
        raise UnknownCell(f"cell = {cell} cannot be read: {why}; readable cells: {shown}")
      raise UnknownCell(f"cell = {cell} is not a model of this run; valid cells: {shown}")
    gid, index = self._where[cell]
    return self._groups[gid], index

  def group_of(self, cell: int) -> str:
    """The id of the cell's group (``'g000'``, …; ``'run'`` for a single run)."""
    return self._locate(cell)[0].id

  def config_of(self, cell: int):
    """The resolved config of the cell's group (an ``ml_collections.ConfigDict``: its B, C,
    data knobs and the ensemble it was trained in)."""
    return self._locate(cell)[0].config

  def model_config(self, cell: int):
    """The cell's ``ihsweep.compute.model.ModelConfig`` (n_layers, n_heads, d_model, vocab_size,
    …)."""
    from ihsweep.compute.model import ModelConfig

    return ModelConfig.from_config(self.config_of(cell).model)

  def steps(self, cell: int) -> list[int]:
    """Updates at which the cell's params were saved (complete checkpoints only), ascending;
    empty if its run saved none (``checkpoint.params_schedule = 'none'``)."""
    return self._locate(cell)[0].steps()

  def _step(self, cell, step) -> tuple[reader.Group, int, int]:
    """(group, ensemble index, step) with ``step`` checked against the saved ones (None: the
    last saved)."""
    group, index = self._locate(cell)
    saved = group.steps()
    if step is None and saved:
      return group, index, saved[-1]
    if (
      isinstance(step, (bool, np.bool_))
      or not isinstance(step, (int, np.integer))
      or int(step) not in saved
    ):
      why = (
        "no params checkpoints were saved (checkpoint.params_schedule = 'none', or none "
        "complete yet)"
        if not saved
        else f"saved steps: {_ids(saved)}{_nearest(saved, step)}"
      )
      raise StepNotSaved(
        f"step = {step!r}: cell {int(cell)} (group {group.id}) has no params "
        f"checkpoint at that update; {why}"
      )
    return group, index, int(step)

  def params(self, cell: int, step: int | None = None) -> dict:
    """The params of model ``cell`` after ``step`` updates (default: its last saved step): the
    ensemble checkpoint's slice at the cell's index (nested dict of jax arrays on the first
    local device, storage dtype — float32 unless ``model.param_dtype`` says otherwise — shaped
    as one ``ihsweep.compute.model.Transformer``'s params, no ensemble axis). The ensemble of the
    last step read is kept, so other cells of the group at that step cost no second read.

    Raises:
      UnknownCell: ``cell`` is not a readable model of this run (the message lists the valid ids).
      StepNotSaved: no params checkpoint at ``step`` (the message lists the saved steps).
      CheckpointUnreadable: the checkpoint at ``step`` is damaged (the message lists the others).
    """
    import jax

    group, index, step = self._step(cell, step)
    if self._ensemble is None or self._ensemble[:2] != (group.id, step):
      try:
        ensemble = group.params(step)
      except Exception as e:  # orbax/tensorstore: any type, messages of a few kB
        others = [s for s in group.steps() if s != step]
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise CheckpointUnreadable(
          f"step = {step}: cell {int(cell)} (group {group.id}): the params checkpoint at that "
          f"update cannot be read ({type(e).__name__}: {first}); it is damaged or was cut "
          f"short; other saved steps: {_ids(others)}"
        ) from e
      self._ensemble = (group.id, step, ensemble)
    ensemble = self._ensemble[2]
    return jax.tree_util.tree_map(lambda x: x[index], ensemble)

  def model(self, cell: int, step: int | None = None) -> Model:
    """Model ``cell`` after ``step`` updates (default: its last saved step) as a callable
    (``Model``: tokens ``[T]`` int → logits ``[T, V]`` float32, internals with
    ``return_internals=True``).

    Raises:
      UnknownCell, StepNotSaved, CheckpointUnreadable: as ``params``.
    """
    step = self._step(cell, step)[2]
    return Model(int(cell), step, self.model_config(cell), self.params(cell, step))

  def probes(self, cell: int) -> ModelProbes:
    """The evaluation inputs of model ``cell`` (``ModelProbes``: repeated-token probes int32
    ``[N, 2L]``, its held-out sequences int32 ``[S, C + 1]``, …), read from ``probes.npz``.

    Raises:
      UnknownCell: as ``params``.
      ValueError: the run saved no probes (evaluation was off: ``eval.every_steps = 0``).
    """
    group, index = self._locate(cell)
    p = group.probes()
    if p is None:
      raise ValueError(
        f"group {group.id} has no probes.npz: evaluation was off "
        f"(eval.every_steps = 0), so the run saved no probes"
      )
    return ModelProbes(
      repeated=np.asarray(p.repeated, np.int32),
      sequences=np.asarray(p.sequences[index], np.int32),
      recall=np.asarray(p.recall[index], bool),
      block_len=int(p.block_len),
    )

  def tokenizer(self):
    """The HF ``tokenizers.Tokenizer`` of a natural-text run (``data.source = 'natural'``):
    ``tok.decode(ids)`` turns model token ids into text, ``tok.encode(text).ids`` text into ids
    (id 0 is ``<|endoftext|>``). A ``data.tokenizer`` file is loaded as is; a trained BPE
    comes from the corpus cache that training filled (``data.cache_dir``/``$IHSWEEP_CACHE``;
    on another machine ``ihsweep.data.corpus.prepare_corpus`` builds it there first, from the
    same documents) — nothing is written in the run directory.

    Raises:
      ValueError: the run's data is not natural text (generated sources and Markov chains use
        token ids directly; a bigram Markov source's ids rank BPE types by frequency, they are
        not tokenizer ids); ``ihsweep.data.errors.CorpusError`` when the corpus cannot be read here.
    """
    cfg = self.config if self.config is not None else next(iter(self._groups.values())).config
    data = cfg.data
    if data.source != "natural":
      raise ValueError(
        f"config.data.source = {data.source!r}: only a natural-text run "
        f"(data.source = 'natural') has a tokenizer; this run's token ids are "
        f"the model's vocabulary itself"
      )
    from ihsweep.data import corpus
    from ihsweep.data import tokenizer as tokenizer_lib

    vocab = int(cfg.model.vocab_size)
    if data.tokenizer != "bpe":
      return tokenizer_lib.load_tokenizer(os.path.expanduser(data.tokenizer), vocab)
    return corpus.prepare_corpus(data, vocab).tokenizer

  # ------------------------------------------------------------------ export (ihsweep.runs.export)

  def to_transformer_lens(self, cell: int, step: int | None = None, **kwargs):
    """Model ``cell`` after ``step`` updates (default: its last saved step) as a TransformerLens
    ``HookedTransformer`` with the same logits (``ihsweep.runs.export.to_transformer_lens``; kwargs
    ``dtype``, ``device``). Needs ``pip install 'ihsweep[interop]'``.

    Raises:
      UnknownCell, StepNotSaved: as ``params``.
    """
    from ihsweep.runs import export

    return export.to_transformer_lens(self.model(cell, step), **kwargs)

  def to_hf(self, cell: int, step: int | None = None, **kwargs):
    """Model ``cell`` after ``step`` updates as a Hugging Face ``GPT2LMHeadModel`` with the same
    logits (``ihsweep.runs.export.to_hf``; kwarg ``dtype``): learned positions with MLPs only.

    Raises:
      UnknownCell, StepNotSaved: as ``params``; ``ihsweep.runs.export.ExportError`` for a rotary or
      attention-only model.
    """
    from ihsweep.runs import export

    return export.to_hf(self.model(cell, step), **kwargs)

  def export(self, cell: int, step: int | None = None, *, to: str, out) -> str:
    """Writes model ``cell`` after ``step`` updates (default: the last saved) to the new path
    ``out``, ``to`` = ``'transformer_lens'`` (one torch file) or ``'hf'`` (a
    ``save_pretrained`` directory), as ``ihsweep export`` does (formats:
    ``ihsweep.runs.export``). Returns ``out``.

    Raises:
      UnknownCell, StepNotSaved: as ``params``; ``ihsweep.runs.export.ExportError`` for an existing
      ``out`` or a model the target cannot hold.
    """
    from ihsweep.runs import export

    return export.export_run(self, cell, step, to, out)[0]


def _nearest(saved: list[int], step) -> str:
  """'; nearest to 1000: 861, 1024' for an integer step between saved ones (a long list of
  saved steps is shortened and may hide them); '' otherwise."""
  if not isinstance(step, (int, np.integer)) or isinstance(step, (bool, np.bool_)):
    return ""
  below = [s for s in saved if s < step][-1:]
  above = [s for s in saved if s > step][:1]
  return f"; nearest to {int(step)}: {', '.join(map(str, below + above))}"


def _ids(values: list[int], limit: int = 12) -> str:
  """``0, 1, 2, … 40`` (first ``limit`` and the last), or 'none'."""
  if not values:
    return "none"
  head = ", ".join(map(str, values[:limit]))
  return head + (f", … {values[-1]}" if len(values) > limit else "")


def load_run(path: str | os.PathLike) -> Run:
  """Opens a run directory for a notebook (read-only): a sweep (``ihsweep run``) or a single run
  (``ihsweep train``), finished or still training.

  Example (docs/analysis.md "From a notebook")::

    run = ihsweep.load_run("runs/induction")
    run.metrics.pivot(index="step", columns="cell", values="ps_max")
    logits, internals = run.model(0, run.steps(0)[-1])(tokens, return_internals=True)

  Raises:
    NotARun: ``path`` is not a directory, or holds neither a sweep (cells.csv) nor a run
      (config.json with checkpoints/ or metrics.jsonl).
  """
  return Run(reader.load_run(os.fspath(path)))
