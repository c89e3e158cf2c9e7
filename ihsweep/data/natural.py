"""Natural text: documents → byte-level BPE tokens → a cached flat token array → windows.

Pipeline (each stage validated before anything is compiled):

1. Documents, from local files (a comma-separated list of globs: .txt/.md/.rst/.rst.txt as
   plain text, .html/.htm with tags stripped, .jsonl with one JSON object per line holding a
   text field, .parquet with a text column; one file, line or row = one document), from a
   tensorflow-datasets corpus read with ``tfds.data_source`` (random access over array_record
   files; no TensorFlow needed), or from the embedded ``python-docs`` corpus that
   ``ihsweep corpus fetch python-docs`` unpacks from Debian's ``python3-doc`` package.
2. A train/validation split by document (each document is validation with probability
   ``val_fraction``, from ``split_seed``).
3. A byte-level BPE tokenizer (HF ``tokenizers``; GPT-2's byte-to-unicode pre-tokenizer, no
   normaliser, so decode(encode(text)) == text) trained on the training documents to
   ``model.vocab_size`` types, id 0 = ``<|endoftext|>``; or a ``tokenizer.json`` loaded as is.
4. Every document's ids followed by ``<|endoftext|>``, concatenated into flat uint16 (V ≤ 65,536)
   or uint32 arrays ``train.npy`` / ``val.npy``, cached under
   ``cache_dir/tokens/<name>-<hash>/`` keyed by (source, tokenizer, vocabulary, split); a second
   run memory-maps them.
5. Windows: each model draws B start offsets s ~ U{0, …, N − C − 1} from its own key and reads
   ``train[s : s + C + 1]`` (GPT-2/nanoGPT-style packing: windows may span document
   boundaries, which the end-of-text token marks). If the array fits
   ``data.device_budget_mb`` it is placed on every device once and windows are gathered inside
   the jitted step; otherwise a host loader gathers the same windows (same keys, same offsets)
   from the memory-mapped file with numpy and prefetches them to the devices one call ahead.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import html.parser
import json
import logging
import os
import shutil
import socket
import tempfile
from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse

from ihsweep.data.errors import DataError
from ihsweep.data.keys import step_keys

log = logging.getLogger("ihsweep")

EOT = "<|endoftext|>"
BYTE_LEVEL_MIN_VOCAB = 257  # 256 byte symbols + <|endoftext|>
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
HTML_SUFFIXES = (".html", ".htm")
CORPORA = ("python-docs",)
_ENCODE_CHUNK = 1024  # documents per encode_batch call
_FORMAT_VERSION = 1  # bump when the cached arrays' meaning changes


class CorpusError(DataError):
  """The corpus cannot be read, tokenized or sampled as configured."""


def default_cache_dir() -> str:
  """``$IHSWEEP_CACHE``, else ``$XDG_CACHE_HOME/ihsweep``, else ``~/.cache/ihsweep``."""
  if os.environ.get("IHSWEEP_CACHE"):
    return os.environ["IHSWEEP_CACHE"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "ihsweep")


def resolve_cache_dir(data_cfg) -> str:
  return os.path.expanduser(data_cfg.cache_dir) if data_cfg.cache_dir else default_cache_dir()


# ----------------------------------------------------------------------------------------------
# 1. Documents


class _TextExtractor(html.parser.HTMLParser):
  """Visible text of an HTML page (script/style dropped, entities unescaped)."""

  _SKIP = {"script", "style", "noscript", "template", "title"}
  _BLOCK = {
    "p",
    "div",
    "br",
    "li",
    "tr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "section",
    "article",
    "blockquote",
    "dt",
    "dd",
    "table",
    "ul",
    "ol",
  }

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.parts: list[str] = []
    self._skip_depth = 0

  def handle_starttag(self, tag, attrs):
    if tag == "body":  # an unclosed <script>/<title> in the head must not hide the body
      self._skip_depth = 0
    elif tag in self._SKIP:
      self._skip_depth += 1
    elif tag in self._BLOCK:
      self.parts.append("\n")

  def handle_endtag(self, tag):
    if tag in self._SKIP and self._skip_depth:
      self._skip_depth -= 1
    elif tag in self._BLOCK:
      self.parts.append("\n")

  def handle_data(self, data):
    if not self._skip_depth:
      self.parts.append(data)


def strip_html(markup: str) -> str:
  """The text of an HTML document: tags removed, script/style/head dropped, entities decoded,
  runs of blank lines collapsed."""
  parser = _TextExtractor()
  parser.feed(markup)
  parser.close()
  lines = [line.rstrip() for line in "".join(parser.parts).splitlines()]
  out, blank = [], False
  for line in lines:
    if line.strip():
      out.append(line)
      blank = False
    elif not blank and out:
      out.append("")
      blank = True
  return "\n".join(out).strip()


def list_files(patterns: str) -> list[str]:
  """Regular files matching a comma-separated list of globs (``**`` recurses), each file once
  (by real path: overlapping globs and symlinks do not duplicate documents), sorted.

  Raises:
    CorpusError: no file matches (field ``data.files``).
  """
  files = {}
  for pattern in (p.strip() for p in patterns.split(",")):
    if pattern:
      for f in glob.glob(os.path.expanduser(pattern), recursive=True):
        if os.path.isfile(f):
          files.setdefault(os.path.realpath(f), f)
  if not files:
    raise CorpusError(f"config.data.files = {patterns!r} matches no file", "data.files")
  return sorted(files)


def _read_text(path: str) -> str:
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise CorpusError(f"cannot read {path}: {e.strerror or e}", "data.files") from None
  if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 with a byte-order mark
    try:
      return raw.decode("utf-16")
    except UnicodeDecodeError:
      pass
  if b"\x00" in raw[:65536]:
    raise CorpusError(
      f"{path} is a binary file (NUL bytes), not text; narrow config.data.files", "data.files"
    )
  try:
    return raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise CorpusError(
      f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); narrow "
      f"config.data.files or convert it",
      "data.files",
    ) from None


def read_documents(path: str, text_field: str = "text") -> Iterator[str]:
  """The documents of one file, by suffix: .jsonl → ``obj[text_field]`` per line; .parquet →
  column ``text_field`` per row; .html/.htm → ``strip_html``; anything else → the whole file as
  UTF-8 text. Empty documents are skipped.

  Raises:
    CorpusError: unreadable, binary or non-UTF-8 file; bad JSON line; missing text field.
  """
  lower = path.lower()
  if lower.endswith(".parquet"):
    import pandas as pd
    import pyarrow.parquet as pq

    try:
      names = pq.read_schema(path).names
    except Exception as e:  # pyarrow raises several types for files that are not parquet
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise CorpusError(f"cannot read {path} as parquet: {first}", "data.files") from None
    if text_field not in names:
      raise CorpusError(
        f"{path}: no column {text_field!r} (config.data.text_field); columns: "
        f"{', '.join(names[:10])}",
        "data.text_field",
      )
    values = pd.read_parquet(path, columns=[text_field])[text_field]
    values = values[values.notna()]
    bad = values[[not isinstance(v, str) for v in values]]
    if len(bad):
      raise CorpusError(
        f"{path}: column {text_field!r} holds {type(bad.iloc[0]).__name__} values, not text",
        "data.text_field",
      )
    yield from (t for t in values if t)
    return
  text = _read_text(path)
  if lower.endswith(".jsonl"):
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 is text
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise CorpusError(f"{path}:{lineno}: not a JSON object ({e.msg})", "data.files") from None
      if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
        raise CorpusError(
          f"{path}:{lineno}: no string field {text_field!r} (config.data.text_field)",
          "data.text_field",
        )
      if obj[text_field]:
        yield obj[text_field]
    return
  if lower.endswith(HTML_SUFFIXES):
    text = strip_html(text)
  if text.strip():
    yield text


def _tfds_source(data_cfg):
  """``tfds.data_source`` for the configured corpus, with clear errors for unknown or
  unprepared datasets."""
  import tensorflow_datasets as tfds

  name, data_dir = data_cfg.tfds_name, data_cfg.tfds_data_dir or None
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    where = (
      f"nor prepared under config.data.tfds_data_dir = {data_dir!r}"
      if data_dir
      else "and config.data.tfds_data_dir is not set"
    )
    raise CorpusError(
      f"config.data.tfds_name = {name!r}: TFDS cannot load this dataset: its "
      f"builder is not available in this install ({where}). Check the name in "
      f"https://www.tensorflow.org/datasets/catalog; some builders (e.g. c4, "
      f"wiki40b) need TensorFlow to load their code, but a dataset prepared once "
      f"with `tfds build NAME --file_format=array_record --data_dir=DIR` is read "
      f"from --config.data.tfds_data_dir=DIR without it",
      "data.tfds_name",
    ) from None
  except Exception as e:  # config names and versions are parsed by the builder
    raise CorpusError(f"config.data.tfds_name = {name!r}: {e}", "data.tfds_name") from None
  try:
    return tfds.data_source(
      name, split=data_cfg.tfds_split, data_dir=data_dir, download=bool(data_cfg.tfds_download)
    )
  except Exception as e:  # TFDS raises several types; say which fix applies
    if not builder.is_prepared() and data_cfg.tfds_download:
      raise CorpusError(
        f"TFDS dataset {name!r} could not be downloaded and prepared under "
        f"{builder.data_dir} (is there no network here?): prepare it where there is, with "
        f"`tfds build {name} --file_format=array_record --data_dir=DIR`, copy DIR here and "
        f"set config.data.tfds_data_dir=DIR and config.data.tfds_download=False [TFDS: "
        f"{type(e).__name__}: {e}]",
        "data.tfds_download",
      ) from None
    if not builder.is_prepared():
      raise CorpusError(
        f"TFDS dataset {name!r} is not prepared under {builder.data_dir}: prepare it with "
        f"`tfds build {name} --file_format=array_record --data_dir=DIR` and set "
        f"config.data.tfds_data_dir=DIR, or set config.data.tfds_download=True",
        "data.tfds_data_dir",
      ) from None
    field = "data.tfds_split" if isinstance(e, (ValueError, KeyError)) else "data.tfds_data_dir"
    raise CorpusError(
      f"TFDS dataset {name!r} (split {data_cfg.tfds_split!r}): {e}", field
    ) from None


def _tfds_documents(data_cfg) -> Iterator[str]:
  source = _tfds_source(data_cfg)
  n = len(source)
  if data_cfg.max_documents:
    n = min(n, data_cfg.max_documents)
  field = data_cfg.text_field
  for i in range(n):
    record = source[i]
    if field not in record:
      raise CorpusError(
        f"TFDS {data_cfg.tfds_name!r} records have no field {field!r} "
        f"(they have {sorted(record)}); set config.data.text_field",
        "data.text_field",
      )
    text = record[field]
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
    if text:
      yield text


def _check_dir_or_absent(path: str, what: str) -> None:
  """Checks that ``path`` is a directory or can become one (its nearest existing ancestor is a
  directory).

  Raises:
    CorpusError: ``what`` (e.g. ``config.data.cache_dir = '/etc/hostname'``) is not a
      directory.
  """
  at = os.path.abspath(path)
  while not os.path.exists(at) and os.path.dirname(at) != at:
    at = os.path.dirname(at)
  if not os.path.isdir(at):
    raise CorpusError(
      f"{what} is not a directory ({at} is a file); set config.data.cache_dir "
      f"or $IHSWEEP_CACHE to a directory",
      "data.cache_dir",
    )


def corpus_dir(cache_dir: str, corpus: str) -> str:
  return os.path.join(cache_dir, "corpora", corpus)


@dataclasses.dataclass(frozen=True)
class DocumentSource:
  """Where a corpus's documents come from. ``kind`` is 'files' or 'tfds'; ``identity`` is what
  the cache key hashes (file paths with sizes and mtimes, or the TFDS name/split/version)."""

  kind: str
  name: str
  files: tuple[str, ...]
  identity: str
  data_cfg: Any

  def documents(self) -> Iterator[str]:
    if self.kind == "tfds":
      yield from _tfds_documents(self.data_cfg)
      return
    n = 0
    for path in self.files:
      for doc in read_documents(path, self.data_cfg.text_field):
        yield doc
        n += 1
        if self.data_cfg.max_documents and n >= self.data_cfg.max_documents:
          return


def document_source(data_cfg) -> DocumentSource:
  """Resolves ``data.corpus`` / ``data.files`` / ``data.tfds_name`` (exactly one is set) into a
  ``DocumentSource``, checking that the files exist or the TFDS dataset is known and prepared.

  Raises:
    CorpusError: none or several set, empty glob, python-docs not fetched, unknown TFDS name.
  """
  chosen = [f for f in ("corpus", "files", "tfds_name") if data_cfg[f]]
  if len(chosen) != 1:
    raise CorpusError(
      f"config.data.source = {data_cfg.source!r} needs exactly one of data.corpus (one of "
      f"{', '.join(CORPORA)}), data.files (globs) or data.tfds_name; got "
      f"{chosen or 'none'}",
      "data.corpus",
    )
  if data_cfg.corpus:
    if data_cfg.corpus not in CORPORA:
      raise CorpusError(
        f"config.data.corpus = {data_cfg.corpus!r} is not allowed: one of "
        f"{', '.join(map(repr, CORPORA))}",
        "data.corpus",
      )
    cache = resolve_cache_dir(data_cfg)
    _check_dir_or_absent(
      cache,
      f"config.data.cache_dir = {data_cfg.cache_dir!r}"
      if data_cfg.cache_dir
      else f"the cache directory {cache!r}",
    )
    root = corpus_dir(cache, data_cfg.corpus)
    if not os.path.isfile(os.path.join(root, "SOURCE.json")):
      raise CorpusError(
        f"the {data_cfg.corpus} corpus is not in {root}: run `ihsweep corpus "
        f"fetch {data_cfg.corpus}` first (same cache dir: data.cache_dir or "
        f"$IHSWEEP_CACHE)",
        "data.corpus",
      )
    files = tuple(sorted(glob.glob(os.path.join(root, "**", "*.rst.txt"), recursive=True)))
    with open(os.path.join(root, "SOURCE.json")) as f:
      identity = f"corpus:{data_cfg.corpus}:{f.read()}"
    return DocumentSource("files", data_cfg.corpus, files, identity, data_cfg)
  if data_cfg.files:
    files = tuple(list_files(data_cfg.files))
    stats = []
    for path in files:
      st = os.stat(path)
      stats.append(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}")
    name = os.path.basename(os.path.commonpath([os.path.abspath(p) for p in files])) or "files"
    return DocumentSource("files", name, files, "files:" + "\n".join(stats), data_cfg)
  source = _tfds_source(data_cfg)
  info = getattr(source, "dataset_info", None)
  version = getattr(info, "version", "")
  identity = (
    f"tfds:{data_cfg.tfds_name}:{version}:{data_cfg.tfds_split}:"
    f"{data_cfg.tfds_data_dir}:{len(source)}"
  )
  return DocumentSource("tfds", data_cfg.tfds_name.replace("/", "_"), (), identity, data_cfg)


def split_documents(
  docs: Iterable[str], val_fraction: float, seed: int
) -> Iterator[tuple[bool, str]]:
  """``(is_validation, document)`` for each document; validation with probability
  ``val_fraction`` from ``np.random.default_rng(seed)`` in document order (deterministic)."""
  rng = np.random.default_rng(seed)
  for doc in docs:
    yield bool(rng.random() < val_fraction), doc


def fetch_corpus(name: str, cache_dir: str | None = None) -> str:
  """Fetches an embedded corpus into ``cache_dir/corpora/<name>/`` and returns that directory.

  ``python-docs``: the reStructuredText sources (``_sources/**/*.rst.txt``, English, ~500 files,
  ~11 MB) of the Python documentation in Debian's ``python3-doc`` package, downloaded without
  root by ``apt-get download`` (from the machine's configured Debian mirror) and unpacked with
  ``dpkg -x``. Writes ``SOURCE.json`` (package, version, files, bytes) last, so an interrupted
  fetch is redone.

  Raises:
    CorpusError: unknown name; no apt-get/dpkg (the message points to data.files and TFDS);
      download or unpack failed.
  """
  import subprocess

  if name not in CORPORA:
    raise CorpusError(f"unknown corpus {name!r}: one of {', '.join(CORPORA)}")
  cache_dir = cache_dir or default_cache_dir()
  dest = corpus_dir(cache_dir, name)
  missing = [t for t in ("apt-get", "apt-cache", "dpkg") if shutil.which(t) is None]
  if missing:
    raise CorpusError(
      f"cannot fetch {name}: {', '.join(missing)} not found (not a Debian-based system). "
      f"Train on your own text with --config.data.files='DIR/**/*.txt' (txt, md, rst, html, "
      f"jsonl, parquet) or on a TFDS corpus with --config.data.tfds_name=NAME"
    )

  def run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
      tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
      raise CorpusError(f"cannot fetch {name}: `{' '.join(cmd)}` failed: {' '.join(tail)}")
    return proc.stdout

  writable_dir(cache_dir, "data.cache_dir")
  remove_stale_temp_dirs(cache_dir)
  if os.path.isfile(os.path.join(dest, "SOURCE.json")):
    log.info("%s is already in %s (delete that directory to fetch it again)", name, dest)
    return dest
  with tempfile.TemporaryDirectory(prefix=_temp_prefix("fetch"), dir=cache_dir) as tmp:
    # python3-doc is a metapackage; the text is in the versioned package it depends on.
    deps = run(["apt-cache", "depends", "python3-doc"], tmp)
    pkgs = [
      line.split(":", 1)[1].strip()
      for line in deps.splitlines()
      if line.strip().startswith("Depends:") and "-doc" in line
    ]
    package = pkgs[0] if pkgs else "python3-doc"
    run(["apt-get", "download", package], tmp)
    debs = glob.glob(os.path.join(tmp, "*.deb"))
    if not debs:
      raise CorpusError(f"cannot fetch {name}: apt-get download {package} produced no .deb")
    unpacked = os.path.join(tmp, "root")
    run(["dpkg", "-x", debs[0], unpacked], tmp)
    sources = glob.glob(os.path.join(unpacked, "usr/share/doc/python3*/html/_sources"))
    if not sources:
      raise CorpusError(
        f"cannot fetch {name}: {os.path.basename(debs[0])} has no html/_sources directory"
      )
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(sources[0], dest, ignore=shutil.ignore_patterns("*.js", "*.css"))
    files = sorted(glob.glob(os.path.join(dest, "**", "*.rst.txt"), recursive=True))
    info = {
      "corpus": name,
      "package": os.path.basename(debs[0]),
      "files": len(files),
      "bytes": sum(os.path.getsize(f) for f in files),
    }
    with open(os.path.join(dest, "SOURCE.json"), "w") as f:
      json.dump(info, f, indent=2)
  log.info(
    "fetched %s: %d files, %.1f MB into %s", name, info["files"], info["bytes"] / 2**20, dest
  )
  return dest


# ----------------------------------------------------------------------------------------------
# 2. Tokenizer


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


# ----------------------------------------------------------------------------------------------
# 3. Tokenized corpus with cache


@dataclasses.dataclass
class TokenizedCorpus:
  """A tokenized corpus. ``train`` / ``val``: flat uint16 or uint32 token arrays (memory-mapped
  ``.npy``), every document followed by ``eot_id``; ``tokenizer``: the HF tokenizer;
  ``path``: its cache directory; ``cache_hit``: loaded rather than built; ``meta``: counts."""

  train: np.ndarray
  val: np.ndarray
  tokenizer: Any
  eot_id: int
  vocab_size: int
  path: str
  cache_hit: bool
  meta: dict


def _cache_key(doc_source: DocumentSource, data_cfg, vocab_size: int) -> str:
  if data_cfg.tokenizer == "bpe":
    tok_id = f"bpe:{vocab_size}"
  else:
    with open(os.path.expanduser(data_cfg.tokenizer), "rb") as f:
      tok_id = "json:" + hashlib.sha256(f.read()).hexdigest()
  parts = [
    f"v{_FORMAT_VERSION}",
    doc_source.identity,
    tok_id,
    f"model_vocab:{vocab_size}",
    f"field:{data_cfg.text_field}",
    f"max_docs:{data_cfg.max_documents}",
    f"val:{data_cfg.val_fraction!r}:{data_cfg.split_seed}",
  ]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _encode(tok, docs: Iterable[str], eot_id: int, dtype) -> np.ndarray:
  chunks, batch = [], []

  def flush():
    try:
      encoded = tok.encode_batch(batch, add_special_tokens=False)
    except Exception as e:  # tokenizers raises plain Exception (e.g. a WordLevel without [UNK])
      raise CorpusError(
        f"config.data.tokenizer: the tokenizer cannot encode this corpus: {e}", "data.tokenizer"
      ) from None
    for enc in encoded:
      chunks.append(np.asarray(enc.ids + [eot_id], dtype=np.int64))
    batch.clear()

  for doc in docs:
    batch.append(doc)
    if len(batch) == _ENCODE_CHUNK:
      flush()
  if batch:
    flush()
  ids = np.concatenate(chunks) if chunks else np.zeros((0,), np.int64)
  return ids.astype(dtype)


def token_dtype(vocab_size: int):
  return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def prepare_corpus(
  data_cfg, vocab_size: int, vocab_field: str = "model.vocab_size"
) -> TokenizedCorpus:
  """Reads, splits, tokenizes and caches the configured corpus (or loads it from the cache).

  Returns a ``TokenizedCorpus`` whose arrays are memory-mapped from
  ``cache_dir/tokens/<name>-<key>/``. Building writes into a temporary directory renamed into
  place, so a killed build leaves no half-written cache and concurrent builders agree.

  Raises:
    CorpusError: any bad input (see ``document_source``, ``read_documents``, ``train_bpe``,
      ``load_tokenizer``); an empty training split.
  """
  doc_source = document_source(data_cfg)
  cache_root = writable_dir(os.path.join(resolve_cache_dir(data_cfg), "tokens"), "data.cache_dir")
  remove_stale_temp_dirs(cache_root)
  key = _cache_key(doc_source, data_cfg, vocab_size)
  path = os.path.join(cache_root, f"{doc_source.name[:64]}-{key}")
  if os.path.isfile(os.path.join(path, "meta.json")):
    try:
      return _load_cache(path, vocab_size, hit=True)
    except (OSError, ValueError, EOFError, KeyError) as e:  # truncated or edited by hand
      log.warning("cache %s is damaged (%s); rebuilding it", path, e)
      shutil.rmtree(path, ignore_errors=True)
  _build_cache(doc_source, data_cfg, vocab_size, path, vocab_field)
  return _load_cache(path, vocab_size, hit=False)


def _load_cache(path: str, vocab_size: int, hit: bool) -> TokenizedCorpus:
  from tokenizers import Tokenizer

  with open(os.path.join(path, "meta.json")) as f:
    meta = json.load(f)
  train = np.load(os.path.join(path, "train.npy"), mmap_mode="r")
  if train.size != meta["train_tokens"]:
    raise ValueError(f"train.npy has {train.size} tokens, meta.json says {meta['train_tokens']}")
  return TokenizedCorpus(
    train=train,
    val=np.load(os.path.join(path, "val.npy"), mmap_mode="r"),
    tokenizer=Tokenizer.from_file(os.path.join(path, "tokenizer.json")),
    eot_id=meta["eot_id"],
    vocab_size=vocab_size,
    path=path,
    cache_hit=hit,
    meta=meta,
  )


def writable_dir(path: str, field: str) -> str:
  """Creates ``path`` if needed and checks it is a writable directory.

  Raises:
    CorpusError: naming ``field`` (e.g. data.cache_dir) when it is not.
  """
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
      pass
  except OSError as e:
    raise CorpusError(
      f"config.{field}: cannot use {path} as a cache directory "
      f"({e.strerror or e}); set config.{field} or $IHSWEEP_CACHE to a writable "
      f"directory",
      field,
    ) from None
  return path


def _temp_prefix(kind: str) -> str:
  """Names temporary build directories after their host and process, so that a later run can
  tell a dead builder's leftovers from a live concurrent build."""
  return f".{kind}-{socket.gethostname()}-{os.getpid()}-"


def remove_stale_temp_dirs(root: str) -> None:
  """Removes ``.build-*`` / ``.fetch-*`` directories left in ``root`` by killed processes of
  this host."""
  host = socket.gethostname()
  for entry in glob.glob(os.path.join(root, ".build-*")) + glob.glob(
    os.path.join(root, ".fetch-*")
  ):
    parts = os.path.basename(entry).split("-")
    if len(parts) < 4 or "-".join(parts[1:-2]) != host or not parts[-2].isdigit():
      continue
    try:
      os.kill(int(parts[-2]), 0)
    except ProcessLookupError:
      shutil.rmtree(entry, ignore_errors=True)
    except PermissionError:  # alive, another user's
      pass


def _build_cache(
  doc_source: DocumentSource, data_cfg, vocab_size: int, path: str, vocab_field: str
) -> None:
  log.info("tokenizing %s (%s) into %s", doc_source.name, doc_source.kind, path)
  frac, seed = data_cfg.val_fraction, data_cfg.split_seed

  def part(want_val: bool) -> Iterator[str]:
    return (
      d for is_val, d in split_documents(doc_source.documents(), frac, seed) if is_val == want_val
    )

  n_docs = {"train": 0, "val": 0}
  for is_val, _ in split_documents(doc_source.documents(), frac, seed):
    n_docs["val" if is_val else "train"] += 1
  if n_docs["train"] == 0:
    raise CorpusError(
      f"the corpus {doc_source.name!r} has no training documents "
      f"({n_docs['val']} validation, config.data.val_fraction = {frac})",
      "data.val_fraction" if n_docs["val"] else "data.files",
    )
  if data_cfg.tokenizer == "bpe":
    tok = train_bpe(part(False), vocab_size, vocab_field)
  else:
    tok = load_tokenizer(data_cfg.tokenizer, vocab_size, vocab_field)
  eot_id = tok.token_to_id(EOT)
  dtype = token_dtype(vocab_size)
  train_ids = _encode(tok, part(False), eot_id, dtype)
  val_ids = _encode(tok, part(True), eot_id, dtype)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=_temp_prefix("build"), dir=os.path.dirname(path))
  os.chmod(tmp, 0o755)  # mkdtemp makes it private; a shared cache must stay readable
  try:
    tok.save(os.path.join(tmp, "tokenizer.json"))
    np.save(os.path.join(tmp, "train.npy"), train_ids)
    np.save(os.path.join(tmp, "val.npy"), val_ids)
    meta = {
      "name": doc_source.name,
      "kind": doc_source.kind,
      "eot_id": eot_id,
      "tokenizer": data_cfg.tokenizer,
      "tokenizer_vocab": tok.get_vocab_size(),
      "model_vocab": vocab_size,
      "dtype": np.dtype(dtype).name,
      "train_documents": n_docs["train"],
      "val_documents": n_docs["val"],
      "train_tokens": int(train_ids.size),
      "val_tokens": int(val_ids.size),
      "val_fraction": frac,
      "split_seed": seed,
      "identity_sha256": hashlib.sha256(doc_source.identity.encode()).hexdigest(),
    }
    with open(os.path.join(tmp, "meta.json"), "w") as f:
      json.dump(meta, f, indent=2)
    try:
      os.rename(tmp, path)
    except OSError:  # another process built it first; theirs is equivalent
      if not os.path.isfile(os.path.join(path, "meta.json")):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  log.info(
    "cached %s train / %s val tokens (%d / %d documents)",
    f"{train_ids.size:,}",
    f"{val_ids.size:,}",
    n_docs["train"],
    n_docs["val"],
  )


# ----------------------------------------------------------------------------------------------
# 4. Corpus statistics (inputs of the semi-natural Markov source)


def unigram_counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """Occurrences of each id: int64 ``[V]``."""
  return np.bincount(np.asarray(tokens, np.int64), minlength=vocab_size)


def bigram_counts(
  tokens: np.ndarray, vocab_size: int, chunk: int = 1 << 24
) -> scipy.sparse.csr_matrix:
  """Counts of adjacent pairs, ``counts[a, b]`` = #{i : t_i = a, t_{i+1} = b}: a sparse int64
  ``[V, V]`` CSR matrix. Pairs through ``<|endoftext|>`` are included (the stream as trained
  on); callers that want within-document statistics drop that row and column. Processed in
  chunks of ``chunk`` pairs to bound memory."""
  total = scipy.sparse.csr_matrix((vocab_size, vocab_size), dtype=np.int64)
  n = len(tokens)
  for lo in range(0, max(n - 1, 0), chunk):
    seg = np.asarray(tokens[lo : min(lo + chunk + 1, n)], np.int64)
    pair = seg[:-1] * vocab_size + seg[1:]
    uniq, cnt = np.unique(pair, return_counts=True)
    total = total + scipy.sparse.csr_matrix(
      (cnt, (uniq // vocab_size, uniq % vocab_size)), shape=(vocab_size, vocab_size)
    )
  return total.tocsr()


# ----------------------------------------------------------------------------------------------
# 5. Window sampling


def window_starts(key: jax.Array, n_tokens: int, batch_size: int, context_size: int) -> jax.Array:
  """B start offsets, int32 ``[B]`` uniform in [0, n_tokens − C − 1], so that the window
  ``[s, s + C]`` (C + 1 tokens) lies inside the array. The device and host paths both call
  this, so they read identical windows."""
  return jax.random.randint(key, (batch_size,), 0, n_tokens - context_size, dtype=jnp.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class NaturalTextSource:
  """Windows of C + 1 tokens from a tokenized corpus's training split.

  ``on_device``: whether the token array is placed on every device (``arrays()``) and windows
  are gathered in-graph; otherwise ``sample`` is not used and the trainer consumes batches from
  ``host_batches``.
  """

  corpus: TokenizedCorpus
  batch_size: int
  context_size: int
  on_device: bool
  placement: str = ""  # why on device or not, for the run log

  @property
  def vocab_size(self) -> int:
    return self.corpus.vocab_size

  @property
  def n_tokens(self) -> int:
    return int(self.corpus.train.size)

  def data_params(self, n_models: int) -> dict:
    del n_models
    return {}

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
    first_step + n_steps − 1``, gathered on the host: ``[E, K, B, C + 1]`` in the corpus dtype."""
    keys = jax.device_put(np.asarray(data_keys_Ex2), jax.local_devices(backend="cpu")[0])
    starts_ExKxB = np.asarray(
      _host_starts(keys, first_step, n_steps, self.n_tokens, self.batch_size, self.context_size)
    )
    offsets = np.arange(self.context_size + 1, dtype=np.int64)
    return self.corpus.train[starts_ExKxB[..., None].astype(np.int64) + offsets]

  @property
  def special_ids(self) -> tuple[int, ...]:
    """Ids that are not text (the end-of-text separator); probes never use them."""
    return (self.corpus.eot_id,)

  def token_counts(self) -> np.ndarray:
    """Occurrences of each id in the training split, int64 ``[V]``."""
    return unigram_counts(self.corpus.train, self.vocab_size)

  def validation_windows(self, key: jax.Array, n: int) -> np.ndarray:
    """``n`` windows of C + 1 tokens ``[n, C + 1]`` from the validation split (the training
    split if the validation split is shorter than C + 1 tokens, e.g. ``data.val_fraction``
    = 0)."""
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


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _host_starts(data_keys_Ex2, first_step, n_steps, n_tokens, batch_size, context_size):
  """Window starts ``[E, K, B]`` for updates first_step … first_step + K − 1 of every model,
  from the keys ``keys.step_keys`` gives the in-graph path."""

  def one_model(data_key):
    return jax.vmap(lambda key: window_starts(key, n_tokens, batch_size, context_size))(
      step_keys(data_key, first_step, n_steps)
    )

  return jax.vmap(one_model)(data_keys_Ex2)
