"""The runner's device choice and process-local training inside a jax.distributed job."""

import json
import os
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import CPU_COMPILE_FLAGS

from ihsweep.base import sharding
from ihsweep.runs import checkpoint
from ihsweep.training import group_build, hooks, progress, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One attention-only layer (its evaluation compiles fastest), evaluation every 10 updates, full
# state every 10, params at 0 and 20.
RUN = {
  "model.n_layers": 1,
  "model.d_mlp": 0,
  "train.num_steps": 20,
  "train.steps_per_call": 10,
  "eval.every_steps": 10,
  "eval.n_probes": 8,
  "eval.n_sequences": 4,
  "checkpoint.state_every_steps": 10,
}


@pytest.mark.parametrize(
  "n_models,batch,n_devices,expect",
  [
    (2, 8, 4, 4),  # (ensemble 2, data 2): all
    (1, 1, 4, 1),  # one model, one sequence: one device
    (3, 6, 4, 3),  # 4 cannot split E = 3, B = 6; 3 can (3, 1)
    (2, 3, 4, 3),  # 4: e | 2 and 4 / e | 3 fails; 3: (1, 3)
    (8, 8, 2, 2),  # fewer devices than the ensemble could use
  ],
)
def test_usable_devices_is_the_longest_prefix_the_mesh_accepts(n_models, batch, n_devices, expect):
  devices = jax.devices()[:n_devices]
  got = sharding.usable_devices(n_models, batch, devices)
  assert got == devices[:expect]
  e, d = sharding.mesh_shape(n_models, batch, len(got))
  assert n_models % e == 0 and batch % d == 0
  if expect < n_devices:
    with pytest.raises(sharding.MeshError):
      sharding.mesh_shape(n_models, batch, expect + 1)


def test_group_devices(tiny):
  devices = jax.devices()
  assert runner.group_devices(tiny(**{"ensemble.size": 2})) == devices  # (2, 2)
  assert runner.group_devices(tiny(**{"ensemble.size": 3, "train.batch_size": 6})) == devices[:3]
  assert runner.group_devices(tiny(**{"mesh.num_devices": 2})) == devices[:2]
  assert (
    runner.group_devices(tiny(**{"ensemble.size": 1, "train.batch_size": 1}), devices[2:])
    == devices[2:3]
  )
  assert runner.group_devices(tiny(), local=True) == jax.local_devices()


def test_a_group_smaller_than_the_devices_trains_on_part_of_them(tiny, tmp_path):
  """E = 1, B = 2 on 4 devices: its mesh is 2 devices (data axis 2), not a refusal."""
  cfg = tiny(**{**RUN, "ensemble.size": 1, "train.batch_size": 2, "eval.every_steps": 0})
  out = runner.fit(cfg, str(tmp_path), progress=False, devices=jax.devices())
  assert out.step == 20
  assert len(out.state.params["embed"]["embedding"].sharding.device_set) == 2


# Run by each process of the two-process job: trains its own group with process-local
# checkpoints, then runs fit again (a resume that restores the final state and trains nothing).
CHILD = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from conftest import tiny_config  # sets XLA_FLAGS for 4 devices: replaced below
os.environ["XLA_FLAGS"] = os.environ["CHILD_XLA_FLAGS"]
import jax
from ihsweep.training import runner
from ihsweep.base import sharding
sharding.initialize_distributed()
overrides, workdir = json.loads(sys.argv[2]), sys.argv[3]
cfg = tiny_config(**overrides[jax.process_index()])
out = runner.fit(cfg, workdir % jax.process_index(), progress=False,
                 devices=jax.local_devices(), local=True)
again = runner.fit(cfg, workdir % jax.process_index(), progress=False,
                   devices=jax.local_devices(), local=True)
print("RESULT " + json.dumps({"process": jax.process_index(), "count": jax.process_count(),
                              "local_devices": len(jax.local_devices()), "step": out.step,
                              "again": [again.resumed_from, again.step]}), flush=True)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _read(workdir, name):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def test_process_local_groups_in_a_two_process_job_equal_one_process(tiny, tmp_path):
  """Two processes of one jax.distributed job (2 CPU devices each) train one group each on
  their own devices (``local=True``), with their own checkpoint managers; each group's logs
  and checkpoints equal a one-process fit of it on 2 devices exactly: the same program over the
  same inputs on a mesh of the same shape (ensemble 2), so the same float32 numbers bit for
  bit. The checkpoints are read back here, in one process."""
  overrides = [{**RUN, "seed": 0}, {**RUN, "seed": 2, "train.lr": 1e-2}]
  for p, o in enumerate(overrides):
    runner.fit(tiny(**o), str(tmp_path / f"ref{p}"), progress=False, devices=jax.devices()[:2])
  flags = f"--xla_force_host_platform_device_count=2 {CPU_COMPILE_FLAGS}"
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "CHILD_XLA_FLAGS": flags,
    "IHSWEEP_COORDINATOR": f"localhost:{_free_port()}",
    "IHSWEEP_NUM_PROCESSES": "2",
    "IHSWEEP_HEARTBEAT_S": "20",
  }
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", CHILD, ROOT, json.dumps(overrides), str(tmp_path / "group%d")],
      cwd=ROOT,
      env={**env, "IHSWEEP_PROCESS_ID": str(p)},
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for p in range(2)
  ]
  results = []
  for proc in procs:
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-4000:]
    results.append(json.loads(text.split("RESULT ")[-1]))
  for p, r in enumerate(results):
    assert r == {"process": p, "count": 2, "local_devices": 2, "step": 20, "again": [20, 20]}

  for p in range(2):
    group, ref = str(tmp_path / f"group{p}"), str(tmp_path / f"ref{p}")
    assert _read(group, "train_log.jsonl") == _read(ref, "train_log.jsonl")
    assert _read(group, "metrics.jsonl") == _read(ref, "metrics.jsonl")
    got = checkpoint.RunCheckpoints(os.path.join(group, "checkpoints"))
    want = checkpoint.RunCheckpoints(os.path.join(ref, "checkpoints"))
    assert got.params_steps_saved() == [0, 20] and got.latest_state_step() == 20
    assert got.step_metadata(20)["cells"] == want.step_metadata(20)["cells"]
    for a, b in zip(
      jax.tree_util.tree_leaves(got.restore_params(20)),
      jax.tree_util.tree_leaves(want.restore_params(20)),
    ):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    got.close()
    want.close()
  # The two groups are different models (their seeds and learning rates differ).
  assert _read(str(tmp_path / "group0"), "train_log.jsonl") != _read(
    str(tmp_path / "group1"), "train_log.jsonl"
  )


# Run in a fresh process with an empty persistent cache in $IHSWEEP_CACHE/xla: precompile a
# group, fit it, then fit a group of other shapes without precompiling (the control), then
# precompile and fit a group on a host-fed corpus. Prints, per phase, the programs JAX compiled
# (persistent-cache misses) and loaded (hits).
CACHE_CHILD = r"""
import dataclasses, json, logging, os, re, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from conftest import tiny_config
from ihsweep.workers import compile_cache
from ihsweep.training import runner
path = compile_cache.enable()
events = []

class Record(logging.Handler):
  def emit(self, record):
    m = re.match(r"(Persistent compilation cache hit|PERSISTENT COMPILATION CACHE MISS) for "
                 r"'([^']+)'", record.getMessage())
    if m:
      events.append(("hit" if m.group(1).startswith("Persistent") else "miss", m.group(2)))

compiler = logging.getLogger("jax._src.compiler")
compiler.setLevel(logging.DEBUG)
compiler.addHandler(Record())
phases, timings = {}, {}

def phase(name, fn):
  events.clear()
  out = fn()
  phases[name] = list(events)
  return out

run, workdir = json.loads(sys.argv[2]), sys.argv[3]
seconds = phase("precompile", lambda: runner.precompile(tiny_config(**run)))
out = phase("fit", lambda: runner.fit(tiny_config(**run), workdir + "/a", progress=False))
timings["warm"] = dataclasses.asdict(out.timings)
other = {**run, "train.context_size": 16, "model.max_context": 16}
out = phase("control", lambda: runner.fit(tiny_config(**other), workdir + "/b", progress=False))
timings["cold"] = dataclasses.asdict(out.timings)
# A corpus fed from the host (batches [E, K, B, C + 1] in the corpus's dtype).
host = {**run, "data.source": "natural", "data.files": sys.argv[4], "data.cache_dir": sys.argv[5],
        "data.val_fraction": 0.2, "model.vocab_size": 300, "data.loader": "host"}
phase("host precompile", lambda: runner.precompile(tiny_config(**host)))
phase("host fit", lambda: runner.fit(tiny_config(**host), workdir + "/c", progress=False))
print("RESULT " + json.dumps({"path": path, "phases": phases, "seconds": seconds,
                              "timings": timings}), flush=True)
"""


def test_precompile_fills_the_persistent_cache_that_fit_then_reads(tmp_path):
  """``compile_cache.enable`` puts the cache in $IHSWEEP_CACHE/xla; ``precompile`` compiles the
  init, train and evaluation programs there; the ``fit`` of the same config after it compiles
  none of them (each is a persistent-cache hit), while a fit of other shapes without
  ``precompile`` compiles its own (misses: the logging sees compilations). The same for a
  corpus fed from the host."""
  env = {
    **os.environ,
    "IHSWEEP_CACHE": str(tmp_path / "cache"),
    "JAX_COMPILATION_CACHE_DIR": "",
  }  # no cache chosen by the user (conftest's is off)
  from test_natural import write_corpus

  files = write_corpus(str(tmp_path / "text"))
  r = subprocess.run(
    [
      sys.executable,
      "-c",
      CACHE_CHILD,
      ROOT,
      json.dumps(RUN),
      str(tmp_path / "runs"),
      files,
      str(tmp_path / "corpora"),
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  out = json.loads(r.stdout.split("RESULT ")[-1])
  assert out["path"] == str(tmp_path / "cache" / "xla") and os.listdir(out["path"])
  assert set(out["seconds"]) == {"init", "train", "eval", "probes"}
  programs = {
    "init": "jit_init_state",
    "train": "jit_train_call",
    "eval": "jit_evaluate",
    "probes": "jit_one_model",
  }  # the markov_chain sampler of held-out sequences
  pre, fit_, control = (
    [tuple(e) for e in out["phases"][k]] for k in ("precompile", "fit", "control")
  )
  for name in programs.values():
    assert ("miss", name) in pre, (name, pre)  # compiled by precompile
    assert ("hit", name) in fit_, (name, fit_)  # loaded by fit
    assert ("miss", name) not in fit_, (name, fit_)  # not compiled again
    assert ("miss", name) in control, (name, control)  # other shapes: compiled by fit
  pre, fit_ = ([tuple(e) for e in out["phases"][f"host {k}"]] for k in ("precompile", "fit"))
  for name in ("jit_init_state", "jit_train_call", "jit_evaluate"):
    assert ("miss", name) in pre and ("hit", name) in fit_ and ("miss", name) not in fit_, (
      name,
      pre,
      fit_,
    )
  for t in out["timings"].values():
    assert t["total_s"] == pytest.approx(t["setup_s"] + t["train_s"])
    assert t["setup_s"] > 0 and t["train_s"] > 0


class FakeDevice:
  """A device on a fake clock (``progress._progress_clock``): every update takes 1 s; a call
  starts when the previous one has ended (or at its dispatch) and the host's own work takes no
  time, so the clock moves only when the host waits for a call — reading its values, saving
  the state it makes, or reading an evaluation dispatched after it. Rates read off it are
  exact."""

  def __init__(self, monkeypatch):
    self.now = self.busy_until = 0.0
    self.ends = {}  # id(dispatched values) -> (values, the fake time they are ready)
    monkeypatch.setattr(progress, "_progress_clock", lambda: self.now)
    make_program = group_build.GroupBuild.train_program

    def train_program(group):
      program = make_program(group)

      def call(state, hp, data, k):
        state, metrics = program(state, hp, data, k)
        self.busy_until = max(self.now, self.busy_until) + k
        self.ends[id(metrics)] = (metrics, self.busy_until)
        return state, metrics

      return call

    evaluation = hooks.Evaluate.dispatch

    def evaluate(hook, step, state):
      item = evaluation(hook, step, state)
      self.ends[id(item[2])] = (item[2], self.busy_until)  # ready after the calls before it
      return item

    to_host, block = sharding.to_host, jax.block_until_ready
    monkeypatch.setattr(group_build.GroupBuild, "train_program", train_program)
    monkeypatch.setattr(hooks.Evaluate, "dispatch", evaluate)
    monkeypatch.setattr(sharding, "to_host", lambda tree: (self.wait(tree), to_host(tree))[1])
    monkeypatch.setattr(jax, "block_until_ready", lambda tree: (self.wait(tree), block(tree))[1])
    for name in ("save_params", "save_state"):  # they read the state the last call made
      save = getattr(checkpoint.RunCheckpoints, name)

      def waiting(ckpts, *args, _save=save, **kwargs):
        self.wait()
        return _save(ckpts, *args, **kwargs)

      monkeypatch.setattr(checkpoint.RunCheckpoints, name, waiting)

  def wait(self, tree=None) -> None:
    """The host waits for ``tree``'s values (None: for every call dispatched so far)."""
    if tree is None:
      self.now = max(self.now, self.busy_until)
    elif id(tree) in self.ends:
      self.now = max(self.now, self.ends[id(tree)][1])


def test_a_resumed_run_reports_the_speed_and_eta_of_an_uninterrupted_one(
  tiny, tmp_path, monkeypatch
):
  """The progress's rate and ETA (``progress.Throughput``, read after each call) on a fake device
  of 1 s per update: an uninterrupted run of 60 updates and the same run resumed from its
  checkpoints at 40 and at 50 (what a kill leaves) report 1 update/s and the same ETAs at the
  same updates. Start-up (compiling, the first call) is outside the rates. Before the fix, the
  origin of the rate was read after the second call had run (the final params save waits for
  it), so a resume with two calls left divided that call's tokens by no time at all."""
  FakeDevice(monkeypatch)
  seen = []
  on_call = hooks.Progress.on_call

  def record(bar, row, loss):
    on_call(bar, row, loss)
    seen.append(bar.rate.snapshot())

  monkeypatch.setattr(hooks.Progress, "on_call", record)
  cfg = tiny(**{
    **RUN,
    "train.num_steps": 60,
    "train.steps_per_call": 5,
    "eval.every_steps": 20,
    "checkpoint.keep_state": 10,
  })  # fmt: skip
  tokens_per_update = 2 * 8 * 32  # E · B · C
  work = tmp_path / "run"
  runs = {}
  for cut in (None, 40, 50):
    if cut is not None:  # the kill: the state saves after `cut` and the final params are lost
      for step in range(cut + 10, 61, 10):
        shutil.rmtree(work / "checkpoints" / "state" / str(step))
      shutil.rmtree(work / "checkpoints" / "params" / "60")
    seen.clear()
    out = runner.fit(cfg, str(work), progress=False)
    assert out.resumed_from == cut and out.step == 60
    runs[cut] = (out, {s["step"]: s for s in seen if s["updates_per_s"] == s["updates_per_s"]})

  full, at = runs[None]
  assert out.timings.compile_s >= 0
  assert full.updates_per_s == pytest.approx(1.0)
  assert full.tokens_per_s == pytest.approx(tokens_per_update)
  for cut in (40, 50):
    out, resumed = runs[cut]
    assert out.updates_per_s == pytest.approx(full.updates_per_s, rel=0.2), cut
    assert out.tokens_per_s == pytest.approx(full.tokens_per_s, rel=0.2), cut
    assert resumed and min(resumed) > cut + 5  # the first call after the resume is not timed
    for step, snap in resumed.items():
      assert snap["updates_per_s"] == pytest.approx(at[step]["updates_per_s"], rel=0.2), (cut, step)
      assert snap["eta_s"] == pytest.approx(at[step]["eta_s"], rel=0.2, abs=1.0), (cut, step)
      assert snap["eta_s"] == pytest.approx((60 - step) / snap["updates_per_s"])


def test_log_lines_are_written_above_an_open_bar(capsys):
  """A console log handler writes through ``tqdm.write`` inside ``logs_above_bars``: the bar
  is cleared first, so the line starts a line of its own instead of running into the bar's
  text; the handler's stream is restored after."""
  import logging

  from tqdm import tqdm

  handler = logging.StreamHandler(sys.stderr)
  logger = logging.getLogger("ihsweep.test_bars")
  logging.getLogger().addHandler(handler)
  try:
    for above in (False, True):
      with progress.logs_above_bars(above), tqdm(total=10, desc="bar", mininterval=0) as bar:
        bar.update(3)
        logger.warning("a line from the log %s", above)
        bar.update(3)
      before = capsys.readouterr().err.split(f"a line from the log {above}")[0]
      assert (before[-1] in "\r\n") == above, repr(before[-40:])
    assert handler.stream is sys.stderr
  finally:
    logging.getLogger().removeHandler(handler)
