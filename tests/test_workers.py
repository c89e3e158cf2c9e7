"""Workers sharing one sweep directory: independent processes and the processes of one
jax.distributed job take groups through claims in the run directory (``ihsweep.workers.sweep``)."""

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import CPU_COMPILE_FLAGS

from ihsweep.base import atomic
from ihsweep.runs import claims, ownership, rundir
from ihsweep.training import resume
from ihsweep.workers import sweep_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 8 groups of one model each (B × C × d_model), a few seconds of compiling and training apiece;
# a full-state checkpoint every 10 updates, so a killed group resumes from update 10 or 20.
FLAGS = [
  "--config=configs/default.py",
  "--noprogress",
  "--config.model.n_layers=1",
  "--config.model.d_mlp=0",
  "--config.model.n_heads=1",
  "--config.model.vocab_size=32",
  "--config.model.max_context=16",
  "--config.model.dtype=float32",
  "--config.train.num_steps=30",
  "--config.train.steps_per_call=10",
  "--config.eval.every_steps=0",
  "--config.checkpoint.params_schedule=none",  # 0 and the end: saves are not what is tested
  "--config.checkpoint.state_every_steps=10",
  "--config.ensemble.size=1",
  "--config.sweep.seeds=1",
  "--grid=train.batch_size=4,8",
  "--grid=train.context_size=8,16",
  "--grid=model.d_model=8,16",
]
GROUPS = [f"g{i:03d}" for i in range(8)]
FLAGS_4 = FLAGS[:-1]  # B × C: 4 groups


def _env(devices: int, **extra) -> dict:
  return {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "IHSWEEP_CLAIM_HEARTBEAT_S": "1",
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {CPU_COMPILE_FLAGS}",
    **extra,
  }


def _ihsweep(*args, env) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, "-m", "ihsweep.cli", *args],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _finish(procs, timeout=600) -> list[tuple[int, str]]:
  out = []
  for p in procs:
    text, _ = p.communicate(timeout=timeout)
    out.append((p.returncode, text))
  return out


def _claims(workdir) -> dict:
  """Per group, the claim events of claims.jsonl in order: (event, worker, state)."""
  events = collections.defaultdict(list)
  with open(os.path.join(workdir, claims.CLAIMS_LOG)) as f:
    for line in f:
      row = json.loads(line)
      events[row["group"]].append((row["event"], row["worker"], row.get("state")))
  return events


def _losses(workdir, group: str) -> list:
  with open(os.path.join(workdir, "groups", group, "train_log.jsonl")) as f:
    return [(r["step"], r["loss"]) for r in map(json.loads, f)]


def _final_params(workdir, group: str, last: int = 30):
  from ihsweep.runs.checkpoint import RunCheckpoints

  ckpts = RunCheckpoints(os.path.join(workdir, "groups", group, "checkpoints"))
  try:
    step = ckpts.params_steps_saved()[-1]
    assert step == last, ckpts.params_steps_saved()
    import jax

    return jax.tree_util.tree_map(np.asarray, ckpts.restore_params(step))
  finally:
    ckpts.close()


def _assert_same_results(workdir, reference, groups=GROUPS, step: int = 30) -> None:
  import jax

  for g in groups:
    assert _losses(workdir, g) == _losses(reference, g), g
    a, b = _final_params(workdir, g, step), _final_params(reference, g, step)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, a, b)), g


def _reference(tmp_path_factory, devices: int, flags=FLAGS) -> str:
  """The sweep of ``flags`` trained by one worker over ``devices`` CPU devices."""
  work = str(tmp_path_factory.mktemp(f"reference{devices}") / "run")
  flags = [*flags, f"--config.sweep.devices_per_worker={devices}"]
  [(rc, out)] = _finish([_ihsweep("run", f"--workdir={work}", *flags, env=_env(devices))])
  assert rc == 0, out[-3000:]
  return work


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The same sweep trained by one process on one device."""
  return _reference(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def reference_two_devices(tmp_path_factory):
  """... on two devices: a group's batch is then split over both (its mesh is 1 × 2), which
  changes float32 sums at the last bit, so a 2-device worker is compared with this one."""
  return _reference(tmp_path_factory, 2, FLAGS_4)


def _job(work: str, flags: list, processes: int, devices: int) -> list[subprocess.Popen]:
  """``processes`` processes of one jax.distributed job (a localhost coordinator), each with
  ``devices`` CPU devices, running ``ihsweep run`` into ``work``."""
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  return [
    _ihsweep(
      "run",
      f"--workdir={work}",
      *flags,
      env=_env(
        devices,
        IHSWEEP_COORDINATOR=f"localhost:{port}",
        IHSWEEP_NUM_PROCESSES=str(processes),
        IHSWEEP_PROCESS_ID=str(k),
      ),
    )
    for k in range(processes)
  ]


def _wait_for_claim(workdir, group: str, proc, timeout=300) -> None:
  deadline = time.time() + timeout
  while group not in (
    _claims(workdir) if os.path.exists(os.path.join(workdir, claims.CLAIMS_LOG)) else {}
  ):
    assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
    time.sleep(0.2)


def test_four_independent_workers_train_each_group_once_and_take_over_a_killed_one(
  tmp_path, reference
):
  work = str(tmp_path / "run")
  # The first worker takes g000 (the most expensive group) and is SIGKILLed right after it has
  # started its full-state checkpoint at update 20 (the one at 10 is complete by then); three
  # more workers start once it holds g000.
  first = subprocess.Popen(
    [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), "KILL", "20", "g000", "--"]
    + ["run", f"--workdir={work}", *FLAGS],
    cwd=ROOT,
    env=_env(1),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  _wait_for_claim(work, "g000", first)
  procs = [first] + [_ihsweep("run", f"--workdir={work}", *FLAGS, env=_env(1)) for _ in range(3)]
  results = _finish(procs)
  codes = [rc for rc, _ in results]
  assert codes == [-9, 0, 0, 0], [(rc, out[-2000:]) for rc, out in results]
  events = _claims(work)
  assert sorted(events) == GROUPS
  killed = events["g000"]
  # Claimed by the worker that was killed, taken over by another, released done once.
  assert [e for e, _, _ in killed] == ["claimed", "taken over", "released"], killed
  assert killed[0][1] != killed[1][1] and killed[2] == ("released", killed[1][1], "done")
  for g in GROUPS[1:]:
    assert [(e, s) for e, _, s in events[g]] == [("claimed", None), ("released", "done")], g
  workers = {w for g in GROUPS for _, w, _ in events[g]}
  assert len(workers) >= 3  # groups side by side
  for g in GROUPS:
    status = rundir.read_status(work, g)
    assert status["state"] == "done" and status["step"] == 30, status
    assert not os.path.exists(os.path.join(work, "groups", g, claims.CLAIM_FILE))
  assert rundir.read_status(work, "g000")["resumed_from"] in (10, 20)
  _assert_same_results(work, reference)
  with open(os.path.join(work, "sweep.json")) as f:
    assert json.load(f)["cells_by_state"]["done"] == 8


def test_a_file_size_limit_ends_the_sweep_in_one_line_and_a_rerun_resumes(tmp_path, reference):
  """g001's full-state save at update 20 meets a real file-size limit (RLIMIT_FSIZE, as `ulimit
  -f` sets: EFBIG, "File too large"; tests/storage_faults.py): `ihsweep run` ends with exit 75
  and one line, no group recorded failed; the rerun resumes g001 from update 10 and ends with
  the uninterrupted sweep's losses and params."""
  work = str(tmp_path / "run")
  faulty = [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), "EFBIG", "20"]
  r = subprocess.run(
    [*faulty, "g001", "--", "run", f"--workdir={work}", *FLAGS],
    cwd=ROOT, env=_env(1), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert r.returncode == 75, r.stderr[-3000:]
  assert "Traceback" not in r.stderr and "Event loop" not in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith(
    f"ihsweep: file too large writing {work}"
  ) and r.stderr.strip().endswith(
    "; raise the file-size limit (ulimit -f) and rerun the same command to resume"
  ), r.stderr[-3000:]
  states = {g: rundir.read_status(work, g)["state"] for g in GROUPS}
  assert "failed" not in states.values() and states["g001"] != "done", states
  [(rc, out)] = _finish([_ihsweep("run", f"--workdir={work}", *FLAGS, env=_env(1))])
  assert rc == 0, out[-3000:]
  assert rundir.read_status(work, "g001")["resumed_from"] == 10
  _assert_same_results(work, reference)


def test_a_live_claim_is_not_taken_and_a_stale_one_is(tmp_path, monkeypatch):
  work = str(tmp_path)
  os.makedirs(os.path.join(work, "groups", "g000"))
  assert claims.try_claim(work, "g000", ["cpu:0"]) == "claimed"
  claim = claims.read_claim(work, "g000")
  assert claim["worker"] == claims.worker_id() and claim["pid"] == os.getpid()
  # Another worker (a live process on this host) holds it: not taken while it beats.
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    other = {**claim, "worker": "other:1", "pid": sleeper.pid, "heartbeat": time.time()}
    atomic.atomic_write_json(os.path.join(work, "groups", "g000", claims.CLAIM_FILE), other)
    assert claims.try_claim(work, "g000", ["cpu:0"]) is None
    assert not claims.refresh_claim(work, "g000")  # not ours
    monkeypatch.setenv("IHSWEEP_CLAIM_HEARTBEAT_S", "1")
    monkeypatch.setenv("IHSWEEP_CLAIM_STALE_S", "5")
    other["heartbeat"] = time.time() - 6  # silent for longer than the stale limit
    atomic.atomic_write_json(os.path.join(work, "groups", "g000", claims.CLAIM_FILE), other)
    assert claims.try_claim(work, "g000", ["cpu:0"]) == "taken over"
  finally:
    sleeper.kill()
    sleeper.wait()
  # A claim of a dead process on this host is stale at once, whatever its heartbeat.
  dead = {**claim, "worker": "dead:1", "pid": sleeper.pid, "heartbeat": time.time() + 100}
  assert claims.claim_is_stale(dead)
  assert not claims.claim_is_stale({**dead, "host": "another-host"})
  claims.release_claim(work, "g000", "done")
  assert claims.read_claim(work, "g000") is None
  assert [e for e, _, _ in _claims(work)["g000"]] == ["claimed", "taken over", "released"]


def test_process_local_groups_in_one_jax_distributed_job(tmp_path, reference_two_devices):
  """2 processes × 4 CPU devices joined by jax.distributed, each running 2 workers of 2 devices
  side by side (``sweep.devices_per_worker=2``: threads, named /pK/wJ in claims): each trains
  whole groups on its own 2 devices (placement 'worker'); every group once, the same numbers
  as one process with 2 devices, and the checkpoints read back on this test's one device."""
  work = str(tmp_path / "run")
  flags = [*FLAGS_4, "--config.sweep.processes_per_worker=1", "--config.sweep.devices_per_worker=2"]
  procs = _job(work, flags, 2, 4)
  results = _finish(procs)
  assert [rc for rc, _ in results] == [0, 0], [out[-3000:] for _, out in results]
  assert "2 worker(s) of 2 cpu device(s) side by side in each process" in results[0][1]
  events = _claims(work)
  groups = GROUPS[:4]
  assert sorted(events) == groups
  for g in groups:
    assert [(e, s) for e, _, s in events[g]] == [("claimed", None), ("released", "done")], g
  workers = {w for g in groups for _, w, _ in events[g]}
  assert {w.split("/")[1] for w in workers} == {"p0", "p1"}  # both processes trained
  assert {w.split("/")[2] for w in workers} == {"w0", "w1"}  # side by side in a process
  assert {rundir.read_status(work, g)["devices"] for g in groups} == {2}
  for g in groups:  # each group directory marked as a run by the process that trained it
    assert os.path.exists(os.path.join(work, "groups", g, ownership.RUN_MARKER)), g
  _assert_same_results(work, reference_two_devices, groups)


def test_workers_spanning_two_processes_in_one_jax_distributed_job(tmp_path, reference_two_devices):
  """4 processes × 1 CPU device joined by jax.distributed, workers of 2 processes
  (``sweep.processes_per_worker=2``): each pair trains whole groups on a mesh over its 2
  devices, with collectives, barriers and checkpoint managers among the pair only; every group
  once (claimed by a pair's first process), the same numbers as one process with 2 devices."""
  work = str(tmp_path / "run")
  procs = _job(work, [*FLAGS_4, "--config.sweep.processes_per_worker=2"], 4, 1)
  results = _finish(procs)
  assert [rc for rc, _ in results] == [0] * 4, [out[-3000:] for _, out in results]
  events = _claims(work)
  groups = GROUPS[:4]
  assert sorted(events) == groups
  for g in groups:
    assert [(e, s) for e, _, s in events[g]] == [("claimed", None), ("released", "done")], g
  leads = {rundir.read_status(work, g)["worker"].rsplit("/", 1)[1] for g in groups}
  assert leads == {"p0", "p2"}  # both pairs trained, each claiming through its first process
  for g in groups:
    status = rundir.read_status(work, g)
    assert status["devices"] == 2 and status["processes"] in ([0, 1], [2, 3]), status

  workers = {
    r["worker"].split(" ", 1)[1] for r in sweep_status.status_rows(work)
  }  # as status shows
  assert workers == {"with processes 0–1", "with processes 2–3"}, workers
  _assert_same_results(work, reference_two_devices, groups)


def test_phases_in_one_jax_distributed_job(tmp_path):
  """2 processes × 1 CPU device, phases chosen from the groups (``processes_per_worker=0``):
  the B = 1 group cannot use 2 devices, so it runs first on a process-local worker; the B = 4
  group then trains on both processes' devices (phase 2, one mesh over the job). Each group
  once, the same numbers as one process on as many devices."""
  flags = FLAGS[:-3] + ["--grid=train.batch_size=1,4", "--grid=train.context_size=8"]
  work = str(tmp_path / "run")
  procs = _job(work, flags, 2, 1)
  # One process with 2 devices: the B = 1 group on 1 of them, the B = 4 group on both.
  reference = str(tmp_path / "reference")
  [(rc, out)] = _finish([_ihsweep("run", f"--workdir={reference}", *flags, env=_env(2))])
  assert rc == 0, out[-3000:]
  results = _finish(procs)
  assert [rc for rc, _ in results] == [0, 0], [out[-3000:] for _, out in results]
  by_batch = {rundir.read_status(work, g)["batch_size"]: g for g in ("g000", "g001")}
  small, large = by_batch[1], by_batch[4]
  events = _claims(work)
  for g in (small, large):
    assert [(e, s) for e, _, s in events[g]] == [("claimed", None), ("released", "done")], g
  assert rundir.read_status(work, small)["devices"] == 1
  assert "processes" not in rundir.read_status(work, small)  # process-local
  assert rundir.read_status(work, large)["devices"] == 2
  assert rundir.read_status(work, large)["processes"] == [0, 1]
  assert (
    "phase 1: 1 group(s) on 1 worker(s) of 1 cpu device(s) in each process; phase 2: 1 "
    "group(s) on workers of 2 processes × 1 device(s) (sweep.devices_per_worker = 0: auto"
    in results[0][1]
  )
  _assert_same_results(work, reference, [small, large])


def test_a_sweep_made_before_workers_resumes(tiny, tmp_path):
  """A sweep's config.json from before ``sweep.placement`` existed: still resumable (the new
  fields only change how the sweep executes), while a changed training field is refused."""
  from ihsweep.configuration.fields import ConfigError

  cfg = tiny()
  with cfg.unlocked():
    from ihsweep.configuration import fields

    cfg.sweep = fields.default_sweep()
  resume.write_resolved_config(cfg, str(tmp_path))
  path = tmp_path / "config.json"
  old = json.loads(path.read_text())
  del old["sweep"]["placement"], old["sweep"]["wait_to_take_over"]
  path.write_text(json.dumps(old))
  resume.check_resumable(cfg, str(tmp_path))
  cfg.train.lr = 0.5
  with pytest.raises(ConfigError, match="train.lr"):
    resume.check_resumable(cfg, str(tmp_path))


def test_a_process_done_first_waits_for_the_job(tmp_path):
  """2 processes × 1 CPU device joined by jax.distributed, process-local workers, one group:
  the process left with nothing to take waits on the run directory until the group is done,
  instead of exiting into jax.distributed's shutdown barrier (which, after its 300 s timeout,
  aborts every process of the job, the one still training included); its last log line and
  the summary come after the group is done."""
  import datetime
  import re

  flags = FLAGS[:-3] + [
    "--config.train.num_steps=100",
    "--grid=train.batch_size=4",
    "--grid=train.context_size=8",
  ]
  work = str(tmp_path / "run")
  procs = _job(work, [*flags, "--config.sweep.processes_per_worker=1"], 2, 1)
  results = _finish(procs)
  assert [rc for rc, _ in results] == [0, 0], [out[-3000:] for _, out in results]
  status = rundir.read_status(work, "g000")
  assert status["state"] == "done" and status["step"] == 100, status
  updated = datetime.datetime.fromisoformat(status["updated"]).astimezone()  # local, as logs
  done = updated.time().replace(microsecond=0)
  idle = [out for _, out in results if "trained no group" in out]
  assert len(idle) == 1, [out[-2000:] for _, out in results]
  [stamp] = re.findall(
    r"^(\d\d:\d\d:\d\d) INFO ihsweep: worker \S+: trained no group$", idle[0], re.M
  )
  assert datetime.time.fromisoformat(stamp) >= done, (stamp, done)
  assert "cells done: 1" in results[0][1]  # process 0's summary, whichever trained the group


def test_workers_spanning_processes_refuse_part_of_a_process_devices(tmp_path):
  """2 processes × 2 CPU devices, workers of 2 processes, ``mesh.num_devices=1``: a team's mesh
  over one device of each process ended in mismatched collectives (an IndexError in process 1
  while process 0 waited minutes; gloo aborted both once the mesh took both processes'), so it
  is refused before anything compiles, naming the field, its value and what is allowed."""
  work = str(tmp_path / "run")
  procs = _job(
    work, [*FLAGS_4, "--config.sweep.processes_per_worker=2", "--config.mesh.num_devices=1"], 2, 2
  )
  results = _finish(procs, timeout=120)
  for rc, out in results:
    assert rc == 2, out[-3000:]
    assert (
      "mesh.num_devices = 1 is not allowed: 0 or 2 (all of a process's devices) when "
      "workers span processes (sweep.processes_per_worker = 2)"
    ) in out, out[-3000:]
  assert not os.path.exists(os.path.join(work, "groups"))


# Run in each process of the host-fed test: cross-process checks of values (what device_put
# does for a batch passed whole on a mesh over several processes) raise when asked for by any
# thread but the main one, i.e. by the host loader.
_NO_LOADER_COLLECTIVES = """
import sys, threading
from jax.experimental import multihost_utils as m
def guard(name, f):
  def guarded(*args, **kwargs):
    if threading.current_thread() is not threading.main_thread():
      raise AssertionError(f"{name} called from thread {threading.current_thread().name}")
    return f(*args, **kwargs)
  return guarded
m.assert_equal = guard("assert_equal", m.assert_equal)
m.process_allgather = guard("process_allgather", m.process_allgather)
from ihsweep.cli import main
sys.exit(main())
"""


def test_host_fed_text_over_two_processes_equals_one_process(tmp_path):
  """2 processes × 2 CPU devices, one worker spanning both (one global 2 × 2 mesh: E = 2 over
  'ensemble', B = 4 over 'data'), natural text fed by the host loader: each process reads only
  its devices' windows, the loader asks no process for another's values (the guard above fails
  it otherwise), the last call is short (2 of 7 updates, padded on the devices), and the losses
  and final parameters are bitwise those of 1 process × 4 devices."""
  import socket

  rng = np.random.default_rng(0)
  words = "the head copies a token after its earlier occurrence in context".split()
  os.makedirs(tmp_path / "text")
  for i in range(30):
    (tmp_path / "text" / f"d{i}.txt").write_text(" ".join(rng.choice(words, 200)) + "\n")
  flags = FLAGS[:-3] + [
    f"--config.data.files={tmp_path / 'text' / '*.txt'}",
    "--config.data.source=natural",
    "--config.data.loader=host",
    f"--config.data.cache_dir={tmp_path / 'cache'}",
    "--config.model.vocab_size=300",
    "--config.train.steps_per_call=7",
    "--config.sweep.seeds=2",
    "--grid=train.batch_size=4",
    "--grid=train.context_size=16",
  ]
  flags = [f for f in flags if f != "--config.ensemble.size=1"]  # sweep.seeds sets it
  reference = str(tmp_path / "reference")
  [(rc, out)] = _finish([_ihsweep("run", f"--workdir={reference}", *flags, env=_env(4))])
  assert rc == 0, out[-3000:]
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  work = str(tmp_path / "run")
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", _NO_LOADER_COLLECTIVES, "run", f"--workdir={work}", *flags]
      + ["--config.sweep.processes_per_worker=2"],
      cwd=ROOT,
      env=_env(
        2,
        IHSWEEP_COORDINATOR=f"localhost:{port}",
        IHSWEEP_NUM_PROCESSES="2",
        IHSWEEP_PROCESS_ID=str(k),
      ),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for k in range(2)
  ]
  results = _finish(procs)
  assert [rc for rc, _ in results] == [0, 0], [out[-3000:] for _, out in results]
  status = rundir.read_status(work, "g000")
  assert status["devices"] == 4 and status["processes"] == [0, 1], status
  assert "host loader" in results[0][1]
  _assert_same_results(work, reference, ["g000"])


def test_a_paused_worker_keeps_its_group_and_the_sweep_ends_done(tmp_path):
  """A worker stopped (SIGSTOP) past the claims' stale time, then continued: its claim looks
  stale, but it still holds the group's directory, so a second worker leaves the group to it
  (no takeover, no 'failed'); the group ends done, trained once, and both exit 0."""
  from ihsweep.base import atomic

  work = str(tmp_path / "run")
  flags = [f for f in FLAGS if not f.startswith(("--grid", "--config.train.num_steps"))]
  flags += ["--config.train.num_steps=3000", "--config.train.batch_size=4"]
  flags += ["--config.train.context_size=8", "--config.model.d_model=8"]
  env = _env(1, IHSWEEP_CLAIM_HEARTBEAT_S="0.5", IHSWEEP_CLAIM_STALE_S="1.5")
  first = _ihsweep("run", f"--workdir={work}", *flags, env=env)
  group = os.path.join(work, "groups", "g000")
  deadline = time.time() + 300
  while atomic.lock_holder(group) is None:
    assert first.poll() is None and time.time() < deadline, first.communicate()[0][-3000:]
    time.sleep(0.05)
  first.send_signal(signal.SIGSTOP)
  lines = []
  try:
    time.sleep(2.5)  # the claim is now stale by its heartbeat
    second = _ihsweep("run", f"--workdir={work}", *flags, env=env)
    reader = threading.Thread(target=lambda: lines.extend(second.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 300  # until it finds g000's claim stale and its directory held
    while not any("left to it" in line for line in lines):
      assert second.poll() is None and time.time() < deadline, "".join(lines)[-3000:]
      time.sleep(0.1)
  finally:
    first.send_signal(signal.SIGCONT)
  out_first, _ = first.communicate(timeout=600)
  second.wait(timeout=600)
  reader.join(timeout=60)
  assert (first.returncode, second.returncode) == (0, 0), (
    out_first[-2000:],
    "".join(lines)[-2000:],
  )
  events = _claims(work)["g000"]
  assert [e for e, _, _ in events] == ["claimed", "released"], events
  assert events[0][1] == events[1][1] and events[1][2] == "done"
  status = rundir.read_status(work, "g000")
  assert status["state"] == "done" and status["step"] == 3000 and status["attempts"] == 1, status


# 4 groups of one model each and of equal cost (1 or 2 heads × learned or rotary positions), with
# B = 2: a mesh over at most 2 devices (E · B), so that on 8 devices one worker trains them one
# after another on 2 devices each (6 idle) and the auto layout runs 4 workers of 2 side by side
# (with groups of unequal cost, fewer workers of 4 may finish as early, and auto takes them).
FLAGS_B2 = [f for f in FLAGS if not f.startswith(("--grid", "--config.model.n_heads"))] + [
  "--config.train.batch_size=2",
  "--config.train.context_size=16",
  "--config.model.d_model=8",
  "--grid=model.n_heads=1,2",
  "--grid=model.pos_encoding=learned,rotary",
]


@pytest.fixture(scope="module")
def one_by_eight(tmp_path_factory):
  """FLAGS_B2's sweep by one worker over 8 CPU devices (each group on 2 of them)."""
  return _reference(tmp_path_factory, 8, FLAGS_B2)


def test_the_auto_layout_trains_groups_side_by_side_in_one_process_and_resumes(
  tmp_path_factory, one_by_eight
):
  """`ihsweep run` on 8 CPU devices with the default layout (``sweep.devices_per_worker`` = 0,
  auto): the plan's model chooses 4 workers of 2 devices in one process (threads, named
  /w0-/w3 in claims); the process is SIGKILLed while g000 saves its state at update 20, with
  other groups mid-way (killed together); the rerun resumes every group, and each group's
  losses and params equal the 1 × 8 run's (one worker over the 8 devices, each group on 2 of
  them: the same program over the same inputs on a mesh of the same shape) bit for bit."""
  work = str(tmp_path_factory.mktemp("auto") / "run")
  killed = subprocess.run(
    [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), "KILL", "20", "g000", "--"]
    + ["run", f"--workdir={work}", *FLAGS_B2],
    cwd=ROOT, env=_env(8), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert killed.returncode == -9, killed.stdout[-3000:] + killed.stderr[-3000:]
  first = _claims(work)
  claimed = {w for g in first for e, w, _ in first[g] if e == "claimed"}
  assert len(claimed) >= 2 and all(w.rsplit("/", 1)[1] in {"w0", "w1", "w2", "w3"} for w in claimed)
  assert len({w.rsplit("/", 1)[0] for w in claimed}) == 1  # one process
  [(rc, out)] = _finish([_ihsweep("run", f"--workdir={work}", *FLAGS_B2, env=_env(8))])
  assert rc == 0, out[-3000:]
  assert (
    "4 worker(s) of 2 cpu device(s) side by side in this process (sweep.devices_per_worker = "
    "0: auto" in out
  ), out[:3000]
  # a worker with nothing left ends: its siblings' groups end with this process, no takeover
  assert "nothing left to take" not in out, out[-3000:]
  groups = GROUPS[:4]
  for g in groups:
    status = rundir.read_status(work, g)
    assert status["state"] == "done" and status["step"] == 30 and status["devices"] == 2, status
    assert rundir.read_status(one_by_eight, g)["devices"] == 2
  assert rundir.read_status(work, "g000")["resumed_from"] in (10, 20)
  _assert_same_results(work, one_by_eight, groups)


def test_a_stop_request_stops_every_worker_of_the_process_and_a_rerun_resumes(
  tmp_path, one_by_eight
):
  """SIGTERM (a stop request) to a process of 4 workers of 2 devices (the auto layout), sent
  while g000 saves its state at update 10: every worker checkpoints its group after its current
  call (g000's at 10 or 20 of 30) and the process exits 143 with one line; no group is
  recorded failed; the rerun resumes them to the 1 × 8 run's numbers bit for bit."""
  work = str(tmp_path / "run")
  stopped = subprocess.run(
    [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), "TERM", "10", "g000", "--"]
    + ["run", f"--workdir={work}", *FLAGS_B2],
    cwd=ROOT, env=_env(8), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert stopped.returncode == 143, stopped.stdout[-3000:] + stopped.stderr[-3000:]
  assert "Traceback" not in stopped.stdout + stopped.stderr, stopped.stderr[-3000:]
  assert stopped.stderr.strip().splitlines()[-1] == (
    f"interrupted: state saved; rerun the same command to resume ({work})"
  )
  states = {g: rundir.read_status(work, g)["state"] for g in GROUPS[:4]}
  assert states["g000"] == "interrupted" and "failed" not in states.values(), states
  # the handler runs on the main thread while g000's worker goes on: it sees the request before
  # its next call or after it
  stop = rundir.read_status(work, "g000")["step"]
  assert stop in (10, 20)
  [(rc, out)] = _finish([_ihsweep("run", f"--workdir={work}", *FLAGS_B2, env=_env(8))])
  assert rc == 0, out[-3000:]
  assert rundir.read_status(work, "g000")["resumed_from"] == stop
  _assert_same_results(work, one_by_eight, GROUPS[:4])


# FLAGS_B2 over a third axis of equal cost (Adam's b2): 8 groups, which the auto layout trains
# as 4 workers of 2 devices side by side; 200 updates, so that a paused process is mid-training.
FLAGS_8 = [
  f for f in FLAGS_B2 if not f.startswith(("--config.train.num_steps", "--config.checkpoint.state"))
] + [
  "--config.train.num_steps=200",
  "--config.checkpoint.state_every_steps=50",
  "--grid=train.b2=0.95,0.99",
]


def _locks_held(work: str, pid: int) -> list[str]:
  """The files under ``work`` on which ``pid`` holds an flock, from /proc/locks."""
  inodes = {}
  for here, _, files in os.walk(work):
    for name in files:
      with contextlib.suppress(OSError):
        inodes[os.stat(os.path.join(here, name)).st_ino] = os.path.relpath(
          os.path.join(here, name), work
        )
  held = []
  with open("/proc/locks") as f:
    for line in f:
      parts = line.split()
      if "FLOCK" in parts and str(pid) in parts:
        inode = int(parts[parts.index(str(pid)) + 1].rsplit(":", 1)[1])
        if inode in inodes:
          held.append(inodes[inode])
  return sorted(held)


def test_a_paused_process_never_stops_another_and_a_stop_ends_a_waiting_one(tmp_path_factory):
  """The auto layout (4 workers of 2 of 8 CPU devices in one process) on 8 groups: the process
  is SIGSTOPped mid-training (claims take no lock: /proc/locks shows it holding only its 4
  groups' directories), and a second `ihsweep run` on the same directory trains the 4 groups
  the paused one does not hold, saying why it leaves each of the others, then waits to take
  them over; a third, asked to stop (SIGTERM) while it waits, exits within seconds; after
  SIGCONT the first two exit 0, every group is claimed once and done once, and each equals an
  uninterrupted run's losses and params bit for bit."""
  work = str(tmp_path_factory.mktemp("paused") / "run")
  env = _env(8, IHSWEEP_CLAIM_HEARTBEAT_S="0.5", IHSWEEP_CLAIM_STALE_S="3")
  first = _ihsweep("run", f"--workdir={work}", *FLAGS_8, env=env)
  out_first = []
  threading.Thread(target=lambda: out_first.extend(first.stdout), daemon=True).start()
  deadline = time.time() + 600
  # until its 4 workers train: each holds a claim and its group's directory
  while sum(atomic.lock_holder(rundir.group_dir(work, g)) is not None for g in GROUPS) < 4:
    assert first.poll() is None and time.time() < deadline, "".join(out_first)[-3000:]
    time.sleep(0.05)
  first.send_signal(signal.SIGSTOP)
  lines, third = [], None
  try:
    mine = sorted(g for g in GROUPS if claims.read_claim(work, g) is not None)
    assert len(mine) == 4, mine
    held = [f for f in _locks_held(work, first.pid) if not f.startswith((".cells", ".sweep"))]
    assert held == [f"groups/{g}/{atomic.LOCK_FILE}" for g in mine], held
    second = _ihsweep("run", f"--workdir={work}", *FLAGS_8, env=env)
    reader = threading.Thread(target=lambda: lines.extend(second.stdout), daemon=True)
    reader.start()
    rest = sorted(set(GROUPS) - set(mine))
    # the second trains the rest while the first stays paused, then waits on the paused one
    while "nothing left to take: waiting while other workers hold" not in "".join(lines) or not all(
      rundir.read_status(work, g)["state"] == "done" for g in rest
    ):
      assert second.poll() is None and time.time() < deadline, "".join(lines)[-3000:]
      time.sleep(0.2)
    why = "\n".join(line for line in lines if "left to it" in line)
    for g in mine:  # why it leaves each of the paused one's groups, naming the worker
      assert re.search(rf"group {g}: (held|not answering): .*{first.pid}.*left to it", why), why
    third = _ihsweep("run", f"--workdir={work}", *FLAGS_8, env=env)
    third_lines = []
    threading.Thread(target=lambda: third_lines.extend(third.stdout), daemon=True).start()
    while "nothing left to take" not in "".join(third_lines):
      assert third.poll() is None and time.time() < deadline, "".join(third_lines)[-3000:]
      time.sleep(0.2)
    third.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    third.wait(timeout=60)
    assert time.monotonic() - asked < 10, time.monotonic() - asked
  finally:
    first.send_signal(signal.SIGCONT)
    if third is not None and third.poll() is None:
      third.kill()
  assert second.wait(timeout=600) == 0 and first.wait(timeout=600) == 0, "".join(lines)[-3000:]
  events = _claims(work)
  for g in GROUPS:
    assert [e for e, _, _ in events[g]] == ["claimed", "released"], (g, events[g])
    assert events[g][1][2] == "done"
    status = rundir.read_status(work, g)
    assert status["state"] == "done" and status["step"] == 200 and status["attempts"] == 1
  reference = _reference(tmp_path_factory, 8, FLAGS_8)
  _assert_same_results(work, reference, GROUPS, step=200)


def _counted(work: str, out: str, flags: list, env: dict) -> subprocess.Popen:
  """``ihsweep run`` under tests/counting.py, its counts written to ``out``."""
  return subprocess.Popen(
    [sys.executable, os.path.join(ROOT, "tests", "counting.py"), out, "--", "run"]
    + [f"--workdir={work}", *flags],
    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
  )  # fmt: skip


def test_each_group_is_resolved_checked_and_built_once_by_workers_side_by_side(tmp_path):
  """4 thread workers in one process (the auto layout on 8 CPU devices), then a jax.distributed
  job of 2 processes × 2 workers (4 devices each): per process each group is resolved, its
  memory checked and its memory setting chosen once (shared by the process's workers:
  worker_layout.Resolutions), and over the whole sweep its programs are built once (by the
  worker that trains it; nothing compiled ahead for a group a sibling then takes)."""
  groups = GROUPS[:4]
  work, out = str(tmp_path / "threads"), str(tmp_path / "threads.json")
  [(rc, text)] = _finish([_counted(work, out, FLAGS_B2, _env(8))])
  assert rc == 0, text[-3000:]
  assert "4 worker(s) of 2 cpu device(s) side by side" in text
  counts = json.load(open(out))
  for what in ("resolve", "check_possible", "resolve_memory", "build"):
    assert counts[what] == {g: 1 for g in groups}, (what, counts)

  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  work = str(tmp_path / "job")
  flags = [*FLAGS_B2, "--config.sweep.devices_per_worker=2"]
  procs = [
    _counted(
      work,
      str(tmp_path / f"p{k}.json"),
      flags,
      _env(
        4,
        IHSWEEP_COORDINATOR=f"localhost:{port}",
        IHSWEEP_NUM_PROCESSES="2",
        IHSWEEP_PROCESS_ID=str(k),
      ),  # fmt: skip
    )
    for k in range(2)
  ]
  results = _finish(procs)
  assert [rc for rc, _ in results] == [0, 0], [t[-3000:] for _, t in results]
  assert all("2 worker(s) of 2 cpu device(s) side by side in each process" in t for _, t in results)
  per_process = [json.load(open(tmp_path / f"p{k}.json")) for k in range(2)]
  for counts in per_process:
    for what in ("resolve", "check_possible", "resolve_memory"):
      assert counts[what] == {g: 1 for g in groups}, (what, counts)
  built = collections.Counter()
  for counts in per_process:
    built.update(counts.get("build", {}))
  assert built == {g: 1 for g in groups}, per_process
  assert {g: rundir.read_status(work, g)["state"] for g in groups} == {g: "done" for g in groups}


def test_two_workers_meeting_different_storage_faults_are_both_named(tmp_path):
  """4 workers side by side (the auto layout on 8 CPU devices): g000's full-state save at
  update 50 meets a read-only filesystem and g001's an I/O error. Each fault is logged at once
  with its worker and group, each group's status.json records it, the other workers stop at
  their next group boundary (none claims a group after the fault), and the process ends
  with exit 75 after naming both workers' errors; groups nobody started stay pending."""
  work = str(tmp_path / "run")
  faulty = [sys.executable, os.path.join(ROOT, "tests", "storage_faults.py"), "EROFS,EIO", "50"]
  r = subprocess.run(
    [*faulty, "g000,g001", "--", "run", f"--workdir={work}", *FLAGS_8],
    cwd=ROOT, env=_env(8), capture_output=True, text=True, timeout=900,
  )  # fmt: skip
  assert r.returncode == 75, r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  ended = {
    g: re.search(rf"worker \S+/(w\d) ended in group {g}: StorageFault: (.*)", r.stderr)
    for g in ("g000", "g001")
  }
  assert all(ended.values()), r.stderr[-3000:]
  assert ended["g000"].group(1) != ended["g001"].group(1)  # two workers, each named
  assert ended["g000"].group(2).startswith("read-only file system writing"), ended["g000"].group(2)
  assert ended["g001"].group(2).startswith("input/output error writing"), ended["g001"].group(2)
  for g in ("g000", "g001"):
    status = rundir.read_status(work, g)
    assert status["state"] == "interrupted" and "storage fault" in status["error"], status
    assert re.search(rf"group {g}: worker \S+ met a storage fault", r.stderr)
  # no worker starts a group once a fault has stopped its siblings (a group claimed before, by a
  # worker that finished its first one early under load, may run to its end)
  with open(os.path.join(work, claims.CLAIMS_LOG)) as f:
    rows = [json.loads(line) for line in f]
  stopped = min(
    r["time"] for r in rows if r["event"] == "released" and r.get("state") == "interrupted"
  )
  late = {r["group"] for r in rows if r["event"] == "claimed" and r["time"] > stopped}
  for g in late:  # claimed in the instant the fault stopped it: given back untouched
    assert [r.get("state") for r in rows if r["group"] == g][-1] == "pending", rows
  states = {g: rundir.read_status(work, g)["state"] for g in GROUPS}
  assert "failed" not in states.values() and "pending" in states.values(), states
