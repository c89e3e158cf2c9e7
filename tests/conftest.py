"""Test setup: 4 fake CPU devices (must be set before jax is imported) and tiny configs."""

import os

# Compiling dominates most tests' time (tiny programs run for milliseconds), so XLA:CPU is told
# to compile fast, here and in every CLI subprocess the tests start (their XLA_FLAGS use this):
# LLVM at -O0 (a tiny ensemble program took ~20 s to compile at the default level, ~5 s at
# -O0; the compute-heavy synthetic-matrix tests get slower, the suite as a whole faster:
# test_markov + test_train 315 s vs 347 s). Not --xla_cpu_use_fusion_emitters=false, though it
# cut compile-heavy tests' CPU by ~24%: its programs for 5 and for 10 updates per call differ
# in the last bit, which Adam turns into other params (test_checkpoint's resume by the clock).
CPU_COMPILE_FLAGS = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count=4 {CPU_COMPILE_FLAGS}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Strict broadcasting: an implicit rank promotion ([B, T, D] + [D]) raises, here and in the CLI
# subprocesses that inherit the environment, so every broadcast in ihsweep is written out.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
# One persistent compilation cache for the session, shared with the CLI subprocesses that tests
# start: most tests compile the same tiny programs again (a fresh jit per run).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ihsweep-test-xla-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
# Nothing of the user's: the tests never read (or fill) ~/.cache/ihsweep. A test session gets an
# empty cache root (an IHSWEEP_CACHE set by the caller is replaced too), so a test that needs a
# corpus must make one (``python_docs_corpus``) or fetch it itself, as on a new machine. Its
# processes (xdist workers, the CLI subprocesses, a child importing this file) inherit it, or
# the IHSWEEP_CACHE a test gave them.
if not os.environ.get("IHSWEEP_TEST_SESSION_CACHE"):
  import atexit
  import shutil
  import tempfile

  os.environ["IHSWEEP_CACHE"] = tempfile.mkdtemp(prefix="ihsweep-test-cache-")
  os.environ["IHSWEEP_TEST_SESSION_CACHE"] = os.environ["IHSWEEP_CACHE"]
  atexit.register(shutil.rmtree, os.environ["IHSWEEP_CACHE"], True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402

import configs.default  # noqa: E402


def tiny_config(**overrides):
  """configs/default.py shrunk so that a compile takes ~1 s: V 64, d 32, B 8, C 32."""
  c = configs.default.get_config()
  c.model.update(
    n_layers=2, n_heads=2, d_model=32, d_mlp=64, vocab_size=64, max_context=32, dtype="float32"
  )
  c.train.update(batch_size=8, context_size=32, num_steps=20, steps_per_call=10, lr=3e-3)
  c.ensemble.size = 2
  c.eval.every_steps = 0  # tests of evaluation and checkpoints turn these back on
  c.checkpoint.params_schedule = "none"
  for path, value in overrides.items():
    *parents, name = path.split(".")
    node = c
    for part in parents:
      node = node[part]
    node[name] = value
  return c


@pytest.fixture
def tiny():
  return tiny_config


def write_python_docs_corpus(cache_dir) -> str:
  """A small stand-in for the fetched python-docs corpus (``ihsweep corpus fetch``'s layout:
  ``corpora/python-docs/**/*.rst.txt`` and ``SOURCE.json``) in ``cache_dir``: 12 generated
  reStructuredText files of ~10 KB, enough for a config that names the corpus to validate and to
  build a BPE vocabulary of 512 types (the demo's). Returns the corpus directory."""
  import json
  import random

  root = os.path.join(str(cache_dir), "corpora", "python-docs")
  os.makedirs(os.path.join(root, "library"), exist_ok=True)
  rng = random.Random(0)
  syllables = (
    "ar be co de el fi go hu in jo ka le mi no op pu qu ra si te un vo wa xe yo ze".split()
  )
  # ~800 made-up words: enough distinct pairs for a BPE vocabulary of 512 types
  words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(800)]
  words += "def class return import from the a of ( ) : . , = self".split()
  for i in range(12):
    lines = [f"Module {i}", "=" * 10, ""]
    for _ in range(200):
      lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + ".")
    with open(os.path.join(root, "library", f"mod{i}.rst.txt"), "w") as f:
      f.write("\n".join(lines))
  with open(os.path.join(root, "SOURCE.json"), "w") as f:
    json.dump({"corpus": "python-docs", "package": "stand-in (tests)", "files": 12}, f)
  return root


@pytest.fixture
def python_docs_corpus(tmp_path, monkeypatch):
  """``IHSWEEP_CACHE`` pointed at a temporary cache holding ``write_python_docs_corpus``'s
  stand-in python-docs corpus; returns the cache directory."""
  cache = tmp_path / "ihsweep-cache"
  write_python_docs_corpus(cache)
  monkeypatch.setenv("IHSWEEP_CACHE", str(cache))
  return str(cache)


@pytest.fixture
def no_compile(monkeypatch):
  """Fails the test if anything reaches compilation (bad input must be refused before)."""
  from ihsweep.compute import train

  def boom(*a, **k):
    raise AssertionError("compiled before rejecting bad input")

  monkeypatch.setattr(train, "make_init_fn", boom)
  monkeypatch.setattr(train, "make_ensemble_train_fn", boom)


# `make test` hands test files to two pytest-xdist workers in this order (--dist loadfile
# --no-loadscope-reorder): the slowest first, so that no long file is left for the end while
# the other worker idles (longest-processing-time-first). Seconds on one worker, 2-core AMD
# EPYC: 158, 109, 109, 102, 91, 67, 59, 53, 46, then under 36 each. A stale order costs balance
# only, never a result.
_SLOWEST_FIRST = (
  "test_workers.py", "test_benchmarks.py", "test_sweep.py", "test_train.py", "test_cli.py",
  "test_export.py", "test_launch.py", "test_targets.py", "test_checkpoint.py",
  "test_analysis.py", "test_runner.py", "test_markov.py", "test_memory.py", "test_rundir.py",
)  # fmt: skip


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within kept
