"""Test setup: 4 fake CPU devices (must be set before jax is imported) and tiny configs."""

import os

# Compiling dominates most tests' time (tiny programs run for milliseconds), so XLA:CPU is told
# to compile fast, here and in every CLI subprocess the tests start (their XLA_FLAGS use this):
# LLVM at -O0 (a tiny ensemble program took ~20 s to compile at the default level, ~5 s at
# -O0) and XLA:CPU's older fusion codegen instead of its MLIR fusion emitters (a new MLIR context
# per fusion: the suite's CPU 2,322 s -> 1,935 s, issue 45). Every equivalence the tests claim
# compares a program with itself or with a tolerance; two programs that differ only in how many
# updates one call runs may differ in float32's last bit under this codegen (test_checkpoint's
# resume by the clock compares runs of the same call length).
CPU_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
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


@pytest.fixture(autouse=True)
def own_compiled_times(tmp_path_factory, monkeypatch):
  """Each test its own empty ``IHSWEEP_COMPILED_TIMES`` (its subprocesses inherit it): a
  ``plan --target`` in one test leaves compiled times that would change another test's FLOPs
  plans and auto layouts on that chip (``ihsweep.planning.compiled_times``)."""
  monkeypatch.setenv("IHSWEEP_COMPILED_TIMES", str(tmp_path_factory.mktemp("compiled-times")))


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


def write_sigmoid_sweep(
  workdir: str,
  batch_sizes: tuple,
  context_sizes: tuple,
  c_exponent: float = 0.0,
  never: tuple | None = None,
  last: int = 4096,
  cap: int | None = None,
  late: float | None = None,
  pt: bool = False,
  n_layers: int = 2,
) -> str:
  """A sweep directory as `ihsweep run` lays it out (configs/induction.py over ``batch_sizes`` ×
  ``context_sizes``, 2 seeds, every group done, no checkpoints), whose metrics.jsonl hold
  ps_max curves rising (a sigmoid in ln updates, 0.02 → 0.82) at UPT = e^9.5 / (B^0.8 ·
  C^c_exponent), seed 1 10% later, at updates 2^(k/4) up to ``last``. ``never``: the (B, C)
  whose seed 1 never rises (censored at the end). ``cap``: training ends there instead of
  4,096, with a last checkpoint at it. ``late``: ``never``'s seed 1 jumps sharply at this
  update instead. ``pt``: also pt_max curves, rising at 0.9 × each model's ps_max update.
  ``n_layers``: the models' (configs/induction.py's 2)."""
  import json
  import math

  import ml_collections

  import configs.induction
  from ihsweep.configuration import grid as grid_lib
  from ihsweep.runs import rundir
  from ihsweep.training import resume

  cfg = configs.induction.get_config()
  cfg.sweep.grid = ml_collections.ConfigDict(
    {"train": ml_collections.ConfigDict({"batch_size": batch_sizes, "context_size": context_sizes})}
  )
  cfg.sweep.update(seeds=2, budget="updates")
  cfg.train.num_steps = cap or 4096
  cfg.model.n_layers = n_layers
  os.makedirs(workdir)
  plan = grid_lib.make_plan(cfg)
  resume.write_resolved_config(cfg, workdir)
  rundir.write_cells(plan, workdir)
  steps = [0] + [int(round(2 ** (k / 4))) for k in range(49)] + ([cap] if cap else [])
  steps = sorted(set(s for s in steps if s <= max(last, cap or 0)))
  for group in plan.groups:
    gdir = rundir.group_dir(workdir, group.id)
    os.makedirs(gdir)
    resume.write_resolved_config(group.cfg, gdir)
    b, c = int(group.cfg.train.batch_size), int(group.cfg.train.context_size)
    with open(os.path.join(gdir, "metrics.jsonl"), "w") as f:
      for cell, seed in zip(group.cfg.ensemble.cell_ids, group.cfg.ensemble.seeds):
        upt = math.exp(9.5 - 0.8 * math.log(b) - c_exponent * math.log(c))
        upt *= 1.1 if seed % 2 else 1.0
        rises, power = not ((b, c) == never and seed % 2 == 1), 6
        if not rises and late:
          rises, upt, power = True, late, 60  # a jump within one checkpoint interval
        for s in steps:
          x = 1 / (1 + (upt / max(s, 0.5)) ** power) if rises else 0.0
          row = {"step": s, "cell": int(cell), "tokens": s * b * c, "ps_max": 0.02 + 0.8 * x}
          if pt:
            row["pt_max"] = 0.03 + 0.9 / (1 + (0.9 * upt / max(s, 0.5)) ** power)
          f.write(json.dumps(row) + "\n")
    rundir.write_status(workdir, group.id, state="done")
  return workdir


# `make test` hands test files to two pytest-xdist workers in this order (--dist loadfile
# --no-loadscope-reorder): the slowest first, so that no long file is left for the end while
# the other worker idles (longest-processing-time-first). Seconds on one worker of two, 2-core
# Xeon, issue 45: 376, 236, 236, 228, 176, 94, 84, 83, 82, 79, 75, 66, 63, 62, 59, then under 52
# each. A stale order costs balance only, never a result.
_SLOWEST_FIRST = (
  "test_workers.py", "test_sweep.py", "test_benchmarks.py", "test_targets.py", "test_train.py",
  "test_cli.py", "test_checkpoint.py", "test_export.py", "test_launch.py",
  "test_device_preflight.py", "test_markov.py", "test_runner.py", "test_memory.py",
  "test_analysis.py", "test_docs_tables.py",
)  # fmt: skip


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within kept
