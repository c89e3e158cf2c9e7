"""The rules between the data and evaluation fields of a run config (``config.validate`` calls
them): a source's own fields, its tokenizer or corpus, the Markov generators' knobs, the probes
and the online evaluation. Each raises ``fields.ConfigError`` naming the field, the value and what
is allowed.
"""

from __future__ import annotations

import functools
import os

from ihsweep import data
from ihsweep.compute.metrics import icl_positions
from ihsweep.configuration.fields import ConfigError, check, check_real
from ihsweep.data import TRANSITIONS, bigram_corpus_tokens, documents, synthetic
from ihsweep.data import tokenizer as tokenizer_lib
from ihsweep.data.probes import MAX_BLOCK, MIN_BLOCK, MIN_BLOCK_REASON, block_length, probe_layout


@functools.lru_cache(maxsize=8)
def _check_tokenizer(path: str, mtime: float, vocab: int, vocab_field: str) -> None:
  """``tokenizer.load_tokenizer``'s checks, once per file version (a sweep validates each group)."""
  del mtime  # part of the cache key only
  tokenizer_lib.load_tokenizer(path, vocab, vocab_field)


@functools.lru_cache(maxsize=8)
def _tokenizer_special_ids(path: str, mtime: float) -> tuple[int, ...]:
  """Ids of ``<|endoftext|>`` and every token the tokenizer.json at ``path`` marks special
  (``NaturalTextSource.special_ids``: probes never use them); once per file version."""
  from tokenizers import Tokenizer

  del mtime  # part of the cache key only
  tok = Tokenizer.from_file(path)
  ids = {tok.token_to_id(tokenizer_lib.EOT)}
  ids |= {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
  return tuple(sorted(int(i) for i in ids if i is not None))


def _probe_excluded(cfg, source: str) -> tuple[int, str]:
  """(how many ids the probes may not use, what they are): a corpus's end-of-text id and, with a
  user tokenizer.json, every token it marks special (``probes.special_token_ids``)."""
  if source != "natural":
    return 0, ""
  path = os.path.expanduser(cfg.data.tokenizer)
  if cfg.data.tokenizer == "bpe" or not os.path.isfile(path):
    return 1, "the end-of-text id"
  n = len(_tokenizer_special_ids(path, os.path.getmtime(path)))
  return n, f"{n} special id(s) of data.tokenizer (end-of-text, <pad>, …)"


def _validate_natural(cfg, vocab: int, vocab_field: str) -> None:
  """Cheap checks of a natural-text data section; the corpus itself is read (and its length
  checked) when the source is built, still before compiling."""
  for name in (
    "loader",
    "device_budget_mb",
    "val_fraction",
    "split_seed",
    "sample_seed",
    "max_documents",
  ):
    check(cfg, f"data.{name}")
  if cfg.data.sample_seed and not cfg.data.max_documents:
    raise ConfigError(
      "data.sample_seed",
      cfg.data.sample_seed,
      "0 while data.max_documents = 0 (every document is kept: the seed chooses nothing, and "
      "a sweep over it would train copies)",
    )
  for name in (
    "corpus",
    "files",
    "tfds_name",
    "tfds_split",
    "tfds_data_dir",
    "text_field",
    "tokenizer",
    "cache_dir",
  ):
    check(cfg, f"data.{name}")
  tokenizer = cfg.data.tokenizer
  if tokenizer == "bpe":
    if vocab < tokenizer_lib.BYTE_LEVEL_MIN_VOCAB:
      raise ConfigError(
        vocab_field,
        vocab,
        f">= {tokenizer_lib.BYTE_LEVEL_MIN_VOCAB} for a byte-level BPE (256 bytes + "
        f"{tokenizer_lib.EOT})",
      )
  elif not os.path.isfile(os.path.expanduser(tokenizer)):
    raise ConfigError("data.tokenizer", tokenizer, "'bpe' or the path of a tokenizer.json")
  else:  # its vocabulary must fit the model's (checked before the probes' block length)
    path = os.path.expanduser(tokenizer)
    _check_tokenizer(path, os.path.getmtime(path), vocab, vocab_field)
  documents.document_source(cfg.data)  # one of corpus/files/tfds_name; files exist; TFDS known


def _validate_markov(cfg, vocab: int, n_models: int) -> None:
  """The markov source's knobs and transitions (a user matrix and synthetic targets are checked
  in full when the source is built, before compiling)."""
  kind = check(cfg, "data.transitions")
  check(cfg, "data.induction_start")
  for name, plural in (("frequency", "frequencies"), ("reliability", "reliabilities")):
    check(cfg, f"data.{name}")
    values = cfg.data[plural]
    if values and len(values) != n_models:
      raise ConfigError(
        f"data.{plural}",
        values,
        f"empty (all models use data.{name}) or one value per model (ensemble.size = {n_models})",
      )
    for i, v in enumerate(values):
      check_real(f"data.{plural}[{i}]", v, 0.0, 1.0, False, False)
  check(cfg, "data.smoothing")
  check(cfg, "data.tokenizer_vocab")
  context = cfg.train.context_size
  if vocab < context + 1:
    raise ConfigError(
      "model.vocab_size",
      vocab,
      f">= train.context_size + 1 = {context + 1} for data.source = 'markov': a "
      f"sequence must be able to hold C + 1 distinct tokens (first-half draws "
      f"exclude every earlier token)",
    )
  if kind == "file" and not os.path.isfile(os.path.expanduser(cfg.data.matrix_file)):
    raise ConfigError(
      "data.matrix_file",
      cfg.data.matrix_file,
      "the path of a [V, V] .npy transition matrix (data.transitions = 'file')",
    )
  if kind in ("synthetic", "iid"):
    syn = cfg.data.synthetic
    for name in ("marginal", "categoriality", "iterations", "power_iterations", "n_groups", "lr"):
      check(cfg, f"data.synthetic.{name}")
    if kind == "synthetic":  # unreachable targets (raises markov.MarkovError with both values)
      synthetic.check_spec(synthetic.SyntheticSpec.from_config(syn, vocab))


def validate_eval(cfg, vocab: int, source: str) -> None:
  every = check(cfg, "eval.every_steps")
  every = check(cfg, "eval.every_tokens") or every
  for name in ("n_probes", "n_sequences", "probe_seed"):
    check(cfg, f"eval.{name}")
  context = cfg.train.context_size
  probe_len = check(
    cfg,
    "eval.probe_len",
    hi=context // 2,
    hint=f" (0 = min(50, C/2); two copies must fit in C = {context})",
  )

  if 0 < probe_len < MIN_BLOCK:  # even with evaluation off: the analysis makes probes from it
    raise ConfigError(
      "eval.probe_len", probe_len, f"0 (= min(50, C/2)) or >= {MIN_BLOCK}: {MIN_BLOCK_REASON}"
    )
  top_k = check(cfg, "eval.probe_top_k")
  position = check(cfg, "eval.probe_position")

  early, late = icl_positions(
    context,
    check(cfg, "eval.icl_early", hi=context - 1),
    check(cfg, "eval.icl_late", hi=context - 1),
  )
  if not every:  # no metric computed while training: any C trains (loss curves only)
    return
  if not probe_len and min(MAX_BLOCK, context // 2) < MIN_BLOCK:
    raise ConfigError(
      "train.context_size",
      context,
      f">= {2 * MIN_BLOCK} when evaluating, or eval.every_steps = 0: the probes "
      f"hold a block of L = min(50, C/2) tokens twice, and {MIN_BLOCK_REASON}",
    )
  _check_probe_ids(cfg, vocab, source, probe_len, top_k, position)
  if early >= late:
    raise ConfigError(
      "eval.icl_early",
      cfg.eval.icl_early,
      f"a position before eval.icl_late (resolved: early {early} >= late {late})",
    )


def _check_probe_ids(cfg, vocab: int, source: str, probe_len: int, top_k: int, position: str):
  """A probe block's distinct ids (and a filler id) must exist among the usable ids, or among
  the ``eval.probe_top_k`` most frequent."""
  context = cfg.train.context_size
  block = block_length(context, probe_len)
  excluded, what = _probe_excluded(cfg, source)  # a corpus's end-of-text and special ids
  usable = vocab - excluded
  # Filler before the blocks needs an id outside each block (so the blocks' copies are unique).
  filler = probe_layout(context, probe_len, position)[1] > 2 * block
  need = block + (1 if filler else 0)
  why = f" and one filler id outside it (eval.probe_position = {position!r})" if filler else ""
  if top_k and not need <= top_k <= usable:
    raise ConfigError(
      "eval.probe_top_k",
      top_k,
      f"0 or in [{need}, {usable}]: a probe block holds L = {block} distinct "
      f"ids drawn from the K most frequent{why}"
      + (f"; {usable} of model.vocab_size = {vocab} ids usable ({what} excluded)" if what else ""),
    )
  if not top_k and usable < need:
    raise ConfigError(
      "eval.probe_len",
      probe_len,
      f"a block of at most {usable - (1 if filler else 0)} distinct ids{why} "
      f"(model.vocab_size = {vocab}" + (f", {what} excluded)" if what else ")"),
    )


def source_words(kinds) -> str:
  """``data.READS`` keys in words: "'natural' or 'markov' (transitions 'bigram')"."""
  markov = [k.split("/")[1] for k in kinds if k.startswith("markov/")]
  words = [repr(k) for k in kinds if not k.startswith("markov/")]
  if markov:
    words.append(
      "'markov'"
      + (
        ""
        if len(markov) == len(TRANSITIONS)
        else f" (transitions {' or '.join(map(repr, markov))})"
      )
    )
  return " or ".join(words)


def _check_unread_data(data_cfg) -> None:
  """A data field the chosen source does not read must keep its default: any other value would
  change nothing (``data.READS``)."""
  defaults = data.default_config()
  kind = data.source_kind(data_cfg)
  for name in data.unread_fields(data_cfg):
    field, value, default = f"data.{name}", data_cfg.get(name), defaults[name]
    if hasattr(default, "keys"):  # a section (data.synthetic): its first changed field
      changed = [k for k in default.keys() if value.get(k) != default[k]]
      if not changed:
        continue
      field, value, default = f"{field}.{changed[0]}", value[changed[0]], default[changed[0]]
    elif value == default:
      continue
    source, *transitions = data.readers(name)[0].split("/")
    hint = (
      f"--config.data.transitions={transitions[0]}"
      if source == data_cfg.source
      else f"--config.data.source={source}"
    )
    raise ConfigError(
      field,
      value,
      f"its default {default!r} with data.source = {source_words([kind])}, which does "
      f"not read it (only data.source = {source_words(data.readers(name))} does: "
      f"e.g. {hint})",
    )


def _check_distinct_models(cfg, size: int, source: str) -> None:
  """Models of one ensemble sharing a seed must differ in another per-model value; else two
  would train the same model."""
  seeds = tuple(cfg.ensemble.get("seeds", ()))
  if len(set(seeds)) == len(seeds):  # (empty: seeds seed + i)
    return
  per_model = {"ensemble.peak_lrs": tuple(cfg.ensemble.peak_lrs) or (cfg.train.lr,) * size}
  if source == "markov":
    per_model["data.frequencies"] = tuple(cfg.data.frequencies) or (cfg.data.frequency,) * size
    per_model["data.reliabilities"] = (
      tuple(cfg.data.reliabilities) or (cfg.data.reliability,) * size
    )
  models = list(zip(seeds, *per_model.values()))
  for i, model in enumerate(models):
    j = models.index(model)
    if j < i:
      same = [f for f, v in per_model.items() if len(set(v)) > 1]
      raise ConfigError(
        "ensemble.seeds",
        seeds,
        f"distinct seeds, or models sharing a seed that differ in a per-model "
        f"value: models {j} and {i} both have seed {seeds[i]}"
        + (f" and the same {' and '.join(same)}" if same else "")
        + ", so they would train the same model twice",
      )


def validate_data(cfg, vocab: int, size: int) -> str:
  """The ``data`` section: the chosen source's fields, and the default of every other one;
  returns data.source."""
  source = check(cfg, "data.source")
  if source == "markov_chain":
    hint = f" (at most model.vocab_size = {vocab})"
    check(cfg, "data.n_successors", hi=vocab, hint=hint)
    check(cfg, "data.chain_seed")
  if source == "repeated_blocks":
    longest = (cfg.train.context_size + 1) // 2
    hint = f" (a block must fit twice in C + 1 = {cfg.train.context_size + 1})"
    block_min = check(cfg, "data.block_min", hi=longest, hint=hint)
    check(cfg, "data.block_max", hi=longest)
    if cfg.data.block_max and cfg.data.block_max < block_min:
      raise ConfigError(
        "data.block_max", cfg.data.block_max, f"0 or >= data.block_min = {block_min}"
      )
  if source == "markov":
    _validate_markov(cfg, vocab, size)
  if source == "natural":
    _validate_natural(cfg, vocab, "model.vocab_size")
  elif source == "markov" and cfg.data.transitions == "bigram":
    _validate_natural(cfg, *bigram_corpus_tokens(cfg.data, vocab))
  _check_unread_data(cfg.data)
  _check_distinct_models(cfg, size, source)
  return source
