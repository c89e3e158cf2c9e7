"""Validation of run configs, done before anything is compiled.

Every check raises ``ConfigError`` naming the field, the value it got and what is allowed, so a bad
override on the command line costs a second, not a compilation.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

import jax

from ihsweep.data import SOURCES
from ihsweep.model import DTYPES, POS_ENCODINGS
from ihsweep.sharding import MeshError, mesh_shape

SCHEDULES = ("cosine", "constant", "inverse_sqrt")


class ConfigError(ValueError):
  """A config field has a value that is not allowed."""

  def __init__(self, field: str, value, allowed: str):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f"config.{field} = {value!r} is not allowed: {allowed}")


def _int(cfg, section: str, name: str, lo: int | None = None, hi: int | None = None,
         hint: str = "") -> int:
  value = cfg[section][name]
  field = f"{section}.{name}"
  if isinstance(value, bool) or not isinstance(value, Integral):
    raise ConfigError(field, value, "an integer")
  if (lo is not None and value < lo) or (hi is not None and value > hi):
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise ConfigError(field, value, f"an integer {rng}{hint}")
  return int(value)


def _real(cfg, section: str, name: str, lo: float, hi: float = math.inf, *,
          lo_open: bool = False, hi_open: bool = True) -> float:
  value = cfg[section][name]
  field = f"{section}.{name}"
  _check_real(field, value, lo, hi, lo_open, hi_open)
  return float(value)


def _check_real(field, value, lo, hi, lo_open, hi_open):
  ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
  if ok:
    ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
  if not ok:
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    raise ConfigError(field, value, f"a finite number in {left}{lo}, {hi}{right}")


def _choice(cfg, section: str, name: str, allowed) -> str:
  value = cfg[section][name]
  if value not in allowed:
    raise ConfigError(f"{section}.{name}", value, f"one of {', '.join(map(repr, allowed))}")
  return value


def _validate_natural(cfg, vocab: int, vocab_field: str) -> None:
  """Cheap checks of a natural-text data section; the corpus itself is read (and its length
  checked) when the source is built, still before compiling."""
  from ihsweep.data import LOADERS, natural
  _choice(cfg, "data", "loader", LOADERS)
  _real(cfg, "data", "device_budget_mb", 0.0)
  _real(cfg, "data", "val_fraction", 0.0, 1.0)
  _int(cfg, "data", "split_seed", 0)
  _int(cfg, "data", "max_documents", 0, hint=" (0 = all)")
  for name in ("corpus", "files", "tfds_name", "tfds_split", "tfds_data_dir", "text_field",
               "tokenizer", "cache_dir"):
    if not isinstance(cfg.data[name], str):
      raise ConfigError(f"data.{name}", cfg.data[name], "a string")
  tokenizer = cfg.data.tokenizer
  if tokenizer == "bpe":
    if vocab < natural.BYTE_LEVEL_MIN_VOCAB:
      raise ConfigError(vocab_field, vocab,
                        f">= {natural.BYTE_LEVEL_MIN_VOCAB} for a byte-level BPE (256 bytes + "
                        f"{natural.EOT})")
  elif not os.path.isfile(os.path.expanduser(tokenizer)):
    raise ConfigError("data.tokenizer", tokenizer, "'bpe' or the path of a tokenizer.json")
  natural.document_source(cfg.data)  # one of corpus/files/tfds_name; files exist; TFDS known


def _validate_markov(cfg, vocab: int, n_models: int) -> None:
  """The markov source's knobs and transitions (a user matrix and synthetic targets are checked
  in full when the source is built, before compiling)."""
  from ihsweep.data import TRANSITIONS
  kind = _choice(cfg, "data", "transitions", TRANSITIONS)
  for name, plural in (("frequency", "frequencies"), ("reliability", "reliabilities")):
    _real(cfg, "data", name, 0.0, 1.0, hi_open=False)
    values = cfg.data[plural]
    if values and len(values) != n_models:
      raise ConfigError(f"data.{plural}", values, f"empty (all models use data.{name}) or one "
                        f"value per model (ensemble.size = {n_models})")
    for i, v in enumerate(values):
      _check_real(f"data.{plural}[{i}]", v, 0.0, 1.0, False, False)
  _real(cfg, "data", "smoothing", 0.0)
  _int(cfg, "data", "tokenizer_vocab", 0, hint=" (0 = 2 · model.vocab_size)")
  context = cfg.train.context_size
  if vocab < context + 1:
    raise ConfigError("model.vocab_size", vocab,
                      f">= train.context_size + 1 = {context + 1} for data.source = 'markov': a "
                      f"sequence must be able to hold C + 1 distinct tokens (first-half draws "
                      f"exclude every earlier token)")
  if kind == "file" and not os.path.isfile(os.path.expanduser(cfg.data.matrix_file)):
    raise ConfigError("data.matrix_file", cfg.data.matrix_file,
                      "the path of a [V, V] .npy transition matrix (data.transitions = 'file')")
  if kind in ("synthetic", "iid"):
    from ihsweep.data import synthetic
    syn = cfg.data.synthetic
    if syn.marginal not in synthetic.MARGINALS:
      raise ConfigError("data.synthetic.marginal", syn.marginal,
                        f"one of {', '.join(map(repr, synthetic.MARGINALS))}")
    if syn.categoriality not in synthetic.CATEGORIALITY:
      raise ConfigError("data.synthetic.categoriality", syn.categoriality,
                        f"one of {', '.join(map(repr, synthetic.CATEGORIALITY))}")
    sub = {"data.synthetic": syn}
    _int(sub, "data.synthetic", "iterations", 1)
    _int(sub, "data.synthetic", "power_iterations", 1)
    _int(sub, "data.synthetic", "n_groups", 1)
    _real(sub, "data.synthetic", "lr", 0.0, lo_open=True)
    if kind == "synthetic":  # unreachable targets (raises markov.MarkovError with both values)
      synthetic.check_spec(synthetic.SyntheticSpec.from_config(syn, vocab))


def validate(cfg) -> None:
  """Checks a whole run config (``configs/*.py`` layout); raises ``ConfigError`` on the first
  bad field (``DataError`` for data that cannot be found or whose targets cannot be reached).
  Does not touch devices beyond counting them."""
  for section in ("model", "train", "ensemble", "data", "mesh"):
    if section not in cfg:
      raise ConfigError(section, None, f"a section '{section}' (see configs/default.py)")

  n_layers = _int(cfg, "model", "n_layers", 1)
  n_heads = _int(cfg, "model", "n_heads", 1)
  d_model = _int(cfg, "model", "d_model", 1)
  if d_model % n_heads:
    divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
    raise ConfigError("model.n_heads", n_heads,
                      f"a divisor of model.d_model = {d_model}: one of {divisors}")
  del n_layers
  _int(cfg, "model", "d_mlp", 0, hint=" (0 = attention-only)")
  vocab = _int(cfg, "model", "vocab_size", 2)
  max_context = _int(cfg, "model", "max_context", 1)
  pos = _choice(cfg, "model", "pos_encoding", POS_ENCODINGS)
  if pos == "rotary" and (d_model // n_heads) % 2:
    raise ConfigError("model.n_heads", n_heads,
                      f"rotary needs an even head size; d_model / n_heads = {d_model // n_heads}")
  _choice(cfg, "model", "dtype", DTYPES)
  _choice(cfg, "model", "param_dtype", ("float32", "bfloat16"))
  if not isinstance(cfg.model.tie_embeddings, bool):
    raise ConfigError("model.tie_embeddings", cfg.model.tie_embeddings, "True or False")

  batch = _int(cfg, "train", "batch_size", 1)
  _int(cfg, "train", "context_size", 1, max_context,
       hint=f" (at most model.max_context = {max_context})")
  _int(cfg, "train", "num_steps", 1)
  _int(cfg, "train", "steps_per_call", 1)
  _real(cfg, "train", "lr", 0.0, lo_open=True)
  _choice(cfg, "train", "schedule", SCHEDULES)
  _real(cfg, "train", "warmup_frac", 0.0, 1.0)
  _real(cfg, "train", "b1", 0.0, 1.0)
  _real(cfg, "train", "b2", 0.0, 1.0)
  _real(cfg, "train", "eps", 0.0, lo_open=True)
  _real(cfg, "train", "weight_decay", 0.0)
  _real(cfg, "train", "grad_clip", 0.0)

  size = _int(cfg, "ensemble", "size", 1)
  peak_lrs = cfg.ensemble.peak_lrs
  if peak_lrs:
    if len(peak_lrs) != size:
      raise ConfigError("ensemble.peak_lrs", peak_lrs,
                        f"empty (all models use train.lr) or one value per model "
                        f"(ensemble.size = {size})")
    for i, lr in enumerate(peak_lrs):
      _check_real(f"ensemble.peak_lrs[{i}]", lr, 0.0, math.inf, True, True)
  if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, Integral) or cfg.seed < 0:
    raise ConfigError("seed", cfg.seed, "an integer >= 0")

  source = _choice(cfg, "data", "source", SOURCES)
  if source == "markov_chain":
    _int(cfg, "data", "n_successors", 1, vocab,
         hint=f" (at most model.vocab_size = {vocab})")
    _int(cfg, "data", "chain_seed", 0)
  text = source == "natural" or (source == "markov" and cfg.data.transitions == "bigram")
  if source == "markov":
    _validate_markov(cfg, vocab, size)
  if text:
    from ihsweep.data import bigram_corpus_tokens
    if source == "natural":
      _validate_natural(cfg, vocab, "model.vocab_size")
    else:
      _validate_natural(cfg, *bigram_corpus_tokens(cfg.data, vocab))
  else:
    for name in ("corpus", "files", "tfds_name"):
      if cfg.data.get(name):
        raise ConfigError(f"data.{name}", cfg.data[name],
                          f"empty unless data.source = 'natural' or 'markov' with "
                          f"transitions 'bigram' (data.source is {source!r}; add "
                          f"--config.data.source=natural to train on this text)")

  n_avail = len(jax.devices())
  n_dev = _int(cfg, "mesh", "num_devices", 0, n_avail,
               hint=f" (0 = all {n_avail} available devices)")
  try:
    n_ens, _ = mesh_shape(size, batch, n_dev or n_avail)
  except MeshError as e:
    raise ConfigError("mesh.num_devices", n_dev, str(e)) from None
  chunk = _int(cfg, "ensemble", "vmap_chunk", 0, hint=" (0 = auto)")
  local = size // n_ens
  if chunk and local % chunk:
    raise ConfigError("ensemble.vmap_chunk", chunk,
                      f"0 (auto) or a divisor of the {local} models per device "
                      f"(E = {size} over an ensemble mesh axis of {n_ens})")
