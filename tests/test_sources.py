"""The data-source interface (ihsweep/data/source.py): every built-in source has every member of
``Source`` with its documented type, and a user's source that writes only ``sample`` (the base
gives ``data_params``, ``arrays`` and the rest) goes through the probes and a training run."""

import dataclasses
import inspect
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.data import builtin, make_source, markov, natural, probes
from ihsweep.data import corpus as corpus_lib
from ihsweep.data.source import Source
from ihsweep.training import group_build, runner

BUILTIN = {
  builtin.UniformSource,
  builtin.RepeatedBlocksSource,
  builtin.MarkovChainSource,
  markov.MarkovSource,
  natural.NaturalTextSource,
}


def _word_corpus():
  """A tokenized corpus of a WordLevel tokenizer with special tokens <|endoftext|>, <pad>,
  <bos> (ids 0, 9, 10) and an added text token (id 11); V = 16."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  words = ["<|endoftext|>", "the", "head", "copies", "a", "token", "after", "its", "prefix"]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="the"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(["<|endoftext|>", "<pad>", "<bos>"])
  tok.add_tokens(["induction"])
  train = np.random.default_rng(0).integers(0, 12, 4000).astype(np.uint16)
  val = np.random.default_rng(1).integers(0, 12, 400).astype(np.uint16)
  return corpus_lib.TokenizedCorpus(
    train=train,
    val=val,
    tokenizer=tok,
    eot_id=0,
    vocab_size=16,
    path="",
    cache_hit=False,
    meta={
      "name": "words",
      "train_tokens": 4000,
      "val_tokens": 400,
      "train_documents": 1,
      "val_documents": 1,
      "dtype": "uint16",
    },
  )


def _builtin_sources(tiny, tmp_path):
  """(name, source) for every built-in source, natural text both on device and host-fed."""
  v, b, c = 64, 4, 16
  p = np.random.default_rng(0).dirichlet(np.ones(v), size=v)
  np.save(tmp_path / "p.npy", p)
  cfg = tiny(
    **{
      "data.source": "markov",
      "data.transitions": "file",
      "data.matrix_file": str(tmp_path / "p.npy"),
      "data.frequencies": (0.2, 0.8),
    }
  )
  corpus = _word_corpus()
  return [
    ("uniform", make_source(tiny(**{"data.source": "uniform"}).data, v, b, c)),
    ("markov_chain", make_source(tiny(**{"data.source": "markov_chain"}).data, v, b, c)),
    ("repeated_blocks", make_source(tiny(**{"data.source": "repeated_blocks"}).data, v, b, c)),
    ("markov", make_source(cfg.data, v, b, c)),
    ("natural/device", natural.NaturalTextSource(corpus, b, c, True, "test")),
    ("natural/host", natural.NaturalTextSource(corpus, b, c, False, "test")),
  ]


def test_the_builtin_sources_are_all_the_source_classes_of_the_package():
  import ihsweep.data as data_pkg

  found = set()
  for name in os.listdir(os.path.dirname(data_pkg.__file__)):
    if name.endswith(".py"):
      module = __import__(f"ihsweep.data.{name[:-3]}", fromlist=["_"])
      found |= {
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, Source) and c is not Source and c.__module__ == module.__name__
      }
  assert found == BUILTIN


def test_every_builtin_source_has_every_member_with_its_type(tiny, tmp_path):
  n_models, key = 2, jax.random.PRNGKey(3)
  for name, src in _builtin_sources(tiny, tmp_path):
    assert isinstance(src, Source), name
    v, b, c = src.vocab_size, src.batch_size, src.context_size
    assert (type(v), type(b), type(c)) == (int, int, int), name
    assert type(src.on_device) is bool and type(src.has_held_out_windows) is bool, name
    assert type(src.special_ids) is tuple and list(src.special_ids) == sorted(src.special_ids)
    assert all(type(i) is int and 0 <= i < v for i in src.special_ids), name
    described = src.describe()
    assert isinstance(described, str) and described and "\n" not in described, name

    dp = src.data_params(n_models)
    assert all(np.shape(x)[0] == n_models for x in jax.tree_util.tree_leaves(dp)), name
    arrays = src.arrays()
    assert all(isinstance(x, np.ndarray) for x in jax.tree_util.tree_leaves(arrays)), name
    if src.on_device:
      dp0 = jax.tree_util.tree_map(lambda x: x[0], dp)
      tokens = np.asarray(jax.jit(src.sample)(key, dp0, arrays))
      assert tokens.dtype == np.int32 and tokens.shape == (b, c + 1), name
      assert tokens.min() >= 0 and tokens.max() < v, name
    else:
      keys = jax.random.split(key, n_models)
      batches = np.asarray(src.host_batches(keys, 5, 3))
      assert batches.shape == (n_models, 3, b, c + 1), name
      assert np.issubdtype(batches.dtype, np.integer) and batches.max() < v, name

    windows = src.held_out_windows(key, 5)
    counts = src.train_token_counts()
    if name.startswith("natural"):
      assert src.has_held_out_windows and windows.shape == (5, c + 1)
      val = np.asarray(src.corpus.val)
      for w in windows:  # every window is a slice of the validation split
        assert any((val[s : s + c + 1] == w).all() for s in np.flatnonzero(val == w[0]))
      np.testing.assert_array_equal(counts, np.bincount(src.corpus.train, minlength=16))
      assert counts.dtype == np.int64
      assert src.special_ids == (0, 9, 10)  # <|endoftext|>, <pad>, <bos>; not "induction"
      assert src.tokenizer is src.corpus.tokenizer
    else:
      assert not src.has_held_out_windows and windows is None and counts is None, name
      assert src.special_ids == () and src.tokenizer is None and src.on_device, name
      with pytest.raises(NotImplementedError, match=type(src).__name__):
        src.host_batches(jax.random.split(key, n_models), 0, 1)
  uniform, chain, blocks = (s for _, s in _builtin_sources(tiny, tmp_path)[:3])
  assert uniform.describe() == "uniform V=64, generated in-graph"
  assert blocks.describe() == "repeated blocks V=64, block length 4–8, generated in-graph"
  assert chain.describe().startswith("markov chain V=64, 4 successors per token, chain seed 0")


def test_the_defaults_are_not_dataclass_fields():
  """The base's defaults leave each source's fields, __init__, equality and hash as written."""
  assert [f.name for f in dataclasses.fields(builtin.UniformSource)] == [
    "vocab_size",
    "batch_size",
    "context_size",
  ]
  assert builtin.UniformSource(64, 8, 32) == builtin.UniformSource(64, 8, 32)
  assert hash(builtin.UniformSource(64, 8, 32)) == hash(builtin.UniformSource(64, 8, 32))
  fields = {f.name: f for f in dataclasses.fields(natural.NaturalTextSource)}
  assert fields["on_device"].default is dataclasses.MISSING  # still required
  with pytest.raises(TypeError, match="on_device"):
    natural.NaturalTextSource(_word_corpus(), 4, 16)
  assert not natural.NaturalTextSource(_word_corpus(), 4, 16, False).on_device


@dataclasses.dataclass(frozen=True)
class Counting(Source):
  """A user's source with only ``sample``: sequences x_i = (s + i) mod V, s uniform per
  sequence — a pattern that only this source produces."""

  vocab_size: int
  batch_size: int
  context_size: int

  def sample(self, key, data_params, arrays):
    start_B = jax.random.randint(key, (self.batch_size,), 0, self.vocab_size, jnp.int32)
    pos = jnp.arange(self.context_size + 1, dtype=jnp.int32)
    return (start_B[:, None] + pos[None, :]) % self.vocab_size


def _is_counting(seqs, v):
  return bool((np.diff(np.asarray(seqs, np.int64), axis=-1) % v == 1).all())


def test_a_source_needs_sample():
  @dataclasses.dataclass(frozen=True)
  class NoSample(Source):
    vocab_size: int = 4
    batch_size: int = 1
    context_size: int = 4

  with pytest.raises(TypeError, match="sample"):
    NoSample()


def test_a_user_source_with_only_sample_gets_probes_from_the_defaults(tiny):
  src = Counting(64, 8, 32)
  assert src.describe() == "Counting V=64, B=8, C=32, generated in-graph"
  cfg = tiny(**{"eval.n_sequences": 6, "eval.n_probes": 5, "eval.probe_top_k": 20})
  p = probes.make_probes(src, src.data_params(2), src.arrays(), cfg.eval, 2, 32)
  assert p.sequences.shape == (2, 6, 33) and p.sequences.dtype == np.int32
  assert _is_counting(p.sequences, 64)  # fresh draws of sample, not some default data
  # One set per model, from the same key: without per-model values the sets are equal.
  np.testing.assert_array_equal(p.sequences[0], p.sequences[1])
  assert "(held-out sequences)" in p.candidates  # counted there: no train_token_counts
  assert p.repeated.shape[0] == 5 and p.block_len == 16


def test_a_user_source_with_only_sample_trains_and_is_evaluated(
  tiny, tmp_path, monkeypatch, caplog
):
  monkeypatch.setattr(group_build, "make_source", lambda data, v, b, c: Counting(v, b, c))
  cfg = tiny(
    **{
      "model.n_layers": 1,
      "model.d_mlp": 0,
      "ensemble.size": 1,
      "train.num_steps": 10,
      "train.steps_per_call": 10,
      "eval.every_steps": 10,
      "eval.n_probes": 4,
      "eval.n_sequences": 2,
    }
  )
  with caplog.at_level(logging.INFO, logger="ihsweep"):
    out = runner.fit(cfg, str(tmp_path), progress=False, devices=jax.devices()[:1])
  assert out.step == 10
  assert "data: Counting V=64, B=8, C=32, generated in-graph" in caplog.text
  saved = probes.Probes.load(str(tmp_path / "probes.npz"))
  assert saved.sequences.shape == (1, 2, 33) and _is_counting(saved.sequences, 64)
