"""``ihsweep plan`` and ``ihsweep run`` decide alike (issue 57, item 3): a group that ``run``
refuses on a process of N devices is refused by ``plan --devices=N`` on this session's 4, and one
it accepts is planned, for N below and above 4, with sweep.devices_per_worker given or auto;
both sides of each boundary, with the same words. ``ihsweep train`` refuses the sweep.* fields
it never reads.

The plans run in this process (``cli.main``); each config is a file of its own (absl defines a
``--config.FIELD`` override once per process). ``run`` runs in a child process of 2 or 8 CPU
devices, up to the point where it would start its workers (``sweep._run_worker``): what it
decides before its run directory holds anything."""

import json
import os
import subprocess
import sys

import pytest

from ihsweep import cli
from ihsweep.commands import flags as flags_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = """from configs import default


def get_config():
  c = default.get_config("tiny")
  c.train.num_steps = 20
  for path, value in {overrides!r}.items():
    *parents, name = path.split(".")
    node = c
    for part in parents:
      node = node[part]
    node[name] = value
  return c
"""

GA, CHUNK = "train.gradient_accumulation_steps", "ensemble.vmap_chunk"
D, MESH = "sweep.devices_per_worker", "mesh.num_devices"
# name: (overrides, N devices (plan --devices=N; run on a process of N), refused field or None)
CASES = {
  # k divides a device's share of B = 8: 4 on 2 devices (E = 1: mesh 1 × 2); this machine's 4
  # devices would leave 2 (the plan refused it, "a data axis of 4 devices")
  "accumulation 4 on 2": ({"ensemble.size": 1, GA: 4}, 2, None),
  "accumulation 8 on 2": ({"ensemble.size": 1, GA: 8}, 2, GA),
  # E = 8 on 2 devices: 4 models per device (on 4 devices, 2: the plan refused chunk 4)
  "chunk 4 on 2": ({"ensemble.size": 8, CHUNK: 4}, 2, None),
  "chunk 3 on 2": ({"ensemble.size": 8, CHUNK: 3}, 2, CHUNK),
  # mesh.num_devices fixes a worker: D must be 0 or that many (the plan dropped D)
  "D 2 with a mesh of 2": ({D: 2, MESH: 2}, 8, None),
  "D 4 with a mesh of 2": ({D: 4, MESH: 2}, 8, D),
  "D 4 with a mesh of 4": ({D: 4, MESH: 4}, 8, None),
  "D 2 with a mesh of 4": ({D: 2, MESH: 4}, 8, D),
  # D given: a group is validated on a worker's 2 devices, not the process's 8
  "accumulation 4 on workers of 2": ({"ensemble.size": 1, D: 2, GA: 4}, 8, None),
  "accumulation 8 on workers of 2": ({"ensemble.size": 1, D: 2, GA: 8}, 8, GA),
}
# A device memory at the bound a group needs on 2 devices, and a byte below it
MEMORY = {"memory at the bound on 2": 0, "memory a byte short on 2": -1}


class _Reached(Exception):
  """The measured plan got past its checks to the timing (``placement.predict``)."""


def _write(tmp_path, name: str, overrides: dict) -> str:
  path = tmp_path / ("case_" + "".join(c if c.isalnum() else "_" for c in name) + ".py")
  path.write_text(CONFIG.format(overrides=overrides))
  return str(path)


def _plan(capsys, *args) -> tuple[int, str]:
  flags_lib.FLAGS.unparse_flags()  # in one process, absl keeps the last call's values otherwise
  code = cli.main(["ihsweep", "plan", *args])
  err = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]
  return code, "\n".join(err)


def _load(path: str):
  """The config of a case's file (its get_config())."""
  import importlib.util

  spec = importlib.util.spec_from_file_location("case_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


RUN = """
import importlib.util, json, os, sys
from ihsweep.configuration.fields import ConfigError
from ihsweep.workers import sweep
import jax

assert len(jax.local_devices()) == int(sys.argv[1])
sweep._run_worker = lambda *args, **kwargs: None  # decided: nothing is trained
out = {}
for name, path, memory, work in json.loads(sys.argv[2]):
  os.environ.pop("IHSWEEP_DEVICE_MEMORY", None)
  if memory:
    os.environ["IHSWEEP_DEVICE_MEMORY"] = str(memory)
  spec = importlib.util.spec_from_file_location("case_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  try:
    sweep.run(module.get_config(), work, progress=False)
    out[name] = None
  except ConfigError as e:
    out[name] = [e.field, str(e)]
print(json.dumps(out))
"""


def _run(n_devices: int, cases: list) -> dict:
  """``{name: None (accepted) or [field, message]}`` from ``sweep.run`` on a process of
  ``n_devices`` CPU devices, for ``cases`` of ``(name, config file, device memory or 0,
  workdir)``."""
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={n_devices}",
  }
  env.pop("IHSWEEP_DEVICE_MEMORY", None)
  r = subprocess.run(
    [sys.executable, "-c", RUN, str(n_devices), json.dumps(cases)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.splitlines()[-1])


def _memory_need(path: str) -> int:
  """Bytes per device the case's one group needs at least on 2 devices."""
  from ihsweep.configuration import grid
  from ihsweep.training import memory

  (group,) = grid.make_plan(_load(path)).groups
  return memory.minimum_bytes(group.cfg, 2, group.n_params)


def test_plan_and_run_refuse_the_same_groups(tmp_path, capsys, monkeypatch):
  from ihsweep.planning import placement

  files = {name: _write(tmp_path, name, o) for name, (o, _, _) in CASES.items()}
  memory_file = _write(tmp_path, "memory", {"ensemble.size": 2})
  need = _memory_need(memory_file)
  limits = {name: need + delta for name, delta in MEMORY.items()}
  expected = {name: field for name, (_, _, field) in CASES.items()}
  expected.update({name: "train.batch_size" if delta else None for name, delta in MEMORY.items()})
  n_of = {name: n for name, (_, n, _) in CASES.items()} | {name: 2 for name in MEMORY}
  files |= {name: memory_file for name in MEMORY}

  ran = {}
  for n in (2, 8):
    cases = [
      (name, files[name], limits.get(name, 0), str(tmp_path / f"run{k}"))
      for k, name in enumerate(expected)
      if n_of[name] == n
    ]
    ran |= _run(n, cases)

  for name, field in expected.items():
    n = n_of[name]
    if name in limits:
      monkeypatch.setenv("IHSWEEP_DEVICE_MEMORY", str(limits[name]))
    else:
      monkeypatch.delenv("IHSWEEP_DEVICE_MEMORY", raising=False)
    code, err = _plan(capsys, f"--config={files[name]}", f"--devices={n}", "--flops_per_s=1e12")
    # run's decision, as expected on both sides of the boundary
    assert (ran[name] and ran[name][0]) == field, (name, ran[name])
    if field is None:
      assert code == 0, (name, err)
    else:  # the same line: run's error, as the CLI prints a config error
      assert code == 2 and err == f"ihsweep: invalid config: {ran[name][1]}", (name, err)
    if n <= 4:  # measured on this machine's first N devices: refused before any timing
      with monkeypatch.context() as m:
        m.setattr(placement, "predict", lambda *a, **k: (_ for _ in ()).throw(_Reached()))
        if field is None:
          with pytest.raises(_Reached):
            _plan(capsys, f"--config={files[name]}", f"--devices={n}")
        else:
          code, err = _plan(capsys, f"--config={files[name]}", f"--devices={n}")
          assert code == 2 and err == f"ihsweep: invalid config: {ran[name][1]}", (name, err)


def test_plan_names_its_devices_per_worker_flag_where_run_would_refuse_it(tmp_path, capsys):
  """--devices_per_worker=D is what the plan's launch lines pass as sweep.devices_per_worker:
  with mesh.num_devices = 2 a worker is those 2 devices (run: "0 or 2 ..."), so D = 4 is
  refused naming the flag, D = 2 planned."""
  path = _write(tmp_path, "mesh 2", {MESH: 2})
  code, err = _plan(
    capsys, f"--config={path}", "--devices=8", "--devices_per_worker=4", "--flops_per_s=1e12"
  )
  assert code == 2 and err.startswith(
    "ihsweep: --devices_per_worker=4 is not allowed with this config: an integer in [0, 2]"
  ), err
  code, err = _plan(
    capsys, f"--config={path}", "--devices=8", "--devices_per_worker=2", "--flops_per_s=1e12"
  )
  assert code == 0, err


def test_train_refuses_the_sweep_fields_it_does_not_read(tmp_path):
  work = tmp_path / "w"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  for flag in ("--config.sweep.seeds=3", "--config.sweep.devices_per_worker=1"):
    r = subprocess.run(
      [sys.executable, "-m", "ihsweep.cli", "train", "--config=configs/default.py:tiny"]
      + ["--config.train.num_steps=2"]
      + [f"--workdir={work}", flag],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
    assert r.stderr.startswith(f"ihsweep: {flag} is not allowed with `ihsweep train`: "), r.stderr
    assert "use `ihsweep run`" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not work.exists()
