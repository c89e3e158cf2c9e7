"""Data sources. Every source plugs into the trainer through one interface:

``source.sample(key, data_params) -> int32 tokens [batch_size, context_size + 1]``

written for one model and jit/vmap-safe (the trainer vmaps it over the ensemble with per-model
keys and per-model ``data_params``, a pytree from ``source.data_params(E)`` with leading axis E).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from ihsweep.data.builtin import MarkovChainSource, UniformSource

SOURCES = ("uniform", "markov_chain")


class Source(Protocol):
  vocab_size: int
  batch_size: int
  context_size: int

  def data_params(self, n_models: int) -> Any: ...

  def sample(self, key: jax.Array, data_params: Any) -> jax.Array: ...


def make_source(data_cfg, vocab_size: int, batch_size: int, context_size: int) -> Source:
  """Builds the source named by ``data_cfg.source`` (validated beforehand by ``ihsweep.config``)."""
  if data_cfg.source == "uniform":
    return UniformSource(vocab_size, batch_size, context_size)
  if data_cfg.source == "markov_chain":
    return MarkovChainSource(vocab_size, batch_size, context_size,
                             n_successors=data_cfg.n_successors, seed=data_cfg.chain_seed)
  raise ValueError(f"config.data.source = {data_cfg.source!r}: allowed: {', '.join(SOURCES)}")
