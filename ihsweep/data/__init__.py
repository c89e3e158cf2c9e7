"""Data sources. Every source plugs into the trainer through one interface, ``Source``
(``source.py``: every member with its default, and how to write a source):

``source.sample(key, data_params, arrays) -> int32 tokens [batch_size, context_size + 1]``

written for one model and jit/vmap-safe. The trainer vmaps it over the ensemble with per-model
keys and per-model ``data_params`` (a pytree from ``source.data_params(E)`` with leading axis E,
e.g. a Markov source's knobs), while ``arrays`` (``source.arrays()``: a pytree of numpy arrays
placed once on every device, e.g. a corpus's tokens or a transition table) is shared by all
models and passed as an argument, never baked into the program as a constant.

A source with ``on_device = False`` (a corpus over the device-memory budget) instead provides
``host_batches(data_keys, first_step, n_steps) -> [E, U, B, C + 1]`` drawing the same windows on
the host; the runner prefetches them to the devices. The probes read ``special_ids``,
``held_out_windows`` and ``train_token_counts``; the run log, ``describe()``.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ihsweep.base import schema
from ihsweep.data import cache, errors, markov, natural, synthetic
from ihsweep.data import corpus as corpus_lib
from ihsweep.data.builtin import MarkovChainSource, RepeatedBlocksSource, UniformSource
from ihsweep.data.source import Source

SOURCES = schema.choices("data.source")
TRANSITIONS = schema.choices("data.transitions")


def default_config():
  """The ``data`` config section with every field at its default (``configs/*.py`` start from
  this; unknown fields cannot be added from the command line, so all live in
  ``ihsweep.base.schema``,
  which gives each one's default, allowed values and help).

  source: 'uniform' | 'markov_chain' | 'repeated_blocks' | 'natural' | 'markov'.
  markov_chain: n_successors (successors per token), chain_seed.
  repeated_blocks (the classic induction task, builtin.RepeatedBlocksSource): block_min,
    block_max (block length range; 0 = (C + 1) // 2).
  markov (semi-natural and synthetic Markov data with injected induction patterns, markov.py):
    transitions 'bigram' (the natural-text corpus below, its V = model.vocab_size most frequent
    types, add-``smoothing`` bigram rows; the BPE is trained to tokenizer_vocab types, 0 =
    2 · model.vocab_size), 'synthetic' (optimised to the ``synthetic`` sub-section, synthetic.py),
    'iid' (every row = the synthetic marginal) or 'file' (matrix_file, a [V, V] .npy);
    frequency / reliability (knobs in [0, 1]) or per-model frequencies / reliabilities;
    induction_start 'half' (patterns in the second half of each sequence) or 'anywhere' (from a
    point drawn per sequence uniformly in 1 … C, so copies can sit at any position).
  natural — documents from exactly one of: corpus ('python-docs', see ``ihsweep corpus fetch``),
    files (comma-separated globs of .txt/.md/.rst/.html/.jsonl/.parquet), tfds_name (e.g.
    'c4/en', read with ``tfds.data_source`` from tfds_data_dir, split tfds_split; tfds_download
    lets TFDS download and prepare it); text_field (jsonl/parquet/TFDS field); max_documents
    (0 = all; else a uniform random sample of that many documents, drawn with sample_seed and
    recorded in the cache's meta.json); tokenizer ('bpe' = train a byte-level BPE to
    model.vocab_size, or a path to a tokenizer.json); val_fraction and split_seed (validation
    documents); cache_dir ('' = $IHSWEEP_CACHE or ~/.cache/ihsweep); loader ('auto' = on device
    if the training tokens fit device_budget_mb MiB per device, 'device', 'host').
  A field the chosen source does not read (``READS``) must keep its default value here.
  """
  return schema.defaults("data")


# The data fields each source reads ('markov/T': the markov source with data.transitions T;
# data.source itself is read by all). A field the chosen source does not read changes nothing in
# its models: ``config.validate`` refuses it at any value but its default, and a sweep axis over
# it would train copies (``grid.make_plan`` refuses it).
_CORPUS = (
  "corpus",
  "files",
  "tfds_name",
  "tfds_split",
  "tfds_data_dir",
  "tfds_download",
  "text_field",
  "max_documents",
  "sample_seed",
  "tokenizer",
  "val_fraction",
  "split_seed",
  "cache_dir",
)
_MARKOV = (
  "transitions",
  "frequency",
  "reliability",
  "induction_start",
  "frequencies",
  "reliabilities",
  "cache_dir",
)
READS = {
  "uniform": (),
  "markov_chain": ("n_successors", "chain_seed"),
  "repeated_blocks": ("block_min", "block_max"),
  "natural": _CORPUS + ("loader", "device_budget_mb"),
  "markov/bigram": _MARKOV + _CORPUS + ("smoothing", "tokenizer_vocab"),
  "markov/synthetic": _MARKOV + ("synthetic",),
  "markov/iid": _MARKOV + ("synthetic",),  # of that section, only the marginal matters
  "markov/file": _MARKOV + ("matrix_file",),
}


def source_kind(data_cfg) -> str:
  """The ``READS`` key of a data section: 'markov/<transitions>' or ``data.source``."""
  if data_cfg.source == "markov":
    return f"markov/{data_cfg.transitions}"
  return data_cfg.source


def unread_fields(data_cfg) -> list[str]:
  """Names of the ``data`` fields (of ``default_config``) that the configured source does not
  read, in field order."""
  reads = READS.get(source_kind(data_cfg), ())
  return [name for name in default_config().keys() if name != "source" and name not in reads]


def readers(name: str) -> list[str]:
  """The ``READS`` keys of the sources that read the ``data`` field ``name``."""
  return [kind for kind, fields in READS.items() if name in fields]


def make_source(data_cfg, vocab_size: int, batch_size: int, context_size: int) -> Source:
  """Builds the source named by ``data_cfg.source`` (validated beforehand by
  ``ihsweep.configuration.config``).

  Raises:
    errors.CorpusError: a natural-text corpus that cannot be read, tokenized or sampled.
    markov.MarkovError: a transition matrix that is not one, or synthetic targets not reached.
  """
  if data_cfg.source == "uniform":
    return UniformSource(vocab_size, batch_size, context_size)
  if data_cfg.source == "markov_chain":
    return MarkovChainSource(
      vocab_size,
      batch_size,
      context_size,
      n_successors=data_cfg.n_successors,
      seed=data_cfg.chain_seed,
    )
  if data_cfg.source == "repeated_blocks":
    return RepeatedBlocksSource(
      vocab_size,
      batch_size,
      context_size,
      block_min=data_cfg.block_min,
      block_max=data_cfg.block_max,
    )
  if data_cfg.source == "natural":
    return make_natural_source(data_cfg, vocab_size, batch_size, context_size)
  if data_cfg.source == "markov":
    return make_markov_source(data_cfg, vocab_size, batch_size, context_size)
  raise ValueError(f"config.data.source = {data_cfg.source!r}: allowed: {', '.join(SOURCES)}")


def make_natural_source(data_cfg, vocab_size: int, batch_size: int, context_size: int):
  """Tokenizes (or loads from the cache) the configured corpus and decides where its tokens
  live: on device if ``data.loader`` is 'device', or 'auto' and the training array fits
  ``data.device_budget_mb``; else host-fed.

  Raises:
    errors.CorpusError: see ``corpus.prepare_corpus``; a training split shorter than C + 1.
  """
  corpus = corpus_lib.prepare_corpus(data_cfg, vocab_size)
  n = int(corpus.train.size)
  if n < context_size + 1:
    raise errors.CorpusError(
      f"the training split of {corpus.meta['name']!r} has {n} tokens, fewer than "
      f"train.context_size + 1 = {context_size + 1}: use more text or a smaller context",
      "train.context_size",
    )
  if n >= 2**31:
    raise errors.CorpusError(
      f"the training split has {n:,} tokens; window offsets are int32, so at most 2^31 - 1: "
      f"set config.data.max_documents",
      "data.max_documents",
    )
  fits = corpus.train.nbytes <= data_cfg.device_budget_mb * 2**20
  on_device = data_cfg.loader == "device" or (data_cfg.loader == "auto" and fits)
  if data_cfg.loader != "auto":
    placement = f"data.loader = {data_cfg.loader!r}"
  else:
    placement = (
      f"data.loader = 'auto': {'within' if fits else 'over'} data.device_budget_mb = "
      f"{data_cfg.device_budget_mb:g} MiB"
    )
  return natural.NaturalTextSource(corpus, batch_size, context_size, on_device, placement)


def bigram_corpus_tokens(data_cfg, vocab_size: int) -> tuple[int, str]:
  """The BPE size used for a bigram Markov source's corpus and the config field that sets it:
  ``data.tokenizer_vocab``, or 2·V when 0 (BPE's intermediate merges and unused bytes leave
  many types that never occur, so a BPE of exactly V + 1 types has fewer than V occurring
  ones)."""
  if data_cfg.tokenizer_vocab:
    return data_cfg.tokenizer_vocab, "data.tokenizer_vocab"
  return 2 * vocab_size, "data.tokenizer_vocab (0: 2 · model.vocab_size)"


def markov_transitions(data_cfg, vocab_size: int):
  """(P float64 ``[V, V]``, first-token distribution ``[V]``, info dict) for
  ``data.transitions``.

  Raises:
    markov.MarkovError / errors.CorpusError: see ``make_markov_source``.
  """
  kind = data_cfg.transitions
  if kind == "bigram":
    corpus = corpus_lib.prepare_corpus(data_cfg, *bigram_corpus_tokens(data_cfg, vocab_size))
    p, first, _ = markov.bigram_transitions(corpus, vocab_size, data_cfg.smoothing)
    info = {
      "transitions": f"bigram of {corpus.meta['name']!r}",
      "corpus_tokens": corpus.meta["train_tokens"],
    }
  elif kind in ("synthetic", "iid"):
    spec = synthetic.SyntheticSpec.from_config(data_cfg.synthetic, vocab_size)
    if kind == "iid":
      spec = dataclasses.replace(spec, entropy_rate_bits=0.0, categoriality="none")
    p, report = synthetic.cached_matrix(spec, cache.resolve_cache_dir(data_cfg))
    first = markov.stationary_distribution(p)
    targets = {k: v for k, v in report["targets"].items() if v is not None}
    info = {
      "transitions": f"{kind} {spec.marginal}/{spec.categoriality}",
      "matrix": report["cache"],
      "targets": targets,
      "achieved": {k: round(v, 4) for k, v in report["achieved"].items()},
    }
  else:
    path = os.path.expanduser(data_cfg.matrix_file)
    try:
      raw = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
      raise markov.MarkovError(
        f"config.data.matrix_file = {data_cfg.matrix_file!r}: cannot load a .npy array ({e})",
        "data.matrix_file",
      ) from None
    p = markov.check_transition_matrix(raw, f"config.data.matrix_file {path}")
    if p.shape[0] != vocab_size:
      raise markov.MarkovError(
        f"config.data.matrix_file {path} is {p.shape[0]} × {p.shape[0]}; "
        f"model.vocab_size = {vocab_size} must match",
        "model.vocab_size",
      )
    first = markov.stationary_distribution(p)
    info = {"transitions": f"file {path}"}
  if kind == "bigram" or kind == "file":
    info.update({k: round(v, 4) for k, v in markov.describe_matrix(p).items()})
  return p, first, info


def make_markov_source(data_cfg, vocab_size: int, batch_size: int, context_size: int):
  """The ``markov`` source: transitions per ``data.transitions`` and per-model knobs.

  Raises:
    markov.MarkovError: a user matrix that is not a transition matrix (negative entries, rows
      not summing to 1), synthetic targets that cannot be reached (achieved vs asked), knobs
      outside [0, 1].
    errors.CorpusError: the bigram corpus cannot be read or tokenized.
  """
  freqs = tuple(data_cfg.frequencies) or (data_cfg.frequency,)
  rels = tuple(data_cfg.reliabilities) or (data_cfg.reliability,)
  for name, plural, values in (
    ("frequency", "frequencies", freqs),
    ("reliability", "reliabilities", rels),
  ):
    for i, v in enumerate(values):
      field = f"data.{name}" if len(values) == 1 else f"data.{plural}[{i}]"
      markov.check_knob(name, v, field)
  p, first, info = markov_transitions(data_cfg, vocab_size)
  return markov.MarkovSource(
    p,
    first,
    batch_size,
    context_size,
    tuple(map(float, freqs)),
    tuple(map(float, rels)),
    info,
    data_cfg.get("induction_start", "half"),
  )
