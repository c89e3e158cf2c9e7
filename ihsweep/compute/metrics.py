"""Induction-head metrics: prefix-matching and previous-token scores, logit attribution,
associative recall, ICL score.

Every function is written for ONE model (no ensemble axis) and is pure; ``make_eval_fn`` vmaps
``evaluate`` over the ensemble. Conventions follow the study's released code (docs/study.md, "The
released code's choices that ihsweep follows") unless a docstring says otherwise.

Repeated-token probes (``ihsweep.data.probes``): ``N`` sequences of ``T`` tokens ending in a block
of ``L ≥ 3`` distinct ids followed by the same block; the first block starts at ``s = T − 2L``
(``s = 0``, ``T = 2L`` for the study's probes; ``T = C`` with filler before the blocks for
``eval.probe_position = 'end'``). In the second block, position ``i`` (``s + L ≤ i < s + 2L``)
holds the token of position ``i − L``; an induction head at ``i`` attends to ``i − L + 1`` (the
token after the earlier copy) and raises the logit of that token. Every metric on the probes
(PS, LA, DLA, AR) averages over all ``L`` second-block positions, and the correct next token at
``i`` is ``tokens[i − L + 1]``: ``tokens[i + 1]`` except at the last position, where it is the
block's first token ``tokens[s]`` (the one that followed the earlier occurrence), although the
sequence ends there (the study's released code). Below, ``i = L … 2L − 1`` is written for
``s = 0``; every position shifts by ``s``.

A model whose logits are NaN or ±inf (diverged) gets NaN, not a score: its recall ranks are
undefined (``recall_ranks``) and NaN activations propagate through PS, LA and DLA.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ihsweep.compute import metric_registry
from ihsweep.compute.model import ModelConfig, Transformer, unembedding_matrix
from ihsweep.data.probes import MIN_BLOCK, MIN_BLOCK_REASON


def __getattr__(name: str):
  # SUMMARY_KEYS: the registered metrics (``ihsweep.compute.metric_registry``), read at access
  # time.
  if name == "SUMMARY_KEYS":
    return metric_registry.names()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def prefix_matching_score(attn_LyxNxHxTxT: jax.Array, block_len: int) -> jax.Array:
  """Prefix-matching score per (layer, head), float32 ``[n_layers, n_heads]`` in [0, 1].

  ``PS = mean over probes n and second-block positions i of attn[n, i, i − L + 1]`` (Olsson et
  al. 2022, "In-context learning and induction heads", §"Prefix matching"; the study's code).
  ``attn``: attention probabilities ``[n_layers, N, n_heads, T, T]``, the blocks at positions
  ``T − 2L … T − 1``. Uniform causal attention scores the mean of 1/(i + 1) over those positions
  (``metric_registry.uniform_ps``).
  """
  i = _second_block(block_len, attn_LyxNxHxTxT.shape[-1])
  return attn_LyxNxHxTxT[..., i, i - block_len + 1].mean(axis=(1, 3))


def previous_token_score(attn_LyxNxHxTxT: jax.Array, block_len: int) -> jax.Array:
  """Previous-token score per (layer, head), float32 ``[n_layers, n_heads]`` in [0, 1].

  ``PT = mean over probes n and positions i of both blocks but the first (T − 2L + 1 … T − 1) of
  attn[n, i, i − 1]``: how much a head attends to the token just before the current one, the
  first half of the induction circuit (a previous-token head writes "the token before me was
  A" at the position after A, which the induction head's key reads; Olsson et al. 2022,
  §"Induction heads"; Elhage et al. 2021, "Two-layer attention-only transformers"). Uniform
  causal attention scores the mean of 1/(i + 1) over those positions
  (``metric_registry.uniform_pt``). ``attn`` as for ``prefix_matching_score``.
  """
  t = attn_LyxNxHxTxT.shape[-1]
  i = jnp.arange(t - 2 * block_len + 1, t)
  return attn_LyxNxHxTxT[..., i, i - 1].mean(axis=(1, 3))


def _second_block(block_len: int, probe_tokens: int) -> jax.Array:
  """The scored positions, all ``L`` of the second block: ``T − L … T − 1``."""
  return jnp.arange(probe_tokens - block_len, probe_tokens)


def _target_entries(block_len: int) -> jax.Array:
  """Block entry of the correct next token at each scored position ``i = s + L + p``:
  ``(p + 1) mod L`` (``tokens[i + 1]``, and the block's first token at the last position)."""
  return (jnp.arange(block_len) + 1) % block_len


def _first_block(tokens_NxT: jax.Array, block_len: int) -> jax.Array:
  """The first block's ids, int32 ``[N, L]`` (positions ``T − 2L … T − L − 1``)."""
  start = tokens_NxT.shape[1] - 2 * block_len
  return tokens_NxT[:, start : start + block_len]


def _probe_targets(tokens_NxT: jax.Array, block_len: int) -> jax.Array:
  """The correct next token at each scored position, ``tokens[i − L + 1]``, int32 ``[N, L]``
  (``tokens[i + 1]``, and the block's first token at the last position)."""
  return _first_block(tokens_NxT, block_len)[:, _target_entries(block_len)]


def logit_attribution(
  head_out_NxPxLyxHxD: jax.Array, unembed_DxV: jax.Array, tokens_NxT: jax.Array, block_len: int
) -> jax.Array:
  """The study's logit attribution per (layer, head), float32 ``[n_layers, n_heads]`` in [0, 1].

  At second-block position i (``L ≤ i ≤ 2L − 1``), the head's output ``z_h W_O^h`` (no bias, no
  final LayerNorm) is dotted with the unembedding vectors of the L block tokens, giving
  ``proj_j``; with ``m = mean_j proj_j``,
  ``LA = ReLU(proj_target − m) / Σ_j ReLU(proj_j − m)`` (0 when the denominator is 0, NaN when
  it is NaN), the target being ``tokens[i − L + 1]`` (at ``i = 2L − 1`` the block's first
  token), averaged over the L positions and the probes (the study's released code, docs/study.md).

  Args:
    head_out_NxPxLyxHxD: per-head writes into the residual stream at the second-block positions
      ``L … 2L − 1`` (``head_outputs``), ``[N, L, n_layers, H, D]``.
    unembed_DxV: unembedding ``[d_model, vocab]``.
    tokens_NxT: int32 probes ``[N, T]``.
  """
  n, p, layers, heads, d = head_out_NxPxLyxHxD.shape
  w_NxDxJ = jnp.swapaxes(unembed_DxV[:, _first_block(tokens_NxT, block_len)], 0, 1)
  # (position, layer, head) flattened: one matrix product per probe.
  proj = jnp.einsum(
    "nmd,ndj->nmj", head_out_NxPxLyxHxD.reshape(n, p * layers * heads, d), w_NxDxJ
  ).reshape(n, p, layers * heads, block_len)
  above_NxPxMxJ = jax.nn.relu(proj - proj.mean(axis=-1, keepdims=True))
  target_PxJ = jax.nn.one_hot(_target_entries(block_len), block_len, dtype=above_NxPxMxJ.dtype)
  target = jnp.einsum("npmj,pj->npm", above_NxPxMxJ, target_PxJ)
  total = above_NxPxMxJ.sum(axis=-1)
  la = jnp.where(total == 0, 0.0, target / jnp.where(total == 0, 1.0, total))  # NaN stays NaN
  return la.mean(axis=(0, 1)).reshape(layers, heads)


def direct_logit_attribution(
  head_out_NxPxLyxHxD: jax.Array,
  resid_final_NxPxD: jax.Array,
  ln_scale_D: jax.Array,
  unembed_DxV: jax.Array,
  tokens_NxT: jax.Array,
  block_len: int,
  ln_eps: float,
) -> jax.Array:
  """Standard direct logit attribution per (layer, head), float32 ``[n_layers, n_heads]``
  (nats of logit).

  The head's output is passed through the final LayerNorm with its scale frozen at the full
  residual's value — ``(h − mean(h)) / σ(resid) · γ``, the LayerNorm bias not attributed — and
  read out as the target token's logit minus the mean logit over the vocabulary, averaged over
  the second-block positions ``L ≤ i ≤ 2L − 1`` (target ``tokens[i − L + 1]``, as for LA) and
  probes (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits";
  TransformerLens ``cache.stack_head_results(apply_ln=True)`` with ``logit_diff`` against the
  mean logit). Positive = the head raises the correct next token. ``head_out`` and
  ``resid_final`` are taken at those positions only (``[N, L, n_layers, H, D]`` and
  ``[N, L, D]``).
  """
  n, p, layers, heads, d = head_out_NxPxLyxHxD.shape
  sigma_NxP = jnp.sqrt(resid_final_NxPxD.var(axis=-1) + ln_eps)
  targets_NxP = _probe_targets(tokens_NxT, block_len)
  direction_NxPxD = (unembed_DxV.T[targets_NxP] - unembed_DxV.mean(axis=1)[None, None, :]) * (
    ln_scale_D[None, None, :] / sigma_NxP[..., None]
  )
  # (h − mean(h)) · w = h · (w − mean(w)): centre the read-out direction instead of each head.
  direction_NxPxD = direction_NxPxD - direction_NxPxD.mean(axis=-1, keepdims=True)
  h_NxPxMxD = head_out_NxPxLyxHxD.reshape(n, p, layers * heads, d)
  dla = jnp.einsum("npmd,npd->npm", h_NxPxMxD, direction_NxPxD).mean(axis=(0, 1))
  return dla.reshape(layers, heads)


def recall_ranks(logits_NxPxV: jax.Array, targets_NxP: jax.Array) -> jax.Array:
  """Rank of each target among all vocabulary items, float32 ``[N, P]``: the number of items
  with a strictly larger logit (0 = the model's top prediction; the study's convention); NaN
  where any logit of the position is NaN or ±inf (a diverged model: no rank is defined)."""
  target_NxP = jnp.take_along_axis(logits_NxPxV, targets_NxP[..., None], axis=-1)
  ranks = jnp.sum(logits_NxPxV > target_NxP, axis=-1, dtype=jnp.float32)
  return jnp.where(jnp.isfinite(logits_NxPxV).all(axis=-1), ranks, jnp.nan)


def _hits(ranks: jax.Array) -> jax.Array:
  """float32: 1 where the rank is 0, else 0; NaN where the rank is undefined."""
  return jnp.where(jnp.isnan(ranks), jnp.nan, (ranks == 0).astype(jnp.float32))


def icl_score(loss_per_position_C: jax.Array, early: int, late: int) -> jax.Array:
  """In-context-learning score ``loss[late] − loss[early]`` in nats (negative = later tokens are
  predicted better; Olsson et al. 2022, §"In-context learning", who use positions 500 and 50)."""
  return loss_per_position_C[late] - loss_per_position_C[early]


def icl_positions(context_size: int, early: int = 0, late: int = 0) -> tuple[int, int]:
  """The ICL score's (early, late) positions: the given ones, or C/10 and C − 1 when 0."""
  return early or context_size // 10, late or context_size - 1


def _argmax_2d(x_LyxH: jax.Array) -> jax.Array:
  flat = jnp.argmax(x_LyxH)
  return jnp.stack([flat // x_LyxH.shape[1], flat % x_LyxH.shape[1]]).astype(jnp.int32)


def _microbatches(x: jax.Array, size: int) -> jax.Array:
  return x.reshape((x.shape[0] // size, size) + x.shape[1:])


def head_outputs(params, cfg: ModelConfig, z_LyxNxTxHxK: jax.Array, pos: jax.Array) -> jax.Array:
  """Each head's write into the residual stream, ``z_h W_O^h`` (no bias), at positions ``pos``:
  float32 ``[N, P, n_layers, H, d_model]`` from the mixed values ``z`` (``Transformer``
  internals). Computed per head as plain matrix products (fast under the ensemble vmap on CPU),
  only where the metrics read it."""
  z = z_LyxNxTxHxK[:, :, pos].astype(jnp.float32)
  layers = []
  for layer in range(cfg.n_layers):
    w_HxKxD = params[f"block_{layer}"]["attn"]["w_o"].astype(jnp.float32)
    layers.append(jnp.stack([z[layer, :, :, h] @ w_HxKxD[h] for h in range(cfg.n_heads)], axis=2))
  return jnp.stack(layers, axis=2)


def _final_logits(params, cfg: ModelConfig, resid_NxPxD: jax.Array) -> jax.Array:
  """float32 logits ``[N, P, V]`` from residual-stream vectors, exactly as ``Transformer`` maps
  its last residual (final LayerNorm, then the unembedding in the compute dtype)."""
  x = nn.LayerNorm(epsilon=cfg.ln_eps, dtype=jnp.float32).apply(
    {"params": params["ln_f"]}, resid_NxPxD
  )
  w_DxV = unembedding_matrix(params, cfg).astype(cfg.compute_dtype)
  return jnp.einsum("npd,dv->npv", x.astype(cfg.compute_dtype), w_DxV).astype(jnp.float32)


def evaluate(
  params,
  probes_NxT: jax.Array,
  sequences_SxCp1: jax.Array,
  recall_SxC: jax.Array,
  *,
  cfg: ModelConfig,
  block_len: int,
  icl_early: int,
  icl_late: int,
  probe_batch: int,
  sequence_batch: int,
) -> dict:
  """All metrics of ONE model (vmap it for an ensemble).

  Args:
    params: the model's Flax params.
    probes_NxT: int32 repeated-token probes ``[N, T]``, the two blocks at positions ``T − 2L …
      T − 1`` (shared by every model).
    sequences_SxCp1: int32 held-out sequences of the model's own data ``[S, C + 1]`` (validation
      loss, ICL score, data-drawn associative recall).
    recall_SxC: bool ``[S, C]``, True at positions i where ``sequences[i]`` (A) occurred earlier at
      j < i − 1 and ``sequences[i + 1]`` equals ``sequences[j + 1]`` (B): the prompts ``… A B …
      A`` whose correct next token is B (``probes.recall_positions``).
    block_len: L (``probes.block_length``), at least 3.
    probe_batch / sequence_batch: micro-batch sizes (must divide N and S) bounding the memory of
      the ``[batch, T, V]`` logits.

  Returns a dict of float32 values: ``ps``, ``pt``, ``la``, ``dla`` ``[n_layers, n_heads]``
  (``metric_registry.HEAD_SCORES``); ``ar_acc``, ``ar_rank`` (repeated-token probes, all L
  second-block positions); ``ar_data_acc``, ``ar_data_rank`` (data prompts; NaN if none) and
  int32 ``ar_data_n`` (how many); ``val_loss`` (nats/token); ``icl_score``; int32 ``[2]``
  (layer, head) ``ps_argmax``, ``pt_argmax``, ``la_argmax``, ``dla_argmax``; and every metric of
  ``ihsweep.compute.metric_registry`` (``ps_max``, ``pt_max``, ``la_max``, ``dla_max``, …:
  those with a ``compute`` function are computed here from the values above, in registry
  order). A model with NaN or ±inf logits gets NaN recall (and, through its activations, NaN
  scores), never a perfect one.

  Raises:
    ValueError: ``block_len`` < 3 (at L = 2 the induction target is the previous token); a
      registered metric whose ``compute`` returns more than a scalar, or that has no ``compute``
      function and is not among the values above.
  """
  p, s = evaluate_sums(
    params,
    probes_NxT,
    sequences_SxCp1,
    recall_SxC,
    cfg=cfg,
    block_len=block_len,
    probe_batch=probe_batch,
    sequence_batch=sequence_batch,
  )
  return finish_evaluation(p, s, sequences_SxCp1.shape[0], icl_early, icl_late)


def evaluate_sums(
  params,
  probes_NxT: jax.Array,
  sequences_SxCp1: jax.Array,
  recall_SxC: jax.Array,
  *,
  cfg: ModelConfig,
  block_len: int,
  probe_batch: int,
  sequence_batch: int,
) -> tuple[dict, dict]:
  """The additive part of ``evaluate`` for ONE model: ``(probe means, sequence sums)``. Probe
  means (``ps``, ``pt``, ``la``, ``dla`` ``[n_layers, n_heads]``, ``ar_acc``, ``ar_rank``) are
  over the given probes; sequence sums (``loss_C`` ``[C]``, ``ar_hits``, ``ar_rank``, ``ar_n``) over
  the given sequences. Parts of the probes / sequences (the shards of a data axis, in equal
  numbers) combine by averaging the means and adding the sums (``make_eval_fn``).

  Raises:
    ValueError: ``block_len`` < 3.
  """
  if block_len < MIN_BLOCK:
    raise ValueError(f"block_len = {block_len}: {MIN_BLOCK_REASON}")
  model = Transformer(cfg)
  unembed_DxV = unembedding_matrix(params, cfg).astype(jnp.float32)
  ln_scale_D = params["ln_f"]["scale"].astype(jnp.float32)
  pos = _second_block(block_len, probes_NxT.shape[1])

  def probe_sums(tokens_NxT):
    _, internals = model.apply({"params": params}, tokens_NxT, return_internals=True)
    # Logits only where recall is scored (the model's own final LayerNorm and unembedding; XLA
    # drops the unused full [N, T, V] logits): half the probes' unembedding work.
    resid_NxPxD = internals["resid_final"][:, pos]
    ranks = recall_ranks(
      _final_logits(params, cfg, resid_NxPxD), _probe_targets(tokens_NxT, block_len)
    )
    head_out = head_outputs(params, cfg, internals["z"], pos)
    return {
      "ps": prefix_matching_score(internals["attn"], block_len),
      "pt": previous_token_score(internals["attn"], block_len),
      "la": logit_attribution(head_out, unembed_DxV, tokens_NxT, block_len),
      "dla": direct_logit_attribution(
        head_out, resid_NxPxD, ln_scale_D, unembed_DxV, tokens_NxT, block_len, cfg.ln_eps
      ),
      "ar_acc": _hits(ranks).mean(),
      "ar_rank": ranks.mean(),
    }

  def sequence_sums(args):
    seq_SxCp1, recall_SxC = args
    inputs, targets = seq_SxCp1[:, :-1], seq_SxCp1[:, 1:]
    logits = model.apply({"params": params}, inputs)
    nll_SxC = (
      jax.nn.logsumexp(logits, axis=-1)
      - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    )
    ranks = recall_ranks(logits, targets)
    return {
      "loss_C": nll_SxC.sum(axis=0),
      "ar_hits": jnp.sum(jnp.where(recall_SxC, _hits(ranks), 0.0)),
      "ar_rank": jnp.sum(jnp.where(recall_SxC, ranks, 0), dtype=jnp.float32),
      "ar_n": jnp.sum(recall_SxC, dtype=jnp.int32),
    }

  # Equal micro-batches: the mean of per-batch means is the overall mean.
  p = jax.tree_util.tree_map(
    lambda x: x.mean(axis=0), jax.lax.map(probe_sums, _microbatches(probes_NxT, probe_batch))
  )
  s = jax.tree_util.tree_map(
    lambda x: x.sum(axis=0),
    jax.lax.map(
      sequence_sums,
      (_microbatches(sequences_SxCp1, sequence_batch), _microbatches(recall_SxC, sequence_batch)),
    ),
  )
  return p, s


def finish_evaluation(p: dict, s: dict, n_sequences: int, icl_early: int, icl_late: int) -> dict:
  """``evaluate``'s outputs from ``evaluate_sums``' probe means and sequence sums over all
  ``n_sequences`` held-out sequences (validation loss per position, ICL score, data-drawn
  recall, argmaxes, the registry's metrics).

  Raises:
    ValueError: a registered metric whose ``compute`` returns more than a scalar, or that has
      no ``compute`` function and is not among the values.
  """
  loss_C = s["loss_C"] / n_sequences
  n = s["ar_n"]
  n_f = jnp.maximum(n, 1).astype(jnp.float32)
  out = dict(p)
  out.update(
    ar_data_acc=jnp.where(n > 0, s["ar_hits"] / n_f, jnp.nan),
    ar_data_rank=jnp.where(n > 0, s["ar_rank"] / n_f, jnp.nan),
    ar_data_n=n,
    val_loss=loss_C.mean(),
    icl_score=icl_score(loss_C, icl_early, icl_late),
  )
  for name in metric_registry.HEAD_SCORES:
    out[f"{name}_argmax"] = _argmax_2d(out[name])
  for metric in metric_registry.REGISTRY.values():
    if metric.compute is not None:
      out[metric.name] = jnp.asarray(metric.compute(out), jnp.float32)
      if out[metric.name].shape:
        raise ValueError(
          f"metric {metric.name!r} (ihsweep.compute.metric_registry): compute returned "
          f"shape {out[metric.name].shape}; a metric is one scalar per model"
        )
    elif metric.name not in out:
      raise ValueError(
        f"metric {metric.name!r} (ihsweep.compute.metric_registry) has no compute "
        f"function and evaluate does not return it; give it compute=fn(out)"
      )
  return out


def make_eval_fn(
  cfg: ModelConfig,
  *,
  block_len: int,
  icl_early: int,
  icl_late: int,
  probe_batch: int,
  sequence_batch: int,
  out_sharding=None,
  mesh=None,
  split_probes: bool = False,
  split_sequences: bool = False,
) -> Callable:
  """``fn(params_E, probes, sequences_E, recall_E) -> dict`` of ``[E, ...]`` arrays: ``evaluate``
  vmapped over the ensemble's leading axis (probes shared), jitted once.

  With a ``mesh`` whose 'data' axis has D > 1 devices, each device evaluates its models
  (``jax.shard_map``) on N / D of the probes (``split_probes``, N divisible by D) and S / D of
  the sequences (``split_sequences``, S divisible by D), or on all of them where not split;
  ``probe_batch`` / ``sequence_batch`` must divide the counts each device holds. The probe
  means of split probes are averaged and the sequence sums of split sequences added over
  'data' (``evaluate_sums``), then every metric is finished from them
  (``finish_evaluation``): the evaluation is split over the devices that split the batch in
  training instead of repeated on each. Output: ``[E, ...]`` sharded over 'ensemble'."""
  kwargs = dict(
    cfg=cfg, block_len=block_len, probe_batch=probe_batch, sequence_batch=sequence_batch
  )
  if mesh is None or mesh.shape["data"] == 1 or not (split_probes or split_sequences):
    one = functools.partial(evaluate, icl_early=icl_early, icl_late=icl_late, **kwargs)
    return jax.jit(jax.vmap(one, in_axes=(0, None, 0, 0)), out_shardings=out_sharding)
  from jax.sharding import PartitionSpec as P

  sums = jax.vmap(functools.partial(evaluate_sums, **kwargs), in_axes=(0, None, 0, 0))
  d = mesh.shape["data"]

  def shard(params_E, probes_NxT, sequences_ExSxCp1, recall_ExSxC):
    p, s = sums(params_E, probes_NxT, sequences_ExSxCp1, recall_ExSxC)
    if split_probes:
      p = jax.lax.pmean(p, "data")
    if split_sequences:
      s = jax.lax.psum(s, "data")
    n_sequences = sequences_ExSxCp1.shape[1] * (d if split_sequences else 1)
    return jax.vmap(lambda p, s: finish_evaluation(p, s, n_sequences, icl_early, icl_late))(p, s)

  shard.__name__ = shard.__qualname__ = "evaluate"  # one name for the program, split or not
  seq_spec = P("ensemble", "data") if split_sequences else P("ensemble")
  fn = jax.shard_map(
    shard,
    mesh=mesh,
    in_specs=(P("ensemble"), P("data") if split_probes else P(), seq_spec, seq_spec),
    out_specs=P("ensemble"),
  )
  return jax.jit(fn, out_shardings=out_sharding)


def microbatch(n: int, tokens_per_item: int, vocab_size: int, budget_bytes: int = 16 << 20) -> int:
  """The largest divisor of ``n`` whose float32 logits ``[m, T, V]`` fit ``budget_bytes``
  (at least 1); ``T`` = ``tokens_per_item``.

  Raises:
    ValueError: ``tokens_per_item`` or ``vocab_size`` < 1 (e.g. probes of a run with C = 1,
      whose block length min(50, C // 2) is 0).
  """
  for name, value in (("tokens_per_item", tokens_per_item), ("vocab_size", vocab_size)):
    if value < 1:
      raise ValueError(
        f"metrics.microbatch: {name} = {value}; must be >= 1 (items of at least "
        f"one token over a vocabulary of at least one id)"
      )
  fits = max(1, budget_bytes // (tokens_per_item * vocab_size * 4))
  return max(m for m in range(1, n + 1) if n % m == 0 and m <= fits)
