"""A natural-text corpus on disk: the embedded corpus fetched into the cache
(``fetch_corpus``), the tokenized corpus built and cached from its documents
(``prepare_corpus``), and its token statistics (inputs of the semi-natural Markov source).

The tokenized corpus: every document's ids followed by ``<|endoftext|>``, concatenated into flat
uint16 (V ≤ 65,536) or uint32 arrays ``train.npy`` / ``val.npy`` beside ``tokenizer.json`` and
``meta.json``, cached under ``cache_dir/tokens/<name>-<hash>/`` keyed by (documents, tokenizer,
vocabulary, split, document sample); a second run memory-maps them. The arrays are streamed to
disk in their final dtype while encoding (memory: one chunk of documents), and a build holds a
lock beside its entry, so the processes of a job that share one cache directory (NFS, Lustre)
tokenise a corpus once: the first builds it, the others wait and load it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from typing import Any, Iterable, Iterator

import numpy as np
import scipy.sparse

from ihsweep.data.cache import (
  default_cache_dir,
  remove_stale_temp_dirs,
  resolve_cache_dir,
  temp_prefix,
  writable_dir,
)
from ihsweep.data.documents import (
  CORPORA,
  DocumentSource,
  corpus_dir,
  document_source,
  split_documents,
)
from ihsweep.data.errors import CorpusError
from ihsweep.data.tokenizer import EOT, load_tokenizer, train_bpe

log = logging.getLogger("ihsweep")

_ENCODE_CHUNK = 1024  # documents per encode_batch call
_FORMAT_VERSION = 1  # bump when the cached arrays' meaning changes
# One lock per cache entry for the threads of this process (a sweep prepares the next group's
# corpus on its compile-ahead thread while the current group prepares it on the main one): a
# file lock need not order them (fcntl locks, NFS's flock, belong to the process).
_BUILDS: dict[str, threading.Lock] = {}
_BUILDS_LOCK = threading.Lock()


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
  with tempfile.TemporaryDirectory(prefix=temp_prefix("fetch"), dir=cache_dir) as tmp:
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
    *([f"sample_seed:{data_cfg.sample_seed}"] if data_cfg.max_documents else []),
    f"val:{data_cfg.val_fraction!r}:{data_cfg.split_seed}",
  ]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _encode_to(tok, docs: Iterable[str], eot_id: int, dtype, path: str) -> int:
  """Encodes ``docs`` (each followed by ``eot_id``) into the ``.npy`` file ``path`` as a flat
  ``dtype`` array and returns its length. Memory is bounded by one chunk of documents: ids are
  streamed to a raw file in ``dtype`` and the ``.npy`` header is written once their count is
  known (then the bytes are copied behind it)."""
  raw_path = path + ".raw"
  n, batch = 0, []
  with open(raw_path, "wb") as raw:

    def flush():
      nonlocal n
      try:
        encoded = tok.encode_batch(batch, add_special_tokens=False)
      except Exception as e:  # tokenizers raises plain Exception (e.g. a WordLevel without [UNK])
        raise CorpusError(
          f"config.data.tokenizer: the tokenizer cannot encode this corpus: {e}", "data.tokenizer"
        ) from None
      for enc in encoded:
        ids = np.asarray(enc.ids + [eot_id], dtype=dtype)
        raw.write(ids.tobytes())
        n += ids.size
      batch.clear()

    for doc in docs:
      batch.append(doc)
      if len(batch) == _ENCODE_CHUNK:
        flush()
    if batch:
      flush()
  header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
  with open(path, "wb") as out, open(raw_path, "rb") as raw:
    np.lib.format.write_array_header_1_0(out, {**header, "shape": (n,)})
    shutil.copyfileobj(raw, out, 1 << 24)
  os.remove(raw_path)
  return n


def token_dtype(vocab_size: int):
  return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def prepare_corpus(
  data_cfg, vocab_size: int, vocab_field: str = "model.vocab_size"
) -> TokenizedCorpus:
  """Reads, splits, tokenizes and caches the configured corpus (or loads it from the cache).

  Returns a ``TokenizedCorpus`` whose arrays are memory-mapped from
  ``cache_dir/tokens/<name>-<key>/``. Building holds ``<entry>.lock`` (processes sharing the
  cache wait for the first one's build, then load it) and writes into a temporary directory
  renamed into place, so a killed build leaves no half-written cache (and releases the lock).
  Threads of one process build an entry once too (the others wait, then load it), so its
  "tokenizing" and "cached" lines are logged once, by the build; a load logs nothing.

  Raises:
    CorpusError: any bad input (see ``document_source``, ``read_documents``, ``train_bpe``,
      ``load_tokenizer``); an empty training split.
  """
  doc_source = document_source(data_cfg)
  cache_root = writable_dir(os.path.join(resolve_cache_dir(data_cfg), "tokens"), "data.cache_dir")
  remove_stale_temp_dirs(cache_root)
  key = _cache_key(doc_source, data_cfg, vocab_size)
  path = os.path.join(cache_root, f"{doc_source.name[:64]}-{key}")
  if os.path.isfile(os.path.join(path, "meta.json")):  # the common case: no lock needed
    try:
      return _load_cache(path, vocab_size, hit=True)
    except (OSError, ValueError, EOFError, KeyError):
      pass  # damaged, or being replaced: decided under the lock
  with _BUILDS_LOCK:
    in_process = _BUILDS.setdefault(path, threading.Lock())
  if not in_process.acquire(blocking=False):
    log.debug("waiting for another thread of this process to finish tokenizing into %s", path)
    in_process.acquire()
  try:
    with _build_lock(path):
      remove_stale_temp_dirs(cache_root)  # a builder that died while this process waited
      if os.path.isfile(os.path.join(path, "meta.json")):  # built while this one waited
        try:
          return _load_cache(path, vocab_size, hit=True)
        except (OSError, ValueError, EOFError, KeyError) as e:  # truncated or edited by hand
          log.warning("cache %s is damaged (%s); rebuilding it", path, e)
          shutil.rmtree(path, ignore_errors=True)
      _build_cache(doc_source, data_cfg, vocab_size, path, vocab_field)
  finally:
    in_process.release()
  return _load_cache(path, vocab_size, hit=False)


@contextlib.contextmanager
def _build_lock(path: str):
  """Holds ``path + '.lock'`` (``filelock.FileLock``: an fcntl lock, which the OS releases when
  its holder dies, and which works across the hosts of a shared NFS/Lustre cache) while a
  corpus is built, so that the processes of a job sharing one cache tokenise it once: the
  others wait here, then load what the first wrote."""
  import filelock

  lock = filelock.FileLock(path + ".lock")
  try:
    try:
      lock.acquire(timeout=0)
    except filelock.Timeout:
      log.info(
        "waiting for another process to finish tokenizing into %s (it holds %s.lock)", path, path
      )
      lock.acquire()
  except OSError as e:  # e.g. a directory where the lock file goes
    raise CorpusError(
      f"cannot lock {path}.lock to build the corpus cache ({e.strerror or e}); remove it or set "
      f"config.data.cache_dir elsewhere",
      "data.cache_dir",
    ) from None
  try:
    yield
  finally:
    lock.release()


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
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=temp_prefix("build"), dir=os.path.dirname(path))
  os.chmod(tmp, 0o755)  # mkdtemp makes it private; a shared cache must stay readable
  try:
    n_train = _encode_to(tok, part(False), eot_id, dtype, os.path.join(tmp, "train.npy"))
    n_val = _encode_to(tok, part(True), eot_id, dtype, os.path.join(tmp, "val.npy"))
    tok.save(os.path.join(tmp, "tokenizer.json"))
    kept = doc_source.kept()
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
      "train_tokens": n_train,
      "val_tokens": n_val,
      # max_documents > 0: a uniform random sample of the corpus's documents, by sample_seed
      "documents_available": doc_source.n_available if data_cfg.max_documents else None,
      "max_documents": data_cfg.max_documents,
      "sample_seed": data_cfg.sample_seed if kept is not None else None,
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
    f"{n_train:,}",
    f"{n_val:,}",
    n_docs["train"],
    n_docs["val"],
  )


# Statistics (inputs of the semi-natural Markov source)


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
