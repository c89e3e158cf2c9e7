"""Documents of a natural-text corpus: where they come from and how each file is read.

Sources (exactly one of ``data.corpus`` / ``data.files`` / ``data.tfds_name``, ``document_source``):
local files (a comma-separated list of globs: .txt/.md/.rst/.rst.txt as plain text, .html/.htm
with tags stripped, .jsonl with one JSON object per line holding a text field, .parquet with a
text column; one file, line or row = one document), a tensorflow-datasets corpus read with
``tfds.data_source`` (random access over array_record files; no TensorFlow needed), or an embedded
corpus (``CORPORA``) that ``ihsweep corpus fetch`` (``corpus.fetch_corpus``) unpacks into the
cache. ``split_documents`` assigns each document to the training or validation split.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import html.parser
import json
import os
from typing import Any, Iterable, Iterator

import numpy as np

from ihsweep.data.cache import check_dir_or_absent, resolve_cache_dir
from ihsweep.data.errors import CorpusError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
HTML_SUFFIXES = (".html", ".htm")
CORPORA = ("python-docs",)


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


def sample_indices(n_available: int, max_documents: int, seed: int) -> np.ndarray | None:
  """The documents a corpus keeps: ascending int64 indices of a uniform random sample without
  replacement of ``max_documents`` of ``n_available`` (``np.random.default_rng(seed).choice``),
  or None for all of them (``max_documents`` 0 or at least ``n_available``)."""
  if not max_documents or max_documents >= n_available:
    return None
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(n_available, size=max_documents, replace=False)).astype(np.int64)


def _tfds_documents(data_cfg, keep: np.ndarray | None) -> Iterator[str]:
  source = _tfds_source(data_cfg)
  field = data_cfg.text_field
  for i in range(len(source)) if keep is None else keep:
    record = source[int(i)]
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
    """The corpus's documents in file (or record) order: all of them, or with
    ``data.max_documents`` the random sample ``kept()`` names."""
    if self.kind == "tfds":
      yield from _tfds_documents(self.data_cfg, self.kept())
      return
    keep = self.kept()
    if keep is None:
      yield from self._file_documents()
      return
    want = iter(keep.tolist())
    next_kept = next(want)
    for i, doc in enumerate(self._file_documents()):
      if i == next_kept:
        yield doc
        next_kept = next(want, None)
        if next_kept is None:
          return

  def _file_documents(self) -> Iterator[str]:
    for path in self.files:
      yield from read_documents(path, self.data_cfg.text_field)

  @functools.cached_property
  def n_available(self) -> int:
    """Documents before sampling: the TFDS split's records, or the files' documents (counted
    by reading them once)."""
    if self.kind == "tfds":
      return len(_tfds_source(self.data_cfg))
    return sum(1 for _ in self._file_documents())

  def kept(self) -> np.ndarray | None:
    """``sample_indices`` of this corpus (None: every document; nothing is counted then),
    drawn once: a build reads the documents several times (split count, BPE, each split)."""
    return self._kept

  @functools.cached_property
  def _kept(self) -> np.ndarray | None:
    if not self.data_cfg.max_documents:
      return None
    return sample_indices(self.n_available, self.data_cfg.max_documents, self.data_cfg.sample_seed)


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
    check_dir_or_absent(
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
