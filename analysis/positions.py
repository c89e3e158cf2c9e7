"""Where in the context a model's induction head works: its prefix-matching score on
repeated-token probes placed at the start, the middle and the end of the context.

A run measures its heads on probes at one place (``eval.probe_position``). A head can work there
and not elsewhere: trained on data whose repeats all sit in the second half of each sequence
(``data.induction_start = 'half'``), a model can learn to copy only past C/2, and a user who
tries it on a repeated random sequence from position 0 finds no induction head. This module
scores each model's best head (the layer and head with the highest prefix-matching score on
the run's own probes) at three places, for the report's table:

* start: the two blocks of L tokens are the whole input (positions 0 … 2L − 1, the study's);
* middle: the second block starts at C/2 (C/2 − L filler ids first);
* end: the blocks fill the last 2L positions of a C-token input.

The blocks are the run's own probe blocks (``probes.npz``: L distinct ids each, drawn from the
ids the run's probes may use), so the three places differ only in where the blocks sit; the
filler ids are drawn from the ids of the saved probes minus the probe's block (all other ids of
the vocabulary if that leaves none; ``probes.repeated_token_probes``'s rule, so each
second-block token's only earlier occurrence is its copy). Where 2L = C the three places are the
same input, and where L = C/2 start and middle are. Besides the
prefix-matching score (Olsson et al. 2022; ``ihsweep.compute.metrics.prefix_matching_score``), the
table gives the model's next-token accuracy on the second block (the argmax logit equals the
token the first block says comes next; the block's last position excluded, since its next token
is outside the probe).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

PLACES = ("start", "middle", "end")


def placed_probes(
  blocks_NxL: np.ndarray, context_size: int, place: str, seed: int = 0, ids=None, vocab_size=0
):
  """int32 ``[N, T]``: each block twice, at ``place`` in a C-token context (module docstring;
  T = 2L, C/2 + L or C). Filler ids are drawn uniformly, with replacement, from ``ids``
  (default: those in ``blocks_NxL``) minus the probe's own block, or from all ``vocab_size``
  ids but the block where that leaves none.

  Raises:
    ValueError: ``place`` not in ``PLACES``; 2L > C; filler needed and no id outside a block.
  """
  from ihsweep.data import probes as probes_lib

  blocks = np.asarray(blocks_NxL, np.int64)
  n, block = blocks.shape
  if 2 * block > context_size:
    raise ValueError(f"blocks of L = {block} do not fit twice in C = {context_size} tokens")
  _, length = probes_lib.probe_layout(context_size, block, place)
  fill = length - 2 * block
  ids = np.unique(blocks if ids is None else ids)
  rng = np.random.default_rng([seed, 2])
  rows = []
  for b in blocks:
    others = np.setdiff1d(ids, b)
    if fill and not others.size:
      others = np.setdiff1d(np.arange(vocab_size), b)
    if fill and not others.size:
      raise ValueError(
        f"filler before a block of {block} ids needs an id outside it; the vocabulary has "
        f"{vocab_size}"
      )
    rows.append(np.concatenate([rng.choice(others, fill, replace=True) if fill else [], b, b]))
  return np.asarray(rows, np.int32)


@functools.lru_cache(maxsize=16)
def _forward(cfg):
  """One compiled forward (logits, attention) per model config, shared by every model of it."""
  import jax

  from ihsweep.compute.model import Transformer

  module = Transformer(cfg)

  def forward(params, tokens):
    logits, internals = module.apply({"params": params}, tokens, return_internals=True)
    return logits, internals["attn"]

  return jax.jit(forward)


def place_scores(model, tokens_NxT: np.ndarray, block_len: int) -> dict:
  """Scores of one model (``ihsweep.runs.notebook.Model``: its ``config`` and ``params``) on probes
  ``[N, T]`` whose blocks are the last 2L tokens: ``ps`` float ``[n_layers, n_heads]`` (the
  prefix-matching score) and ``acc`` float, the next-token accuracy over second-block positions
  T − L … T − 2."""
  from ihsweep.compute.metrics import prefix_matching_score

  logits, attn = _forward(model.config)(model.params, np.asarray(tokens_NxT, np.int32))
  ps = np.asarray(prefix_matching_score(attn, block_len))
  t = tokens_NxT.shape[1]
  scored = np.arange(t - block_len, t - 1)  # the next token of each is the following one
  predicted = np.asarray(logits)[:, scored].argmax(-1)
  acc = float((predicted == tokens_NxT[:, scored + 1]).mean())
  return {"ps": ps, "acc": acc}


def head_positions(run, cells=None, n_probes: int = 64, seed: int = 0) -> pd.DataFrame:
  """One row per model (cell) at its last saved step: ``cell``, ``seed``, ``batch_size``,
  ``context_size``, ``step`` (updates), ``head`` ('L1H0': the best head on the run's own
  probes), ``probe_position`` (the run's own place), then ``ps_start``, ``ps_middle``,
  ``ps_end`` (that head's prefix-matching score, in [0, 1]) and ``acc_start``, ``acc_middle``,
  ``acc_end`` (next-token accuracy on the second block, in [0, 1]).

  ``run``: an ``ihsweep.runs.notebook.Run`` or an ``ihsweep.runs.reader.Run``; ``cells``: the cell
  ids (default all readable); ``n_probes``: how many of the run's probe blocks (at most those
  saved). Cells whose group has no probes or params are left out.
  """
  from ihsweep.runs.notebook import Run as NotebookRun

  nb = run if isinstance(run, NotebookRun) else NotebookRun(run)
  table = nb.cells.set_index("cell")
  axes = [a for a in nb.axes if a not in ("train.batch_size", "train.context_size")]
  rows = []
  for cell in cells if cells is not None else nb.cell_ids:
    try:
      saved = nb.probes(cell)
      model = nb.model(cell)
    except (ValueError, OSError):  # no probes (evaluation off), no params, a damaged file
      continue
    cfg = nb.config_of(cell)
    context = int(cfg.train.context_size)
    block = saved.block_len
    start = saved.repeated.shape[1] - 2 * block
    blocks = saved.repeated[:n_probes, start : start + block]
    own = cfg.eval.get("probe_position", "start")
    scores = {}
    for place in PLACES:
      try:
        tokens = placed_probes(
          blocks, context, place, seed, saved.repeated, model.config.vocab_size
        )
      except ValueError:  # no filler id outside a block: this place cannot be probed
        continue
      scores[place] = place_scores(model, tokens, block)
    if own not in scores:
      continue
    layer, head = np.unravel_index(np.argmax(scores[own]["ps"]), scores[own]["ps"].shape)
    row = {"cell": int(cell), "seed": int(table.loc[cell, "seed"])}
    row.update({a: table.loc[cell, a] for a in axes if a in table})
    row.update(
      batch_size=int(table.loc[cell, "batch_size"]),
      context_size=context,
      block_len=block,
      step=model.step,
      head=f"L{layer}H{head}",
      probe_position=own,
    )
    nan = {"ps": np.full_like(scores[own]["ps"], np.nan), "acc": np.nan}
    row.update({f"ps_{p}": float(scores.get(p, nan)["ps"][layer, head]) for p in PLACES})
    row.update({f"acc_{p}": scores.get(p, nan)["acc"] for p in PLACES})
    rows.append(row)
  return pd.DataFrame(rows)


def _keys(table: pd.DataFrame) -> list[str]:
  """The columns that tell grid points apart: run, the grid axes, then B and C."""
  not_keys = {"cell", "seed", "block_len", "step", "head", "probe_position", "batch_size"}
  not_keys.add("context_size")
  axes = [c for c in table.columns if c not in not_keys and not c.startswith(("ps_", "acc_"))]
  return sorted(axes, key=lambda c: c != "run") + ["batch_size", "context_size"]


def by_cell(table: pd.DataFrame) -> pd.DataFrame:
  """``head_positions`` averaged over seeds per grid point (``run`` and the grid axes if the
  table has them, B, C): those columns, ``models``, and the mean ``ps_*`` and ``acc_*``
  columns (2 decimals)."""
  cols = [f"{m}_{p}" for m in ("ps", "acc") for p in PLACES]
  grouped = table.groupby(_keys(table), sort=True, dropna=False)
  out = grouped[cols].mean().round(2)
  out.insert(0, "models", grouped.size())
  return out.reset_index()


def _point(keys: dict) -> str:
  """A grid point in words: 'B 8 × C 64' with any other axis ('data.induction_start half, …')."""
  other = [f"{k} {v}" for k, v in keys.items() if k not in ("batch_size", "context_size")]
  return ", ".join([*other, f"B {keys['batch_size']} × C {keys['context_size']}"])


WHERE = {
  "start": "at the start (the blocks are positions 0 … 2L − 1)",
  "middle": "across the middle (the second block from C/2)",
  "end": "at the end (the last 2L positions)",
}
WORKS = 0.3  # a mean score below this at a place: the heads do not work there


def words(table: pd.DataFrame, induction_starts=None) -> str:
  """The position table in a paragraph: per place, the mean and range over models of the best
  head's prefix-matching score and the mean next-token accuracy, and the places where the
  heads do not work (mean score below ``WORKS``) while they do elsewhere. ``induction_starts``:
  the runs' ``data.induction_start`` values where their data is 'markov' (None: not known);
  the hint to place repeats elsewhere is given only where one is not already 'anywhere'."""
  own = ", ".join(sorted(set(table["probe_position"])))
  parts = []
  for place in PLACES:
    ps = table[f"ps_{place}"]
    parts.append(
      f"{WHERE[place]} {ps.mean():.2f} ({ps.min():.2f}–{ps.max():.2f}), next token "
      f"{table[f'acc_{place}'].mean():.0%}"
    )
  text = (
    f"Each model's best head (the layer and head with the highest prefix-matching score on the "
    f"run's own probes, placed '{own}'), at its last saved update, scored on the same probe "
    f"blocks placed elsewhere in a C-token context (filler ids before them; "
    f"analysis/positions.py). Prefix-matching score, mean (range) over {len(table)} models, and "
    f"next-token accuracy on the second block: " + "; ".join(parts) + "."
  )
  own_ps = table.apply(lambda r: r[f"ps_{r['probe_position']}"], axis=1)
  misses = []
  for place in PLACES:
    weak = table[(table[f"ps_{place}"] < WORKS) & (own_ps >= WORKS)]
    if not weak.empty:
      keys = _keys(table)
      cells = weak.groupby(keys, dropna=False).size()
      shown = ", ".join(
        _point(dict(zip(keys, k if isinstance(k, tuple) else (k,))))
        + (f" ({n} models)" if n > 1 else "")
        for k, n in cells.items()
      )
      misses.append(f"{WHERE[place].split(' (')[0]} for {len(weak)} of {len(table)}: {shown}")
  same = sorted({int(c) for c, b in zip(table["context_size"], table["block_len"]) if 2 * b >= c})
  half = sorted(
    {int(c) for c, b in zip(table["context_size"], table["block_len"]) if c // 2 == b} - set(same)
  )
  if same:
    text += f" At C = {', '.join(map(str, same))} (= 2L) the three places are the same input"
    text += f"; at C = {', '.join(map(str, half))} start and middle are." if half else "."
  elif half:
    text += f" At C = {', '.join(map(str, half))} (L = C/2) start and middle are the same input."
  if misses:
    hint = induction_starts is None or any(s != "anywhere" for s in induction_starts)
    text += (
      f" Heads that work on the run's own probes score below {WORKS} "
      + "; ".join(misses)
      + ": there they are not induction heads (a model learns to copy where its training data "
      + ("put repeats; for markov data see data.induction_start)." if hint else "put repeats).")
    )
  return text
