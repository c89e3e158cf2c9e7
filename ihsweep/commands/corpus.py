"""``ihsweep corpus fetch NAME`` (an embedded corpus into the cache) and ``ihsweep corpus
prepare --config=FILE`` (tokenize and cache the config's corpus; print its counts)."""

from __future__ import annotations

import json

from ihsweep.commands.common import fail, load_config
from ihsweep.commands.flags import FLAGS

NAME = "corpus"
DESCRIPTION = "corpus fetch NAME (embedded corpora: python-docs) | corpus prepare --config=FILE"
SUBCOMMAND_FLAGS = {"fetch": ("cache_dir",), "prepare": ("config",)}
FLAGS_ONLY, COMPILES, TRAINS = False, False, False
USAGE = """usage: ihsweep corpus fetch NAME [--cache_dir=DIR]
       ihsweep corpus prepare --config=FILE[:VARIANT] [--config.data.FIELD=VALUE ...]"""
ABOUT = """\
fetch NAME   download an embedded corpus into the cache (NAME: python-docs, the Python
             documentation from Debian's python3-doc; needs apt-get and dpkg, no root)
prepare      read, split, tokenize and cache the config's natural-text corpus (e.g. once
             before a sweep) and print its counts as JSON"""


def main(argv) -> int:
  from ihsweep.data import corpus as corpus_lib
  from ihsweep.data import documents
  from ihsweep.data.errors import DataError

  args = argv[1:]
  try:
    if args[:1] == ["fetch"] and len(args) == 2:
      path = corpus_lib.fetch_corpus(args[1], FLAGS.cache_dir)
      print(
        f"fetched {args[1]} into {path}; train on it with "
        f"--config.data.source=natural --config.data.corpus={args[1]}"
      )
      return 0
    if args == ["prepare"]:
      return _prepare()
  except DataError as e:
    return fail(str(e))
  return fail(
    "usage: ihsweep corpus fetch NAME [--cache_dir=DIR] | ihsweep corpus prepare "
    f"--config=FILE (corpora: {', '.join(documents.CORPORA)})"
  )


def _prepare() -> int:
  from ihsweep.configuration import config as config_lib
  from ihsweep.configuration import fields
  from ihsweep.data import bigram_corpus_tokens
  from ihsweep.data import corpus as corpus_lib

  cfg, failed = load_config()
  if failed is not None:
    return failed
  if cfg is None:
    return fail("corpus prepare needs --config=FILE")
  if cfg.data.source == "natural":
    vocab, field = cfg.model.vocab_size, "model.vocab_size"
  elif cfg.data.source == "markov" and cfg.data.transitions == "bigram":
    vocab, field = bigram_corpus_tokens(cfg.data, cfg.model.vocab_size)
  else:
    return fail(
      f"config.data.source = {cfg.data.source!r}: corpus prepare needs 'natural' "
      f"or 'markov' with data.transitions = 'bigram'"
    )
  try:
    config_lib.validate(cfg)
    corpus = corpus_lib.prepare_corpus(cfg.data, vocab, field)
  except fields.ConfigError as e:
    return fail(f"invalid config: {e}")
  print(json.dumps({"path": corpus.path, "cache_hit": corpus.cache_hit, **corpus.meta}, indent=2))
  return 0
