"""One time model decides layouts (ihsweep/planning/compiled_times.py): the compiled plan
(``ihsweep plan --target``) keeps each group's compiled seconds per update, and the FLOPs plan
(``plan --flops_per_s --network``), the compiled plan's own choice and ``ihsweep run``'s auto
layout (``worker_layout.phases``) then price every group by them and choose the same layout."""

import json
import os
import types

import jax
import pytest
from test_placement import _plan as plan_here
from test_targets import LIBTPU, _plan

from ihsweep.planning import chips, compiled_times, placement, targets, timing, toolchain

V5E = chips.NETWORKS["v5e"]
CORNERS = {"train.batch_size": (8, 128), "train.context_size": (64, 1024)}


def _exp1_corners():
  from configs import exp1_natural

  cfg = exp1_natural.get_config("")
  with cfg.unlocked():
    cfg.sweep.grid.train.batch_size = CORNERS["train.batch_size"]
    cfg.sweep.grid.train.context_size = CORNERS["train.context_size"]
  return cfg


# Roofline seconds per update on one v5e core: the TPU compiler's plan of exp1's corners
# (`ihsweep plan --target=v5e:2x4`, 2026-12-07); the B 8 x C 64 group is bound by memory
# traffic, 3.7x its FLOPs time at 40% of peak (4.1 ms).
V5E_UPDATE_S = {(128, 1024): 0.55838, (8, 1024): 0.03804, (128, 64): 0.03654, (8, 64): 0.01532}


def _store_corners(jobs, directory):
  store = compiled_times.CompiledTimes("v5e", str(directory))
  for j in jobs:
    store.write(j, {1: V5E_UPDATE_S[(j.batch_size, j.context_size)]}, "test")
  return store


def _shape(phases) -> list:
  """Phases as (processes per worker, devices per worker, groups)."""
  out = []
  for ph in phases:
    ph = ph if isinstance(ph, dict) else ph.to_json()
    out.append((ph["processes_per_worker"], ph["devices_per_worker"], tuple(ph["groups"])))
  return out


def test_an_entry_scales_from_its_nearest_compile_and_knows_where_it_does_not_fit(tmp_path):
  t = compiled_times.GroupTimes({2: 0.4, 8: 0.08, 1: None})
  assert t.seconds_per_update(2) == 0.4 and t.seconds_per_update(8) == 0.08
  assert t.seconds_per_update(4) == pytest.approx(0.4 * 2 / 4)  # the widest below: 2
  assert t.seconds_per_update(16) == pytest.approx(0.08 * 8 / 16)
  assert t.does_not_fit(1) and not t.does_not_fit(2)
  with pytest.raises(KeyError):
    compiled_times.GroupTimes({1: None}).seconds_per_update(1)

  _, jobs = placement.make_jobs(_exp1_corners(), check_data=False)
  store = compiled_times.CompiledTimes("v5e", str(tmp_path))
  store.write(jobs[0], {1: None, 2: 0.5}, "plan A")
  store.write(jobs[0], {2: 0.4, 4: 0.2}, "plan B")  # a later plan's compile replaces m = 2
  got = store.read(jobs[0])
  assert got.update_s == {1: None, 2: 0.4, 4: 0.2} and got.source == "plan B"
  # another chip, or the same group with other seeds and budget: not / the same entry
  assert compiled_times.CompiledTimes("v5p", str(tmp_path)).read(jobs[0]) is None
  other = _exp1_corners()
  with other.unlocked():
    other.sweep.seeds = 3
    other.sweep.tokens = 10**8

  def same_corner(js):
    return next(j for j in js if (j.batch_size, j.context_size) == key)

  key = (jobs[0].batch_size, jobs[0].context_size)
  _, again = placement.make_jobs(other, check_data=False)
  assert same_corner(again).n_models == 3 and store.read(same_corner(again)) is None  # E counts
  with other.unlocked():
    other.sweep.seeds = 2
  _, again = placement.make_jobs(other, check_data=False)
  assert same_corner(again).updates != jobs[0].updates and store.read(same_corner(again)) == got
  # a damaged entry reads as none, and a plan missing some groups prices none of them so
  path = tmp_path / "v5e" / f"{compiled_times.group_key(jobs[1])}.json"
  path.parent.mkdir(exist_ok=True)
  path.write_text("{not json")
  assert store.read(jobs[1]) is None
  found, why = store.for_jobs(jobs)
  missing = ", ".join(j.id for j in jobs[1:])
  assert found is None
  assert why == f"compiled times for v5e exist for 1 of the 4 groups (missing: {missing})"


def test_the_model_prices_by_compiled_times_only_where_every_group_has_them(tmp_path, monkeypatch):
  _, jobs = placement.make_jobs(_exp1_corners(), check_data=False)
  flops = timing.FlopsModel(7.9e13, V5E, 4)
  bare_store = compiled_times.CompiledTimes("v5e", str(tmp_path))
  bare = flops.compiled_for(jobs, bare_store)
  assert bare.compiled is None and "memory traffic" in bare.describe()
  assert "--target=v5e:SHAPE" in bare.describe() and "exist for none of the 4" in bare.describe()
  planned = timing.FlopsModel(7.9e13, V5E, 4, planned_devices=8).compiled_for(jobs, bare_store)
  assert "`ihsweep plan --target=v5e:2x4`" in planned.describe()  # a plan's N names the slice
  h100 = timing.FlopsModel(4e14, chips.NETWORKS["h100"], planned_devices=8)
  assert "`ihsweep plan --target=h100-80gb --devices=8`" in h100.describe()
  assert timing.target_example(chips.NETWORKS["v4"], 16) == "v4:2x2x2"  # 2 TensorCores a chip
  store = _store_corners(jobs, tmp_path)
  model = flops.compiled_for(jobs, store)
  small = next(j for j in jobs if (j.batch_size, j.context_size) == (8, 64))
  for m in (1, 2):
    t = model.seconds(small, m)
    assert t.train_s == pytest.approx(small.updates * 0.01532 / m)
    assert t.comm_s == pytest.approx(small.updates * flops.all_reduce_s(small, m))
    assert t.total_s == pytest.approx(t.train_s + t.comm_s) and t.eval_s == 0.0
  assert model.to_json()["model"] == "compiled"
  # FLOPs alone put the memory-bound group at a small share of its compiled time
  assert flops.seconds(small, 1).train_s < 0.3 * model.seconds(small, 1).train_s
  # a group known not to fit one device refuses workers of one device, and nothing wider
  store.write(jobs[0], {1: None, 2: 0.345}, "test")
  model = flops.compiled_for(jobs, store)
  assert model.cannot_time(1) == (
    f"group {jobs[0].id} does not fit 1 device(s) (the compiled plan's memory)"
  )
  assert model.cannot_time(2) is None and model.cannot_time(8) is None
  # the runtime model of a v5e slice binds the same times, read from IHSWEEP_COMPILED_TIMES
  v5e = [types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite", process_index=p)
         for p in (0,) * 4 + (1,) * 4]  # fmt: skip
  monkeypatch.setenv("IHSWEEP_COMPILED_TIMES", str(tmp_path))
  run = timing.runtime_model(v5e).compiled_for(jobs)
  assert run.compiled is not None and run.devices_per_host == 4
  assert run.seconds(jobs[0], 2) == model.seconds(jobs[0], 2)


def _fake_target() -> toolchain.Target:
  """v5e:2x4 as the plan sees it (8 devices, 4 per host), without its compiler."""
  chip = chips.TPU_CHIPS["v5e"]
  devices = [types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")] * 8
  return toolchain.Target("v5e:2x4", chip, devices, 16 << 30, 4, "test")


def _run_auto_layout(cfg, monkeypatch) -> list:
  """``worker_layout.phases`` as each process of a v5e:2x4 job computes it: 2 processes of 4
  devices (every slice fits: the run checks memory on its own devices)."""
  from ihsweep.configuration import config as config_lib
  from ihsweep.configuration import grid
  from ihsweep.workers import worker_layout

  devices = [
    types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite", process_index=p, id=i)
    for i, p in enumerate((0,) * 4 + (1,) * 4)
  ]
  with placement.data_unchecked():  # the corpus is the run's, not this test's
    plan = grid.make_plan(cfg)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "devices", lambda *a: devices)
  monkeypatch.setattr(jax, "local_devices", lambda *a, **k: devices[:4])
  monkeypatch.setattr(config_lib, "process_devices", lambda cfg, d=None: devices[:4])
  monkeypatch.setattr(worker_layout, "_fits_everywhere", lambda *a: {1: True, 2: True, 4: True})
  return worker_layout.phases(cfg, plan)


def test_both_plans_and_the_run_choose_one_layout_for_exp1_corners_on_v5e(tmp_path, monkeypatch):
  """exp1's corners on a v5e:2x4 slice (2 hosts of 4): with FLOPs alone the FLOPs plan and the
  run choose 4 workers of 2; with the compiled times (the B 8 x C 64 group bound by memory
  traffic) the FLOPs plan, the compiled plan's choice and the run's auto layout choose one
  other layout, at one makespan."""
  cfg = _exp1_corners()
  monkeypatch.setenv("IHSWEEP_COMPILED_TIMES", str(tmp_path))
  before = placement.predict(cfg, 8, devices_per_host=4, flops_per_s=7.9e13, network=V5E)
  before_run = _run_auto_layout(cfg, monkeypatch)
  assert _shape(before.phased.phases) == _shape(before_run)
  assert [(p.n_workers, p.devices_per_worker) for p in before.phased.phases] == [(4, 2)]

  _, jobs = placement.make_jobs(cfg, check_data=False)
  _store_corners(jobs, tmp_path)
  flops_plan = placement.predict(cfg, 8, devices_per_host=4, flops_per_s=7.9e13, network=V5E)
  assert flops_plan.model.compiled is not None
  model = timing.FlopsModel(197e12, V5E, 4).compiled_for(jobs)
  target = _fake_target()
  _, best, unpriced, phased, _ = targets.decide(cfg, jobs, target, model, d=1)
  assert unpriced is None and not phased.beaten_by(best)  # the compiled plan chooses the phases
  run = _run_auto_layout(cfg, monkeypatch)

  assert _shape(flops_plan.phased.phases) == _shape(phased.phases) == _shape(run)
  assert _shape(run) != _shape(before_run)  # what the compiled times changed
  assert flops_plan.phased.makespan_s == pytest.approx(phased.makespan_s, rel=1e-12)
  # the FLOPs plan's best mark is the same layout as the compiled plan's best one-phase layout
  assert flops_plan.layout.devices_per_worker == best.devices_per_worker
  assert flops_plan.layout.makespan_s == pytest.approx(best.makespan_s, rel=1e-12)


TINY_CORNERS = ["--config=configs/default.py:tiny", "--grid=train.batch_size=8,16",
                "--grid=train.context_size=16"]  # fmt: skip


@pytest.mark.skipif(not (LIBTPU / "libtpu").is_dir(), reason="make test installs build/libtpu")
def test_a_compiled_plan_leaves_the_times_the_flops_plan_then_prices_and_launches_alike(
  tmp_path, monkeypatch, capsys
):
  """The TPU compiler's plan of two tiny groups on v5e:2x4 writes their times (in an empty
  cache, saying nothing of an earlier plan); the FLOPs plan of the same sweep then reads them:
  the same phases, makespan, per-group seconds and launch line."""
  monkeypatch.setenv("IHSWEEP_COMPILED_TIMES", str(tmp_path))
  r = _plan("--target=v5e:2x4", *TINY_CORNERS, "--json")
  assert r.returncode == 0, r.stderr[-3000:]
  compiled = json.loads(r.stdout)
  assert len(os.listdir(tmp_path / "v5e")) == 2
  assert "compiled by an earlier plan" not in r.stderr

  flops_args = ["--devices=8", "--devices_per_host=4", "--flops_per_s=7.9e13", "--network=v5e"]
  code, out, err = plan_here(capsys, *TINY_CORNERS, *flops_args, "--json")
  assert code == 0, err
  flops = json.loads(out)
  assert flops["throughput"]["model"] == "compiled"
  assert compiled["chosen"] == "phases"
  assert _shape(flops["phases"]) == _shape(compiled["phases"])
  assert flops["makespan_s"] == pytest.approx(compiled["phases_makespan_s"], rel=1e-9)
  by_id = {g["id"]: g for g in compiled["groups"]}
  for row in flops["groups"]:
    g = by_id[row["group"]]
    per_update = g["roofline_update_s"] * g["devices"] / row["devices"]
    assert row["times"]["train_s"] == pytest.approx(row["updates"] * per_update, rel=1e-9)
  (line,) = compiled["launch"]["lines"]
  assert line == (
    'launch/tpu_pod.sh "${TPU_NAME:?}" "${ZONE:?}" --config=configs/default.py:tiny '
    "--grid=train.batch_size=8,16 --grid=train.context_size=16 --workdir=/mnt/shared/default_tiny"
  )
  code, out, err = plan_here(capsys, *TINY_CORNERS, *flops_args)
  assert code == 0 and f"\n  {line}\n" in out  # the FLOPs plan's default launch: the same
