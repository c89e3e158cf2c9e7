"""Natural text: files and TFDS → BPE → cached token arrays → windows (ihsweep/data/natural.py and
the modules of its stages: documents.py, tokenizer.py, corpus.py, cache.py, windows.py)."""

import collections
import json
import os

import jax
import numpy as np
import pandas as pd
import pytest

from ihsweep.configuration import config as config_lib
from ihsweep.configuration import fields
from ihsweep.data import cache, corpus, documents, errors, make_source, tokenizer
from ihsweep.data import windows as windows_lib
from ihsweep.training import loader as loader_lib
from ihsweep.training.runner import fit

WORDS = (
  "the induction head copies a token after the previous occurrence of its prefix while "
  "models learn bigram statistics first then attend back to match patterns in context "
  "über naïve café — λ x: x² 日本語"
).split()


def write_corpus(root, n_docs=40, words_per_doc=300, seed=0):
  """Text files the test owns: sentences of random words, one file per document."""
  rng = np.random.default_rng(seed)
  os.makedirs(root, exist_ok=True)
  for i in range(n_docs):
    words = rng.choice(WORDS, size=words_per_doc)
    text = f"Document {i}.\n" + " ".join(words) + "\n"
    with open(os.path.join(root, f"doc{i:03d}.txt"), "w", encoding="utf-8") as f:
      f.write(text)
  return os.path.join(root, "*.txt")


def natural_cfg(tiny, tmp_path, **overrides):
  glob_ = write_corpus(str(tmp_path / "text"))
  base = {
    "data.source": "natural",
    "data.files": glob_,
    "data.cache_dir": str(tmp_path / "cache"),
    "data.val_fraction": 0.2,
    "model.vocab_size": 300,
  }
  base.update(overrides)
  return tiny(**base)


def test_bpe_round_trip_and_special_ids(tmp_path):
  docs = [
    "Hello wörld, 日本語 and emoji 🙂\ttabs\n  indented",
    "the quick brown fox " * 20,
    "ünïcödé " * 30,
    "x = [i**2 for i in range(10)]\n" * 5,
  ]
  tok = tokenizer.train_bpe(iter(docs * 3), 280)
  assert tok.get_vocab_size() == 280
  assert tok.token_to_id(tokenizer.EOT) == 0
  for text in docs + ["unseen text: Ωμέγα ✓ \x01 control"]:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert max(ids) < 280 and 0 not in ids


def test_corpus_split_by_document_and_cache_hit(tiny, tmp_path, monkeypatch):
  cfg = natural_cfg(tiny, tmp_path)
  first = corpus.prepare_corpus(cfg.data, 300)
  assert not first.cache_hit and first.train.dtype == np.uint16
  # The arrays are exactly the split's documents, each followed by <|endoftext|>.
  docs = [next(documents.read_documents(f)) for f in documents.list_files(cfg.data.files)]
  split = list(documents.split_documents(docs, 0.2, 0))
  for arr, want_val in ((first.train, False), (first.val, True)):
    ids = np.asarray(arr)
    pieces = np.split(ids, np.flatnonzero(ids == first.eot_id) + 1)[:-1]
    want = [d for v, d in split if v == want_val]
    assert len(want) > 0
    assert [first.tokenizer.decode(p[:-1].tolist()) for p in pieces] == want
  assert first.meta["train_documents"] + first.meta["val_documents"] == 40

  def no_training(*a, **k):
    raise AssertionError("the second run must load the cache, not tokenize again")

  monkeypatch.setattr(corpus, "train_bpe", no_training)
  monkeypatch.setattr(corpus, "_encode_to", no_training)
  second = corpus.prepare_corpus(cfg.data, 300)
  assert second.cache_hit and second.path == first.path
  np.testing.assert_array_equal(second.train, first.train)
  # Changing the corpus invalidates the key.
  with open(documents.list_files(cfg.data.files)[0], "a") as f:
    f.write("one more line\n")
  monkeypatch.undo()
  third = corpus.prepare_corpus(cfg.data, 300)
  assert not third.cache_hit and third.path != first.path


def test_max_documents_is_a_random_sample_by_seed_recorded_in_the_cache(tiny, tmp_path):
  """data.max_documents keeps a uniform random sample of the documents (not the first ones in
  file order), drawn with data.sample_seed, in corpus order; meta.json records it; each seed
  is its own cache entry."""
  docs = [
    next(documents.read_documents(f))
    for f in documents.list_files(write_corpus(str(tmp_path / "text")))
  ]
  built = {}
  for seed in (0, 1):
    cfg = natural_cfg(
      tiny,
      tmp_path,
      **{"data.max_documents": 10, "data.sample_seed": seed, "data.val_fraction": 0.0},
    )
    built[seed] = corpus.prepare_corpus(cfg.data, 300)
    ids = np.asarray(built[seed].train)
    pieces = np.split(ids, np.flatnonzero(ids == built[seed].eot_id) + 1)[:-1]
    keep = documents.sample_indices(40, 10, seed)
    assert [built[seed].tokenizer.decode(p[:-1].tolist()) for p in pieces] == [
      docs[i] for i in keep
    ]
    meta = built[seed].meta
    assert (meta["documents_available"], meta["max_documents"], meta["sample_seed"]) == (
      40,
      10,
      seed,
    )
    assert meta["train_documents"] == 10
  assert documents.sample_indices(40, 10, 0).tolist() != list(range(10))
  assert (
    documents.sample_indices(40, 10, 0).tolist() != documents.sample_indices(40, 10, 1).tolist()
  )
  assert built[0].path != built[1].path
  assert documents.sample_indices(40, 0, 0) is None and documents.sample_indices(40, 40, 0) is None


# Two processes of one job preparing one corpus on a shared cache directory: each waits for
# the other to be ready (so the builds would overlap), then prepares it; the build is slowed
# by 3 s so that the second process arrives while the first holds the lock.
_PREPARE_TOGETHER = """
import json, logging, os, sys, time
logging.basicConfig(level=logging.INFO)
from ihsweep.data import corpus, default_config
slow = corpus.train_bpe
corpus.train_bpe = lambda *a: (time.sleep(3), slow(*a))[1]
data = default_config()
data.update(json.loads(sys.argv[1]))
me, other = sys.argv[2], sys.argv[3]
open(me, "w").close()
while not os.path.exists(other):
  time.sleep(0.01)
tc = corpus.prepare_corpus(data, 300)
print(json.dumps({"hit": tc.cache_hit, "path": tc.path, "tokens": int(tc.train.size)}))
"""


def test_a_corpus_prepared_by_two_processes_on_one_cache_is_tokenized_once(tmp_path):
  import subprocess
  import sys

  data = {
    "source": "natural",
    "files": write_corpus(str(tmp_path / "text")),
    "cache_dir": str(tmp_path / "cache"),
  }
  ready = [str(tmp_path / f"ready{i}") for i in range(2)]
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", _PREPARE_TOGETHER, json.dumps(data), ready[i], ready[1 - i]],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert sorted(r["hit"] for r in results) == [False, True]  # one built it, the other loaded it
  assert results[0]["path"] == results[1]["path"] and results[0]["tokens"] == results[1]["tokens"]
  waited = [err for (_, err), r in zip(outs, results) if r["hit"]][0]
  assert "waiting for another process to finish tokenizing" in waited, waited[-2000:]


def test_windows_lie_inside_the_training_split(tiny, tmp_path):
  cfg = natural_cfg(tiny, tmp_path, **{"train.context_size": 32, "train.batch_size": 64})
  source = make_source(cfg.data, 300, 64, 32)
  train_ids = np.asarray(source.corpus.train)
  n = train_ids.size
  sample = jax.jit(source.sample)
  arrays = jax.device_put(source.arrays())
  all_starts = []
  for i in range(20):
    key = jax.random.PRNGKey(i)
    windows = np.asarray(sample(key, {}, arrays))
    starts = np.asarray(windows_lib.window_starts(key, n, 64, 32))
    all_starts.append(starts)
    assert windows.shape == (64, 33) and windows.dtype == np.int32
    for w, s in zip(windows, starts):
      np.testing.assert_array_equal(w, train_ids[s : s + 33])
  starts = np.concatenate(all_starts)
  assert starts.min() >= 0 and starts.max() <= n - 33
  assert starts.max() > n - 33 - n // 10  # the whole range is reachable, not a prefix


def test_host_loader_draws_the_windows_the_device_draws(tiny, tmp_path):
  cfg = natural_cfg(tiny, tmp_path)
  source = make_source(cfg.data, 300, 8, 32)
  keys = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in (3, 4)])  # E = 2
  host = source.host_batches(keys, 5, 3)  # steps 5, 6, 7
  assert host.shape == (2, 3, 8, 33)
  arrays = source.arrays()
  for e in range(2):
    for k in range(3):
      key = jax.random.fold_in(keys[e], 5 + k)
      np.testing.assert_array_equal(host[e, k], np.asarray(source.sample(key, {}, arrays)))


def test_host_batch_array_reads_each_device_part_once(tiny, tmp_path, monkeypatch):
  """The global batch of a 2 × 2 mesh (E over 'ensemble', B over 'data') is assembled from
  per-device parts: each part read once, only its models and rows, equal to the whole batch."""
  from ihsweep.base import sharding
  from ihsweep.data.source import host_batch_array

  cfg = natural_cfg(tiny, tmp_path)
  source = make_source(cfg.data, 300, 8, 32)
  keys = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in (3, 4)])
  reads = []
  host_rows = type(source).host_rows
  monkeypatch.setattr(
    type(source),
    "host_rows",
    lambda self, k, first, n, rows: (
      reads.append((len(k), rows)) or host_rows(self, k, first, n, rows)
    ),
  )
  mesh = sharding.make_mesh(2, 8, jax.devices()[:4])
  assert dict(mesh.shape) == {"ensemble": 2, "data": 2}
  batch = host_batch_array(source, keys, 5, 3, sharding.host_batch_sharding(mesh))
  assert sorted((n, r.start, r.stop) for n, r in reads) == [
    (1, 0, 4),
    (1, 0, 4),
    (1, 4, 8),
    (1, 4, 8),
  ]
  reads.clear()
  np.testing.assert_array_equal(np.asarray(batch), source.host_batches(keys, 5, 3))
  assert batch.dtype == np.uint16 and batch.sharding == sharding.host_batch_sharding(mesh)


def test_host_fed_training_equals_in_graph_training(tiny, tmp_path, monkeypatch):
  """Same windows either way, so the same losses; over 4 devices with the data axis used. The
  last call is short (1 of 3 updates): only its row crosses to the devices, padded there."""
  common = {"train.num_steps": 7, "train.steps_per_call": 3, "ensemble.size": 2}
  padded = []
  padder = loader_lib.HostLoader._padder
  monkeypatch.setattr(
    loader_lib.HostLoader, "_padder", lambda self, k: padded.append(k) or padder(self, k)
  )
  out = {}
  for loader in ("device", "host"):
    cfg = natural_cfg(tiny, tmp_path, **common, **{"data.loader": loader})
    out[loader] = fit(cfg, str(tmp_path / loader), progress=False)
  np.testing.assert_allclose(out["host"].losses, out["device"].losses, rtol=1e-5)
  rows = [json.loads(line) for line in open(tmp_path / "host" / "train_log.jsonl")]
  assert [r["step"] for r in rows] == [3, 6, 7] and padded == [1]


def test_auto_loader_respects_the_device_budget(tiny, tmp_path):
  cfg = natural_cfg(tiny, tmp_path)
  assert make_source(cfg.data, 300, 8, 32).on_device
  cfg.data.device_budget_mb = 0.001  # ~1 KB: the corpus does not fit
  src = make_source(cfg.data, 300, 8, 32)
  assert not src.on_device and src.arrays() == {}
  assert "host loader" in src.describe()


def test_bigram_and_unigram_counts_equal_a_direct_count():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 20, size=5000).astype(np.uint16)
  counts = corpus.bigram_counts(tokens, 20, chunk=777)  # several chunks, boundaries included
  direct = collections.Counter(zip(tokens[:-1].tolist(), tokens[1:].tolist()))
  dense = counts.toarray()
  assert dense.sum() == len(tokens) - 1
  for (a, b), c in direct.items():
    assert dense[a, b] == c
  np.testing.assert_array_equal(
    corpus.unigram_counts(tokens, 20), np.bincount(tokens, minlength=20)
  )


def test_file_formats(tmp_path):
  (tmp_path / "a.html").write_text(
    "<html><head><title>t</title><style>p{}</style></head><body><h1>Title</h1>"
    "<p>Fish &amp; chips</p><script>var x=1;</script><p>end</p></body></html>"
  )
  assert documents.strip_html((tmp_path / "a.html").read_text()) == "Title\n\nFish & chips\n\nend"
  assert list(documents.read_documents(str(tmp_path / "a.html"))) == [
    "Title\n\nFish & chips\n\nend"
  ]
  (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 2}\n')
  assert list(documents.read_documents(str(tmp_path / "b.jsonl"))) == ["one", "two"]
  pd.DataFrame({"body": ["x y", "", "z"]}).to_parquet(tmp_path / "c.parquet")
  assert list(documents.read_documents(str(tmp_path / "c.parquet"), "body")) == ["x y", "z"]
  with pytest.raises(errors.CorpusError, match="text_field"):
    list(documents.read_documents(str(tmp_path / "c.parquet"), "text"))
  (tmp_path / "d.jsonl").write_text('{"text": "ok"}\nnot json\n')
  with pytest.raises(errors.CorpusError, match=r"d.jsonl:2"):
    list(documents.read_documents(str(tmp_path / "d.jsonl")))


def test_tfds_corpus_through_data_source_with_mock_data(tiny, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  cfg = tiny(
    **{
      "data.source": "natural",
      "data.tfds_name": "lm1b",
      "model.vocab_size": 260,
      "data.cache_dir": str(tmp_path),
      "data.val_fraction": 0.1,
    }
  )
  with tfds.testing.mock_data(num_examples=60, policy=tfds.testing.MockPolicy.USE_CODE):
    config_lib.validate(cfg)
    tc = corpus.prepare_corpus(cfg.data, 260)
    records = documents._tfds_source(cfg.data)
    texts = [records[i]["text"] for i in range(len(records))]
  assert tc.meta["kind"] == "tfds"
  assert tc.meta["train_documents"] + tc.meta["val_documents"] == 60
  ids = np.asarray(tc.train)
  first = tc.tokenizer.decode(ids[: np.flatnonzero(ids == tc.eot_id)[0]].tolist())
  assert first in texts


def test_tfds_unknown_name_and_unprepared_dataset(tiny, tmp_path):
  cfg = tiny(
    **{"data.source": "natural", "data.tfds_name": "no_such_corpus_xyz", "model.vocab_size": 300}
  )
  with pytest.raises(errors.CorpusError, match="TFDS cannot load this dataset"):
    config_lib.validate(cfg)
  cfg = tiny(
    **{
      "data.source": "natural",
      "data.tfds_name": "lm1b",
      "model.vocab_size": 300,
      "data.tfds_data_dir": str(tmp_path),
    }
  )
  with pytest.raises(errors.CorpusError, match="not prepared"):
    config_lib.validate(cfg)


def test_offline_tfds_download_says_so_and_names_the_prepared_copy(tiny, tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets")

  def offline(*args, **kwargs):  # what a download without network ends in (TFDS varies)
    raise ConnectionError("[Errno -3] Temporary failure in name resolution")

  monkeypatch.setattr(tfds, "data_source", offline)
  cfg = tiny(
    **{
      "data.source": "natural",
      "data.tfds_name": "lm1b",
      "model.vocab_size": 300,
      "data.tfds_data_dir": str(tmp_path),
      "data.tfds_download": True,
    }
  )
  with pytest.raises(errors.CorpusError) as err:
    config_lib.validate(cfg)
  assert "'lm1b' could not be downloaded and prepared" in str(err.value)
  assert "no network" in str(err.value) and "config.data.tfds_data_dir=DIR" in str(err.value)
  assert err.value.field == "data.tfds_download"


def test_tokenizer_larger_than_the_model_vocabulary_is_named(tiny, tmp_path, no_compile):
  tok = tokenizer.train_bpe(iter(["some text to learn merges from " * 50]), 270)
  tok.save(str(tmp_path / "tok.json"))
  cfg = natural_cfg(
    tiny,
    tmp_path,
    **{
      "data.tokenizer": str(tmp_path / "tok.json"),
      "model.vocab_size": 16,
      "eval.every_steps": 10,
    },
  )
  with pytest.raises(errors.CorpusError) as err:
    fit(cfg, str(tmp_path / "run"), progress=False)
  assert err.value.field == "model.vocab_size"
  assert "model.vocab_size = 16 is smaller than the tokenizer's 270 types" in str(err.value)


def _bad_inputs(tmp_path):
  (tmp_path / "bin").mkdir()
  (tmp_path / "bin" / "x.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10)
  (tmp_path / "latin1").mkdir()
  (tmp_path / "latin1" / "x.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
  (tmp_path / "short").mkdir()
  (tmp_path / "short" / "x.txt").write_text("too short")
  (tmp_path / "small").mkdir()
  (tmp_path / "small" / "x.txt").write_text("abc abd abe " * 200)
  (tmp_path / "afile").write_text("")
  return {
    "empty glob": ({"data.files": str(tmp_path / "none" / "*.txt")}, "matches no file"),
    "binary": ({"data.files": str(tmp_path / "bin" / "*")}, "binary file"),
    "not utf-8": ({"data.files": str(tmp_path / "latin1" / "*")}, "not UTF-8"),
    "short": (
      {"data.files": str(tmp_path / "short" / "*"), "model.vocab_size": 257},
      "fewer than train.context_size",
    ),
    "vocab unreachable": (
      {"data.files": str(tmp_path / "small" / "*"), "model.vocab_size": 4096},
      "only supports",
    ),
    "vocab below bytes": (
      {"data.files": str(tmp_path / "small" / "*"), "model.vocab_size": 64},
      "model.vocab_size",
    ),
    "no document source": ({}, "exactly one of"),
    "two document sources": (
      {"data.files": str(tmp_path / "small" / "*"), "data.corpus": "python-docs"},
      "exactly one of",
    ),
    "corpus not fetched": ({"data.corpus": "python-docs"}, "ihsweep corpus fetch"),
    "cache dir is a file": (
      {"data.corpus": "python-docs", "data.cache_dir": str(tmp_path / "afile")},
      r"data.cache_dir = '.*afile' is not a directory",
    ),
    "bad tokenizer path": (
      {"data.files": str(tmp_path / "small" / "*"), "data.tokenizer": str(tmp_path / "nope.json")},
      "tokenizer.json",
    ),
    "bad loader": (
      {"data.files": str(tmp_path / "small" / "*"), "data.loader": "disk"},
      "data.loader",
    ),
  }


@pytest.mark.parametrize(
  "case",
  [
    "empty glob",
    "binary",
    "not utf-8",
    "short",
    "vocab unreachable",
    "vocab below bytes",
    "no document source",
    "two document sources",
    "corpus not fetched",
    "cache dir is a file",
    "bad tokenizer path",
    "bad loader",
  ],
)
def test_bad_inputs_fail_before_compiling(tiny, tmp_path, no_compile, case):
  overrides, message = _bad_inputs(tmp_path)[case]
  cfg = tiny(
    **{
      "data.source": "natural",
      "data.cache_dir": str(tmp_path / "cache"),
      "model.vocab_size": 300,
      **overrides,
    }
  )
  with pytest.raises((errors.CorpusError, fields.ConfigError), match=message):
    fit(cfg, str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_unreadable_file_is_named(tmp_path, monkeypatch):
  path = tmp_path / "locked.txt"
  path.write_text("secret")
  real_open = open

  def deny(p, *a, **k):  # tests run as root here, where chmod 000 does not stop a read
    if str(p) == str(path):
      raise PermissionError(13, "Permission denied", str(p))
    return real_open(p, *a, **k)

  monkeypatch.setattr("builtins.open", deny)
  with pytest.raises(errors.CorpusError, match="cannot read .*locked.txt: Permission denied"):
    list(documents.read_documents(str(path)))


def test_loaded_tokenizer_json(tiny, tmp_path):
  tok = tokenizer.train_bpe(iter(["some text to learn merges from " * 50]), 270)
  tok.save(str(tmp_path / "tok.json"))
  cfg = natural_cfg(
    tiny, tmp_path, **{"data.tokenizer": str(tmp_path / "tok.json"), "model.vocab_size": 300}
  )  # padded model vocabulary
  tc = corpus.prepare_corpus(cfg.data, 300)
  assert tc.meta["tokenizer_vocab"] == 270 and int(np.max(tc.train)) < 270
  with pytest.raises(errors.CorpusError, match="smaller than the tokenizer"):
    tokenizer.load_tokenizer(str(tmp_path / "tok.json"), 260)


def test_corpus_fetch_without_apt_points_elsewhere(monkeypatch):
  monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
  with pytest.raises(errors.CorpusError) as err:
    corpus.fetch_corpus("python-docs", "/nonexistent")
  assert "apt-get" in str(err.value) and "--config.data.files" in str(err.value)
  assert "tfds_name" in str(err.value)
  with pytest.raises(errors.CorpusError, match="unknown corpus"):
    corpus.fetch_corpus("nonsense")


def test_html5_without_head_end_tag_keeps_its_body():
  assert documents.strip_html("<html><head><title>T</title><body><p>Hello</p>") == "Hello"


def test_jsonl_line_separators_inside_strings_are_text(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text(
    json.dumps({"text": "one\u2028two\x85three"}, ensure_ascii=False) + "\n", encoding="utf-8"
  )
  assert list(documents.read_documents(str(path))) == ["one\u2028two\x85three"]


def test_parquet_nulls_dropped_and_non_text_refused(tmp_path):
  pd.DataFrame({"text": ["a", None, "b"]}).to_parquet(tmp_path / "n.parquet")
  assert list(documents.read_documents(str(tmp_path / "n.parquet"))) == ["a", "b"]
  pd.DataFrame({"text": [1, 2]}).to_parquet(tmp_path / "i.parquet")
  with pytest.raises(errors.CorpusError, match="int"):
    list(documents.read_documents(str(tmp_path / "i.parquet")))
  (tmp_path / "fake.parquet").write_text("not parquet")
  with pytest.raises(errors.CorpusError, match="cannot read .* as parquet") as err:
    list(documents.read_documents(str(tmp_path / "fake.parquet")))
  assert "\n" not in str(err.value)


def test_symlinks_and_overlapping_globs_read_each_file_once(tmp_path):
  write_corpus(str(tmp_path / "t"), n_docs=3)
  os.symlink(tmp_path / "t", tmp_path / "t" / "loop")
  files = documents.list_files(f"{tmp_path}/t/**/*.txt,{tmp_path}/t/../t/doc000.txt")
  assert len(files) == 3


def test_tokenizer_ids_beyond_the_model_vocabulary_are_refused(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers

  tok = Tokenizer(models.WordLevel({tokenizer.EOT: 0, "[UNK]": 1, "x": 5000}, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(str(tmp_path / "sparse.json"))
  with pytest.raises(errors.CorpusError, match="ids up to 5000"):
    tokenizer.load_tokenizer(str(tmp_path / "sparse.json"), 300)


def test_unusable_cache_dir_and_damaged_cache(tiny, tmp_path, caplog):
  (tmp_path / "afile").write_text("")
  cfg = natural_cfg(tiny, tmp_path, **{"data.cache_dir": str(tmp_path / "afile")})
  with pytest.raises(errors.CorpusError, match="data.cache_dir"):
    corpus.prepare_corpus(cfg.data, 300)
  cfg = natural_cfg(tiny, tmp_path)
  built = corpus.prepare_corpus(cfg.data, 300)
  with open(os.path.join(built.path, "train.npy"), "r+b") as f:
    f.truncate(200)  # a disk filled up, or a hand edit
  rebuilt = corpus.prepare_corpus(cfg.data, 300)
  assert not rebuilt.cache_hit and rebuilt.train.size == built.meta["train_tokens"]
  assert "damaged" in caplog.text


def test_leftovers_of_killed_builds_are_removed(tmp_path):
  import socket
  import subprocess

  dead = subprocess.Popen(["true"])
  dead.wait()
  host = socket.gethostname()
  stale = tmp_path / f".build-{host}-{dead.pid}-abc123"
  live = tmp_path / f".build-{host}-{os.getpid()}-def456"
  other_host = tmp_path / f".build-elsewhere-{dead.pid}-ghi789"
  for d in (stale, live, other_host):
    d.mkdir()
  cache.remove_stale_temp_dirs(str(tmp_path))
  assert not stale.exists() and live.exists() and other_host.exists()


def test_corpus_fields_need_the_natural_source(tiny):
  cfg = tiny(**{"data.files": "/tmp/*.txt"})  # source stays markov_chain
  with pytest.raises(fields.ConfigError, match="data.source=natural"):
    config_lib.validate(cfg)


def test_probes_of_a_corpus_use_its_validation_split_and_frequent_tokens(tiny, tmp_path):
  from ihsweep.data import probes

  cfg = natural_cfg(tiny, tmp_path, **{"eval.probe_top_k": 40, "eval.n_sequences": 6})
  src = make_source(cfg.data, 300, 8, 32)
  p = probes.make_probes(src, {}, None, cfg.eval, 2, 32)
  val = np.asarray(src.corpus.val)
  assert p.sequences.shape == (2, 6, 33)
  np.testing.assert_array_equal(p.sequences[0], p.sequences[1])  # no per-model data knobs
  for seq in p.sequences[0]:  # every window is a slice of the validation split
    starts = np.flatnonzero(val[: len(val) - 32] == seq[0])
    assert any((val[s : s + 33] == seq).all() for s in starts)
  top = set(np.argsort(-src.train_token_counts(), kind="stable")[:41].tolist()) - {
    src.corpus.eot_id
  }
  assert set(np.unique(p.repeated)) <= top and src.corpus.eot_id not in p.repeated
  assert "40 most frequent ids (training split)" in p.candidates
