"""The launchers (launch/*).

local_multiprocess.sh joined, when a process fails: the exit status is the failed process's, one
line names it, a process that stops answering ends the others within the heartbeat bound (not
JAX's C++ abort), and the group's status.json is not left "running"; a bad IHSWEEP_HEARTBEAT_S
is one line. local_multiprocess.sh --independent: each worker's environment (no coordinator,
GPUs round-robin, memory fraction for a shared GPU) and its exit rules (a failed worker does
not stop the others), with a stand-in for ihsweep; a real tiny sweep. slurm_array.sbatch,
slurm.sbatch, tpu_pod.sh: --dry-run commands and the environment a task's worker gets (a
stand-in srun). From the repository without an activated venv: the printed local lines run for
real to done, and every dry run checks the command and the config in one line, without a
traceback."""

import functools
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import jax
import pytest
from conftest import CPU_COMPILE_FLAGS

from ihsweep.base import runtime_abort, sharding
from ihsweep.runs import rundir
from ihsweep.workers import sweep_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTBEAT_S, GRACE_S = 5, 5
# One group of E = 2 (one model per process), small enough to compile in seconds, with far more
# updates than a test waits for: the launch is still training when the signal arrives.
TINY = [
  "--config.model.n_layers=1",
  "--config.model.d_mlp=0",
  "--config.model.d_model=16",
  "--config.model.n_heads=1",
  "--config.model.vocab_size=32",
  "--config.model.max_context=16",
  "--config.model.dtype=float32",
  "--config.train.batch_size=8",
  "--config.train.context_size=16",
  "--config.train.num_steps=1000000",
  "--config.train.steps_per_call=10",
  "--config.eval.every_steps=0",
  "--config.checkpoint.params_schedule=none",
  "--config.checkpoint.state_every_steps=0",
  "--config.ensemble.size=2",
  "--config.sweep.seeds=2",
]
# The joined failure tests: one worker spanning both processes (sweep.processes_per_worker = 2),
# both train the group together, so one's failure reaches the other (with process-local groups,
# the default, only the worker holding the group trains it).
FLAGS = ["--config.sweep.processes_per_worker=2", *TINY]
# What JAX's runtime prints when it aborts a process (an absl FATAL line "F1201 hh:mm:ss...",
# a stack trace; bash's "Aborted"), and Python's tracebacks.
CRASH = re.compile(r"^F\d{4} |Aborted|Check fail|stack trace|terminate called|Traceback", re.M)


def _launch_and_signal(workdir, process: int, sig: int):
  """Starts two processes, sends ``sig`` to ``process`` once both train, and returns
  ``(exit status, launcher output, seconds from the signal to the launcher's exit)``."""
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "IHSWEEP": f"{sys.executable} -m ihsweep.cli",
    "XLA_FLAGS": f"--xla_force_host_platform_device_count=1 {CPU_COMPILE_FLAGS}",
    "IHSWEEP_HEARTBEAT_S": str(HEARTBEAT_S),
    "IHSWEEP_GRACE_S": str(GRACE_S),
  }
  cmd = [
    "bash",
    os.path.join(ROOT, "launch", "local_multiprocess.sh"),
    "2",
    "--config=configs/default.py",
    f"--workdir={workdir}",
    "--noprogress",
    *FLAGS,
  ]
  launcher = subprocess.Popen(
    cmd,
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
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
  """The other process ends, nonzero, with one line that names the stopped one, and the
  launcher kills the stopped one at once (instead of after IHSWEEP_GRACE_S). Normally the peer
  watchdog ends it (within IHSWEEP_HEARTBEAT_S plus a few polls, the group marked failed);
  JAX's own abort is given 2 × IHSWEEP_HEARTBEAT_S + 30 s, but a watchdog starved of CPU on a
  loaded machine can still lose to it (it did once: status 134): then its C++ stack trace is one
  line in the log (ihsweep.base.runtime_abort), which the test accepts as well."""
  work = tmp_path / "run"
  rc, out, seconds = _launch_and_signal(work, stopped, signal.SIGSTOP)
  print(f"status {rc}, {seconds:.1f} s after the stop")  # which end came (-rA shows it)
  other = 1 - stopped
  assert rc != 0, out[-3000:]
  lines = [line for line in out.splitlines() if line.startswith("local_multiprocess.sh:")]
  assert len(lines) == 1, out[-3000:]
  assert f"not answering: process {stopped}, killed" in lines[0]
  logs = _logs(work)
  assert not CRASH.search(out + logs), CRASH.findall(out + logs)
  watchdog = f"ihsweep: process {other} ends: process {stopped} of 2 stopped answering"
  if rc == 1:  # the watchdog's end
    assert seconds < HEARTBEAT_S + GRACE_S, (seconds, out[-3000:])
    assert f"process {other} of 2 exited with status 1" in lines[0]
    assert logs.count(watchdog) == 1, logs[-3000:]
    status = rundir.read_status(str(work), "g000")
    assert status["state"] == "failed" and "stopped answering" in status["error"], status
    assert "failed" in next(
      line for line in sweep_status.format_status(str(work)).splitlines() if "g000" in line
    )
  else:  # JAX's: SIGABRT
    assert rc == 134 and f"process {other} of 2 ended with status 134" in lines[0], lines
    assert seconds < 2 * HEARTBEAT_S + 30 + GRACE_S, (seconds, out[-3000:])
    ended = [line for line in logs.splitlines() if "ended by JAX's runtime" in line]
    assert len(ended) == 1 and "stopped sending heartbeats" in ended[0], logs[-3000:]
    assert watchdog not in logs


def test_jax_runtime_abort_is_one_line_in_the_log():
  """runtime_abort.filter_stream on what jaxlib 0.10 writes when its coordination service gives
  up on a stopped peer (here, with heartbeat_timeout_seconds=4): the lines before pass, the fatal
  line, its status and the stack trace become one line."""
  before = (
    b"proc 0 up\n"
    b"E1206 07:56:07.119397   16675 coordination_service.cc:1549] [35884005262117205] Use error "
    b"polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks "
    b"are unhealthy (stopped sending heartbeats):\n1\n"
  )
  fatal = (
    b"F1206 07:56:07.119997   16686 client.h:80] Terminating process because the JAX "
    b"distributed service detected fatal errors. absl::Status: UNAVAILABLE: The following tasks "
    b"are unhealthy (stopped sending heartbeats):\n1\nThe tasks have crashed.\n\nRPC: "
    b"/xla.coordination.CoordinationService/PollForError [type.googleapis.com/tensorflow.Coordin"
    b"ationServiceError='']\n*** Check failure stack trace: ***\n"
    b"    @     0x7fb049440634  absl::lts_20260107::log_internal::LogMessage::SendToLog()\n"
    b"    @     0x7fb0510441f5  (unknown)\n"
  )
  sink = io.BytesIO()
  runtime_abort.filter_stream(io.BytesIO(before + fatal), sink, "process 0")
  assert sink.getvalue() == before + (
    b"ihsweep: process 0 ended by JAX's runtime: Terminating process because the JAX distributed "
    b"service detected fatal errors. absl::Status: UNAVAILABLE: The following tasks are "
    b"unhealthy (stopped sending heartbeats): 1 The tasks have crashed. RPC: "
    b"/xla.coordination.CoordinationService/PollForError\n"
  )
  assert not CRASH.search(sink.getvalue().decode())
  # In a process: the lines pass as written, and the filter ends with its input.
  r = subprocess.run(
    [sys.executable, "-I", runtime_abort.__file__, "process 1"],
    input=before + fatal, capture_output=True, timeout=60,
  )  # fmt: skip
  assert r.returncode == 0 and r.stdout == sink.getvalue().replace(b"process 0", b"process 1")


@pytest.mark.parametrize("value", ["abc", "0", "inf"])
def test_bad_heartbeat_is_one_line(tmp_path, value):
  env = {
    **os.environ,
    "IHSWEEP_COORDINATOR": "localhost:1",
    "IHSWEEP_NUM_PROCESSES": "2",
    "IHSWEEP_PROCESS_ID": "0",
    "IHSWEEP_HEARTBEAT_S": value,
  }
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "ihsweep.cli",
      "run",
      "--config=configs/default.py",
      f"--workdir={tmp_path / 'run'}",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 2 and r.stderr.strip() == (
    f"ihsweep: IHSWEEP_HEARTBEAT_S={value!r} is not allowed: a finite number of seconds > 0"
  ), r.stderr[-2000:]
  assert not (tmp_path / "run").exists()


# ------------------------------------------------------------- launchers without JAX (stand-ins)

LAUNCH = os.path.join(ROOT, "launch")
ARGS = ["--config=configs/default.py", "--workdir=/shared/runs/x", "--grid=seed=0,1"]
RUN = "ihsweep run --config=configs/default.py --workdir=/shared/runs/x --grid=seed=0\\,1"
# A stand-in for `ihsweep`: says what it got, then acts as FAKE_<CUDA_VISIBLE_DEVICES> says (the
# GPU id tells the workers apart): ok (runs 1 s), slow (60 s), fail (status 3), kill (SIGKILL
# itself), stop (SIGSTOP itself). SIGTERM: "term", status 143 (as ihsweep after checkpointing).
FAKE = r"""
trap 'kill $! 2>/dev/null; echo "term $CUDA_VISIBLE_DEVICES"; exit 143' TERM
act=FAKE_$CUDA_VISIBLE_DEVICES; act=${!act:-ok}
echo "start $CUDA_VISIBLE_DEVICES $act coordinator=${IHSWEEP_COORDINATOR-unset}" \
  "distributed=${IHSWEEP_DISTRIBUTED-unset} fraction=${XLA_PYTHON_CLIENT_MEM_FRACTION-unset}" \
  "preallocate=${XLA_PYTHON_CLIENT_PREALLOCATE-unset} args: $*"
case $act in
  ok) sleep 1 & wait $! ;;
  slow) sleep 60 & wait $! ;;
  fail) exit 3 ;;
  kill) kill -KILL $$ ;;
  stop) kill -STOP $$ ;;
esac
echo "done $CUDA_VISIBLE_DEVICES"
"""


@functools.cache
def _stand_ins() -> str:
  """A folder of do-nothing ``ihsweep`` and ``gcloud`` commands: what a dry run checks for."""
  folder = tempfile.mkdtemp(prefix="launch_stand_ins_")
  for name in ("ihsweep", "gcloud"):
    with open(os.path.join(folder, name), "w") as f:
      f.write("#!/bin/sh\nexit 0\n")
    os.chmod(os.path.join(folder, name), 0o755)
  return folder


def _clean_env(**extra) -> dict:
  """This environment without what the launchers read (IHSWEEP*, XLA_*, SLURM_*, GPUs; nproc
  also reads OMP_*), with stand-ins for ihsweep and gcloud on PATH, plus ``extra``."""
  keep = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("IHSWEEP", "XLA_", "SLURM_", "OMP_", "CUDA_VISIBLE_DEVICES"))
  }
  keep["PATH"] = f"{_stand_ins()}:{keep.get('PATH', '')}"
  return {**keep, "IHSWEEP": "ihsweep", **extra}


CHECKED = "# checked: "  # a dry run's line on stderr: the command and config it found


def _without_check(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
  """``r`` with its dry run's "# checked: …" line (one at most) taken out of stderr."""
  lines = r.stderr.splitlines(keepends=True)
  assert sum(line.startswith(CHECKED) for line in lines) <= 1, r.stderr
  r.stderr = "".join(line for line in lines if not line.startswith(CHECKED))
  return r


def _dry(script: str, *args, **env) -> subprocess.CompletedProcess:
  """``script ARGS --dry-run``, its "# checked: …" line taken out of stderr."""
  r = subprocess.run(
    ["bash", os.path.join(LAUNCH, script), *args, "--dry-run"],
    cwd=ROOT,
    env=_clean_env(**env),
    capture_output=True,
    text=True,
    timeout=60,
  )
  return _without_check(r)


def _lines(r: subprocess.CompletedProcess) -> list[str]:
  assert r.returncode == 0, r.stderr
  return [line.rstrip() for line in r.stdout.splitlines()]


def _split(line: str) -> tuple[dict, str]:
  """A dry-run line → (its VAR=value words before the command, the command)."""
  words = line.split(" ")
  i = next(i for i, w in enumerate(words) if not re.match(r"[A-Z_]+=", w))
  return dict(w.split("=", 1) for w in words[:i]), " ".join(words[i:])


def test_independent_workers_dry_run_no_coordinator_cores_split():
  per = max(len(os.sched_getaffinity(0)) // 3, 1)  # what nproc counts
  assert (
    _lines(_dry("local_multiprocess.sh", "3", "--independent", *ARGS))
    == [f"XLA_FLAGS=--xla_force_host_platform_device_count={per} {RUN}"] * 3
  )
  # Inherited variables that would make a worker join a job are removed from its environment.
  lines = _lines(
    _dry(
      "local_multiprocess.sh",
      "2",
      *ARGS,
      "--independent",
      IHSWEEP_COORDINATOR="host:1",
      IHSWEEP_DISTRIBUTED="1",
      IHSWEEP_CPU_DEVICES="2",
      XLA_FLAGS="--xla_cpu_foo=1",
    )
  )
  assert (
    lines
    == [
      "env -u IHSWEEP_COORDINATOR -u IHSWEEP_DISTRIBUTED XLA_FLAGS=--xla_cpu_foo=1"
      f"\\ --xla_force_host_platform_device_count=2 {RUN}"
    ]
    * 2
  )


@pytest.mark.parametrize(
  "n, gpus, fraction, want",
  [
    (2, "0,1", None, [("0", None), ("1", None)]),  # one worker per GPU: JAX's defaults
    (
      5,
      "0,1",
      None,
      [("0", "0.300"), ("1", "0.450"), ("0", "0.300"), ("1", "0.450"), ("0", "0.300")],
    ),  # 3 share GPU 0, 2 share GPU 1
    (4, "GPU-4f2a", None, [("GPU-4f2a", "0.225")] * 4),
    (2, "7", "0.4", [("7", "0.4")] * 2),  # a fraction set by the caller is kept
    # fewer workers than GPUs: each its consecutive share (the plan's workers of 2 GPUs)
    (4, "0,1,2,3,4,5,6,7", None, [("0,1", None), ("2,3", None), ("4,5", None), ("6,7", None)]),
    (1, "a,b", None, [("a,b", None)]),
  ],
)
def test_independent_workers_gpus_round_robin_with_memory_fraction(n, gpus, fraction, want):
  env = {"IHSWEEP_GPUS": gpus}
  if fraction:
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
  lines = _lines(_dry("local_multiprocess.sh", str(n), "--independent", *ARGS, **env))
  assert len(lines) == n
  for line, (gpu, share) in zip(lines, want):
    variables, command = _split(line)
    assert command == RUN
    assert variables["CUDA_VISIBLE_DEVICES"].replace("\\,", ",") == gpu  # printf %q: 0\,1
    assert variables.get("XLA_PYTHON_CLIENT_MEM_FRACTION") == share
    assert variables.get("XLA_PYTHON_CLIENT_PREALLOCATE") == (share and "false")
    assert "IHSWEEP_COORDINATOR" not in variables


def test_dry_runs_name_each_processs_workers():
  """Every launcher's dry run says on stderr which workers each process runs side by side:
  auto (ihsweep run chooses; its log names them) or slices of --config.sweep.devices_per_worker
  = D of the devices the process gets; a D that does not divide them is named."""
  fixed = "--config.sweep.devices_per_worker=2"
  r = _dry(
    "local_multiprocess.sh", "2", "--independent", *ARGS, fixed, IHSWEEP_GPUS="0,1,2,3,4,5,6,7"
  )
  assert _lines(r)[0].endswith(f"{RUN} {fixed}")
  assert r.stderr.splitlines() == [
    "# worker 0: devices 0,1,2,3; workers: 2 worker(s) of 2: [0,1] [2,3]",
    "# worker 1: devices 4,5,6,7; workers: 2 worker(s) of 2: [4,5] [6,7]",
  ]
  r = _dry("local_multiprocess.sh", "2", "--independent", *ARGS, IHSWEEP_GPUS="0,1,2,3")
  assert [line.split("; workers: ")[1][:5] for line in r.stderr.splitlines()] == ["auto "] * 2
  assert "slices of its 2 device(s)" in r.stderr
  r = _dry("local_multiprocess.sh", "1", "--independent", *ARGS, fixed, IHSWEEP_GPUS="0,1,2")
  assert "refused: sweep.devices_per_worker=2 does not divide its 3 device(s)" in r.stderr
  for script, words in (
    ("local.sh", "# workers: 2 consecutive devices each, over this machine's devices"),
    ("slurm_array.sbatch", "# each process's workers: 2 consecutive device(s) each, over its GPUs"),
    ("slurm.sbatch", "# each process's workers: 2 consecutive device(s) each, over its GPUs"),
  ):
    r = _dry(script, *ARGS, fixed)
    assert r.returncode == 0 and words in r.stderr, (script, r.stderr)
    auto = _dry(script, *ARGS).stderr
    assert "auto" in auto and "(sweep.devices_per_worker = 0: ihsweep run chooses" in auto, script


def test_joined_processes_one_gpu_each_and_never_two_on_one():
  lines = _lines(
    _dry("local_multiprocess.sh", "2", *ARGS, IHSWEEP_GPUS="3,5", IHSWEEP_PORT="12345")
  )
  for k, (line, gpu) in enumerate(zip(lines, ("3", "5"))):
    variables, command = _split(line)
    assert command == RUN
    assert variables["IHSWEEP_COORDINATOR"] == "localhost:12345"
    assert variables["IHSWEEP_PROCESS_ID"] == str(k) and variables["IHSWEEP_NUM_PROCESSES"] == "2"
    assert variables["CUDA_VISIBLE_DEVICES"] == gpu
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in variables
  r = _dry("local_multiprocess.sh", "3", *ARGS, IHSWEEP_GPUS="3,5", IHSWEEP_PORT="12345")
  assert r.returncode == 2 and r.stdout == "", r.stdout
  assert len(r.stderr.splitlines()) == 1 and "cannot share a GPU; use --independent" in r.stderr
  r = _dry("local_multiprocess.sh", "2", "--independent", *ARGS, IHSWEEP_GPUS="0;1")
  assert r.returncode == 2 and "IHSWEEP_GPUS=0;1 is not allowed" in r.stderr
  r = _dry("local_multiprocess.sh", "3", "--independent", *ARGS, IHSWEEP_GPUS="0,1,2,3,4,5,6,7")
  assert r.returncode == 2 and "a number of processes that divides the GPUs" in r.stderr


# A stand-in `ihsweep run`: one JSON line of the devices JAX gives the process and the workers
# `ihsweep run` lays over them (config.worker_slices, slices of sweep.devices_per_worker).
DEVICES_AND_WORKERS = """
import json, sys
import jax, ml_collections
from ihsweep.configuration import config
given = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--config.sweep.devices_per_worker=")]
cfg = ml_collections.ConfigDict(
  {"mesh": {"num_devices": 0}, "sweep": {"devices_per_worker": int(given[-1]) if given else 0}}
)
workers = [len(s) for s in config.worker_slices(cfg)]
print(json.dumps({"devices": len(jax.local_devices()), "workers": workers}), flush=True)
"""


def test_the_plans_launch_line_starts_the_processes_and_workers_it_describes(tmp_path):
  """The plan's local line for 4 independent workers of 2 devices on a host of 8
  (``launch.launch_lines``: ``IHSWEEP_GPUS=0,...,7 launch/local_multiprocess.sh 4 --independent
  ... --config.sweep.devices_per_worker=2``), run as printed where JAX has only the CPU and
  XLA_FLAGS gives a process 8 fake devices: 4 processes, each of 2 devices and one worker over
  them (before: 8 devices and 4 workers in each, 16 workers)."""
  from ihsweep.planning import launch

  work = tmp_path / "run"
  lines, note = launch.launch_lines(["--config=configs/default.py", f"--workdir={work}"], 4, 2, 8)
  line = lines[1]
  assert line.startswith("IHSWEEP_GPUS=0,1,2,3,4,5,6,7 launch/local_multiprocess.sh 4 --indep")
  assert line.endswith(" --config.sweep.devices_per_worker=2") and "4 local worker(s)" in note
  stand_in = tmp_path / "stand_in.py"
  stand_in.write_text(DEVICES_AND_WORKERS)
  env = _clean_env(
    IHSWEEP=f"{sys.executable} {stand_in}",
    JAX_PLATFORMS="cpu",
    XLA_FLAGS="--xla_force_host_platform_device_count=8",
  )
  r = subprocess.run(
    ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  assert r.returncode == 0, r.stdout + r.stderr
  logs = sorted(os.listdir(work / "logs"))
  assert logs == [f"worker_{k}.log" for k in range(4)]
  seen = [
    json.loads((work / "logs" / name).read_text().splitlines()[-1]) for name in logs
  ]  # after each log's header line
  assert seen == [{"devices": 2, "workers": [2]}] * 4
  # The dry run says the same of each process.
  r = subprocess.run(["bash", "-c", line + " --dry-run"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=60)  # fmt: skip
  r = _without_check(r)
  assert [said.split(": ", 1)[1] for said in r.stderr.splitlines()] == [
    f"devices {2 * k},{2 * k + 1}; workers: 1 worker(s) of 2: [{2 * k},{2 * k + 1}]"
    for k in range(4)
  ]
  for row in r.stdout.splitlines():
    variables, _ = _split(row)
    assert variables["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2", row


def _fake_launch(tmp_path, n: int, *flags, term: bool = False, **env):
  """local_multiprocess.sh with the stand-in ihsweep, worker k on GPU "k"; with ``term``,
  SIGTERM to the launcher once every worker has started. Returns (status, stdout, the
  launcher's own lines on stderr, {k: log text})."""
  fake = tmp_path / "fake_ihsweep.sh"
  fake.write_text(FAKE)
  work = tmp_path / "run"
  launcher = subprocess.Popen(
    [
      "bash",
      os.path.join(LAUNCH, "local_multiprocess.sh"),
      str(n),
      *flags,
      f"--workdir={work}",
      "--noprogress",
    ],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
    env=_clean_env(
      IHSWEEP=f"bash {fake}", IHSWEEP_GPUS=",".join(map(str, range(n))), IHSWEEP_PORT="1", **env
    ),
  )
  logs = work / "logs"
  try:
    if term:
      deadline = time.time() + 30
      while not (logs.is_dir() and sum("start" in p.read_text() for p in logs.iterdir()) == n):
        assert time.time() < deadline and launcher.poll() is None
        time.sleep(0.05)
      launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=60)
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
      launcher.wait()
  own = [line for line in err.splitlines() if line.startswith("local_multiprocess.sh:")]
  texts = {int(p.stem.rsplit("_", 1)[1]): p.read_text() for p in logs.iterdir()}
  return launcher.returncode, out, own, texts


def test_independent_worker_killed_does_not_stop_the_others(tmp_path):
  rc, out, own, logs = _fake_launch(
    tmp_path, 3, "--independent", FAKE_1="kill", IHSWEEP_COORDINATOR="localhost:9"
  )
  work = tmp_path / "run"
  assert rc == 137, (own, logs)
  assert own == [
    f"local_multiprocess.sh: 3 independent workers on {work}: worker 0 here, worker k in "
    f"{work}/logs/worker_k.log; `ihsweep status --workdir={work}` shows who holds which group",
    f"local_multiprocess.sh: worker 1 of 3 ended with status 137 (128 + 9: SIGKILL) (log: "
    f"{work}/logs/worker_1.log); the others go on",
    f"local_multiprocess.sh: exit status 137 (worker 1 of 3); 2 of 3 workers exited with "
    f"status 0; rerun the same command to finish any group left unfinished (`ihsweep status "
    f"--workdir={work}`)",
  ]
  # The others ran to their end; worker 0 also on the terminal; no worker saw a coordinator.
  assert sorted(logs) == [0, 1, 2]
  for k in (0, 2):
    assert logs[k].rstrip().endswith(f"done {k}"), logs[k]
  assert "done 1" not in logs[1]
  assert out.rstrip().endswith("done 0") and "start 1" not in out
  for k, text in logs.items():
    assert text.startswith("=== ") and f"worker {k} of 3 (independent):" in text
    assert "coordinator=unset distributed=unset" in text
    assert f"args: run --workdir={work} --noprogress" in text


def test_independent_worker_left_stopped_is_killed_after_the_others(tmp_path):
  rc, _, own, logs = _fake_launch(tmp_path, 3, "--independent", FAKE_1="stop", FAKE_2="fail")
  work = tmp_path / "run"
  assert rc == 3, (own, logs)  # the first failure's status, not the killed one's
  assert own[1:] == [
    f"local_multiprocess.sh: worker 2 of 3 exited with status 3 (log: "
    f"{work}/logs/worker_2.log); the others go on",
    "local_multiprocess.sh: stopped (SIGSTOP?) and not answering after the others ended: "
    "worker 1 of 3, killed",
    f"local_multiprocess.sh: exit status 3 (worker 2 of 3); 1 of 3 workers exited with "
    f"status 0; rerun the same command to finish any group left unfinished (`ihsweep status "
    f"--workdir={work}`)",
  ]
  assert logs[0].rstrip().endswith("done 0") and "done 1" not in logs[1]


def test_independent_sigterm_reaches_every_worker_and_is_the_status(tmp_path):
  rc, _, own, logs = _fake_launch(
    tmp_path, 2, "--independent", term=True, FAKE_0="slow", FAKE_1="slow"
  )
  assert rc == 143
  assert len(own) == 1 and "2 independent workers" in own[0]  # no failure lines: it was asked
  for k in (0, 1):
    assert logs[k].rstrip().endswith(f"term {k}"), logs[k]


def test_joined_failure_stops_the_others(tmp_path):
  rc, _, own, logs = _fake_launch(tmp_path, 2, FAKE_0="slow", FAKE_1="fail")
  work = tmp_path / "run"
  assert rc == 3
  assert own == [
    f"local_multiprocess.sh: process 1 of 2 exited with status 3 (log: "
    f"{work}/logs/process_1.log); stopping the others"
  ]
  assert "coordinator=localhost:1 " in logs[0] and logs[0].rstrip().endswith("term 0")


def test_slurm_array_dry_runs_and_header():
  assert _lines(_dry("slurm_array.sbatch", *ARGS)) == [
    "srun --ntasks=1 ihsweep run --noprogress --config=configs/default.py "
    "--workdir=/shared/runs/x --grid=seed=0\\,1"
  ]
  assert _lines(_dry("slurm_array.sbatch", *ARGS, SLURM_CPUS_PER_TASK="8")) == [
    "srun --ntasks=1 --cpus-per-task=8 ihsweep run --noprogress --config=configs/default.py "
    "--workdir=/shared/runs/x --grid=seed=0\\,1"
  ]
  assert _lines(
    _dry("slurm_array.sbatch", *ARGS, IHSWEEP_WORKERS_PER_GPU="4", SLURM_ARRAY_TASK_ID="3")
  ) == [  # IHSWEEP: the command found here, for local_multiprocess.sh to start
    "IHSWEEP=ihsweep XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.225 "
    "IHSWEEP_LOG_PREFIX=task3_worker_ srun --ntasks=1 launch/local_multiprocess.sh 4 "
    "--independent --noprogress --config=configs/default.py --workdir=/shared/runs/x "
    "--grid=seed=0\\,1"
  ]
  r = _dry("slurm_array.sbatch", *ARGS, IHSWEEP_WORKERS_PER_GPU="0")
  assert r.returncode == 2 and "IHSWEEP_WORKERS_PER_GPU=0 is not allowed" in r.stderr
  text = open(os.path.join(LAUNCH, "slurm_array.sbatch")).read()
  sbatch = re.findall(r"^#SBATCH (\S+)", text, re.M)
  for option in ("--array=0-7", "--gres=gpu:1", "--signal=TERM@120", "--requeue"):
    assert option in sbatch, sbatch
  assert (
    "sbatch --array=0-63 launch/slurm_array.sbatch --config=configs/exp1_natural.py \\\n"
    "#       --workdir=/shared/exp1 --config.data.tfds_data_dir=$TFDS"
  ) in text
  subprocess.run(["bash", "-n", os.path.join(LAUNCH, "slurm_array.sbatch")], check=True)


@pytest.mark.parametrize("per_gpu", [1, 2])
def test_slurm_array_task_environment(tmp_path, per_gpu):
  """The task as SLURM runs it (a stand-in srun that runs its command): the worker gets no
  jax.distributed variables; K = 2 workers share the task's GPU with half the memory each."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  srun = bin_dir / "srun"
  srun.write_text('#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
  srun.chmod(0o755)
  fake = tmp_path / "fake_ihsweep.sh"
  fake.write_text(FAKE)
  work = tmp_path / "run"
  env = _clean_env(
    PATH=f"{bin_dir}:{os.environ['PATH']}",
    IHSWEEP=f"bash {fake}",
    IHSWEEP_WORKERS_PER_GPU=str(per_gpu),
    SLURM_ARRAY_TASK_ID="3",
    SLURM_CPUS_PER_TASK="8",
    CUDA_VISIBLE_DEVICES="5",
    IHSWEEP_DISTRIBUTED="1",
    IHSWEEP_COORDINATOR="node1:1234",
  )
  r = subprocess.run(
    ["bash", os.path.join(LAUNCH, "slurm_array.sbatch"), "--config=c.py", f"--workdir={work}"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert r.returncode == 0, r.stderr
  fraction, preallocate = ("unset", "unset") if per_gpu == 1 else ("0.450", "false")
  want = (
    f"start 5 ok coordinator=unset distributed=unset fraction={fraction} "
    f"preallocate={preallocate} args: run --noprogress --config=c.py --workdir={work}"
  )
  if per_gpu == 1:
    assert r.stdout.splitlines() == [want, "done 5"]
  else:
    logs = sorted(os.listdir(work / "logs"))
    assert logs == ["task3_worker_0.log", "task3_worker_1.log"]
    for name in logs:
      assert want in (work / "logs" / name).read_text()


def test_joined_launchers_dry_runs():
  ihsweep = f"{sys.executable} -m ihsweep.cli"
  lines = _lines(_dry("slurm.sbatch", *ARGS, SLURM_CPUS_PER_TASK="8", IHSWEEP=ihsweep))
  assert lines[0] == (
    f"IHSWEEP_DISTRIBUTED=1 srun --kill-on-bad-exit=1 --cpus-per-task=8 {ihsweep} run "
    "--noprogress --config=configs/default.py --workdir=/shared/runs/x --grid=seed=0\\,1"
  )
  # Inside an allocation: 4 tasks on this node, srun binds one GPU to each (--gpus-per-task=1).
  slurm = dict(
    SLURM_NTASKS_PER_NODE="4", SLURM_GPUS_PER_TASK="1", SLURM_GPUS_ON_NODE="4",
    CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_NODEID="0", JAX_PLATFORMS="", IHSWEEP=ihsweep,
    SLURM_JOB_ID="7",
  )  # fmt: skip
  assert _lines(_dry("slurm.sbatch", *ARGS, **slurm))[1:] == [
    f"task {i} of 4 on node 0: local device ids [0]: the 1 GPU(s) visible to this task "
    f"(CUDA_VISIBLE_DEVICES={i})"
    for i in range(4)
  ]
  # Without binding every task sees the node's 4 GPUs and takes its own.
  del slurm["SLURM_GPUS_PER_TASK"]
  assert _lines(_dry("slurm.sbatch", *ARGS, **slurm))[2] == (
    "task 1 of 4 on node 0: local device ids [1]: task 1 (SLURM_LOCALID)'s share of the "
    "node's 4 GPUs, visible to each of its 4 tasks"
  )


def _remote(line: str) -> str:
  """The --command=… of a dry-run gcloud line (as the shell would pass it)."""
  return next(w for w in shlex.split(line) if w.startswith("--command="))[len("--command=") :]


def test_tpu_pod_hosts_run_detached_with_the_environment_and_a_log(tmp_path):
  """launch/tpu_pod.sh: the command each host runs (from --dry-run), run here in bash with a
  stand-in for .venv/bin/ihsweep: it outlives the shell that started it in a session of its own,
  gets the forwarded IHSWEEP_*/JAX_* variables and the flags, and logs to
  WORKDIR/logs/host_<hostname>.log; --stop's command ends it with SIGTERM."""
  repo, work = tmp_path / "my repo", tmp_path / "run"  # a space: one word on every host
  (repo / ".venv" / "bin").mkdir(parents=True)
  stand_in = repo / ".venv" / "bin" / "ihsweep"
  stand_in.write_text(
    "#!/usr/bin/env bash\n"
    "trap 'echo got SIGTERM; exit 143' TERM\n"
    'echo "args: $* heartbeat=$IHSWEEP_HEARTBEAT_S cache=$JAX_COMPILATION_CACHE_DIR '
    'distributed=$IHSWEEP_DISTRIBUTED repo=${IHSWEEP_REPO:-unset}"\n'
    "for i in $(seq 600); do sleep 0.1; done\n"
  )
  stand_in.chmod(0o755)
  env = dict(IHSWEEP_REPO=str(repo), IHSWEEP_HEARTBEAT_S="50", JAX_COMPILATION_CACHE_DIR="/c d")
  args = ("my-tpu", "us-central2-b", f"--workdir={work}", "--config=configs/default.py",
          "--grid=seed=0,1")  # fmt: skip
  lines = _lines(_dry("tpu_pod.sh", *args, **env))
  assert len(lines) == 1 and lines[0].startswith(
    "gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central2-b --worker=all --command="
  )
  started = subprocess.run(["bash", "-c", _remote(lines[0])], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
  host = os.uname().nodename
  assert started.returncode == 0 and f"{host}: started" in started.stdout, started.stderr
  pid = int((work / "logs" / f"host_{host}.pid").read_text())
  log = work / "logs" / f"host_{host}.log"
  deadline = time.time() + 30
  while "args:" not in log.read_text() and time.time() < deadline:
    time.sleep(0.1)
  assert os.getsid(pid) == pid  # its own session: the SSH session's SIGHUP does not reach it
  again = subprocess.run(["bash", "-c", _remote(lines[0])], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
  assert again.returncode == 1 and f"{host}: already running (process {pid})" in again.stdout
  assert (
    f"args: run --noprogress --workdir={work} --config=configs/default.py --grid=seed=0,1 "
    "heartbeat=50 cache=/c d distributed=1 repo=unset"
  ) in log.read_text()
  stop = _lines(_dry("tpu_pod.sh", "my-tpu", "us-central2-b", "--stop", f"--workdir={work}"))
  assert len(stop) == 1
  r = subprocess.run(["bash", "-c", _remote(stop[0])], capture_output=True, text=True, timeout=60)
  assert f"{host}: SIGTERM to {pid}" in r.stdout, r.stderr
  deadline = time.time() + 30
  while "got SIGTERM" not in log.read_text() and time.time() < deadline:
    time.sleep(0.1)
  assert "got SIGTERM" in log.read_text()
  # --sync: the committed tree copied to every host, installed there once
  sync = _lines(_dry("tpu_pod.sh", *args, "--sync", **env))
  assert sync[0].startswith("git archive --format=tar.gz -o ") and sync[0].endswith(" HEAD")
  assert sync[1].startswith("gcloud compute tpus tpu-vm scp ") and "--worker=all" in sync[1]
  assert "pip install -q -c constraints.txt -e" in _remote(sync[2]) and sync[3] == lines[0]
  for bad in ([], ["--stop", f"--workdir={work}", "--sync"], ["--config=configs/default.py"]):
    r = _dry("tpu_pod.sh", "my-tpu", "us-central2-b", *bad)
    assert r.returncode == 2 and "usage:" in r.stderr
  for relative in ("runs/x", "~/x"):  # each host would resolve it in its own directory
    r = _dry("tpu_pod.sh", "my-tpu", "us-central2-b", f"--workdir={relative}", "--stop")
    assert r.returncode == 2 and "an absolute path" in r.stderr
  # a value holding a newline is one variable (not a second line read as another)
  nl = _lines(_dry("tpu_pod.sh", *args, IHSWEEP_NOTE="a\nJAX_GHOST=zz"))
  assert len(nl) == 1 and "JAX_GHOST=zz " not in _remote(nl[0])


# --------------------------------------------------------------------- a real independent sweep


def test_two_independent_workers_finish_a_tiny_sweep(tmp_path):
  work = tmp_path / "run"
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "IHSWEEP": f"{sys.executable} -m ihsweep.cli",
    "IHSWEEP_CPU_DEVICES": "1",
    "XLA_FLAGS": CPU_COMPILE_FLAGS,
  }
  r = subprocess.run(
    [
      "bash",
      os.path.join(LAUNCH, "local_multiprocess.sh"),
      "2",
      "--independent",
      "--config=configs/default.py",
      f"--workdir={work}",
      "--noprogress",
      *[f for f in TINY if not f.startswith("--config.train.batch_size=")],  # the axis sets it
      "--config.train.num_steps=20",
      "--grid=train.batch_size=4,8",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + _logs(work)[-3000:]
  assert sorted(os.listdir(work / "logs")) == ["worker_0.log", "worker_1.log"]
  claimed = {}
  for line in open(work / "claims.jsonl"):
    row = json.loads(line)
    if row["event"] in ("claimed", "taken over"):
      claimed.setdefault(row["group"], []).append(row["event"])
  assert claimed == {"g000": ["claimed"], "g001": ["claimed"]}, claimed
  for g in ("g000", "g001"):
    assert rundir.read_status(str(work), g)["state"] == "done"


# ----------------------------------------------------------------- SLURM tasks' local device ids

_TASK = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}


@pytest.mark.parametrize(
  "env, ids",
  [
    # one GPU bound to each of 4 tasks per node: renumbered 0 (JAX's own rule gives 1: "invalid
    # device ordinal", jax-ml/jax #28194)
    (dict(CUDA_VISIBLE_DEVICES="1", SLURM_GPUS_ON_NODE="4", SLURM_TASKS_PER_NODE="4(x2)"), [0]),
    # one task per node with its 8 GPUs (JAX's rule: GPU 0 only, #16788)
    (dict(CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7", SLURM_GPUS_ON_NODE="8",
          SLURM_TASKS_PER_NODE="1(x2)", SLURM_LOCALID="0"), list(range(8))),
    # 2 tasks per node, both seeing the node's 8 GPUs: task 1 takes the second half
    (dict(CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7", SLURM_GPUS_ON_NODE="8",
          SLURM_STEP_TASKS_PER_NODE="2(x2)"), [4, 5, 6, 7]),
    (dict(SLURM_GPUS_ON_NODE="8", SLURM_NTASKS_PER_NODE="2"), [4, 5, 6, 7]),
    (dict(SLURM_JOB_GPUS="0,1,2,3", SLURM_TASKS_PER_NODE="3,4"), [1]),  # node 1 holds 4 tasks
    # nothing to split by (3 tasks, 4 GPUs; no GPU count): JAX's default, said
    (dict(SLURM_GPUS_ON_NODE="4", SLURM_NTASKS_PER_NODE="3"), None),
    (dict(), None),
    (dict(JAX_PLATFORMS="tpu", CUDA_VISIBLE_DEVICES="0"), None),  # TPU: JAX decides
    (dict(IHSWEEP_LOCAL_DEVICE_IDS="2,3", CUDA_VISIBLE_DEVICES="1"), [2, 3]),
  ],
)  # fmt: skip
def test_a_slurm_task_uses_the_gpus_slurm_gave_it(env, ids):
  got, why = sharding.slurm_local_device_ids({**_TASK, **env})
  assert got == ids, why
  if ids is None and "JAX_PLATFORMS" not in env:
    assert "GPU 1 only" in why and "IHSWEEP_LOCAL_DEVICE_IDS" in why
  assert sharding.slurm_local_device_ids({"CUDA_VISIBLE_DEVICES": "1"}) == (None, "")  # no SLURM


@pytest.mark.parametrize(
  "env",
  [
    dict(SLURM_LOCALID="5", SLURM_TASKS_PER_NODE="2", SLURM_GPUS_ON_NODE="4"),  # past the tasks
    dict(SLURM_LOCALID="-1", SLURM_TASKS_PER_NODE="2", SLURM_GPUS_ON_NODE="4"),
    dict(SLURM_LOCALID="abc"),
    dict(SLURM_TASKS_PER_NODE="2(x", SLURM_GPUS_ON_NODE="4"),  # malformed: tasks unknown
  ],
)
def test_a_slurm_environment_that_names_no_gpus_is_left_to_jax(env):
  ids, why = sharding.slurm_local_device_ids({**_TASK, **env})
  assert ids is None and "IHSWEEP_LOCAL_DEVICE_IDS" in why


@pytest.mark.parametrize("bad", ["a", "0,0", "-1", "0,,1"])
def test_a_bad_local_device_ids_override_is_one_line(bad):
  from ihsweep.base.environment import EnvironmentVariableError

  with pytest.raises(EnvironmentVariableError) as e:
    sharding.slurm_local_device_ids({**_TASK, "IHSWEEP_LOCAL_DEVICE_IDS": bad})
  assert str(e.value) == (
    f"IHSWEEP_LOCAL_DEVICE_IDS={bad!r} is not allowed: distinct device ids >= 0, comma-separated "
    "(e.g. 0,1)"
  )


def test_initialize_distributed_passes_the_tasks_gpus(monkeypatch, capsys):
  seen = {}
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: seen.update(args=a, **k))
  monkeypatch.setattr(runtime_abort, "start", lambda who: seen.update(filtered=who))
  # a SLURM step as JAX's detection sees one (SlurmCluster: these five variables)
  step = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "8"}
  for name, value in {**_TASK, **step, "IHSWEEP_DISTRIBUTED": "1", "CUDA_VISIBLE_DEVICES": "3",
                      "JAX_PLATFORMS": "cuda"}.items():  # fmt: skip
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("IHSWEEP_COORDINATOR", raising=False)
  assert sharding.initialize_distributed() == 1  # the stand-in joins nothing
  assert seen["args"] == () and seen["local_device_ids"] == [0]
  assert seen["filtered"] == "this process"  # its stderr through runtime_abort's filter
  assert "ihsweep: SLURM task 5: local device ids [0]" in capsys.readouterr().err


def test_slurm_dry_run_reads_typed_gpu_counts_and_refuses_what_slurm_would_not_write():
  env = {
    "SLURM_JOB_ID": "1",
    "SLURM_NTASKS_PER_NODE": "2",
    "JAX_PLATFORMS": "cuda",
    "IHSWEEP": f"{sys.executable} -m ihsweep.cli",
  }
  lines = _lines(_dry("slurm.sbatch", *ARGS, SLURM_GPUS_PER_TASK="a100:2", **env))
  assert lines[1:] == [
    "task 0 of 2 on node 0: local device ids [0…1]: the 2 GPU(s) visible to this task "
    "(CUDA_VISIBLE_DEVICES=0,1)",
    "task 1 of 2 on node 0: local device ids [0…1]: the 2 GPU(s) visible to this task "
    "(CUDA_VISIBLE_DEVICES=2,3)",
  ]
  for name, value in (("SLURM_NODEID", "x"), ("SLURM_GPUS_PER_TASK", "a100:two")):
    r = _dry("slurm.sbatch", *ARGS, **{**env, name: value})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"ihsweep: {name}={value!r} is not allowed: "), r.stderr


def test_the_launchers_own_variables_are_checked_before_anything_starts(tmp_path):
  for name, value, words in (
    ("IHSWEEP_CPU_DEVICES", "abc", "a whole number >= 1"),
    ("IHSWEEP_GRACE_S", "-1", "a whole number >= 0"),
    ("IHSWEEP_PORT", "99999", "a port from 1 to 65535"),
    ("IHSWEEP_GPUS", "0,0", "distinct GPU ids or UUIDs"),
    ("IHSWEEP_GPUS", "00,0", "distinct GPU ids or UUIDs"),  # both GPU 0 to CUDA
    ("IHSWEEP_GPUS", "1,2,01", "distinct GPU ids or UUIDs"),
  ):
    work = tmp_path / name
    r = _dry("local_multiprocess.sh", "2", "--config=configs/default.py", f"--workdir={work}",
             **{name: value})  # fmt: skip
    assert r.returncode == 2 and r.stdout == "" and not work.exists(), r.stderr
    assert r.stderr.endswith(f"{name}={value} is not allowed: " + r.stderr.split(": ", 2)[2])
    assert words in r.stderr and len(r.stderr.splitlines()) == 1


# ------------------------------------------- the printed lines, run as from a fresh clone (#58)

VENV_IHSWEEP = os.path.join(ROOT, ".venv", "bin", "ihsweep")
SMALL = [f for f in TINY if not f.startswith("--config.train.num_steps=")]
SMALL += ["--config.train.num_steps=20"]  # a tiny sweep: one group of 2 models, 20 updates
needs_venv = pytest.mark.skipif(
  not os.access(VENV_IHSWEEP, os.X_OK), reason="`make install` makes .venv/bin/ihsweep"
)


def _no_venv_env(*extra_path: str, **extra) -> dict:
  """A user's shell after `make install` without activating the venv: PATH without .venv/bin
  (``ihsweep`` is not found there; ``python3`` is the system's, which may have no JAX), no
  IHSWEEP; ``extra_path`` folders (stand-ins) first."""
  venv_bin = os.path.realpath(os.path.dirname(VENV_IHSWEEP))
  env = {k: v for k, v in _clean_env().items() if k not in ("IHSWEEP", "VIRTUAL_ENV")}
  path = [p for p in os.environ.get("PATH", "").split(":") if p]
  path = [p for p in path if os.path.realpath(p) != venv_bin]
  env["PATH"] = ":".join([*extra_path, *path])
  assert subprocess.run(["bash", "-c", "type -P ihsweep"], env=env).returncode != 0
  return {**env, **extra}


def _stand_in(folder, name: str, text: str) -> str:
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, name)
  with open(path, "w") as f:
    f.write(text)
  os.chmod(path, 0o755)
  return str(folder)


@needs_venv
def test_the_printed_local_lines_run_as_printed_without_an_activated_venv(tmp_path):
  """The plan's local line (``ihsweep plan`` → ``launch/local.sh …``), the local and SLURM job
  array lines of independent workers (``launch.launch_lines``; the array's task through a
  stand-in srun), each run as printed from the repository with PATH not holding .venv/bin:
  each launcher finds .venv/bin/ihsweep (before: bash found the ihsweep/ package folder, "exec:
  ihsweep: cannot execute: Is a directory", status 126) and the tiny sweep ends done."""
  from ihsweep.planning import launch

  env = _no_venv_env(
    _stand_in(
      tmp_path / "bin",
      "srun",
      '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n',
    ),
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=CPU_COMPILE_FLAGS,
  )
  plan_dir = tmp_path / "plan"
  r = subprocess.run(
    [VENV_IHSWEEP, "plan", "--config=configs/default.py", f"--workdir={plan_dir}", *SMALL,
     "--devices=1", "--flops_per_s=1e12"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  lines = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("launch/")]
  assert lines and lines[0].startswith("launch/local.sh "), r.stdout[-3000:]
  flags = ["--config=configs/default.py", "--noprogress", *SMALL]
  array, local = launch.launch_lines([*flags, f"--workdir={tmp_path / 'local'}"], 1, 1, 1)[0]
  array = launch.launch_lines([*flags, f"--workdir={tmp_path / 'array'}"], 1, 1, 1)[0][0]
  assert array.startswith("sbatch --array=0-0 --gres=gpu:1 launch/slurm_array.sbatch ")
  assert local.startswith("IHSWEEP_GPUS=0 launch/local_multiprocess.sh 1 --independent ")
  for line, work in (
    (lines[0], plan_dir),
    (local, tmp_path / "local"),
    ("bash " + array.split(" ", 3)[3], tmp_path / "array"),  # what sbatch runs, here
  ):
    r = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}{r.stderr[-3000:]}"
    assert "Traceback" not in r.stdout + r.stderr, line
    assert rundir.read_status(str(work), "g000")["state"] == "done", line


@needs_venv
def test_dry_runs_check_the_command_and_config_and_never_trace(tmp_path):
  """Each launcher's --dry-run from the repository without an activated venv, the system
  python3 on PATH: one "# checked: …" line naming .venv/bin/ihsweep and the config; where the
  run would fail (no such config; a clone without `make install`), one line, status 1, nothing
  printed to run, and no traceback (before: slurm.sbatch ran the system python3 and printed
  "No module named 'jax'", status 0); a real run without the command: one line, status 127."""
  env = _no_venv_env(_stand_in(tmp_path / "bin", "gcloud", "#!/bin/sh\nexit 0\n"))
  found = f"the run starts {VENV_IHSWEEP} (this checkout's venv: no ihsweep on PATH)"
  launchers = {
    "local.sh": [],
    "local_multiprocess.sh": ["2", "--independent"],
    "slurm.sbatch": [],
    "slurm_array.sbatch": [],
    "tpu_pod.sh": ["my-tpu", "us-central2-b"],
  }

  def dry(script, *args, where=LAUNCH, **more):
    return subprocess.run(
      ["bash", os.path.join(where, script), *launchers[script], *args, "--dry-run"],
      cwd=ROOT, env={**env, **more}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

  good = ["--config=configs/default.py:tiny", "--workdir=/shared/runs/x"]
  for script in launchers:
    r = dry(script, *good)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, (script, r.stderr)
    checked = [line for line in r.stderr.splitlines() if line.startswith(CHECKED)]
    assert len(checked) == 1 and "configs/default.py found" in checked[0].replace(" (", " "), (
      r.stderr
    )
    if script != "tpu_pod.sh":  # the hosts run their own checkout's .venv/bin/ihsweep
      assert checked[0] == f"{CHECKED}{found} with configs/default.py (found)"
      assert f"{VENV_IHSWEEP} run " in r.stdout.splitlines()[0] or script == "slurm_array.sbatch"
    bad = dry(script, "--config=configs/nope.py", "--workdir=/shared/runs/x")
    assert bad.returncode == 1 and bad.stdout == "", (script, bad.stdout, bad.stderr)
    assert bad.stderr.splitlines() == [
      f"{os.path.join(LAUNCH, script)}: the run would fail: --config=configs/nope.py: no file "
      f"configs/nope.py (from {ROOT})"
    ]
  # slurm.sbatch in an allocation: each task's GPUs, by the Python behind .venv/bin/ihsweep
  slurm = dict(SLURM_JOB_ID="1", SLURM_NTASKS_PER_NODE="2", SLURM_GPUS_PER_TASK="2",
               JAX_PLATFORMS="cuda")  # fmt: skip
  r = dry("slurm.sbatch", *good, **slurm)
  assert r.returncode == 0 and r.stdout.splitlines()[1].startswith("task 0 of 2 on node 0: "), r
  # A clone without `make install`: no .venv/bin/ihsweep beside the launchers.
  clone = tmp_path / "clone"
  shutil.copytree(LAUNCH, clone / "launch")
  missing = os.path.join(clone, ".venv", "bin", "ihsweep")
  for script in ("local.sh", "local_multiprocess.sh", "slurm.sbatch", "slurm_array.sbatch"):
    r = dry(script, *good, where=clone / "launch")
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
      f"{clone / 'launch' / script}: the run would fail: {missing} (this checkout's venv: no "
      "ihsweep on PATH) is not an executable file (`make install` makes .venv/bin/ihsweep; or "
      "set IHSWEEP)"
    ]
  r = subprocess.run(["bash", str(clone / "launch" / "local.sh"), *good], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=60)  # fmt: skip
  assert r.returncode == 127 and "cannot start ihsweep: " in r.stderr, r.stderr
  assert len(r.stderr.splitlines()) == 1 and "Is a directory" not in r.stderr
