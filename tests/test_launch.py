"""launch/local_multiprocess.sh when a process fails: the exit status is the failed process's,
one line names it, a process that stops answering ends the others within the heartbeat bound
(not JAX's C++ abort), and the group's status.json is not left "running"; a bad
IHSWEEP_HEARTBEAT_S is one line."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ihsweep import rundir, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTBEAT_S, GRACE_S = 5, 5
# One group of E = 2 (one model per process), small enough to compile in seconds, with far more
# updates than a test waits for: the launch is still training when the signal arrives.
FLAGS = ["--config.model.n_layers=1", "--config.model.d_mlp=0", "--config.model.d_model=16",
         "--config.model.n_heads=1", "--config.model.vocab_size=32", "--config.model.max_context=16",
         "--config.model.dtype=float32", "--config.train.batch_size=8",
         "--config.train.context_size=16", "--config.train.num_steps=1000000",
         "--config.train.steps_per_call=10", "--config.eval.every_steps=0",
         "--config.checkpoint.params_schedule=none", "--config.checkpoint.state_every_steps=0",
         "--config.ensemble.size=2", "--config.sweep.seeds=2"]
# What JAX's runtime prints when it aborts a process (an absl FATAL line "F1201 hh:mm:ss...",
# a stack trace; bash's "Aborted"), and Python's tracebacks.
CRASH = re.compile(r"^F\d{4} |Aborted|Check fail|stack trace|terminate called|Traceback", re.M)


def _launch_and_signal(workdir, process: int, sig: int):
  """Starts two processes, sends ``sig`` to ``process`` once both train, and returns
  ``(exit status, launcher output, seconds from the signal to the launcher's exit)``."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "IHSWEEP": f"{sys.executable} -m ihsweep.cli",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1 "
                      "--xla_backend_optimization_level=0",
         "IHSWEEP_HEARTBEAT_S": str(HEARTBEAT_S), "IHSWEEP_GRACE_S": str(GRACE_S)}
  cmd = ["bash", os.path.join(ROOT, "launch", "local_multiprocess.sh"), "2",
         "--config=configs/default.py", f"--workdir={workdir}", "--noprogress", *FLAGS]
  launcher = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    log = os.path.join(workdir, "groups", "g000", "train_log.jsonl")
    deadline = time.time() + 240
    while not (os.path.exists(log) and os.path.getsize(log)):
      assert launcher.poll() is None and time.time() < deadline, launcher.communicate()[0]
      time.sleep(0.2)
    os.kill(_worker(launcher.pid, process), sig)
    start = time.time()
    out, _ = launcher.communicate(timeout=120)
    return launcher.returncode, out, time.time() - start
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
      launcher.wait()


def _worker(launcher_pid: int, process: int) -> int:
  """The pid of the launcher's child with IHSWEEP_PROCESS_ID=process."""
  with open(f"/proc/{launcher_pid}/task/{launcher_pid}/children") as f:
    children = f.read().split()
  for pid in children:
    with open(f"/proc/{pid}/environ", "rb") as f:
      if f"IHSWEEP_PROCESS_ID={process}".encode() in f.read().split(b"\0"):
        return int(pid)
  raise AssertionError(f"no process {process} among the launcher's children {children}")


def _logs(workdir) -> str:
  logs = os.path.join(workdir, "logs")
  return "".join(open(os.path.join(logs, name)).read() for name in sorted(os.listdir(logs)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_a_worker_is_the_launchers_exit_status(tmp_path):
  work = tmp_path / "run"
  rc, out, _ = _launch_and_signal(work, 1, signal.SIGKILL)
  # 128 + 9, not the status 1 of process 0, which fails on its next collective with the dead one
  assert rc == 137, out[-3000:]
  lines = [line for line in out.splitlines() if line.startswith("local_multiprocess.sh:")]
  assert len(lines) == 1 and "process 1 of 2 ended with status 137" in lines[0], out[-3000:]
  assert "SIGKILL" in lines[0]
  assert rundir.read_status(str(work), "g000")["state"] != "running"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("stopped", [1, 0])  # 0 also hosts JAX's coordination service
def test_stopped_process_ends_the_others_with_one_line(tmp_path, stopped):
  work = tmp_path / "run"
  rc, out, seconds = _launch_and_signal(work, stopped, signal.SIGSTOP)
  other = 1 - stopped
  assert rc != 0, out[-3000:]
  # Heartbeat bound: the other notices within IHSWEEP_HEARTBEAT_S plus a few polls (JAX's own
  # abort, given 2 × IHSWEEP_HEARTBEAT_S, never comes), and the stopped one is killed at once
  # instead of after IHSWEEP_GRACE_S.
  assert seconds < HEARTBEAT_S + GRACE_S, (seconds, out[-3000:])
  lines = [line for line in out.splitlines() if line.startswith("local_multiprocess.sh:")]
  assert len(lines) == 1, out[-3000:]
  assert f"process {other} of 2 exited with status 1" in lines[0]
  assert f"not answering: process {stopped}, killed" in lines[0]
  logs = _logs(work)
  ends = f"ihsweep: process {other} ends: process {stopped} of 2 stopped answering"
  assert logs.count(ends) == 1, logs[-3000:]
  assert not CRASH.search(out + logs), CRASH.findall(out + logs)
  status = rundir.read_status(str(work), "g000")
  assert status["state"] == "failed" and "stopped answering" in status["error"], status
  assert "failed" in next(l for l in sweep.format_status(str(work)).splitlines() if "g000" in l)


@pytest.mark.parametrize("value", ["abc", "0", "inf"])
def test_bad_heartbeat_is_one_line(tmp_path, value):
  env = {**os.environ, "IHSWEEP_COORDINATOR": "localhost:1", "IHSWEEP_NUM_PROCESSES": "2",
         "IHSWEEP_PROCESS_ID": "0", "IHSWEEP_HEARTBEAT_S": value}
  r = subprocess.run([sys.executable, "-m", "ihsweep.cli", "run", "--config=configs/default.py",
                      f"--workdir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 2 and r.stderr.strip() == (
      f"ihsweep: IHSWEEP_HEARTBEAT_S={value!r} is not allowed: a finite number of seconds > 0"), (
      r.stderr[-2000:])
  assert not (tmp_path / "run").exists()
