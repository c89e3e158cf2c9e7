"""Data sources. Every source plugs into the trainer through one interface:

``source.sample(key, data_params, arrays) -> int32 tokens [batch_size, context_size + 1]``

written for one model and jit/vmap-safe. The trainer vmaps it over the ensemble with per-model
keys and per-model ``data_params`` (a pytree from ``source.data_params(E)`` with leading axis E,
e.g. a Markov source's knobs), while ``arrays`` (``source.arrays()``: a pytree of numpy arrays
placed once on every device, e.g. a corpus's tokens or a transition table) is shared by all
models and passed as an argument, never baked into the program as a constant.

A source with ``on_device = False`` (a corpus over the device-memory budget) instead provides
``host_batches(data_keys, first_step, n_steps) -> [E, K, B, C + 1]`` drawing the same windows on
the host; the runner prefetches them to the devices.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from ihsweep.data import natural
from ihsweep.data.builtin import MarkovChainSource, UniformSource

SOURCES = ("uniform", "markov_chain", "natural")
LOADERS = ("auto", "device", "host")


def default_config():
  """The ``data`` config section with every field at its default (``configs/*.py`` start from
  this; unknown fields cannot be added from the command line, so all live here).

  source: 'uniform' | 'markov_chain' | 'natural'.
  markov_chain: n_successors (successors per token), chain_seed.
  natural — documents from exactly one of: corpus ('python-docs', see ``ihsweep corpus fetch``),
    files (comma-separated globs of .txt/.md/.rst/.html/.jsonl/.parquet), tfds_name (e.g.
    'c4/en', read with ``tfds.data_source`` from tfds_data_dir, split tfds_split; tfds_download
    lets TFDS download and prepare it); text_field (jsonl/parquet/TFDS field); max_documents
    (0 = all); tokenizer ('bpe' = train a byte-level BPE to model.vocab_size, or a path to a
    tokenizer.json); val_fraction and split_seed (validation documents); cache_dir ('' =
    $IHSWEEP_CACHE or ~/.cache/ihsweep); loader ('auto' = on device if the training tokens fit
    device_budget_mb MiB per device, 'device', 'host').
  """
  import ml_collections
  return ml_collections.ConfigDict(dict(
      source="markov_chain", n_successors=4, chain_seed=0,
      corpus="", files="", tfds_name="", tfds_split="train", tfds_data_dir="",
      tfds_download=False, text_field="text", max_documents=0, tokenizer="bpe",
      val_fraction=0.01, split_seed=0, cache_dir="", loader="auto", device_budget_mb=1024.0))


class Source(Protocol):
  vocab_size: int
  batch_size: int
  context_size: int

  def data_params(self, n_models: int) -> Any: ...

  def arrays(self) -> Any: ...

  def sample(self, key: jax.Array, data_params: Any, arrays: Any) -> jax.Array: ...


def make_source(data_cfg, vocab_size: int, batch_size: int, context_size: int) -> Source:
  """Builds the source named by ``data_cfg.source`` (validated beforehand by ``ihsweep.config``).

  Raises:
    natural.CorpusError: a natural-text corpus that cannot be read, tokenized or sampled.
  """
  if data_cfg.source == "uniform":
    return UniformSource(vocab_size, batch_size, context_size)
  if data_cfg.source == "markov_chain":
    return MarkovChainSource(vocab_size, batch_size, context_size,
                             n_successors=data_cfg.n_successors, seed=data_cfg.chain_seed)
  if data_cfg.source == "natural":
    return make_natural_source(data_cfg, vocab_size, batch_size, context_size)
  raise ValueError(f"config.data.source = {data_cfg.source!r}: allowed: {', '.join(SOURCES)}")


def make_natural_source(data_cfg, vocab_size: int, batch_size: int, context_size: int):
  """Tokenizes (or loads from the cache) the configured corpus and decides where its tokens
  live: on device if ``data.loader`` is 'device', or 'auto' and the training array fits
  ``data.device_budget_mb``; else host-fed.

  Raises:
    natural.CorpusError: see ``natural.prepare_corpus``; a training split shorter than C + 1.
  """
  corpus = natural.prepare_corpus(data_cfg, vocab_size)
  n = int(corpus.train.size)
  if n < context_size + 1:
    raise natural.CorpusError(
        f"the training split of {corpus.meta['name']!r} has {n} tokens, fewer than "
        f"train.context_size + 1 = {context_size + 1}: use more text or a smaller context",
        "train.context_size")
  if n >= 2**31:
    raise natural.CorpusError(
        f"the training split has {n:,} tokens; window offsets are int32, so at most 2^31 - 1: "
        f"set config.data.max_documents", "data.max_documents")
  fits = corpus.train.nbytes <= data_cfg.device_budget_mb * 2**20
  on_device = data_cfg.loader == "device" or (data_cfg.loader == "auto" and fits)
  if data_cfg.loader != "auto":
    placement = f"data.loader = {data_cfg.loader!r}"
  else:
    placement = (f"data.loader = 'auto': {'within' if fits else 'over'} data.device_budget_mb = "
                 f"{data_cfg.device_budget_mb:g} MiB")
  return natural.NaturalTextSource(corpus, batch_size, context_size, on_device, placement)
