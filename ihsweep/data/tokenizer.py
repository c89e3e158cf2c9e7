"""The tokenizer of a natural-text corpus (HF ``tokenizers``): a byte-level BPE trained on the
training documents (GPT-2's byte-to-unicode pre-tokenizer, no normaliser, so
decode(encode(text)) == text; id 0 = ``<|endoftext|>``), or a user's ``tokenizer.json`` loaded as
is. Either way ``<|endoftext|>`` (``EOT``) separates documents in the token stream.
"""

from __future__ import annotations

import os
from typing import Iterable

from ihsweep.data.errors import CorpusError

EOT = "<|endoftext|>"
BYTE_LEVEL_MIN_VOCAB = 257  # 256 byte symbols + <|endoftext|>


def train_bpe(docs: Iterable[str], vocab_size: int, field: str = "model.vocab_size"):
  """A byte-level BPE ``tokenizers.Tokenizer`` trained to ``vocab_size`` types (GPT-2's scheme:
  byte-to-unicode pre-tokenizer and decoder, no normaliser). id 0 is ``<|endoftext|>``, ids
  1–256 the bytes, the rest merges.

  Raises:
    CorpusError: ``vocab_size`` < 257, or the corpus has too few distinct pairs to reach it.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  if vocab_size < BYTE_LEVEL_MIN_VOCAB:
    raise CorpusError(
      f"config.{field} = {vocab_size}: a byte-level BPE needs at least "
      f"{BYTE_LEVEL_MIN_VOCAB} (256 bytes + {EOT})",
      field,
    )
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=[EOT],
    show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  tok.train_from_iterator(docs, trainer)
  if tok.get_vocab_size() < vocab_size:
    raise CorpusError(
      f"config.{field} = {vocab_size}: this corpus only supports "
      f"{tok.get_vocab_size()} BPE types (it runs out of pairs to merge); use a value "
      f"<= {tok.get_vocab_size()} or a larger corpus",
      field,
    )
  return tok


def load_tokenizer(path: str, vocab_size: int, vocab_field: str = "model.vocab_size"):
  """A ``tokenizer.json`` (HF ``tokenizers``) with an ``<|endoftext|>`` token and at most
  ``vocab_size`` types (a model may pad its vocabulary); ``vocab_field`` is the config field
  that sets ``vocab_size``.

  Raises:
    CorpusError: unreadable file, no end-of-text token, more types (or a higher id) than the
      model has (naming ``vocab_field`` and the tokenizer's size).
  """
  from tokenizers import Tokenizer

  try:
    tok = Tokenizer.from_file(os.path.expanduser(path))
  except Exception as e:  # tokenizers raises its own Exception type
    raise CorpusError(
      f"config.data.tokenizer = {path!r}: cannot load a tokenizer.json ({e})", "data.tokenizer"
    ) from None
  if tok.token_to_id(EOT) is None:
    raise CorpusError(
      f"config.data.tokenizer = {path!r} has no {EOT} token to separate documents", "data.tokenizer"
    )
  if tok.get_vocab_size() > vocab_size:
    raise CorpusError(
      f"config.{vocab_field} = {vocab_size} is smaller than the tokenizer's "
      f"{tok.get_vocab_size()} types ({path}): use {vocab_field} >= "
      f"{tok.get_vocab_size()} or a tokenizer of at most {vocab_size} types",
      vocab_field.split(" ")[0],
    )
  top = max(tok.get_vocab(with_added_tokens=True).values())
  if top >= vocab_size:
    raise CorpusError(
      f"config.{vocab_field} = {vocab_size}: the tokenizer {path} uses ids up "
      f"to {top}; the model needs vocab_size > {top}",
      vocab_field.split(" ")[0],
    )
  return tok
