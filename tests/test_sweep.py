"""Sweeps: planning, one process vs two, kill and rerun, divergence, early stop, SIGTERM,
launchers, bad configs."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pandas as pd
import pytest
from conftest import CPU_COMPILE_FLAGS, tiny_config

from ihsweep.base import schema
from ihsweep.configuration import axes as axes_lib
from ihsweep.configuration import grid as grid_lib
from ihsweep.configuration.fields import ConfigError
from ihsweep.runs import checkpoint, ownership, rundir
from ihsweep.training import evaluation, group_build, memory, resume, runner
from ihsweep.workers import sweep, sweep_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")

# The acceptance grid: B ∈ {4, 8} × C ∈ {16, 32} × 2 seeds = 8 cells in 4 groups of E = 2.
GRID = {"train.batch_size": (4, 8), "train.context_size": (16, 32)}
SWEEP_FLAGS = ["--grid=train.batch_size=4,8", "--grid=train.context_size=16,32"]
# Run settings shared by the in-process and CLI runs (the CLI gets them as --config.X=V). One
# attention-only layer: compiling the evaluation dominates these runs, and it scales with depth.
RUN = {
  "model.n_layers": 1,
  "model.d_mlp": 0,
  "train.num_steps": 20,
  "train.steps_per_call": 10,
  "checkpoint.state_every_steps": 10,
  "eval.every_steps": 10,
  "eval.n_probes": 8,
  "eval.n_sequences": 4,
  "sweep.seeds": 2,
}


def _config(tiny, grid=GRID, **overrides):
  if overrides.get("sweep.budget", "updates") != "updates":  # that budget sets the updates
    overrides.setdefault("train.num_steps", schema.field("train.num_steps").default)
  cfg = tiny(**{**RUN, **overrides})
  axes_lib.add_axes(cfg, [f"{k}={','.join(map(str, v))}" for k, v in grid.items() if v])
  for path in (k for k, v in grid.items() if not v):  # an empty axis, as a config file may have
    axes_lib.add_axes(cfg, [f"{path}=0"])
    section, name = path.split(".")
    cfg.sweep.grid[section][name] = ()
  return cfg


def _cli_flags(axes=(), **overrides):
  """The tiny run as --config.X=V flags, without the fields the ``--grid`` flags ``axes`` set
  (a field given both ways is refused)."""
  swept = tuple(f"--config.{a.split('=')[1]}=" for a in axes)
  tiny_flags = [
    "--config.train.batch_size=8",
    "--config.train.context_size=32",
    "--config.model.d_model=32",
    "--config.model.n_heads=2",
    "--config.model.vocab_size=64",
    "--config.model.max_context=32",
    "--config.model.dtype=float32",
    "--config.checkpoint.params_schedule=none",
    "--config.train.lr=0.003",
    "--config.ensemble.size=2",
  ]
  flags = tiny_flags + [f"--config.{k}={v}" for k, v in {**RUN, **overrides}.items()]
  return [f for f in flags if not f.startswith(swept)]


def _env(devices_per_process: int, **extra):
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "IHSWEEP": f"{sys.executable} -m ihsweep.cli",
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process} "
    f"{CPU_COMPILE_FLAGS}",
    "IHSWEEP_HEARTBEAT_S": "10",
    "IHSWEEP_GRACE_S": "5",
  }
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _launch_two(workdir, extra_flags=(), **env):
  """Two processes joined by jax.distributed, training each group together on one global mesh
  (one worker spanning both: sweep.processes_per_worker = 2; tests/test_workers.py has
  process-local groups)."""
  cmd = [
    "bash",
    os.path.join(LAUNCH, "local_multiprocess.sh"),
    "2",
    "--config=configs/default.py",
    f"--workdir={workdir}",
    "--noprogress",
    *SWEEP_FLAGS,
    *_cli_flags(axes=SWEEP_FLAGS),
    "--config.sweep.processes_per_worker=2",
    *extra_flags,
  ]
  return subprocess.run(
    cmd, cwd=ROOT, env=_env(2, **env), capture_output=True, text=True, timeout=600
  )


def _final_metrics(workdir) -> dict:
  """cell id -> its metrics.jsonl row at the last step (the run's final evaluation)."""
  out = {}
  for g in sorted(os.listdir(os.path.join(workdir, "groups"))):
    rows = [json.loads(line) for line in open(os.path.join(workdir, "groups", g, "metrics.jsonl"))]
    last = max(r["step"] for r in rows)
    out.update({r["cell"]: r for r in rows if r["step"] == last})
  return out


def _plan_columns(workdir):
  cells = pd.read_csv(os.path.join(workdir, "cells.csv"))
  return cells.drop(columns=["status", "steps_done"])


# What the reference sweep did per group on its way to the train step (test_each_group_...).
REFERENCE_CALLS: dict = {}


def _counted(calls: dict, name: str, fn):
  def wrapper(*args, **kwargs):
    calls[name] = calls.get(name, 0) + 1
    return fn(*args, **kwargs)

  return wrapper


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The acceptance sweep in one process on 4 fake CPU devices, counting what is worked out
  for its groups (``REFERENCE_CALLS``)."""
  from ihsweep.configuration import config as config_lib

  work = str(tmp_path_factory.mktemp("sweep") / "one")
  counted = {
    (config_lib, "validate"): "validate",
    (config_lib, "validate_devices"): "validate_devices",
    (memory, "check_possible"): "check_possible",
    (runner, "resolve_memory"): "resolve_memory",
    (runner, "GroupBuild"): "build",
    (group_build, "make_source"): "data source",
  }
  with pytest.MonkeyPatch.context() as mp:
    for (module, attr), name in counted.items():
      mp.setattr(module, attr, _counted(REFERENCE_CALLS, name, getattr(module, attr)))
    result = sweep.run(_config(tiny_config), work, progress=False)
  return work, result


# ---------------------------------------------------------------------------- planning (no JAX)


def test_plan_cells_groups_and_cost_order(tiny):
  cfg = _config(tiny, grid={**GRID, "train.lr": (1e-3, 3e-3)})
  plan = grid_lib.make_plan(cfg)
  assert len(plan.cells) == 2 * 2 * 2 * 2  # B × C × lr × seeds
  assert len(plan.groups) == 4  # lr and seed are vmapped: one group per (B, C)
  assert plan.axes == ["train.batch_size", "train.context_size", "train.lr"]
  # Grid order, seed innermost; each group holds every lr and seed of its (B, C).
  assert [c.seed for c in plan.cells[:4]] == [0, 1, 0, 1]
  assert [c.coords["train.lr"] for c in plan.cells[:4]] == [1e-3, 1e-3, 3e-3, 3e-3]
  for g in plan.groups:
    assert len(g.cells) == 4
    assert g.cfg.ensemble.peak_lrs == (1e-3, 1e-3, 3e-3, 3e-3)
    assert g.cfg.ensemble.seeds == (0, 1, 0, 1)
    assert g.cfg.ensemble.cell_ids == tuple(c.id for c in g.cells)
  costs = [g.cost_flops for g in plan.groups]
  assert costs == sorted(costs, reverse=True)
  first = plan.groups[0].cfg.train
  assert (first.batch_size, first.context_size) == (8, 32)  # most tokens per update first
  table = rundir.cells_table(plan)
  assert list(table["cell"]) == list(range(16))
  for col in (
    "group",
    "seed",
    "train.batch_size",
    "train.context_size",
    "train.lr",
    "n_params",
    "law_updates",
    "law_tokens",
    "budget_updates",
    "diverged",
  ):
    assert col in table.columns
  row = table.iloc[0]
  law = np.exp(13.26) / (row["batch_size"] ** 0.37 * row["context_size"] ** 0.62)
  assert row["law_updates"] == pytest.approx(law, abs=0.1)


def test_plan_zip_budgets_and_single_cell(tiny):
  cfg = _config(tiny, grid={})
  axes_lib.add_axes(cfg, ["train.batch_size=4,8", "train.context_size=16,32"], "zip")
  plan = grid_lib.make_plan(cfg)
  assert len(plan.groups) == 2 and len(plan.cells) == 4  # zipped: (4, 16) and (8, 32)
  assert {(g.cfg.train.batch_size, g.cfg.train.context_size) for g in plan.groups} == {
    (4, 16),
    (8, 32),
  }
  # A zip axis may repeat a value as long as the zipped points differ …
  cfg = _config(tiny, grid={})
  axes_lib.add_axes(cfg, ["train.batch_size=4,4,8", "train.context_size=16,32,32"], "zip")
  assert len(grid_lib.make_plan(cfg).groups) == 3
  cfg = _config(tiny, grid={})  # … but not a whole point
  axes_lib.add_axes(cfg, ["train.batch_size=4,8,4", "train.context_size=16,32,16"], "zip")
  with pytest.raises(ConfigError, match="distinct points"):
    grid_lib.make_plan(cfg)
  cfg = _config(tiny, **{"sweep.budget": "tokens", "sweep.tokens": 10_000})
  steps = {
    (g.cfg.train.batch_size, g.cfg.train.context_size): g.num_steps
    for g in grid_lib.make_plan(cfg).groups
  }
  assert steps[(4, 16)] == 157 and steps[(8, 32)] == 40  # ceil(10,000 / (B · C))
  cfg = _config(tiny, **{"sweep.budget": "law", "sweep.law_multiple": 0.001})
  g = grid_lib.make_plan(cfg).groups[0]
  assert g.num_steps == int(np.ceil(0.001 * g.law_updates))
  plain = tiny()  # no axes: one grid point with ensemble.size seeds, = `ihsweep train`
  plan = grid_lib.make_plan(plain)
  assert len(plan.groups) == 1 and plan.groups[0].cfg.ensemble.seeds == (0, 1)


@pytest.mark.parametrize(
  "grid, extra, field, words",
  [
    ({"train.batch_size": ()}, {}, "sweep.grid.train.batch_size", "non-empty"),
    ({"train.context_size": (16, 64)}, {}, "sweep.grid.train.context_size", "max_context"),
    ({"train.batchsize": (4,)}, {}, "sweep.grid.train.batchsize", "existing config field"),
    ({"ensemble.size": (2, 4)}, {}, "sweep.grid.ensemble.size", "sweep.seeds"),
    ({}, {"sweep.placement": "pod"}, "sweep.placement", "'worker'"),
    ({}, {"sweep.budget": "emergence", "eval.every_steps": 0}, "eval.every_steps", "emergence"),
    ({}, {"sweep.budget": "forever"}, "sweep.budget", "'updates'"),
    ({"seed": (1, 2)}, {}, "sweep.grid.seed", "sweep.seeds"),
    ({"train.batch_size": (4, 4)}, {}, "sweep.grid.train.batch_size", "distinct"),
    ({"train.batch_size": (0, 8)}, {}, "sweep.grid.train.batch_size", ">= 1"),
    ({"data.frequency": (0.2, 0.5)}, {}, "sweep.grid.data.frequency", "markov"),
    # Copies: values equal once cast, execution-only fields, fields the source does not read.
    (
      {"train.lr": (1, 1.0)},
      {},
      "sweep.grid.train.lr",
      "cells 0 and 2 would be the same model (1 and 1.0 are the same value 1.0",
    ),
    (
      {"train.steps_per_call": (5, 10)},
      {},
      "sweep.grid.train.steps_per_call",
      "only changes how a run executes",
    ),
    (
      {"checkpoint.async_save": (True, False)},
      {},
      "sweep.grid.checkpoint.async_save",
      "its cells would be copies",
    ),
    ({"ensemble.vmap_chunk": (1, 2)}, {}, "sweep.grid.ensemble.vmap_chunk", "copies"),
    ({"data.cache_dir": ("/tmp/a", "/tmp/b")}, {}, "sweep.grid.data.cache_dir", "copies"),
    (
      {"data.smoothing": (0.1, 0.2)},
      {},
      "sweep.grid.data.smoothing",
      "data.source = 'markov_chain' does not read data.smoothing; only data.source = 'markov' "
      "(transitions 'bigram') does",
    ),
    (
      {"data.source": ("markov", "markov_chain"), "data.frequency": (0.5, 1.0)},
      {"data.transitions": "iid"},
      "sweep.grid.data.frequency",
      "'markov_chain' does not read data.frequency",
    ),
    # An emergence threshold an untrained model reaches (C = 32: L = 16, uniform PS 0.0424).
    (
      {},
      {"sweep.budget": "emergence", "sweep.stop_threshold": 0.04},
      "sweep.stop_threshold",
      "above 0.0424, the ps_max of uniform attention on probe blocks of L = 16",
    ),
    (
      {},
      {"sweep.budget": "emergence", "sweep.stop_metric": "ar_acc", "sweep.stop_threshold": 0.0},
      "sweep.stop_threshold",
      "(0.0, 1.0]",
    ),
    # Workers of several processes in a job of one process, or a negative team size.
    ({}, {"sweep.processes_per_worker": 2}, "sweep.processes_per_worker", "an integer in [0, 1]"),
    ({}, {"sweep.processes_per_worker": -1}, "sweep.processes_per_worker", "an integer in [0, 1]"),
  ],
)
def test_bad_sweeps_fail_before_compiling(tiny, tmp_path, no_compile, grid, extra, field, words):
  cfg = _config(tiny, grid=grid, **extra)
  with pytest.raises(ConfigError) as e:
    sweep.run(cfg, str(tmp_path / "run"), progress=False)
  assert e.value.field == field, e.value
  assert words in str(e.value)
  assert not os.path.exists(tmp_path / "run" / "cells.csv")


def test_a_group_smaller_than_the_devices_runs_on_part_of_them(tiny, tmp_path):
  """E · B = 2 of the 4 devices: no longer refused (it was, before workers); it trains on 2."""
  work = str(tmp_path / "run")
  cfg = _config(
    tiny,
    grid={"train.batch_size": (2,)},
    **{"sweep.seeds": 1, "ensemble.size": 1, "eval.every_steps": 0},
  )
  result = sweep.run(cfg, work, progress=False)
  assert result.groups["g000"]["state"] == "done", result.groups
  assert rundir.read_status(work, "g000")["devices"] == 2


class _ProcessLock:
  """``filelock.FileLock`` as an fcntl lock behaves on NFS: held by the process, so it never
  keeps out another thread of the same process."""

  def __init__(self, path, *args, **kwargs):
    self.path = path

  def acquire(self, *args, **kwargs):
    return self

  def release(self, *args, **kwargs):
    pass


def test_a_sweeps_log_says_each_thing_once(tiny, tmp_path, monkeypatch, caplog):
  """A 2-group sweep on a corpus no run has tokenized yet, with its progress bars on: every
  INFO line of the log is different (the lines of each group name it); the corpus is
  tokenized, and said so, once, although the first group prepares it on the main thread while
  the second's programs are compiled ahead on another (a slow build makes the two meet; the
  cache's file lock is one that does not order threads, as on NFS); and a progress line
  follows each group with the groups done and tokens trained."""
  from test_natural import write_corpus

  from ihsweep.data import corpus

  build = corpus._build_cache

  def slow_build(*args, **kwargs):
    time.sleep(1.0)  # the other thread arrives meanwhile
    return build(*args, **kwargs)

  monkeypatch.setattr(corpus, "_build_cache", slow_build)
  monkeypatch.setattr("filelock.FileLock", _ProcessLock)
  natural = {
    "data.source": "natural",
    "data.files": write_corpus(str(tmp_path / "text")),
    "data.cache_dir": str(tmp_path / "cache"),
    "data.val_fraction": 0.2,
    "model.vocab_size": 300,
  }
  cfg = _config(tiny, grid={"train.batch_size": (4, 8)}, **natural)
  with caplog.at_level("INFO", logger="ihsweep"):
    result = sweep.run(cfg, str(tmp_path / "run"), progress=True)
  assert all(s["state"] == "done" for s in result.groups.values()), result.groups
  lines = [r.getMessage() for r in caplog.records if r.levelno >= 20 and r.name == "ihsweep"]
  assert any("compiled group g001's programs ahead" in m for m in lines), lines  # they met
  twice = sorted({m for m in lines if lines.count(m) > 1})
  assert not twice, twice
  assert sum(m.startswith("tokenizing ") for m in lines) == 1, lines
  assert sum(m.startswith("cached ") for m in lines) == 1, lines
  assert not any("waiting for another process" in m for m in lines), lines
  progress = [m for m in lines if m.startswith("sweep progress: ")]
  assert progress[0].startswith("sweep progress: 0/2 groups done, 0 running, 2 pending; 0 tokens")
  assert "ETA once a group has finished here" in progress[0]
  assert progress[1].startswith("sweep progress: 1/2 groups done, 0 running, 1 pending; ")
  assert "ETA ~" in progress[1] and "measured over the 1 group(s) trained here" in progress[1]
  tokens = 2 * 20 * (4 + 8) * 32  # E · updates · (B₀ + B₁) · C
  assert progress[2] == f"sweep progress: 2/2 groups done, 0 running, 0 pending; {tokens:,} " + (
    "tokens trained; nothing left"
  )


def test_unwritable_workdir_fails_before_compiling(tiny, tmp_path, no_compile):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  with pytest.raises(ConfigError, match="workdir"):
    sweep.run(_config(tiny), str(blocker / "run"), progress=False)


def test_one_run_per_directory(tiny, tmp_path, no_compile):
  work = str(tmp_path / "run")
  with ownership.workdir_lock(work):  # another `ihsweep train` holds it: one at a time
    with pytest.raises(ConfigError, match=r"in use by pid \d+"):
      runner.fit(tiny(), work, progress=False)
  with pytest.raises(ConfigError, match="'worker'"):  # the global placement is gone
    sweep.run(_config(tiny, **{"sweep.placement": "global"}), work, progress=False)
  (tmp_path / "train_run").mkdir()
  (tmp_path / "train_run" / "train_log.jsonl").write_text("")
  with pytest.raises(ConfigError, match="no ihsweep run"):  # a log alone is no run
    sweep.run(_config(tiny), str(tmp_path / "train_run"), progress=False)
  (tmp_path / "sweep_run").mkdir()
  (tmp_path / "sweep_run" / "cells.csv").write_text("cell\n")
  with pytest.raises(ConfigError, match="no ihsweep run"):
    runner.fit(tiny(), str(tmp_path / "sweep_run"), progress=False)
  with pytest.raises(ConfigError, match="one --grid/--zip flag per field"):
    axes_lib.add_axes(tiny(), ["train.batch_size=4", "train.batch_size=8"])


def test_cli_reports_bad_axis_in_one_line(tmp_path):
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "ihsweep.cli",
      "run",
      "--config=configs/default.py",
      f"--workdir={tmp_path}",
      "--grid=train.context_size=256",
    ],
    cwd=ROOT,
    env=_env(4),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 2
  assert "sweep.grid.train.context_size = 256" in r.stderr and "Traceback" not in r.stderr


def test_emergence_stop_rule(caplog):
  rule = evaluation.EmergenceStop("ps_max", 0.5, 2.0, 3)
  rule.observe(0, [0.1, 0.1, 0.1], [False, False, False])
  assert "stop_threshold" not in caplog.text
  rule.observe(100, [0.1, 0.6, None], [False, False, False])
  assert rule.crossed == [None, 100, None] and not rule.done(200)
  rule.observe(200, [0.7, 0.9, float("nan")], [False, False, True])  # model 2 diverged
  assert not rule.done(300)  # model 0 crossed at 200: done at 400
  assert rule.done(400)


def test_emergence_stop_ignores_a_threshold_reached_before_training(caplog):
  rule = evaluation.EmergenceStop("ps_max", 0.05, 2.0, 2)
  rule.observe(0, [0.06, 0.03], [False, False])  # model 0's untrained baseline is past it
  assert (
    "sweep.stop_threshold = 0.05 is already reached before emergence: ps_max at update 0 "
    "is 0.0600 for model(s) 0"
  ) in caplog.text
  rule.observe(100, [0.07, 0.5], [False, False])
  assert rule.crossed == [None, 100] and not rule.done(10_000)  # model 0 never counted
  rule.observe(200, [0.04, 0.5], [False, False])  # below it now: the next crossing counts
  rule.observe(300, [0.8, 0.5], [False, False])
  assert rule.crossed == [300, 100] and rule.done(600)


def test_axis_flags_without_values_or_with_nan(tiny):
  for spec, words in [
    (
      "train.lr=,",
      "sweep.grid.train.lr = 'train.lr=,' is not allowed: at least one value: the axis has none",
    ),
    ("train.lr= , ", "the axis has none"),
    ("train.lr=1e-3,,2e-3", "value 2 of 3 is empty"),
    ("train.lr=1e-3,nan", "sweep.grid.train.lr = 'nan' is not allowed: a finite number"),
    ("train.lr=-inf", "NaN and infinity are not allowed"),
    ("train.lr=1e999", "NaN and infinity are not allowed"),
  ]:
    with pytest.raises(ConfigError) as e:
      axes_lib.add_axes(tiny(), [spec])
    assert words in str(e.value), str(e.value)
    assert "string" not in str(e.value) and "distinct" not in str(e.value)


# ------------------------------------------------------------------------- launchers (no JAX)


@pytest.mark.parametrize(
  "script", ["local.sh", "local_multiprocess.sh", "slurm.sbatch", "tpu_pod.sh"]
)
def test_launchers_parse(script):
  subprocess.run(["bash", "-n", os.path.join(LAUNCH, script)], check=True)


def test_launcher_dry_runs(tmp_path):
  # A dry run checks that the command and the config exist: stand-ins for ihsweep and gcloud.
  for name in ("ihsweep", "gcloud"):
    (tmp_path / name).write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / name).chmod(0o755)
  path = f"{tmp_path}:{os.environ.get('PATH', '')}"
  env = {**os.environ, "IHSWEEP": "ihsweep", "IHSWEEP_PORT": "12345", "XLA_FLAGS": "", "PATH": path}
  args = ["--dry-run", "--config=configs/default.py", "--workdir=/shared/runs/x", "--grid=seed=0,1"]

  def dry(*cmd):
    r = subprocess.run(["bash", *cmd], env=env, capture_output=True, text=True, check=True)
    return [line.strip() for line in r.stdout.strip().splitlines()]

  assert dry(f"{LAUNCH}/local.sh", *args) == [
    "ihsweep run --config=configs/default.py --workdir=/shared/runs/x --grid=seed=0\\,1"
  ]
  lines = dry(f"{LAUNCH}/local_multiprocess.sh", "3", *args)
  assert len(lines) == 3
  for k, line in enumerate(lines):
    assert line.startswith(
      f"IHSWEEP_COORDINATOR=localhost:12345 IHSWEEP_NUM_PROCESSES=3 "
      f"IHSWEEP_PROCESS_ID={k} XLA_FLAGS=--xla_force_host_platform_device_"
      f"count="
    )
    assert line.endswith(
      "ihsweep run --config=configs/default.py --workdir=/shared/runs/x --grid=seed=0\\,1"
    )
  # (the device ids slurm.sbatch prints next, and tpu_pod.sh's per-host command: test_launch)
  assert dry(f"{LAUNCH}/slurm.sbatch", *args)[0] == (
    "IHSWEEP_DISTRIBUTED=1 srun --kill-on-bad-exit=1 ihsweep run --noprogress "
    "--config=configs/default.py --workdir=/shared/runs/x --grid=seed=0\\,1"
  )
  (line,) = dry(f"{LAUNCH}/tpu_pod.sh", "my-tpu", "us-central2-b", *args)
  assert line.startswith("gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central2-b --worker=all")
  assert "--workdir=/shared/runs/x --grid=seed=0\\,1 >> /shared/runs/x/logs/host_" in line


# ------------------------------------------------------------------------------- training runs


def test_one_process_sweep_trains_every_cell(reference):
  work, result = reference
  cells = pd.read_csv(os.path.join(work, "cells.csv"))
  assert len(cells) == 8 and set(cells["status"]) == {"done"}
  assert sorted(cells.groupby("group").size()) == [2, 2, 2, 2]
  final = _final_metrics(work)
  assert sorted(final) == list(range(8))
  assert all(
    r["step"] == 20 and np.isfinite(r["val_loss"]) and not r["diverged"] for r in final.values()
  )
  # Metrics rows carry the sweep's cell ids and seeds.
  for _, cell in cells.iterrows():
    assert final[cell["cell"]]["seed"] == cell["seed"]
  assert result.summary["cells_by_state"]["done"] == 8
  # A rerun skips every finished group: nothing is compiled or rewritten.
  before = {
    g: os.path.getmtime(os.path.join(work, "groups", g, "metrics.jsonl"))
    for g in os.listdir(os.path.join(work, "groups"))
  }
  again = sweep.run(_config(tiny_config), work, progress=False)
  assert all(s["state"] == "done" for s in again.groups.values())
  assert before == {
    g: os.path.getmtime(os.path.join(work, "groups", g, "metrics.jsonl")) for g in before
  }
  text = sweep_status.format_status(work)
  assert "g003" in text and "cells: 8 done" in text
  status_file = os.path.join(work, "groups", "g003", "status.json")
  saved = open(status_file).read()
  with open(status_file, "w") as f:
    f.write(saved[:10])  # cut short
  assert "status.json unreadable" in sweep_status.format_status(work)
  with open(status_file, "w") as f:
    f.write(saved)


def test_each_group_is_resolved_once(reference):
  """On the run path each of the 4 groups is validated once (when the sweep is planned; its
  worker's devices checked once), checked against memory once, has its memory resolved once
  and its parts (mesh, model, data source) built once, shared by the compile-ahead and the
  training (issue 46)."""
  assert REFERENCE_CALLS == {
    "validate": 4,
    "validate_devices": 4,
    "check_possible": 4,
    "resolve_memory": 4,
    "build": 4,
    "data source": 4,
  }


def test_status_names_the_worker_layout_of_each_process_holding_a_running_group(
  reference, tmp_path
):
  """workers.jsonl records each process's layout as it started (the run log's words); `ihsweep
  status` names it for a process whose worker (a thread's /wK included) holds a running
  group, and not for a process holding none."""
  import shutil

  from ihsweep.runs import claims

  work = str(tmp_path / "copy")
  shutil.copytree(reference[0], work)
  ((process, layout),) = claims.read_layouts(work).items()
  assert process == claims.worker_id()  # the reference trained in this process
  assert layout.startswith("1 worker(s) of 4 cpu device(s) in this process (sweep."), layout
  assert f"process {process}:" not in sweep_status.format_status(work)
  claims.set_thread_worker(1)
  try:
    assert claims.try_claim(work, "g002", ["cpu:0"]) == "claimed"
    rundir.write_status(work, "g002", state="running", worker=claims.worker_id())
    text = sweep_status.format_status(work)
  finally:
    claims.release_claim(work, "g002", "interrupted")
    claims.set_thread_worker(None)
  assert f"worker {process}/w1" in text and text.endswith(f"\nprocess {process}: {layout}"), text


def test_done_is_believed_only_with_a_finished_groups_evidence(reference, tmp_path, caplog):
  """A status.json that says done where the group's checkpoints and train log do not show its
  final update (cut short; never trained) is not counted as done: status says why, and a rerun
  resumes or retrains the group to the same numbers."""
  import shutil

  work = str(tmp_path / "copy")
  shutil.copytree(reference[0], work)
  g0, g1 = rundir.group_dir(work, "g000"), rundir.group_dir(work, "g001")
  status = json.load(open(os.path.join(g0, "status.json")))
  rundir.write_status(work, "g000", **{**status, "step": 10})  # "done at update 10 of 20"
  for name in ("checkpoints", "train_log.jsonl", "metrics.jsonl"):  # g001: never trained
    path = os.path.join(g1, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  text = sweep_status.format_status(work)
  assert "cells: 4 pending, 4 done" in text, text
  assert "status.json says done, but its update 10 is short of its 20" in text
  assert "status.json says done, but there is no full-state checkpoint at its update 20" in text
  with caplog.at_level("WARNING", logger="ihsweep"):
    result = sweep.run(_config(tiny_config), work, progress=False)
  assert "group g001: status.json says done, but there is no full-state checkpoint" in caplog.text
  assert all(s["state"] == "done" and s["step"] == 20 for s in result.groups.values())
  assert sweep_status.format_status(work).endswith("cells: 8 done")
  want, got = _final_metrics(reference[0]), _final_metrics(work)
  for cell in want:  # g001 trained again from the start: the same numbers
    assert got[cell]["val_loss"] == pytest.approx(want[cell]["val_loss"], rel=1e-5)
  # A step directory emptied by hand is no checkpoint.
  state = os.path.join(rundir.group_dir(work, "g003"), "checkpoints", "state", "20")
  for name in os.listdir(state):
    path = os.path.join(state, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  assert rundir.read_status(work, "g003")["state"] == "pending"
  # An early stop is believed with its checkpoints (params saved at the stop): here none.
  rundir.write_status(
    work,
    "g002",
    **{
      **json.load(open(rundir.group_dir(work, "g002") + "/status.json")),
      "step": 10,
      "stopped_early": True,
    },
  )
  assert rundir.read_status(work, "g002")["unverified"] == (
    "it stopped early without the params checkpoint an early stop saves at 10"
  )


def _finished(work: str, group_id: str, step: int) -> None:
  """The evidence a finished group leaves (rundir.unfinished): its final update as a full-state
  checkpoint directory and as the last train-log row."""
  gdir = rundir.group_dir(work, group_id)
  os.makedirs(os.path.join(gdir, "checkpoints", "state", str(step)))
  open(os.path.join(gdir, "checkpoints", "state", str(step), "_CHECKPOINT_METADATA"), "w").close()
  with open(os.path.join(gdir, "train_log.jsonl"), "w") as f:
    f.write(json.dumps({"step": step}) + "\n")


def test_status_of_a_cut_cells_table_shows_every_group_with_a_warning(tiny, tmp_path):
  """`ihsweep status` on a sweep whose cells.csv was cut short (`head -c 250`): every group
  directory is shown, its cells rebuilt from the group's config.json and status.json."""
  plan = grid_lib.make_plan(_config(tiny))
  work = str(tmp_path / "sweep")
  os.makedirs(work)
  for i, g in enumerate(plan.groups):  # as if g000, g001 finished and g002 ran; g003 not started
    if i < 3:
      resume.write_resolved_config(g.cfg, rundir.group_dir(work, g.id))
      rundir.write_status(
        work,
        g.id,
        state="done" if i < 2 else "interrupted",
        cells=[c.id for c in g.cells],
        num_steps=g.num_steps,
        step=g.num_steps if i < 2 else 10,
      )
      if i < 2:
        _finished(work, g.id, g.num_steps)
  path = rundir.write_cells(plan, work)
  whole = sweep_status.format_status(work).splitlines()
  text = open(path).read()
  assert len(text) > 250 and text[250] != "\n"  # the cut falls inside a row
  open(path, "w").write(text[:250])
  lines = sweep_status.format_status(work).splitlines()
  assert lines[0].startswith(f"warning: {path} is damaged or cut short: ")
  assert "cells.csv lacks" in lines[0] and "g000, g001, g002" in lines[0]
  assert "rebuilt from each group's config.json and status.json" in lines[0]
  # Every group directory reads as before the cut; g003 (pending, no directory) is left out.
  assert lines[1:-1] == [line for line in whole[:-1] if not line.startswith("g003")]
  assert lines[-1] == "cells: 4 done, 2 interrupted" and whole[-1].endswith(", 2 pending")


def test_two_processes_match_one_then_survive_a_kill(reference, tmp_path):
  """Two processes joined by jax.distributed, process 1 SIGKILLed right after the state save at
  update 10 of the second group (the coordinator then ends process 0 too); the same command
  then finishes the sweep. Every group equals the one-process run exactly: g000 (finished
  before the kill) and g002, g003 (trained after it) as uninterrupted two-process training,
  g001 as a resumed one: its logged losses, final evaluation and params."""
  work, _ = reference
  killed = tmp_path / "killed"
  faults = os.path.join(ROOT, "tests", "storage_faults.py")
  r = _launch_two(killed, IHSWEEP=f"{sys.executable} {faults} KILL 10 g001 1 --")
  assert r.returncode != 0
  status = {s["group"]: s for s in sweep_status.status_rows(str(killed))}
  assert status["g000"]["state"] == "done"
  assert status["g001"]["state"] in ("running", "stopped")
  assert status["g002"]["state"] == "pending"
  r = _launch_two(killed)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  pd.testing.assert_frame_equal(_plan_columns(work), _plan_columns(killed))
  assert _final_metrics(killed) == _final_metrics(work)
  for g in ("g000", "g001", "g002", "g003"):
    st = rundir.read_status(str(killed), g)
    assert st["state"] == "done"
    # g000 finished before the kill and was not touched again; g001 was started twice.
    assert st["attempts"] == (2 if g == "g001" else 1)
    rows = [json.loads(line) for line in open(killed / "groups" / g / "train_log.jsonl")]
    assert [r["step"] for r in rows] == [10, 20]  # each update logged once
    ref_rows = [
      json.loads(line) for line in open(os.path.join(work, "groups", g, "train_log.jsonl"))
    ]
    assert rows == ref_rows
    # Every metrics row bit-equal (no field of it holds a time: test_checkpoint's
    # METRICS_TIMING_FIELDS); a float's JSON repr is its shortest, so equal text is equal bits.
    metrics = [open(os.path.join(d, "groups", g, "metrics.jsonl")).read() for d in (killed, work)]
    assert metrics[0] == metrics[1], g
    got, want = (
      checkpoint.RunCheckpoints(os.path.join(d, "groups", g, "checkpoints"), {})
      for d in (str(killed), work)
    )
    for a, b in zip(
      jax.tree_util.tree_leaves(got.restore_params(20)),
      jax.tree_util.tree_leaves(want.restore_params(20)),
    ):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    got.close()
    want.close()


def test_diverging_cell_is_frozen_and_others_unaffected(tiny, tmp_path, monkeypatch):
  from ihsweep.configuration import config as config_lib

  monkeypatch.setattr(config_lib, "LR_MAX", math.inf)  # validation refuses 1e30: let it through
  grid = {"train.lr": (3e-3, 1e30)}
  extra = {"sweep.seeds": 1, "ensemble.size": 1, "mesh.num_devices": 1}
  result = sweep.run(_config(tiny, grid=grid, **extra), str(tmp_path / "both"), progress=False)
  assert result.groups["g000"]["diverged"].keys() == {"1"}
  cells = pd.read_csv(tmp_path / "both" / "cells.csv")
  assert list(cells["diverged"]) == [False, True]
  step = cells["diverged_step"][1]
  assert 0 <= step < 20
  final = _final_metrics(tmp_path / "both")
  assert final[1]["diverged"] and final[1]["diverged_step"] == step
  assert final[1]["ps_max"] is None and final[1]["val_loss"] is None
  log = [
    json.loads(line) for line in open(tmp_path / "both" / "groups" / "g000" / "train_log.jsonl")
  ]
  assert log[-1]["loss"][1] is None and np.isfinite(log[-1]["loss"][0])

  alone = sweep.run(
    _config(tiny, grid={"train.lr": (3e-3,)}, **extra), str(tmp_path / "alone"), progress=False
  )
  assert not alone.groups["g000"]["diverged"]
  healthy, control = final[0], _final_metrics(tmp_path / "alone")[0]
  for key in ("val_loss", "train_loss", "ps_max", "ar_acc", "icl_score"):
    assert healthy[key] == pytest.approx(control[key], rel=1e-5, abs=1e-6), key


def test_emergence_budget_stops_early_and_reports_savings(tiny, tmp_path, monkeypatch, caplog):
  # The stop rule sees a scripted metric: untrained models below the threshold at update 0,
  # past it from update 10 on; with margin 1 the group stops there (of a 40-update cap).
  observe = evaluation.EmergenceStop.observe
  monkeypatch.setattr(
    evaluation.EmergenceStop,
    "observe",
    lambda self, step, values, diverged: observe(
      self, step, [0.0 if step == 0 else 1.0] * len(values), diverged
    ),
  )
  cfg = _config(
    tiny,
    grid={},
    **{
      "sweep.budget": "emergence",
      "sweep.law_multiple": 1e-3,
      "sweep.stop_threshold": 0.5,
      "sweep.stop_margin": 1.0,
      "sweep.seeds": 2,
    },
  )
  plan = grid_lib.make_plan(cfg)
  cap = plan.groups[0].num_steps
  assert cap > 10
  with caplog.at_level("INFO", logger="ihsweep"):
    result = sweep.run(cfg, str(tmp_path), progress=False)
  status = result.groups["g000"]
  assert status["state"] == "done" and status["stopped_early"] and status["step"] == 10
  # The progress counts the tokens trained, not the cap's: the stop freed the rest.
  assert [m for m in caplog.messages if m.startswith("sweep progress: ")][-1] == (
    f"sweep progress: 1/1 groups done (1 stopped early), 0 running, 0 pending; "
    f"{10 * 2 * 8 * 32:,} tokens trained; nothing left"
  )
  assert result.summary["saved_fraction"] == pytest.approx(1 - 10 / cap)
  steps = [r["step"] for r in map(json.loads, open(tmp_path / "groups/g000/metrics.jsonl"))]
  assert max(steps) == 10
  assert "stopped early" in sweep_status.format_status(str(tmp_path))
  cells = pd.read_csv(tmp_path / "cells.csv")
  assert list(cells["online_crossing_step"]) == [10, 10]


def test_sigterm_checkpoints_and_rerun_finishes(tmp_path):
  work = tmp_path / "run"
  cmd = [
    sys.executable,
    "-m",
    "ihsweep.cli",
    "run",
    "--config=configs/default.py",
    f"--workdir={work}",
    "--noprogress",
    *_cli_flags(
      **{
        "train.num_steps": 400,
        "train.steps_per_call": 5,
        "eval.every_steps": 0,
        "checkpoint.state_every_steps": 1000,
      }
    ),
  ]
  proc = subprocess.Popen(
    cmd, cwd=ROOT, env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  log = work / "groups" / "g000" / "train_log.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-2000:]
  status = rundir.read_status(str(work), "g000")
  assert status["state"] == "interrupted" and 0 < status["step"] < 400
  cells = pd.read_csv(work / "cells.csv")
  assert set(cells["status"]) == {"interrupted"} and set(cells["steps_done"]) == {status["step"]}
  ckpts = os.listdir(work / "groups" / "g000" / "checkpoints" / "state")
  assert str(status["step"]) in ckpts  # the final checkpoint at the stop, not a scheduled one
  r = subprocess.run(cmd, cwd=ROOT, env=_env(4), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert rundir.read_status(str(work), "g000")["resumed_from"] == status["step"]


def test_the_sweep_eta_expects_early_stops_as_the_finished_groups_had():
  """With an 'emergence' budget, groups that stopped at half their predicted updates make the
  ETA count half of the remaining groups' updates (the demo's ETA was 1.2–1.7× too high while
  it counted them to their caps); without that budget, all of them."""
  from ihsweep.planning.timing import FlopsModel
  from ihsweep.workers.sweep_progress import SweepProgress

  progress = SweepProgress.__new__(SweepProgress)
  progress.model = FlopsModel(1.0)
  progress.jobs = {"g000": object()}
  progress.emergence, progress.stopped_at, progress.planned = True, 0, 0
  assert progress._stop_share() == 1.0
  progress.stopped_at, progress.planned = 1_500, 3_000
  progress.measured_s, progress.predicted_s, progress.trained_here = 20.0, 10.0, 1
  eta, basis = progress._eta(60.0, {"running": 0, "pending": 1})
  assert progress._stop_share() == 0.5 and eta == "~2.0 min", (eta, basis)
  assert "the groups left stopping at 50% of their predicted updates as those did" in basis
  progress.emergence = False
  assert progress._stop_share() == 1.0
  assert "stopping at" not in progress._eta(60.0, {"running": 0, "pending": 1})[1]
