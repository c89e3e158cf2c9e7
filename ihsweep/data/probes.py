"""Inputs of the induction-head metrics, deterministic from ``eval.probe_seed``.

* Repeated-token probes (the study's, docs/study.md): N sequences, each a block of L = min(50, C/2)
  distinct random token ids (no special tokens: a corpus's end-of-text id and every token its
  tokenizer marks special, e.g. ``<pad>``, ``<bos>``) followed by the same block again, no BOS;
  L ≥ 3 (``block_length``). With ``eval.probe_position = 'start'`` (the study's) the two blocks
  are the whole input, positions 0 … 2L − 1; with ``'middle'`` the second block starts at C/2
  (after C/2 − L filler ids); with ``'end'`` they fill the last 2L positions of a C-token input
  (``probe_layout``). A fixed L at 'middle' or 'end' measures every C at the same place relative
  to its context, so a context-size effect is not the probe's. The
  ids come from the whole vocabulary, as in the study, or (``eval.probe_top_k`` = K) from the K
  most frequent tokens of the training data: on a small corpus many ids are rare or never
  trained, and a probe made of them measures nothing.
* Held-out sequences of the run's own data source (same vocabulary and statistics as training):
  the validation split of a corpus, or fresh draws of a generated source with a key no update
  uses; one set per model, since models may differ in their data knobs. They give the validation
  loss, the ICL score, and the data-drawn associative-recall prompts ``… A B … A``
  (``recall_positions``).

Every model of a run (and every run with the same seed, C and vocabulary) is measured on the same
repeated-token probes. The runner saves the probes as ``probes.npz`` in the run directory and
reuses that file on resume, so a run is always measured on the sequences it started with.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from ihsweep.base.atomic import atomic_file
from ihsweep.data.keys import step_keys

MAX_BLOCK = 50  # the study's L = min(50, C/2)
MIN_BLOCK = 3
POSITIONS = ("start", "middle", "end")  # eval.probe_position
MIN_BLOCK_REASON = (
  f"the metrics need L >= {MIN_BLOCK} (at L = 2 the induction target i − L + 1 "
  f"is the previous token, so a previous-token head scores PS = 1)"
)


@dataclasses.dataclass(frozen=True)
class Probes:
  """repeated: int32 ``[N, T]``, the two blocks at positions T − 2L … T − 1 (T = 2L, C/2 + L
  or C for 'start', 'middle', 'end': ``probe_layout``); sequences: int32 ``[E, S, C + 1]``;
  recall: bool ``[E, S, C]`` (``recall_positions`` of each model's sequences); block_len: L;
  candidates: how the probe ids were chosen (for the log and the record)."""

  repeated: np.ndarray
  sequences: np.ndarray
  recall: np.ndarray
  block_len: int
  candidates: str

  def save(self, path: str) -> None:
    """Writes ``path`` (an ``.npz``) atomically."""
    with atomic_file(path, "wb") as f:
      np.savez(
        f,
        repeated=self.repeated,
        sequences=self.sequences,
        recall=self.recall,
        block_len=self.block_len,
        candidates=self.candidates,
      )

  @classmethod
  def load(cls, path: str) -> "Probes":
    with np.load(path, allow_pickle=False) as z:
      return cls(
        repeated=z["repeated"],
        sequences=z["sequences"],
        recall=z["recall"],
        block_len=int(z["block_len"]),
        candidates=str(z["candidates"]),
      )


def block_length(context_size: int, probe_len: int = 0) -> int:
  """L: ``probe_len`` if set, else min(50, C // 2) (the study's).

  Raises:
    ValueError: L < 3 (``config.validate`` names the field first when evaluation is on).
  """
  block = probe_len or min(MAX_BLOCK, context_size // 2)
  if block < MIN_BLOCK:
    why = (
      f"eval.probe_len = {probe_len}"
      if probe_len
      else f"train.context_size = {context_size}: L = min({MAX_BLOCK}, C // 2); C >= "
      f"{2 * MIN_BLOCK} needed"
    )
    raise ValueError(
      f"repeated-token probes with a block of L = {block} ({why}): {MIN_BLOCK_REASON}"
    )
  return block


def probe_layout(context_size: int, probe_len: int = 0, position: str = "start") -> tuple:
  """``(L, T)``: the block length (``block_length``) and the probes' length in tokens — 2L for
  ``position = 'start'`` (the blocks are the whole input), C/2 + L for ``'middle'`` (C/2 − L
  filler ids, then the blocks: the second starts at position C/2), C for ``'end'`` (C − 2L
  filler ids, then the blocks). The first block starts at ``T − 2L`` (``block_start``); the
  model is causal, so nothing after the second block would change the scores.

  Raises:
    ValueError: L < 3; ``position`` not in ``POSITIONS``.
  """
  if position not in POSITIONS:
    raise ValueError(f"eval.probe_position = {position!r}: one of {', '.join(POSITIONS)}")
  block = block_length(context_size, probe_len)
  length = {"start": 2 * block, "middle": context_size // 2 + block, "end": context_size}
  return block, int(length[position])


def eval_layout(eval_cfg, context_size: int) -> tuple:
  """``probe_layout`` for a config's ``eval`` section (``probe_len``, ``probe_position``; a run
  written before ``probe_position`` existed has the study's 'start')."""
  return probe_layout(
    context_size, int(eval_cfg.probe_len), eval_cfg.get("probe_position", "start")
  )


def block_start(probe_tokens: int, block_len: int) -> int:
  """Position of the first block's first token in probes of ``probe_tokens`` (T) tokens: T − 2L
  (0 for the study's probes, which are the two blocks alone)."""
  return int(probe_tokens) - 2 * int(block_len)


def special_token_ids(source) -> tuple[int, ...]:
  """Ids probes never use, ascending: the source's ``special_ids`` (``Source.special_ids``: a
  corpus's end-of-text id and every token its tokenizer marks special — a user
  ``tokenizer.json``'s ``<pad>``, ``<bos>``, ``<unk>`` etc.; added tokens not marked special are
  text and stay)."""
  return tuple(sorted(int(i) for i in source.special_ids))


def probe_candidates(
  vocab_size: int, special_ids=(), top_k: int = 0, counts: np.ndarray | None = None
) -> np.ndarray:
  """Token ids probes may use, int64 ascending: every id but ``special_ids``, or the ``top_k``
  most frequent by ``counts`` ``[V]`` (ties broken by the smaller id)."""
  ids = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids, np.int64))
  if not top_k:
    return ids
  order = np.lexsort((ids, -np.asarray(counts)[ids]))
  return np.sort(ids[order[:top_k]])


def repeated_token_probes(
  seed: int, n_probes: int, block_len: int, candidates: np.ndarray, length: int = 0
) -> np.ndarray:
  """int32 ``[n_probes, T]`` (T = ``length``, default 2L): per probe, T − 2L filler ids, then L
  distinct ids drawn uniformly from ``candidates``, then the same L ids again. Filler ids are
  drawn uniformly, with replacement, from the candidates not in the probe's block, so the only
  earlier occurrence of a second-block token is its copy in the first block (the
  prefix-matching target is unique). The blocks do not depend on ``length``.

  Raises:
    ValueError: fewer than L candidates; ``length`` < 2L; filler needed and no candidate outside
      the block.
  """
  length = length or 2 * block_len
  if len(candidates) < block_len:
    raise ValueError(
      f"{len(candidates)} candidate ids cannot fill a block of {block_len} distinct tokens"
    )
  if length < 2 * block_len:
    raise ValueError(f"probes of {length} tokens cannot hold two blocks of L = {block_len}")
  rng = np.random.default_rng([seed, 0])
  blocks = np.stack([rng.choice(candidates, block_len, replace=False) for _ in range(n_probes)])
  fill = length - 2 * block_len
  if fill and len(candidates) == block_len:
    raise ValueError(
      f"{len(candidates)} candidate ids: filler before a block of {block_len} needs at least "
      f"one id outside the block"
    )
  filler_rng = np.random.default_rng([seed, 1])
  filler = np.stack(
    [filler_rng.choice(np.setdiff1d(candidates, b), fill, replace=True) for b in blocks]
  ).reshape(n_probes, fill)
  return np.concatenate([filler, blocks, blocks], axis=1).astype(np.int32)


def recall_positions(sequences_SxCp1: np.ndarray) -> np.ndarray:
  """bool ``[S, C]``: True at input position i when token A = x[i] occurred before, its most
  recent earlier occurrence j satisfies j + 1 < i (so ``A B … A``), and the true next token
  x[i + 1] is that occurrence's successor B = x[j + 1] — the associative-recall prompts of the
  data, whose correct answer is the induction answer."""
  seqs = np.asarray(sequences_SxCp1)
  s, cp1 = seqs.shape
  out = np.zeros((s, cp1 - 1), bool)
  for r in range(s):
    row = seqs[r].tolist()
    last: dict[int, int] = {}
    for i in range(cp1 - 1):
      j = last.get(row[i])
      if j is not None and j + 1 < i and row[i + 1] == row[j + 1]:
        out[r, i] = True
      last[row[i]] = i
  return out


def held_out_sequences(source, data_params, arrays, seed: int, n: int, n_models: int) -> np.ndarray:
  """int32 ``[E, n, C + 1]``: the source's held-out windows (``held_out_windows``) for
  every model, or fresh draws per model from the key ``fold_in(PRNGKey(seed), 1)`` (no update
  of any model uses it: training keys derive from each model's own seed)."""
  key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
  windows = source.held_out_windows(key, n)
  if windows is not None:
    return np.broadcast_to(windows, (n_models,) + windows.shape).astype(np.int32)
  calls = math.ceil(n / source.batch_size)
  keys = step_keys(key, 0, calls)

  def one_model(dp):
    return jax.vmap(source.sample, in_axes=(0, None, None))(keys, dp, arrays)

  seqs = np.asarray(jax.jit(jax.vmap(one_model, axis_size=n_models))(data_params))
  # [E, calls, B, C + 1]
  return seqs.reshape(n_models, -1, seqs.shape[-1])[:, :n].astype(np.int32)


def make_probes(source, data_params, arrays, eval_cfg, n_models: int, context_size: int) -> Probes:
  """All probes of a run from ``eval_cfg`` (``probe_seed``, ``n_probes``, ``probe_len``,
  ``probe_position``, ``probe_top_k``, ``n_sequences``). Special tokens (``special_token_ids``)
  never appear in repeated-token probes; top-K frequencies come from
  ``source.train_token_counts()`` when the source has them (a corpus's training split), else from
  the held-out sequences.

  Raises:
    ValueError: L < 3 (``block_length``); fewer usable ids than L or than ``probe_top_k``; no
      id left for filler (``repeated_token_probes``).
  """
  block, length = eval_layout(eval_cfg, context_size)
  seqs = held_out_sequences(
    source, data_params, arrays, eval_cfg.probe_seed, eval_cfg.n_sequences, n_models
  )
  special = special_token_ids(source)
  counts, how = None, "all ids"
  if eval_cfg.probe_top_k:
    counts, where = source.train_token_counts(), "training split"
    if counts is None:
      counts, where = (
        np.bincount(seqs.reshape(-1), minlength=source.vocab_size),
        "held-out sequences",
      )
    how = f"the {eval_cfg.probe_top_k} most frequent ids ({where})"
  ids = probe_candidates(source.vocab_size, special, eval_cfg.probe_top_k, counts)
  if special:
    shown = ", ".join(map(str, special[:8])) + (", …" if len(special) > 8 else "")
    how += f", {len(special)} special id(s) excluded ({shown})"
  repeated = repeated_token_probes(eval_cfg.probe_seed, eval_cfg.n_probes, block, ids, length)
  recall = np.stack([recall_positions(s) for s in seqs])
  return Probes(
    repeated=repeated,
    sequences=np.ascontiguousarray(seqs),
    recall=recall,
    block_len=block,
    candidates=how,
  )


def as_device_arrays(probes: Probes, ensemble_sharding, replicated):
  """(repeated, sequences, recall) on the mesh: probes replicated, per-model arrays sharded."""
  return (
    jax.device_put(np.asarray(probes.repeated), replicated),
    jax.device_put(np.asarray(probes.sequences), ensemble_sharding),
    jax.device_put(np.asarray(probes.recall), ensemble_sharding),
  )
