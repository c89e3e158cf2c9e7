"""Checkpoints: schedules, resume after SIGKILL or a full disk equals an uninterrupted run, config
guard, readers that never disturb a live run."""

import dataclasses
import errno
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ihsweep.base import errors
from ihsweep.base.errors import StorageFault
from ihsweep.compute import schedule
from ihsweep.configuration import fields
from ihsweep.runs import checkpoint
from ihsweep.training import hooks, resume
from ihsweep.training.resume import write_resolved_config
from ihsweep.training.runner import fit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One attention-only layer: compiling the evaluation dominates this file's runs.
RUN = {
  "model.n_layers": 1,
  "model.d_mlp": 0,
  "train.num_steps": 60,
  "train.steps_per_call": 10,
  "train.lr": 1e-2,
  "eval.every_steps": 10,
  "eval.n_probes": 10,
  "eval.n_sequences": 8,
  "checkpoint.state_every_steps": 20,
  "checkpoint.params_schedule": "none",
}


def test_params_schedules():
  steps = schedule.params_steps(1000, 512, points_per_octave=1)
  assert steps == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
  dense = schedule.params_steps(
    1000, 512, points_per_octave=1, law_updates=100.0, law_window=2.0, law_points_per_octave=4
  )
  assert {50, 59, 71, 84, 100, 119, 141, 168, 200} <= set(dense)
  study = schedule.params_steps(10**6, 1000, schedule="study")
  assert study[:5] == [0, 250, 500, 1000, 2000] and study[-2:] == [900_000, 10**6]
  assert [s for s in range(101) if schedule.is_state_step(s, 100, 30)] == [30, 60, 90, 100]
  assert [s for s in range(11) if schedule.is_state_step(s, 10, 0)] == [10]
  assert schedule.params_steps(50, 8, schedule="none") == [0, 50]


def test_checkpoint_bytes_count_saves_by_updates_and_by_time(tiny):
  """schedule.checkpoint_bytes: E = 2 models of 1,000 float32 params, 100 updates, a state every
  30 updates and every minute of a 150 s group: 1 + 99 // 30 + 150 // 60 = 6 states of 3 · 8 kB
  (params and AdamW's two moments), params at 0 and 100 of 8 kB; the newest 2 states kept."""
  cfg = tiny(**{"train.num_steps": 100, "checkpoint.state_every_steps": 30,
                "checkpoint.state_every_minutes": 1.0,
                "checkpoint.params_schedule": "none"})  # fmt: skip
  got = schedule.checkpoint_bytes(cfg, 1000, 100, 150.0)
  assert got == {"state_saves": 6, "params_saves": 2, "state_bytes": 24_000,
                 "params_bytes": 8_000, "written_bytes": 160_000, "kept_bytes": 64_000}  # fmt: skip
  assert schedule.checkpoint_bytes(cfg, 1000, 100, None)["state_saves"] == 4  # time unknown
  # a second per save over a day: at most one per host call (10 calls of 10 updates)
  assert schedule.checkpoint_bytes(cfg, 1000, 100, 86_400.0)["state_saves"] == 4 + 10
  assert schedule.checkpoint_totals([got, got])["written_bytes"] == 320_000


def test_run_schedule_ends_a_call_at_every_evaluation_and_checkpoint(tiny):
  """RunSchedule: evaluation every 8 updates (every_tokens 2048 / (B·C = 256)), full state every
  12, params at 0, 5, 30; calls of at most 10 updates ending at each of them."""
  cfg = tiny(
    **{
      "train.num_steps": 30,
      "train.steps_per_call": 10,
      "eval.every_tokens": 2048,
      "checkpoint.state_every_steps": 12,
      "checkpoint.params_schedule": "none",
    }
  )
  run = schedule.RunSchedule.from_config(cfg)
  assert run.eval_every == 8 and run.params == {0, 30}
  run = dataclasses.replace(run, params=frozenset({0, 5, 30}))
  assert [s for s in range(31) if run.eval_due(s)] == [0, 8, 16, 24, 30]
  assert [s for s in range(31) if run.state_due(s)] == [12, 24, 30]
  assert run.calls() == [5, 3, 4, 4, 8, 6]  # ending at 5, 8, 12, 16, 24, 30
  assert list(itertools.accumulate(run.calls(done=12), initial=12))[1:] == [16, 24, 30]
  assert run.last_eval(17) == 16 and run.last_eval(16) == 8 and run.last_eval(1) == 0


def test_the_longest_run_lists_no_steps():
  """At the int32 bound of train.num_steps with a full-state checkpoint every update, whether
  an update is saved is arithmetic (a list of its steps would take tens of GB)."""
  import tracemalloc

  last = fields.INT32_MAX
  tracemalloc.start()
  try:
    assert schedule.is_state_step(last - 1, last, 1) and schedule.is_state_step(last, last, 7)
    assert not schedule.is_state_step(last - 1, last, 5)
    assert tracemalloc.get_traced_memory()[1] < 2**20
  finally:
    tracemalloc.stop()


def _overrides(d):
  return [f"--config.{k}={v}" for k, v in d.items()]


def _values(rows):
  return [{k: v for k, v in r.items()} for r in rows]


TINY_FLAGS = {
  "model.n_layers": 2,
  "model.n_heads": 2,
  "model.d_model": 32,
  "model.d_mlp": 64,
  "model.vocab_size": 64,
  "model.max_context": 32,
  "model.dtype": "float32",
  "train.batch_size": 8,
  "train.context_size": 32,
  "ensemble.size": 2,
  **RUN,
}
CMD = [
  sys.executable,
  "-m",
  "ihsweep.cli",
  "train",
  "--config=configs/default.py",
  "--noprogress",
  *_overrides(TINY_FLAGS),
]  # the tiny(**RUN) run as a command


# metrics.jsonl fields that hold wall-clock time, left out of the bit-for-bit comparison: none
# (every row is a function of the step, the cell and the numbers; speeds and times go to
# status.json). A timing field added to the rows belongs here, and these tests then say so.
METRICS_TIMING_FIELDS = frozenset()


def _assert_same_run(ref, run):
  """Two run directories of the same config hold the same metrics rows, bit for bit (every
  field but ``METRICS_TIMING_FIELDS``; JSON writes a float's shortest repr, so equal values are
  equal bits), and the same final params."""
  rows = {}
  for name, d in (("ref", ref), ("run", run)):
    lines = (d / "metrics.jsonl").read_text().splitlines()
    rows[name] = [
      {k: v for k, v in json.loads(x).items() if k not in METRICS_TIMING_FIELDS} for x in lines
    ]
  assert [(r["step"], r["cell"]) for r in rows["run"]] == [
    (r["step"], r["cell"]) for r in rows["ref"]
  ]
  for a, b in zip(rows["ref"], rows["run"]):
    assert a.keys() == b.keys()
    for k in a:
      assert b[k] == a[k], f"{k} at update {a['step']}, cell {a['cell']}: {b[k]!r} != {a[k]!r}"
  params = [
    checkpoint.RunCheckpoints(str(d / "checkpoints")).restore_params(60) for d in (ref, run)
  ]
  for x, y in zip(jax.tree_util.tree_leaves(params[0]), jax.tree_util.tree_leaves(params[1])):
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_sigkill_then_resume_equals_uninterrupted_run(tiny, tmp_path):
  """SIGKILL right after the full-state save at update 40, between the evaluations at 25 and 50
  (calls end at 30 and 40 in between): the rerun resumes at 40 and writes every metrics row
  bit-equal to an uninterrupted run's — the training loss of the row at 50 included, whose sum
  over updates 26-50 it takes up from train_log.jsonl's rows at 30 and 40 — and the same
  params."""
  every = {"eval.every_steps": 25}
  fit(tiny(**{**RUN, **every}), str(tmp_path / "ref"), progress=False)
  cmd = CMD + _overrides(every) + [f"--workdir={tmp_path / 'run'}"]
  env = dict(os.environ)  # the same 4 fake CPU devices as this process
  # Synchronous saves: the kill lands right after state/40 is complete, so the resume starts
  # there and every row up to 40 must already be on disk (checkpoint.* may change on resume).
  faults = [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), "KILL", "40", "--"]
  killed = subprocess.run(
    faults + cmd[3:] + ["--config.checkpoint.async_save=False"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
  )
  assert killed.returncode == -9, killed.stderr
  resumed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming from the full-state checkpoint at update 40" in resumed.stderr

  _assert_same_run(tmp_path / "ref", tmp_path / "run")
  ckpts = checkpoint.RunCheckpoints(str(tmp_path / "run" / "checkpoints"))
  meta = ckpts.step_metadata(60)
  assert [c["seed"] for c in meta["cells"]] == [0, 1] and meta["tokens_per_update"] == 8 * 32
  assert meta["n_params"] > 0 and meta["step"] == 60 and meta["tokens"] == 60 * 256
  assert not any("tmp" in name for name in os.listdir(tmp_path / "run" / "checkpoints" / "state"))
  before = (tmp_path / "run" / "metrics.jsonl").read_text()
  again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert again.returncode == 0 and "nothing left to train" in again.stdout, again.stderr
  assert (tmp_path / "run" / "metrics.jsonl").read_text() == before  # finished rows kept


def test_state_checkpoints_follow_the_clock_and_resume_exactly(tiny, tmp_path, monkeypatch):
  """checkpoint.state_every_minutes: with a clock that advances a minute at every reading (at the
  loop's start, after each host call of 5 updates, at each save), 2.5 minutes give a save after
  every third call — 15, 30, 45 and the end (60), steps no update count of the config gives; a
  run cut back to the save at 15 (what a kill leaves) resumes to the uninterrupted run's rows
  and params. The uninterrupted run calls the same 5-update program (another call length is
  another program, whose float32 results may differ in the last bit under another emitter)."""
  five = {**RUN, "train.steps_per_call": 5}
  fit(tiny(**five), str(tmp_path / "ref"), progress=False)  # saves by count: 20, 40, 60
  minutes = itertools.count()
  monkeypatch.setattr(hooks, "_clock", lambda: 60.0 * next(minutes))
  by_time = {
    **five,
    "checkpoint.state_every_steps": 0,
    "checkpoint.state_every_minutes": 2.5,
    "checkpoint.keep_state": 10,
  }
  run = tmp_path / "run"
  fit(tiny(**by_time), str(run), progress=False)
  state = run / "checkpoints" / "state"
  assert sorted(int(d) for d in os.listdir(state) if d.isdigit()) == [15, 30, 45, 60]
  for step in (30, 45, 60):  # the kill: only the save at 15 was complete
    shutil.rmtree(run / "checkpoints" / "state" / str(step))
  shutil.rmtree(run / "checkpoints" / "params" / "60")
  monkeypatch.setattr(hooks, "_clock", lambda: 0.0)  # no save by time on the way
  resumed = fit(tiny(**by_time), str(run), progress=False)
  assert resumed.resumed_from == 15, resumed
  _assert_same_run(tmp_path / "ref", run)


# What the command says for each storage fault (tests/storage_faults.py makes them).
STORAGE_FAULTS = {
  "ENOSPC": "no space left on device writing {}; free space",
  "EFBIG": "file too large writing {}; raise the file-size limit (ulimit -f)",
  "EROFS": "read-only file system writing {}; make the file system writable",
}


@pytest.mark.parametrize("kind", STORAGE_FAULTS)
def test_a_storage_fault_is_one_line_and_a_rerun_resumes_to_the_same_numbers(tiny, tmp_path, kind):
  """The full-state save at update 40 meets a full disk (orbax's error), a file-size limit (a
  real one: RLIMIT_FSIZE) or a read-only file system (an OSError): exit 75 and one line; the
  rerun resumes from update 20 to the uninterrupted run's numbers."""
  cmd = CMD[3:] + [f"--workdir={tmp_path / 'run'}"]
  full = subprocess.run(
    [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), kind, "40", "--", *cmd],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert full.returncode == StorageFault.EXIT_CODE == 75, full.stderr
  assert "Traceback" not in full.stderr and "Event loop" not in full.stderr, full.stderr
  assert full.stderr.strip().splitlines()[-1] == (
    f"ihsweep: {STORAGE_FAULTS[kind].format(tmp_path / 'run')} and rerun the same command to resume"
  )
  resumed = subprocess.run(CMD[:3] + cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming from the full-state checkpoint at update 20" in resumed.stderr, (
    full.stderr[-3000:],
    resumed.stderr[:3000],
  )
  fit(tiny(**RUN), str(tmp_path / "ref"), progress=False)
  _assert_same_run(tmp_path / "ref", tmp_path / "run")


def test_a_save_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
  ckpts = checkpoint.RunCheckpoints(str(tmp_path), {}, async_save=False, read_only=False)
  state = {"w": jnp.ones((1000,), jnp.float32)}  # 4,000 bytes
  monkeypatch.setattr(
    checkpoint.shutil, "disk_usage", lambda d: shutil._ntuple_diskusage(10**9, 10**9 - 3999, 3999)
  )
  with pytest.raises(
    StorageFault,
    match=r"no space left on device writing .*free space "
    r"and rerun the same command to resume",
  ):
    ckpts.save_state(10, state)
  assert os.listdir(tmp_path / "state") == []  # orbax never started: no temporary directory
  monkeypatch.undo()
  assert ckpts.save_state(10, state)
  for code, error in (
    (errno.ENOSPC, OSError(errno.ENOSPC, "No space left on device")),
    (errno.EDQUOT, OSError(errno.EDQUOT, "quota")),
    (errno.EFBIG, OSError(errno.EFBIG, "File too large")),
    (errno.EIO, OSError(errno.EIO, "Input/output error")),
    (
      errno.ENOSPC,
      ValueError(
        "RESOURCE_EXHAUSTED: Error writing local file ... No space left on "
        "device [os_error_code='28']"
      ),
    ),
    (  # orbax's error under a file-size limit (RLIMIT_FSIZE), as it reads
      errno.EFBIG,
      ValueError(
        'OUT_OF_RANGE: Error writing "w/0" in OCDBT database at local file ... Failed to write '
        "304366 bytes to file 7: File too large [os_error_code='27']"
      ),
    ),
    (errno.EROFS, RuntimeError(f"a wrapper's own text: {os.strerror(errno.EROFS)}")),
  ):
    for chain in ("cause", "context"):
      try:
        try:
          raise error
        except Exception as inner:
          if chain == "cause":
            raise RuntimeError("wrapped") from inner
          raise RuntimeError("raised while handling it")  # noqa: B904 — its context
      except RuntimeError as e:
        assert errors.storage_errno(e) == (error, code), (error, chain)
        assert StorageFault.of(e, "d").errno == code
  assert errors.storage_errno(OSError(errno.EACCES, "denied")) is None
  assert errors.storage_errno(ValueError("RESOURCE_EXHAUSTED: out of memory")) is None


def test_a_reader_never_disturbs_a_live_run(tmp_path):
  state = {"w": jnp.arange(6.0)}
  writer = checkpoint.RunCheckpoints(str(tmp_path), {}, async_save=False, read_only=False)
  writer.save_state(10, state)
  writer.close()
  # The trainer's save of update 20 in progress: orbax writes it under a temporary name.
  in_progress = tmp_path / "state" / "20.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp"
  os.makedirs(in_progress)
  (in_progress / "_sharding").write_text("{}")
  reader = checkpoint.RunCheckpoints(str(tmp_path))  # as analysis and the README open them
  step, restored = reader.restore_latest_state(state)
  assert step == 10 and reader.params_steps_saved() == []
  np.testing.assert_array_equal(restored["w"], state["w"])
  reader.close()
  time.sleep(1)  # orbax removes leftovers in the background
  assert (in_progress / "_sharding").exists()
  assert sorted(os.listdir(tmp_path / "state")) == ["10", "20.orbax-checkpoint-tmp"]
  with pytest.raises(ValueError, match="opened read-only .* read_only=False to save"):
    reader.save_state(30, state)
  # The trainer itself (read_only=False, holding the run's lock) clears a dead writer's
  # leftovers before its first save: what a reader opened writable used to do to a live run.
  writer = checkpoint.RunCheckpoints(str(tmp_path), {}, async_save=False, read_only=False)
  writer.save_state(30, state)
  writer.close()
  assert sorted(os.listdir(tmp_path / "state")) == ["10", "30"]


def test_a_step_that_was_not_saved_is_named_with_the_saved_ones(tmp_path):
  params = {"w": jnp.arange(4.0)}
  writer = checkpoint.RunCheckpoints(str(tmp_path), {"n": 1}, async_save=False, read_only=False)
  for step in (0, 724, 1024):
    writer.save_params(step, params)
  writer.close()
  reader = checkpoint.RunCheckpoints(str(tmp_path))
  np.testing.assert_array_equal(reader.restore_params(724)["w"], params["w"])
  with pytest.raises(
    checkpoint.CheckpointError, match=r"no params checkpoint at update 800 .*saved: 0, 724, 1024$"
  ):
    reader.restore_params(800)
  with pytest.raises(checkpoint.CheckpointError, match="no params checkpoint at update 800"):
    reader.step_metadata(800)
  assert reader.step_metadata(1024)["n"] == 1
  reader.close()


def test_resume_refuses_a_different_config(tiny, tmp_path, no_compile):
  cfg = tiny(**RUN)
  write_resolved_config(cfg, str(tmp_path))
  os.makedirs(tmp_path / "checkpoints" / "params" / "8")  # params only: still checked
  with pytest.raises(fields.ConfigError, match="train.lr"):
    fit(tiny(**{**RUN, "train.lr": 3e-3}), str(tmp_path), progress=False)
  os.makedirs(tmp_path / "checkpoints" / "state" / "20")
  with pytest.raises(fields.ConfigError, match="train.lr.*as in the run being resumed"):
    fit(tiny(**{**RUN, "train.lr": 3e-3}), str(tmp_path), progress=False)
  with pytest.raises(fields.ConfigError, match="train.num_steps"):
    fit(tiny(**{**RUN, "train.num_steps": 80}), str(tmp_path), progress=False)
  # Fields that only choose what is saved or how work is split may change.
  resume.check_resumable(
    tiny(**{**RUN, "checkpoint.state_every_steps": 5, "train.steps_per_call": 7}), str(tmp_path)
  )
  # A run made before a data or eval field existed lacks it in config.json: it resumes at the
  # field's default (what runs did then), not at another value.
  with open(tmp_path / "config.json") as f:
    stored = json.load(f)
  del stored["data"]["induction_start"], stored["eval"]["probe_position"]
  with open(tmp_path / "config.json", "w") as f:
    json.dump(stored, f)
  resume.check_resumable(cfg, str(tmp_path))
  moved = tiny(**{**RUN, "eval.probe_position": "end"})
  absent = "eval.probe_position.*absent .* its default 'start'"
  with pytest.raises(fields.ConfigError, match=absent):
    resume.check_resumable(moved, str(tmp_path))
  os.remove(tmp_path / "config.json")
  with pytest.raises(fields.ConfigError, match="config.json can be read"):
    fit(cfg, str(tmp_path), progress=False)


def test_a_rerun_with_another_grid_is_refused_naming_the_axes(tiny, tmp_path):
  """Issue 58: a rerun adding --grid=model.n_heads=1,2 to a sweep over train.batch_size was
  refused as "absent from the run being resumed (made before the field existed)", and one
  dropping an axis blamed "config.sweep.grid.train.batch_size = '(absent)'". The refusal stays
  and says what differs: each axis added, dropped or changed, with its values."""
  from ihsweep.configuration import axes as axes_lib

  def swept(*axes):
    cfg = tiny()
    axes_lib.add_axes(cfg, list(axes))
    return cfg

  work = str(tmp_path)
  write_resolved_config(swept("train.batch_size=4,8"), work)
  resume.check_resumable(swept("train.batch_size=4,8"), work)  # the same grid resumes
  lead = f"--workdir={work} holds a sweep over another grid: this run "
  tail = (
    " (the run directory's axes: train.batch_size = (4, 8)); its checkpoints are of that "
    "grid's cells: rerun with its axes to resume it, or use a new --workdir for this grid"
  )
  for axes, change in (
    (("train.batch_size=4,8", "model.n_heads=1,2"), "adds the axis model.n_heads = (1, 2)"),
    ((), "drops the axis train.batch_size = (4, 8)"),
    (("train.batch_size=4,8,16",), "changes the axis train.batch_size from (4, 8) to (4, 8, 16)"),
  ):
    with pytest.raises(fields.WorkdirError) as e:
      resume.check_resumable(swept(*axes), work)
    assert str(e.value) == lead + change + tail
    assert "existed" not in str(e.value)


def test_a_damaged_newest_state_falls_back_to_an_older_one(tmp_path, caplog):
  """The fallback is one warning that names whose checkpoint it was (issue 58: with 4 workers
  side by side it named no group): by default its directory, in a run its group and worker."""
  state = {"w": jnp.arange(6.0), "step": jnp.zeros((), jnp.int32)}
  ckpts = checkpoint.RunCheckpoints(str(tmp_path), {"cells": []}, async_save=False, read_only=False)
  ckpts.save_state(10, state)
  ckpts.save_state(20, {"w": state["w"] + 1, "step": state["step"] + 20})
  ckpts.close()
  for root, _, files in os.walk(tmp_path / "state" / "20" / "state"):
    for f in files:
      os.remove(os.path.join(root, f))  # a step directory emptied by hand
  with caplog.at_level(logging.WARNING, logger="ihsweep"):
    step, restored = checkpoint.RunCheckpoints(str(tmp_path), {}).restore_latest_state(state)
  assert step == 10
  np.testing.assert_array_equal(restored["w"], state["w"])
  (line,) = [r.getMessage() for r in caplog.records if r.name == "ihsweep"]
  assert line.startswith(f"{tmp_path}: full-state checkpoint 20 cannot be restored (20: ")
  assert line.endswith("; trying an older one")
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="ihsweep"):
    reader = checkpoint.RunCheckpoints(str(tmp_path), {})
    assert reader.restore_latest_state(state, "g003 (worker h:1/w2): ")[0] == 10
  (line,) = [r.getMessage() for r in caplog.records if r.name == "ihsweep"]
  assert line.startswith("g003 (worker h:1/w2): full-state checkpoint 20 cannot be restored")
