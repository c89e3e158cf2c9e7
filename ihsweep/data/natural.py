"""Natural text: documents → byte-level BPE tokens → a cached flat token array → windows.

Pipeline (each stage validated before anything is compiled), one module per stage:

1. Documents (``documents.py``), from local files (a comma-separated list of globs: .txt/.md/
   .rst/.rst.txt as plain text, .html/.htm with tags stripped, .jsonl with one JSON object per
   line holding a text field, .parquet with a text column; one file, line or row = one
   document), from a tensorflow-datasets corpus read with ``tfds.data_source`` (random access
   over array_record files; no TensorFlow needed), or from the embedded ``python-docs`` corpus
   that ``ihsweep corpus fetch python-docs`` (``corpus.fetch_corpus``) unpacks from Debian's
   ``python3-doc`` package.
2. A train/validation split by document (each document is validation with probability
   ``val_fraction``, from ``split_seed``; ``documents.split_documents``).
3. A byte-level BPE tokenizer (``tokenizer.py``, HF ``tokenizers``; GPT-2's byte-to-unicode
   pre-tokenizer, no normaliser, so decode(encode(text)) == text) trained on the training
   documents to ``model.vocab_size`` types, id 0 = ``<|endoftext|>``; or a ``tokenizer.json``
   loaded as is.
4. Every document's ids followed by ``<|endoftext|>``, concatenated into flat uint16
   (V ≤ 65,536) or uint32 arrays ``train.npy`` / ``val.npy`` (streamed to disk in that dtype),
   cached under ``cache_dir/tokens/<name>-<hash>/`` keyed by (source, tokenizer, vocabulary,
   split, sample); a second run memory-maps them; processes sharing the cache build it once,
   under a lock (``corpus.prepare_corpus``; the cache directory rules: ``cache.py``).
5. Windows (``windows.py``, this module's ``NaturalTextSource``): each model draws B start
   offsets s ~ U{0, …, N − C − 1} from its own key and reads ``train[s : s + C + 1]``
   (GPT-2/nanoGPT-style packing: windows may span document boundaries, which the end-of-text
   token marks). If the array fits ``data.device_budget_mb`` it is placed on every device once
   and windows are gathered inside the jitted step; otherwise a host loader gathers the same
   windows (same keys, same offsets) from the memory-mapped file with numpy and prefetches them
   to the devices one call ahead.

Each stage's names are imported from its own module (``corpus.prepare_corpus``,
``errors.CorpusError``, …); this module holds the source that reads the windows.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from ihsweep.data.corpus import (
  TokenizedCorpus,
  unigram_counts,
)
from ihsweep.data.source import Source
from ihsweep.data.windows import host_window_starts, window_starts


@dataclasses.dataclass(frozen=True, eq=False)
class NaturalTextSource(Source):
  """Windows of C + 1 tokens from a tokenized corpus's training split.

  ``on_device``: whether the token array is placed on every device (``arrays()``) and windows
  are gathered in-graph; otherwise ``sample`` is not used and the trainer consumes batches from
  ``host_batches``. Held-out sequences are windows of the validation split
  (``held_out_windows``); no per-model data values (``data_params`` is the default, ``{}``).
  """

  corpus: TokenizedCorpus
  batch_size: int
  context_size: int
  on_device: bool = dataclasses.field()  # required: the bare annotation would default to Source's
  placement: str = ""  # why on device or not, for the run log

  has_held_out_windows = True

  @property
  def vocab_size(self) -> int:
    return self.corpus.vocab_size

  @property
  def n_tokens(self) -> int:
    return int(self.corpus.train.size)

  def arrays(self) -> dict:
    """``{"tokens": uint16/uint32 [N]}`` when on device (the trainer replicates it), else {}."""
    return {"tokens": np.asarray(self.corpus.train)} if self.on_device else {}

  def sample(self, key: jax.Array, data_params: dict, arrays: dict) -> jax.Array:
    """int32 tokens ``[B, C + 1]`` for one model, gathered in-graph from ``arrays["tokens"]``."""
    del data_params
    starts_B = window_starts(key, self.n_tokens, self.batch_size, self.context_size)
    idx_BxCp1 = starts_B[:, None] + jnp.arange(self.context_size + 1, dtype=jnp.int32)[None, :]
    return jnp.asarray(arrays["tokens"])[idx_BxCp1].astype(jnp.int32)

  def host_batches(self, data_keys_Ex2: np.ndarray, first_step: int, n_steps: int) -> np.ndarray:
    """The windows the in-graph path would draw for steps ``first_step …
    first_step + n_steps − 1``, gathered on the host: ``[E, U, B, C + 1]`` in the corpus dtype."""
    return self.host_rows(data_keys_Ex2, first_step, n_steps, slice(None))

  def host_rows(
    self, data_keys_Ex2: np.ndarray, first_step: int, n_steps: int, rows: slice
  ) -> np.ndarray:
    """Rows ``rows`` of ``host_batches``, ``[E, U, len(rows), C + 1]``: all B starts are drawn
    (cheap) so that the rows are those of the whole batch, but only the chosen windows are read
    from the memory-mapped corpus."""
    keys = jax.device_put(np.asarray(data_keys_Ex2), jax.local_devices(backend="cpu")[0])
    starts_ExUxR = np.asarray(
      host_window_starts(
        keys, first_step, n_steps, self.n_tokens, self.batch_size, self.context_size
      )
    )[:, :, rows]
    offsets = np.arange(self.context_size + 1, dtype=np.int64)
    return self.corpus.train[starts_ExUxR[..., None].astype(np.int64) + offsets]

  @property
  def special_ids(self) -> tuple[int, ...]:
    """Ids that are not text, ascending: the end-of-text separator and every token the
    tokenizer marks special (a user ``tokenizer.json``'s ``<pad>``, ``<bos>``, ``<unk>``; added
    tokens not marked special are text). Probes never use them."""
    ids = {self.corpus.eot_id}
    if self.corpus.tokenizer is not None:
      decoder = self.corpus.tokenizer.get_added_tokens_decoder()
      ids |= {i for i, t in decoder.items() if t.special}
    return tuple(sorted(int(i) for i in ids))

  @property
  def tokenizer(self):
    """The corpus's HF ``tokenizers.Tokenizer``."""
    return self.corpus.tokenizer

  def train_token_counts(self) -> np.ndarray:
    """Occurrences of each id in the training split, int64 ``[V]``."""
    return unigram_counts(self.corpus.train, self.vocab_size)

  def held_out_windows(self, key: jax.Array, n: int) -> np.ndarray:
    """``n`` windows of C + 1 tokens ``[n, C + 1]`` in the corpus dtype from the validation
    split (the training split if the validation split is shorter than C + 1 tokens, e.g.
    ``data.val_fraction`` = 0)."""
    tokens = self.corpus.val if self.corpus.val.size > self.context_size else self.corpus.train
    if tokens is self.corpus.train:
      logging.getLogger("ihsweep").warning(
        "the validation split has %d tokens (< C + 1 = %d): held-out sequences, val_loss and "
        "the ICL score use training windows; raise data.val_fraction for a real validation "
        "split",
        self.corpus.val.size,
        self.context_size + 1,
      )
    key = jax.device_put(key, jax.local_devices(backend="cpu")[0])
    starts = np.asarray(window_starts(key, int(tokens.size), n, self.context_size), np.int64)
    return np.asarray(tokens[starts[:, None] + np.arange(self.context_size + 1)])

  def describe(self) -> str:
    meta = self.corpus.meta
    size_mib = self.corpus.train.nbytes / 2**20
    where = (
      "on device, windows gathered in-graph"
      if self.on_device
      else "in host memory, windows gathered by a host loader with prefetch"
    )
    return (
      f"natural text {meta['name']!r}: {meta['train_tokens']:,} train / "
      f"{meta['val_tokens']:,} val tokens ({meta['train_documents']} / "
      f"{meta['val_documents']} documents, {size_mib:.2f} MiB {meta['dtype']}), {where} "
      f"({self.placement}); "
      f"cache {'hit' if self.corpus.cache_hit else 'built'}: {self.corpus.path}"
    )
