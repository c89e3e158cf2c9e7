"""Run directories: ihsweep writes only into a new or empty directory or a run it made, never
mixes a sweep and a train run, and a repeated Ctrl-C still ends with a checkpoint."""

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ihsweep.configuration.fields import ConfigError, WorkdirError
from ihsweep.runs import checkpoint, ownership
from ihsweep.training import resume, runner, stopping
from ihsweep.workers import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_FLAGS = [
  "--config.model.n_layers=1",
  "--config.model.d_mlp=0",
  "--config.model.d_model=32",
  "--config.model.n_heads=2",
  "--config.model.vocab_size=64",
  "--config.model.max_context=32",
  "--config.model.dtype=float32",
  "--config.train.batch_size=8",
  "--config.train.context_size=32",
  "--config.ensemble.size=2",
  "--config.checkpoint.params_schedule=none",
]


def _snapshot(d) -> dict:
  """Every path under ``d`` (``d`` too) → (mtime in ns, SHA-256 of a file's bytes)."""
  out = {}
  for root, dirs, files in os.walk(d):
    for name in [""] + dirs + files:
      path = os.path.join(root, name)
      digest = hashlib.sha256(open(path, "rb").read()).hexdigest() if name in files else None
      out[os.path.relpath(path, d)] = (os.stat(path).st_mtime_ns, digest)
  return out


def _train_or_run(command: str, workdir) -> subprocess.CompletedProcess:
  """``ihsweep train|run`` of the tiny config into ``workdir``, as a user types it."""
  return subprocess.run(
    [sys.executable, "-m", "ihsweep.cli", command, "--config=configs/default.py",
     f"--workdir={workdir}", "--noprogress", *TINY_FLAGS],
    cwd=ROOT, capture_output=True, text=True, timeout=300,
  )  # fmt: skip


def _users_dir(tmp_path):
  d = tmp_path / "mine"
  (d / "notes").mkdir(parents=True)
  (d / "config.json").write_text('{"experiment": "my own"}')
  (d / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
  (d / "train_log.jsonl").write_text('{"step": 1, "mine": true}\n')
  return d


def test_a_users_directory_is_refused_untouched(tiny, tmp_path, no_compile):
  d = _users_dir(tmp_path)
  before = _snapshot(d)
  with pytest.raises(
    WorkdirError,
    match=rf"^--workdir={re.escape(str(d))} is not allowed: .* "
    r"holds files of its own \(config.json, metrics.jsonl, notes, \.\.\.\) and "
    r"no ihsweep run; nothing was changed: use a new --workdir",
  ):
    runner.fit(tiny(), str(d), progress=False)
  with pytest.raises(ConfigError, match="holds files of its own .* and no ihsweep run"):
    sweep.run(tiny(), str(d), progress=False)
  # A config.json with ihsweep's sections is not enough: a run also has its checkpoints.
  (d / "config.json").unlink()
  resume.write_resolved_config(tiny(), str(d))
  before = _snapshot(d)
  with pytest.raises(ConfigError, match="no ihsweep run"):
    runner.fit(tiny(), str(d), progress=False)
  assert _snapshot(d) == before


def test_the_commands_refuse_a_users_directory_in_one_line(tmp_path):
  d = _users_dir(tmp_path)
  before = _snapshot(d)
  for command in ("train", "run"):
    r = _train_or_run(command, d)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if " INFO " not in line]
    assert len(lines) == 1, r.stderr  # --workdir is a flag, not a config field:
    assert lines[0].startswith(f"ihsweep: --workdir={d} is not allowed: "), r.stderr
    assert "no ihsweep run" in lines[0] and "nothing was changed" in lines[0]
  assert _snapshot(d) == before


def test_a_symbolic_link_to_nothing_is_named(tmp_path):
  link = tmp_path / "link"
  link.symlink_to(tmp_path / "nowhere" / "x")
  for command in ("train", "run"):
    r = _train_or_run(command, link)
    lines = [line for line in r.stderr.splitlines() if " INFO " not in line]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == (
      f"ihsweep: --workdir={link} is a symbolic link to {tmp_path}/nowhere/x, "
      f"which does not exist: create that directory, or give another --workdir"
    )
  assert not (tmp_path / "nowhere").exists()


def test_sweep_and_train_directories_are_not_mixed_up(tiny, tmp_path, no_compile):
  train_dir, sweep_dir = str(tmp_path / "t"), str(tmp_path / "s")
  ownership.claim_workdir(train_dir, "train")
  ownership.check_workdir(sweep_dir, "sweep")
  # Runs made before the marker existed: ihsweep's config.json beside checkpoints/ or cells.csv.
  old_train, old_sweep = tmp_path / "old_t", tmp_path / "old_s"
  for d in (old_train, old_sweep):
    resume.write_resolved_config(tiny(), str(d))
  (old_train / "checkpoints").mkdir()
  (old_sweep / "cells.csv").write_text("cell,group\n0,g000\n")
  assert [ownership.run_kind(str(d)) for d in (train_dir, sweep_dir, old_train, old_sweep)] == [
    "train",
    "sweep",
    "train",
    "sweep",
  ]
  for d in (train_dir, old_train):
    with pytest.raises(
      ConfigError,
      match=r"an earlier sweep to resume; it holds an `ihsweep "
      r"train` run \(use `ihsweep train` with it\)",
    ):
      sweep.run(tiny(), str(d), progress=False)
  for d in (sweep_dir, old_sweep):
    with pytest.raises(
      ConfigError,
      match=r"an earlier train run to resume; it holds a sweep of "
      r"`ihsweep run` \(use `ihsweep run` with it\)",
    ):
      runner.fit(tiny(), str(d), progress=False)
  # A sweep's group directory, before its first update, holds the sweep's status.json only.
  group = tmp_path / "s" / "groups" / "g000"
  group.mkdir(parents=True)
  (group / "status.json").write_text('{"state": "running"}')
  assert ownership.run_kind(str(group)) == "train"
  assert ownership.run_kind(str(tmp_path / "new")) == "empty"
  (tmp_path / "locked").mkdir()
  (tmp_path / "locked" / ".ihsweep.lock").write_text("pid 1")  # a run that stopped early
  assert ownership.run_kind(str(tmp_path / "locked")) == "empty"
  (tmp_path / "locked" / "logs").mkdir()  # the multi-process launcher's, written first
  (tmp_path / "locked" / "logs" / "process_0.log").write_text("launch\n")
  assert ownership.run_kind(str(tmp_path / "locked")) == "empty"
  (tmp_path / "locked" / "logs" / "mine.txt").write_text("")
  assert ownership.run_kind(str(tmp_path / "locked")) is None


def test_a_run_made_before_the_marker_resumes(tiny, tmp_path):
  cfg = tiny(**{"train.num_steps": 10})
  d = tmp_path / "run"
  runner.fit(cfg, str(d), progress=False)
  os.remove(d / ownership.RUN_MARKER)  # as the previous version left it
  out = runner.fit(cfg, str(d), progress=False)
  assert out.resumed_from == 10 and out.losses is None
  assert ownership.run_kind(str(d)) == "train"


# `ihsweep` with a final save that takes 3 s once a stop is requested, announced on stderr, so
# that the test's second Ctrl-C surely lands in the middle of it.
SLOW_FINAL_SAVE = """
import sys, time
from ihsweep.runs import checkpoint
from ihsweep import cli
from ihsweep.training import stopping
save = checkpoint.RunCheckpoints.save_state
def slow(self, *args, **kwargs):
  if stopping.stop_requested():
    print("test: the final save starts", file=sys.stderr, flush=True)
    time.sleep(3)
  return save(self, *args, **kwargs)
checkpoint.RunCheckpoints.save_state = slow
sys.exit(cli.main(["ihsweep"] + sys.argv[1:]))
"""


def test_a_second_ctrl_c_waits_for_the_checkpoint(tmp_path):
  work = tmp_path / "run"
  cmd = [
    sys.executable,
    "-c",
    SLOW_FINAL_SAVE,
    "train",
    "--config=configs/default.py",
    f"--workdir={work}",
    "--noprogress",
    *TINY_FLAGS,
    "--config.train.num_steps=2000",
    "--config.train.steps_per_call=5",
    "--config.eval.every_steps=0",
    "--config.checkpoint.state_every_steps=10000",
  ]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  log = work / "train_log.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  seen = []
  while not any("the final save starts" in line for line in seen):
    seen.append(proc.stderr.readline())
    assert seen[-1], "".join(seen)  # ended before its final save
  proc.send_signal(signal.SIGINT)
  _, rest = proc.communicate(timeout=120)
  err = "".join(seen) + rest
  assert proc.returncode == 143, err
  assert "already stopping: saving a checkpoint" in err
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
  step = int(re.search(r"stopped at update (\d+) on request", err).group(1))
  assert 0 < step < 2000
  assert checkpoint.RunCheckpoints(str(work / "checkpoints")).latest_state_step() == step


def test_a_third_stop_request_exits_at_once_saying_what_is_lost(monkeypatch, capsys):
  exits = []
  monkeypatch.setattr(stopping.os, "_exit", exits.append)
  monkeypatch.setattr(stopping, "_STOP_REQUESTED", stopping.threading.Event())
  monkeypatch.setattr(stopping, "_STOP_SIGNALS", [0])
  stopping.request_stop(signal.SIGINT)
  stopping.request_stop(signal.SIGTERM)  # no KeyboardInterrupt: the save goes on
  assert stopping.stop_requested() and exits == []
  stopping.request_stop(signal.SIGINT)
  assert exits == [130]
  assert capsys.readouterr().err.strip() == (
    "ihsweep: forced exit on a third stop request (SIGINT): the updates since the last "
    "complete full-state checkpoint are lost; rerun the same command to resume from it"
  )


def test_a_workdir_inside_another_run_is_refused(tmp_path):
  """A run under a stopped run's checkpoints/ (which that run deletes when it resumes and cleans
  up old full-state checkpoints) or anywhere else inside a run directory is refused in one line
  naming both; a sweep's own group directories are not inside it."""
  run, swp = tmp_path / "run", tmp_path / "sweep"
  ownership.claim_workdir(str(run), "train")
  ownership.claim_workdir(str(swp), "sweep")
  (run / "checkpoints" / "state" / "5").mkdir(parents=True)
  (tmp_path / "link").symlink_to(run / "checkpoints")
  inside = [
    (run / "checkpoints" / "state" / "5", run),
    (run / "checkpoints" / "params" / "999", run),
    (tmp_path / "link" / "new", run),
    (swp / "elsewhere", swp),
    (swp / "groups" / "g000" / "checkpoints" / "x", swp),
    (swp / "groups" / "mine", swp),
  ]
  for workdir, outer in inside:
    for kind in (None, "train", "sweep"):
      with pytest.raises(WorkdirError, match=f"is inside {re.escape(str(outer))}, the run"):
        ownership.claim_workdir(str(workdir), kind)
  assert not (run / "checkpoints" / "params").exists() and not (swp / "elsewhere").exists()
  # A link to the sweep's groups/ names one of its groups all the same.
  (tmp_path / "groups_link").symlink_to(swp / "groups")
  for kind in (None, "sweep"):
    with pytest.raises(WorkdirError, match=f"is group g005 of the sweep in {re.escape(str(swp))}"):
      ownership.claim_workdir(str(tmp_path / "groups_link" / "g005"), kind)
  assert not (swp / "groups" / "g005").exists()
  # The sweep trains its own groups; next to a run (not inside it) is fine.
  ownership.claim_workdir(str(swp / "groups" / "g000"), "train")
  ownership.claim_workdir(str(tmp_path / "run2"), "train")
  assert ownership.enclosing_run(str(swp / "groups" / "g000" / "sub")) == (
    str(swp / "groups" / "g000"),
    "train",
  )
  before = _snapshot(run)
  for command in ("train", "run"):
    workdir = run / "checkpoints" / "state" / "5"
    r = _train_or_run(command, workdir)
    lines = [line for line in r.stderr.splitlines() if " INFO " not in line]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"ihsweep: --workdir={workdir} is inside {run}, the run directory")
    assert "nothing was changed" in lines[0]
  assert _snapshot(run) == before
