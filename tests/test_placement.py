"""ihsweep/planning/placement.py and ihsweep/planning/timing.py: the schedule simulation on
hand-built groups with known answers, one worker of all devices, the layouts, the time models, and
`ihsweep plan`."""

import copy
import dataclasses
import functools
import json
import math
import os
import shlex
import subprocess
import sys
import time

import jax
import ml_collections
import pytest
from conftest import tiny_config

from ihsweep import cli
from ihsweep.base import sharding
from ihsweep.base.law import Law
from ihsweep.commands import flags
from ihsweep.compute import schedule as schedule_lib
from ihsweep.planning import chips, launch, list_schedule, placement, timing
from ihsweep.planning import phases as phases_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job(name, e=2, b=8, c=32, updates=100, flops_per_update=1.0, **kw):
  return list_schedule.Job(
    id=name,
    n_models=e,
    batch_size=b,
    context_size=c,
    updates=updates,
    flops_per_update=flops_per_update,
    **kw,
  )


def test_four_equal_groups_on_two_workers_fill_them():
  t = 5.0
  s = list_schedule.simulate([(f"g{i}", 1, t) for i in range(4)], n_devices=2, devices_per_worker=1)
  assert s.n_workers == 2
  assert [(x.group, x.worker, x.start_s, x.end_s) for x in s.slots] == [
    ("g0", 0, 0, t),
    ("g1", 1, 0, t),
    ("g2", 0, t, 2 * t),
    ("g3", 1, t, 2 * t),
  ]
  assert s.makespan_s == 2 * t and s.utilisation == 1.0


def test_three_equal_groups_on_two_workers_leave_a_quarter_idle():
  s = list_schedule.simulate([(f"g{i}", 1, 2.0) for i in range(3)], 2, 1)
  assert s.makespan_s == 4.0 and s.utilisation == pytest.approx(0.75)


def test_a_worker_that_finishes_takes_the_next_group():
  # plan order: one long group, then three short ones; the second worker takes all three
  s = list_schedule.simulate([("g0", 1, 3.0), ("g1", 1, 1.0), ("g2", 1, 1.0), ("g3", 1, 1.0)], 2, 1)
  assert [(x.group, x.worker, x.start_s) for x in s.slots] == [
    ("g0", 0, 0),
    ("g1", 1, 0),
    ("g2", 1, 1.0),
    ("g3", 1, 2.0),
  ]
  assert s.makespan_s == 3.0 and s.utilisation == 1.0


def test_a_group_that_uses_half_a_worker_leaves_the_other_half_idle():
  # E = 1, B = 2: at most E · B = 2 devices of a 4-device worker
  assert list_schedule.usable_device_count(1, 2, 4) == 2
  model = timing.FlopsModel(10.0)
  s = list_schedule.worker_schedule([job("g0", e=1, b=2, updates=40)], model, 4, 4)
  assert [(x.devices, x.end_s) for x in s.slots] == [(2, 40 / (2 * 10.0))]
  assert s.utilisation == pytest.approx(0.5)
  # beside it a group that fills its worker: 2 + 4 busy of 8 device-seconds per second
  s = list_schedule.worker_schedule(
    [job("g0", e=1, b=2, updates=80), job("g1", e=2, b=8, updates=160)], model, 8, 4
  )
  assert [(x.worker, x.devices, x.end_s) for x in s.slots] == [(0, 2, 4.0), (1, 4, 4.0)]
  assert s.utilisation == pytest.approx(6 / 8)


def test_time_is_cost_over_devices_times_flops():
  j = job("g0", updates=1000, flops_per_update=3e9)
  assert timing.FlopsModel(1e12).seconds(j, 4).total_s == pytest.approx(3e12 / 4e12)


@pytest.mark.parametrize(
  "e,b,n",
  [
    (2, 8, 8),
    (2, 8, 16),
    (2, 8, 32),
    (2, 16, 64),
    (3, 6, 4),
    (4, 4, 16),
    (1, 1, 1),
    (1, 3, 2),
    (6, 2, 12),
    (2, 2, 3),
  ],
)
def test_one_worker_of_all_devices_gives_each_group_what_its_mesh_can_use(e, b, n):
  """One worker of all n devices (a worker spanning every process: one global mesh): the
  groups one after another, each on the most devices its mesh can use (all n exactly when
  ``mesh_shape`` accepts n); utilisation counts only the devices a group holds."""
  jobs = [job("g0", e=2, b=64, updates=10), job("g1", e=e, b=b, updates=30)]
  try:
    sharding.mesh_shape(e, b, n)
    fits = True
  except sharding.MeshError:
    fits = False
  s = list_schedule.worker_schedule(jobs, timing.FlopsModel(1.0), n, n)
  m0, m1 = (list_schedule.usable_device_count(j.n_models, j.batch_size, n) for j in jobs)
  assert (m1 == n) == fits and m1 <= min(n, e * b)
  assert [(x.devices, x.start_s, x.end_s) for x in s.slots] == [
    (m0, 0, 10 / m0),
    (m1, 10 / m0, 10 / m0 + 30 / m1),
  ]
  assert s.makespan_s == pytest.approx(10 / m0 + 30 / m1)
  assert s.utilisation == pytest.approx(40 / (n * s.makespan_s))


def test_layouts_are_divisors_up_to_a_host_and_ties_go_to_fewer_devices():
  assert list_schedule.candidate_layouts(8, 8) == [1, 2, 4, 8]
  assert list_schedule.candidate_layouts(64, 8) == [1, 2, 4, 8]
  assert list_schedule.candidate_layouts(6, 8) == [1, 2, 3, 6]
  assert list_schedule.candidate_layouts(24, 8) == [
    1,
    2,
    4,
    8,
  ]  # 3 GPUs: 2 workers per host, not 8/3
  model = timing.FlopsModel(1.0)
  # 4 equal groups of E = 2, B = 8 on 4 devices: every layout takes the same time
  jobs = [job(f"g{i}", updates=12) for i in range(4)]
  layouts = [list_schedule.worker_schedule(jobs, model, 4, d) for d in (1, 2, 4)]
  assert [s.makespan_s for s in layouts] == [12, 12, 12]
  assert list_schedule.choose_layout(layouts).devices_per_worker == 1
  # 5 groups: one worker of 4 (5 × 3) beats 4 workers of 1 (2 × 12)
  jobs = [job(f"g{i}", updates=12) for i in range(5)]
  layouts = [list_schedule.worker_schedule(jobs, model, 4, d) for d in (1, 2, 4)]
  assert [s.makespan_s for s in layouts] == [24, 18, 15]
  best = list_schedule.choose_layout(layouts)
  assert best.devices_per_worker == 4 and best.utilisation == 1.0
  assert layouts[0].utilisation == pytest.approx(60 / (4 * 24))


# ---- phases: teams of processes inside one jax.distributed job ----


def _phases(phases):
  return [(p.processes_per_worker, p.devices_per_worker, p.n_workers, p.groups) for p in phases]


def test_small_groups_share_processes_then_one_big_group_takes_all_of_them():
  # 4 processes of 1 device; four groups of E = B = 1 (one device at most) and one of E = 4:
  # all 5 alone on processes take 2 rounds (8), phases 4 + 1 = 5 = 20 device-s / 4 devices
  jobs = [job("big", e=4, b=1, updates=4)] + [job(f"s{i}", e=1, b=1, updates=4) for i in range(4)]
  phases = phases_lib.plan_phases(jobs, n_processes=4, devices_per_process=1)
  assert _phases(phases) == [(1, 1, 4, ("s0", "s1", "s2", "s3")), (4, 4, 1, ("big",))]
  assert [(p.start_s, p.end_s) for p in phases] == [(0, 4), (4, 5)]
  assert [(s.group, s.phase, s.worker, s.devices, s.start_s, s.end_s) for s in phases[1].slots] == [
    ("big", 1, 0, 4, 4, 5)
  ]
  whole = phases_lib.PhasedSchedule(4, phases)
  assert whole.makespan_s == 5 and whole.utilisation == 1.0
  # one phase on processes alone: 2 rounds of 4 s
  only = phases_lib.plan_phases(jobs, 4, 1, processes_per_worker=1)
  assert _phases(only) == [(1, 1, 4, ("big", "s0", "s1", "s2", "s3"))]
  assert phases_lib.PhasedSchedule(4, only).makespan_s == 8


def test_ties_go_to_fewer_phases_then_smaller_teams():
  # 3 groups of E = 4 on 4 one-device processes: one team of 4 (3 × 3 s) ties with 2 teams of 2
  # then one of 4 (6 + 3 s) at 9 s; teams of 2 alone (6 + 6 s) and processes (12 s) lose
  jobs = [job(f"g{i}", e=4, b=1, updates=12) for i in range(3)]
  phases = phases_lib.plan_phases(jobs, 4, 1)
  assert _phases(phases) == [(4, 4, 1, ("g0", "g1", "g2"))]
  assert phases_lib.PhasedSchedule(4, phases).makespan_s == 9
  # 4 such groups: every team size takes 4 s; processes alone (the smallest teams) win
  jobs = [job(f"g{i}", e=4, b=1, updates=4) for i in range(4)]
  assert _phases(phases_lib.plan_phases(jobs, 4, 1)) == [(1, 1, 4, ("g0", "g1", "g2", "g3"))]


def test_a_fixed_team_size_refuses_groups_that_cannot_fill_a_team():
  jobs = [job("g0", e=4, b=1), job("g1", e=1, b=2), job("g2", e=2, b=8)]
  with pytest.raises(list_schedule.LayoutError) as e:
    phases_lib.plan_phases(jobs, 4, 2, processes_per_worker=2)  # teams of 4 devices
  assert str(e.value) == (
    "sweep.processes_per_worker=2: 1 of 3 groups cannot use all 4 devices of a team of 2 "
    "processes × 2 (a mesh needs a divisor e of them dividing E with the rest dividing B; "
    "at most E · B): g1 (E = 1, B = 2); allowed: 0 (phases chosen) or 1"
  )
  phases = phases_lib.plan_phases(jobs, 4, 2, processes_per_worker=1)  # g1 on 2 of 2: fine
  assert [s.devices for s in phases[0].slots] == [2, 2, 2]
  with pytest.raises(
    list_schedule.LayoutError,
    match=r"sweep.processes_per_worker=3 is not allowed "
    r"on 4 processes: 0 \(phases chosen\) or a divisor of the process count "
    r"\(1, 2, 4\)",
  ):
    phases_lib.plan_phases(jobs, 4, 2, processes_per_worker=3)
  with pytest.raises(list_schedule.LayoutError, match="n_processes=0 is not allowed"):
    phases_lib.plan_phases(jobs, 0, 2)
  assert phases_lib.plan_phases([], 4, 2) == []


def test_the_search_is_bounded_for_many_groups():
  # 300 groups of E = 64 on 128 processes: past SEARCH_WORK the cuts take fewer positions
  jobs = [job(f"g{i:03d}", e=64, b=(8, 16, 32)[i % 3], updates=1000 - i) for i in range(300)]
  t = time.perf_counter()
  phases = phases_lib.plan_phases(jobs, 128, 8)
  assert time.perf_counter() - t < 10  # about 0.5 s here
  assert sorted(g for p in phases for g in p.groups) == [j.id for j in jobs]
  assert phases_lib.PhasedSchedule(1024, phases).utilisation > 0.99
  assert phases_lib.plan_phases(jobs, 128, 8) == phases


@pytest.fixture(scope="module")
def exp1_jobs():
  from configs import exp1_natural

  _, jobs = placement.make_jobs(exp1_natural.get_config(""), check_data=False)
  return jobs


@pytest.mark.parametrize(
  "n,phases,utilisation",
  [
    (8, [(1, 25)], 1.0),
    (64, [(1, 24), (8, 1)], 0.9951),
    (256, [(2, 16), (4, 8), (32, 1)], 0.9614),
  ],
)
def test_exp1_at_study_scale_fills_a_pod_in_phases(exp1_jobs, n, phases, utilisation):
  # 25 near-equal groups of E = 2, B 8–128: 16 or 32 workers of one host idle 22–25% of the
  # time (README); teams of several hosts for the groups that fill them do not
  procs, d = n // 8, 8
  got = phases_lib.plan_phases(exp1_jobs, procs, d)
  assert [(p.processes_per_worker, len(p.groups)) for p in got] == phases
  whole = phases_lib.PhasedSchedule(n, got)
  assert whole.utilisation == pytest.approx(utilisation, abs=5e-5)
  assert sorted(g for p in got for g in p.groups) == sorted(j.id for j in exp1_jobs)
  by_id = {j.id: j for j in exp1_jobs}
  for p in got:
    assert p.devices_per_worker == p.processes_per_worker * d
    assert p.n_workers * p.devices_per_worker == n
    assert [s.group for s in p.slots] == list(p.groups)  # claimed in plan order
    if p.processes_per_worker > 1:
      assert all(phases_lib.fills(by_id[g], p.devices_per_worker) for g in p.groups)
      assert all(s.devices == p.devices_per_worker for s in p.slots)
    assert all(p.start_s <= s.start_s and s.end_s <= p.end_s for s in p.slots)
  assert [p.start_s for p in got[1:]] == [p.end_s for p in got[:-1]]
  # pure: every process computes the same phases
  assert phases_lib.plan_phases(exp1_jobs, procs, d) == got
  # the phases are chosen on relative FLOPs; a FLOP/s only scales the times
  timed = phases_lib.time_phases(exp1_jobs, got, procs, d, timing.FlopsModel(4e14))
  assert [p.groups for p in timed] == [p.groups for p in got]
  assert timed[-1].end_s == pytest.approx(got[-1].end_s / 4e14)


def test_a_worker_of_several_hosts_is_one_phase_and_refused_where_a_group_cannot_fill_it():
  from configs import exp1_natural

  cfg = exp1_natural.get_config("")
  p = placement.predict(cfg, 64, devices_per_worker=16, flops_per_s=4e14)
  assert [
    (x.processes_per_worker, x.devices_per_worker, x.n_workers, len(x.groups))
    for x in p.phased.phases
  ] == [(2, 16, 4, 25)]
  assert p.phased.utilisation == pytest.approx(0.8975, abs=5e-5)
  with pytest.raises(list_schedule.LayoutError) as e:  # B = 8, E = 2: 16 devices at most
    placement.predict(cfg, 64, devices_per_worker=32, flops_per_s=4e14)
  assert str(e.value) == (
    "32 devices per worker (--devices_per_worker, workers of 4 processes × 8): 5 of 25 groups "
    "cannot use all 32 devices, e.g. group g004 (E = 2, B = 8); allowed: 1, 2, 4, 8, 16"
  )


def test_measured_times_on_one_machine_give_one_phase_of_processes(monkeypatch):
  # measured, the N devices are processes of this machine's 4: teams of several are not timed
  pieces = dict(
    startup_s=1.0,
    compile_s=0.5,
    call_s=0.0,
    update_s=0.01,
    eval_s=0.0,
    params_save_s=0.0,
    state_save_s=0.0,
  )
  monkeypatch.setattr(
    timing,
    "MeasuredModel",
    functools.partial(
      timing.MeasuredModel, measure=lambda cfg, devices: dict(devices=len(devices), **pieces)
    ),
  )
  cfg = tiny_config(**{"train.num_steps": 100})
  with cfg.unlocked():
    cfg.sweep.grid.train = ml_collections.ConfigDict({"batch_size": (8, 16, 32)})
  for n, procs, workers in [(4, 1, 1), (8, 2, 2)]:
    p = placement.predict(cfg, n)
    assert (p.n_processes, p.devices_per_process) == (procs, 4)
    assert [
      (x.processes_per_worker, x.devices_per_worker, x.n_workers, len(x.groups))
      for x in p.phased.phases
    ] == [(1, 4, workers, 3)]
    assert [s.devices_per_worker for s in p.layouts] == [4]
  # one worker: 3 groups of 1 s start-up + 100 updates of 0.01 s, one after another
  assert placement.predict(cfg, 4).phased.makespan_s == pytest.approx(6)


def _marked(p) -> tuple[list, list, str]:
  """A plan's best and chosen layouts ``(D, workers)`` as --json marks them, and its text."""
  from ihsweep.planning import prediction

  rows = p.to_json()["layouts"]
  best = [(r["devices_per_worker"], r["n_workers"]) for r in rows if r["best"]]
  chosen = [(r["devices_per_worker"], r["n_workers"]) for r in rows if r["chosen"]]
  return best, chosen, prediction.format_text(p)


def test_the_layout_list_its_best_mark_and_the_phases_agree(monkeypatch):
  """The plan's one-phase layouts include the one its phases run, and where none beats the
  phases (``PHASE_TIE``) that one is `best` in the text and in --json.

  Measured (a start-up of 1.5 s and 100 updates of 10 ms per group, whatever its devices) on
  this machine's 4 devices, 4 groups of E = 1, B = 2 (a mesh of at most 2 devices): auto runs
  2 workers of 2 (4.0 s), which the list lacked (it listed 1 × 4 alone, 7.6 s, marked best).
  From FLOPs, 4 groups of equal cost that use all 4 devices: 4 × 1, 2 × 2 and 1 × 4 tie; the
  phases run 1 × 4 (no network priced: the most devices), which `best` marked 4 × 1 (the
  fewest)."""
  pieces = dict(startup_s=1.0, compile_s=0.5, call_s=0.0, update_s=0.01, eval_s=0.0,
                params_save_s=0.0, state_save_s=0.0)  # fmt: skip
  monkeypatch.setattr(
    timing,
    "MeasuredModel",
    functools.partial(
      timing.MeasuredModel, measure=lambda cfg, devices: dict(devices=len(devices), **pieces)
    ),
  )
  cfg = tiny_config(**{"train.num_steps": 100, "ensemble.size": 1, "train.batch_size": 2})
  with cfg.unlocked():
    cfg.sweep.seeds = 1
    cfg.sweep.grid.train = ml_collections.ConfigDict({"context_size": (8, 16, 24, 32)})
  p = placement.predict(cfg, 4)
  (phase,) = p.phased.phases
  assert (phase.n_workers, phase.devices_per_worker) == (2, 2)
  assert p.phased.makespan_s == pytest.approx(4.0)
  assert [s.devices_per_worker for s in p.layouts] == [2, 4]
  assert p.layout is p.chosen_layout and p.layout.makespan_s == pytest.approx(4.0)
  best, chosen, text = _marked(p)
  assert best == chosen == [(2, 2)]
  listed = text.split("one-phase layouts (workers × devices each):\n")[1].split("\n\n")[0]
  assert [" ".join(line.split()) for line in listed.splitlines()] == [
    "2 × 2 makespan 4.0 s, utilisation 95.4% <- best, the phases' layout",
    "1 × 4 makespan 7.6 s, utilisation 50.0%",
  ]
  assert "\nbest one-phase layout, 2 × 2: makespan 4.0 s" in text and "faster" not in text

  cfg = tiny_config(**{"train.num_steps": 100})
  with cfg.unlocked():
    cfg.sweep.grid.train = ml_collections.ConfigDict({"weight_decay": (0.0, 0.1, 0.2, 0.3)})
  p = placement.predict(cfg, 4, flops_per_s=1e12, network=None)
  assert [(x.n_workers, x.devices_per_worker) for x in p.phased.phases] == [(1, 4)]
  spans = [s.makespan_s for s in p.layouts]
  assert [s.devices_per_worker for s in p.layouts] == [1, 2, 4]
  assert max(spans) == pytest.approx(min(spans))  # a tie, which choose_layout gives to 4 × 1
  assert list_schedule.choose_layout(p.layouts).devices_per_worker == 1
  best, chosen, text = _marked(p)
  assert best == chosen == [(4, 1)]
  assert text.count("<- best") == 1 and "1 × 4 " in text.split("<- best")[0].splitlines()[-1]
  assert "\nbest one-phase layout, 1 × 4: " in text


class _Group:
  """The fields of grid.Group that predicted_updates reads."""

  def __init__(self, cfg, num_steps, law_updates):
    self.cfg, self.num_steps, self.law_updates = cfg, num_steps, law_updates
    self.cap_reason = "cap"


def test_an_emergence_budget_is_predicted_to_stop_at_the_margin():
  cfg = tiny_config(**{"eval.every_steps": 100, "train.batch_size": 8, "train.context_size": 32})
  with cfg.unlocked():
    cfg.sweep.update(budget="emergence", stop_margin=2.0)
  # the law puts the transition at 1,234 updates: seen at the evaluation at 1,300; stop 2,600
  group = _Group(cfg, num_steps=10_000, law_updates=1234.0)
  assert placement.predicted_updates(cfg, group)[0] == 2600
  assert placement.predicted_updates(cfg, _Group(cfg, 2000, 1234.0))[0] == 2000  # the cap
  law = Law(log_T=math.log(150 * 8**0.5 * 32**0.5), alpha=0.5, beta=0.5)  # 150 updates
  assert placement.predicted_updates(cfg, group, law)[0] == 400
  with cfg.unlocked():
    cfg.sweep.budget = "updates"
  assert placement.predicted_updates(cfg, group)[0] == 10_000


def _jobs_with_configs(n=3):
  cfg = tiny_config(**{"eval.every_steps": 10, "train.num_steps": 100})
  jobs = []
  for i, (b, c) in enumerate([(8, 32), (16, 32), (8, 16)][:n]):
    g = copy.deepcopy(cfg)
    g.train.batch_size, g.train.context_size = b, c
    from ihsweep.compute import model as model_lib

    fpt = model_lib.flops_per_token(model_lib.ModelConfig.from_config(g.model), c)
    jobs.append(
      list_schedule.Job(
        id=f"g{i:03d}",
        n_models=2,
        batch_size=b,
        context_size=c,
        updates=100,
        cap_updates=100,
        flops_per_update=2 * b * c * fpt,
        n_params=1000,
        cfg=g,
      )
    )
  return jobs


def test_measured_time_follows_the_runs_schedule():
  jobs = _jobs_with_configs(1)
  pieces = dict(
    devices=2,
    startup_s=7.0,
    compile_s=5.0,
    call_s=0.5,
    update_s=0.01,
    eval_s=0.25,
    params_save_s=0.125,
    state_save_s=1.0,
  )
  model = timing.MeasuredModel(jobs, jax.devices()[:2], measure=lambda cfg, devices: pieces)
  t = model.seconds(jobs[0], 2)
  run = schedule_lib.RunSchedule.from_config(jobs[0].cfg)
  calls = run.calls()  # K = 10, evaluations every 10: ten calls of 10
  assert calls == [10] * 10
  n_params = len(run.params)  # params_schedule 'none': 0 and 100
  assert n_params == 2
  expected = 7.0 + 10 * 0.5 + 100 * 0.01 + 11 * 0.25 + 2 * 0.125 + 1 * 1.0
  assert t.total_s == pytest.approx(expected)
  assert (t.calls, t.evaluations, t.checkpoints, t.measured) == (10, 11, 3, True)
  assert t.hidden_s == 0.0  # on a CPU the compiler takes the training's cores: not hidden


class _Accelerator:
  platform = "gpu"


def test_on_an_accelerator_only_a_workers_first_group_waits_for_its_compilation():
  s = list_schedule.simulate([("g0", 1, 4.0, 3.0), ("g1", 1, 4.0, 3.0), ("g2", 1, 4.0, 3.0)], 2, 1)
  assert [(x.worker, x.start_s, x.end_s) for x in s.slots] == [(0, 0, 7), (1, 0, 7), (0, 7, 11)]
  jobs = _jobs_with_configs(3)
  pieces = dict(
    devices=1,
    startup_s=6.0,
    compile_s=5.0,
    call_s=0.0,
    update_s=0.0,
    eval_s=0.0,
    params_save_s=0.0,
    state_save_s=0.0,
  )
  model = timing.MeasuredModel(jobs, [_Accelerator()], measure=lambda cfg, devices: pieces)
  assert model.hides_compile and model.seconds(jobs[0], 1).hidden_s == 5.0
  s = list_schedule.worker_schedule(jobs, model, 1, 1)  # one worker: 6 s, then 1 s, 1 s
  assert [x.end_s for x in s.slots] == pytest.approx([6.0, 7.0, 8.0])


def test_unmeasured_groups_are_scaled_from_the_nearest_measured_one():
  jobs = _jobs_with_configs(3)
  calls = []

  def fake(cfg, devices):
    calls.append(int(cfg.train.batch_size))
    return dict(
      devices=len(devices),
      startup_s=2.0,
      compile_s=1.0,
      call_s=0.1,
      update_s=0.01,
      eval_s=0.0,
      params_save_s=0.0,
      state_save_s=0.0,
    )

  model = timing.MeasuredModel(jobs, jax.devices()[:2], measure=fake, subset=[jobs[0], jobs[2]])
  t = model.seconds(jobs[1], 2)  # B = 16: scaled from g000 (B = 8, the same C)
  assert t.scaled_from == "g000" and not t.measured
  ratio = jobs[1].flops_per_update / jobs[0].flops_per_update
  assert ratio == pytest.approx(2.0)
  assert t.train_s == pytest.approx(t.calls * 0.1 * 2 + 100 * 0.01 * ratio)
  model.seconds(jobs[0], 2)
  assert sorted(calls) == [8, 8]  # each measured group once per device count


def test_measure_group_times_a_tiny_group():
  # the one compiling test here (no evaluation: its program is the slow one to compile)
  cfg = tiny_config(**{"train.num_steps": 20})
  m = timing.measure_group(cfg, jax.devices()[:2], repeats=1)
  assert set(m) == {f.name for f in dataclasses.fields(timing.Measured)} - {"group"}
  assert m["devices"] == 2 and m["eval_s"] == 0.0
  assert m["startup_s"] > 0 and m["update_s"] >= 0 and m["call_s"] >= 0
  assert m["params_save_s"] > 0 and m["state_save_s"] > 0


def _plan(capsys, *args):
  flags.FLAGS.unparse_flags()  # in one process, absl keeps the last call's values otherwise
  code = cli.main(["ihsweep", "plan", *args])
  out = capsys.readouterr()
  return code, out.out, out.err


def test_plan_json_at_study_scale_without_the_corpus(capsys):
  # exp1 at study scale reads C4, absent here: a plan from a FLOP/s needs no data
  code, out, err = _plan(
    capsys,
    "--config=configs/exp1_natural.py",
    "--devices=64",
    "--flops_per_s=4e14",
    "--network=none",
    "--json",
  )
  assert code == 0, err
  p = json.loads(out)
  assert {
    "groups",
    "schedule",
    "makespan_s",
    "utilisation",
    "layouts",
    "devices_per_worker",
    "n_workers",
    "throughput",
  } <= set(p)
  assert len(p["groups"]) == 25 and len(p["schedule"]) == 25
  g = p["groups"][0]
  assert {
    "group",
    "cells",
    "batch_size",
    "context_size",
    "updates",
    "cost_flops",
    "devices",
    "mesh",
    "seconds",
  } <= set(g)
  assert g["times"]["train_s"] == pytest.approx(g["cost_flops"] / (g["devices"] * 4e14))
  # + its evaluations (every 1M tokens; 100 probes and 32 sequences per model, split over the
  # data axis of 4), a third of the training FLOPs per token
  assert g["seconds"] == pytest.approx(g["times"]["train_s"] + g["times"]["eval_s"])
  # (on all 64 devices, a data axis of 32: the 32 sequences are split over it, the 100 probes
  # are not, as 32 does not divide them)
  assert 0 < g["times"]["eval_s"] < 0.15 * g["seconds"] and g["times"]["comm_s"] == 0.0
  written = [x["checkpoints"]["written_bytes"] for x in p["groups"]]
  assert min(written) > 0 and p["checkpoints"]["written_bytes"] == sum(written)
  assert 0 < p["utilisation"] <= 1
  assert p["makespan_s"] == pytest.approx(max(s["end_s"] for s in p["schedule"]))
  # one-phase layouts: one host's divisors, then workers of 2, 4, 8 processes (hosts)
  assert [
    (x["devices_per_worker"], x["processes_per_worker"], x["refused"] is None) for x in p["layouts"]
  ] == [
    (1, 1, True),
    (2, 1, True),
    (4, 1, True),
    (8, 1, True),
    (16, 2, True),
    (32, 4, False),
    (64, 8, False),
  ]
  assert [x["devices_per_worker"] for x in p["layouts"] if x["best"]] == [16]
  assert max(x["utilisation"] or 0 for x in p["layouts"]) == pytest.approx(0.8975, abs=5e-5)
  # the phases: 24 groups on the 8 hosts alone, then the most expensive on all of them
  assert (p["n_processes"], p["devices_per_process"]) == (8, 8)
  assert [
    (x["processes_per_worker"], x["devices_per_worker"], x["n_workers"], len(x["groups"]))
    for x in p["phases"]
  ] == [(1, 8, 8, 24), (8, 64, 1, 1)]
  assert p["phases"][1]["groups"] == ["g000"] and p["utilisation"] == pytest.approx(
    0.9951, abs=5e-5
  )
  assert p["phases"][0]["end_s"] == p["phases"][1]["start_s"]
  assert p["makespan_s"] == pytest.approx(p["phases"][1]["end_s"])
  assert p["n_workers"] is None and p["devices_per_worker"] is None  # two phases
  assert [s["phase"] for s in p["schedule"]] == [0] * 24 + [1]
  assert p["throughput"]["model"] == "flops"
  # on 8 devices, one phase of 4 workers of 2
  code, out, err = _plan(
    capsys,
    "--config=configs/exp1_natural.py",
    "--devices=8",
    "--flops_per_s=4e14",
    "--network=none",
    "--devices_per_worker=2",
    "--json",
  )
  p = json.loads(out)
  assert "global" not in p and "global_seconds" not in p["groups"][0]
  assert p["n_workers"] == 4 and p["layouts"][0]["devices_per_worker"] == 2
  total = sum(g["cost_flops"] + g["eval_flops"] for g in p["groups"])
  assert p["utilisation"] == pytest.approx(total / 4e14 / (8 * p["makespan_s"]))


def test_plan_text_says_what_it_assumes(capsys):
  code, out, err = _plan(
    capsys,
    "--config=configs/exp1_natural.py",
    "--devices=8",
    "--flops_per_s=4e14",
    "--network=none",
  )
  assert code == 0, err
  assert "perfect data-parallel scaling" in out and "no start-up" in out
  assert "<- best" in out
  assert "the sweep (1 phase(s): 1 × 8): makespan 1.4 h, utilisation 100.0%" in out
  code, out, err = _plan(
    capsys,
    "--config=configs/exp1_natural.py",
    "--devices=256",
    "--flops_per_s=4e14",
    "--network=none",
  )
  assert code == 0, err
  assert (
    "the sweep (3 phase(s): 16 × 16 (2 processes each), then "
    "8 × 32 (4 processes each), then 1 × 256 (32 processes each)): makespan 3.0 min, "
    "utilisation 96.1%"
  ) in out
  assert (
    "best one-phase layout, 16 × 16 (2 processes each): makespan 3.4 min, utilisation 78.9%" in out
  )


@pytest.mark.parametrize(
  "args,words",
  [
    (["--devices=0"], "--devices=0 is not allowed: an integer >= 1"),
    (
      ["--devices=8", "--devices_per_worker=3", "--flops_per_s=1e12"],
      "--devices_per_worker=3 is not allowed: a divisor of --devices=8 (1, 2, 4, 8)",
    ),
    (["--devices=8", "--flops_per_s=0"], "--flops_per_s=0 is not allowed: a finite number > 0"),
    (["--devices=8", "--flops_per_s=-5e13"], "--flops_per_s=-5e+13 is not allowed"),
    (
      ["--devices=24", "--devices_per_worker=12", "--flops_per_s=1e12"],
      "--devices_per_worker=12 is not allowed: at most --devices_per_host=8 (a worker of one "
      "process), or a multiple of it",
    ),
    (
      ["--devices=8", "--devices_per_host=0", "--flops_per_s=1e12"],
      "--devices_per_host=0 is not allowed: an integer >= 1",
    ),
    (
      ["--devices=8", "--devices_per_host=4"],
      "--devices_per_host=4 is not allowed without --flops_per_s",
    ),
    (
      ["--devices=8", "--devices_per_worker=8"],
      "--devices_per_worker=8 is not allowed without --flops_per_s: at most this machine's",
    ),
    ([], "plan needs --config=FILE and --devices=N"),
    (["--devices=8", "--network=v5e"], "--network=v5e is not allowed without --flops_per_s"),
    (
      ["--devices=64", "--flops_per_s=1e12", "--devices_per_host=6"],
      "--devices_per_host=6 is not allowed with --devices=64: a divisor of it",
    ),
    (
      ["--devices=8", "--flops_per_s=1e12", "--network=ib"],
      "--network=ib is not allowed: one of none, h100, h200, a100, l40s, v4, v5e, v5p, v6e",
    ),
    (
      ["--devices=8", "--flops_per_s=1e12", "--compare_attention"],
      "--compare_attention is not allowed without --target",
    ),
  ],
)
def test_plan_flags_are_checked_in_one_line(capsys, args, words):
  code, out, err = _plan(capsys, "--config=configs/exp1_natural.py", *args)
  assert code == 2 and out == ""
  assert err.startswith("ihsweep: ") and len(err.splitlines()) == 1, err
  assert words in err, err


@pytest.mark.parametrize(
  "args,value,n",
  [
    (["--devices=8", "--flops_per_s=4e14"], -1, 8),  # was a ValueError from list_schedule
    (["--devices=8", "--flops_per_s=4e14"], 16, 8),
    (["--devices=1"], -1, 1),  # measured: refused before anything is timed
  ],
)
def test_plan_refuses_the_mesh_size_run_refuses(args, value, n):
  """The config's mesh.num_devices: `run`'s check of the field (fields.check), against the N
  devices planned; one line, exit 2. (A process of its own: absl defines a --config.X flag
  once per process.)"""
  r = subprocess.run(
    [sys.executable, "-m", "ihsweep.cli", "plan", "--config=configs/demo.py", *args,
     f"--config.mesh.num_devices={value}"],
    cwd=ROOT, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
  assert r.stderr == (
    f"ihsweep: invalid config: config.mesh.num_devices = {value} is not allowed: an integer in "
    f"[0, {n}] (0 = as many of the {n} devices as a group can use)\n"
  )


def test_ring_all_reduce_known_answer():
  """2 (n − 1) / n of the bytes over the slowest link, plus 2 (n − 1) latencies."""
  net = chips.Network("test", 100e9, 10e9, "made up", latency_s=1e-5)
  assert net.all_reduce_s(1e9, 4, False) == pytest.approx(2 * 3 / 4 * 1e9 / 100e9 + 6e-5)
  assert net.all_reduce_s(1e9, 4, True) == pytest.approx(2 * 3 / 4 * 1e9 / 10e9 + 6e-5)
  assert net.all_reduce_s(1e9, 1, True) == 0.0


def test_flops_model_prices_the_data_axis_all_reduce():
  """A group's gradient all-reduce per update: the models of one device (E / ensemble axis) ×
  parameters × 4 bytes over the data axis; none without a data axis; across hosts (the
  InfiniBand figure) once the data axis spans more devices than a host has."""
  net = chips.NETWORKS["h100"]
  model = timing.FlopsModel(1e14, net, devices_per_host=8)
  job = list_schedule.Job("g0", 2, 8, 64, updates=1000, flops_per_update=1e12, n_params=10**6)
  compute_8 = job.cost_flops / (8 * 1e14)
  t = model.seconds(job, 8)  # mesh 2 × 4: one model per device, its batch over 4
  ring = 2 * 3 / 4 * 4e6 / 450e9 + 6 * net.latency_s
  assert t.comm_s == pytest.approx(1000 * ring)
  assert t.total_s == pytest.approx(compute_8 + 1000 * ring)
  assert model.seconds(job, 2).comm_s == 0.0  # mesh 2 × 1: no data axis
  wide = list_schedule.Job("g1", 1, 32, 64, updates=10, flops_per_update=1e12, n_params=10**6)
  ring_16 = 2 * 15 / 16 * 4e6 / 50e9 + 30 * net.latency_s  # 1 × 16 spans two hosts of 8
  assert model.seconds(wide, 16).comm_s == pytest.approx(10 * ring_16)
  assert timing.FlopsModel(1e14).seconds(job, 8).comm_s == 0.0  # no network: not priced
  # rings of 4 on hosts of 6: devices 4–7 span two hosts, so every ring is priced across
  three = list_schedule.Job("g2", 3, 4, 64, updates=10, flops_per_update=1e12, n_params=10**6)
  ring_4x = 2 * 3 / 4 * 4e6 / 50e9 + 6 * net.latency_s
  on_6 = timing.FlopsModel(1e14, net, devices_per_host=6)
  assert on_6.seconds(three, 12).comm_s == pytest.approx(10 * ring_4x)


def test_phase_switches_are_priced():
  jobs = [
    list_schedule.Job(f"g{i}", 1, 8, 16, updates=100, flops_per_update=1e12, n_params=1000)
    for i in range(3)
  ]
  model = timing.FlopsModel(1e12, chips.NETWORKS["v5e"], devices_per_host=2)
  phases = phases_lib.time_phases(jobs, [(1, ("g0", "g1")), (2, ("g2",))], 2, 2, model)
  assert phases[1].start_s == pytest.approx(phases[0].end_s + 60.0)
  no_net = phases_lib.time_phases(jobs, [(1, ("g0", "g1")), (2, ("g2",))], 2, 2)
  assert no_net[1].start_s == no_net[0].end_s


def test_runtime_model_prices_known_accelerators_only():
  import types

  cpu = timing.runtime_model(jax.devices())
  assert cpu.network is None and cpu.flops_per_s == 1.0 and cpu.phase_switch_s == 0.0
  h100 = [
    types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", process_index=p)
    for p in (0,) * 8 + (1,) * 8
  ]
  m = timing.runtime_model(h100)
  assert m.network is chips.NETWORKS["h100"] and m.devices_per_host == 8
  assert m.flops_per_s == pytest.approx(0.4 * 989e12)
  other = [types.SimpleNamespace(platform="gpu", device_kind="NVIDIA L4", process_index=0)]
  assert timing.runtime_model(other).network is None
  # every chip `ihsweep plan --target` prices, by its device_kind (the auto layout's model)
  for kind, net in (
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("TPU v4", "v4"),
    ("TPU v6 lite", "v6e"),
    ("TPU v5 lite", "v5e"),
  ):
    chip = [types.SimpleNamespace(platform="tpu", device_kind=kind, process_index=0)]
    assert timing.runtime_model(chip).network is chips.NETWORKS[net], kind  # fmt: skip


def test_plan_at_study_scale_prices_communication_and_says_why_a_layout_wins(capsys):
  """exp1 on 64 H100s (8 per host, the default network): every E = 2 group on a host's 8 GPUs
  (one worker per host, ``--devices_per_worker=8``) splits each model's batch 4 ways and
  all-reduces its 54M-parameter gradient every update, most of the time at B = 8 (1.95M
  updates); 32 workers of 2 GPUs hold each model whole on its own GPU (no data axis). The plan
  marks that layout best, and it is the default launch (`ihsweep run`'s auto layout: 4 workers
  of 2 side by side in each of the job's 8 processes), printed with the line that starts it;
  against the fixed 8 × 8 it says why it is faster."""
  code, out, err = _plan(
    capsys, "--config=configs/exp1_natural.py", "--devices=64", "--flops_per_s=4e14", "--json",
    "--devices_per_worker=8",
  )  # fmt: skip
  assert code == 0, err
  host = json.loads(out)
  assert host["throughput"]["network"]["name"] == "h100"
  g = next(x for x in host["groups"] if x["batch_size"] == 8 and x["context_size"] == 64)
  net = chips.NETWORKS["h100"]
  assert g["mesh"] == [2, 4]
  ring = 2 * 3 / 4 * g["n_params"] * 4 / net.intra_host_bytes_per_s + 6 * net.latency_s
  assert g["times"]["comm_s"] == pytest.approx(g["updates"] * ring)
  assert g["times"]["comm_s"] > 5 * g["times"]["train_s"]
  assert host["comm_share"] > 0.5
  code, out, err = _plan(
    capsys, "--config=configs/exp1_natural.py", "--devices=64", "--flops_per_s=4e14", "--json"
  )
  p = json.loads(out)
  best = next(x for x in p["layouts"] if x["best"])
  assert best["devices_per_worker"] == 2 and best["groups_with_data_axis"] == 0
  assert best["comm_share"] == 0.0 and best["makespan_s"] < host["makespan_s"] / 2
  # the default launch: that layout, as phases of 4 workers of 2 in each of 8 processes
  ((phase),) = p["phases"]
  assert (phase["processes_per_worker"], phase["devices_per_worker"], phase["n_workers"]) == (
    1, 2, 32
  )  # fmt: skip
  assert p["makespan_s"] == pytest.approx(best["makespan_s"]) and p["comm_share"] == 0.0
  assert p["utilisation"] > 0.9 * 0.78  # issue 47: the packing bound 0.78; before, 0.53
  code, out, err = _plan(
    capsys, "--config=configs/exp1_natural.py", "--devices=64", "--flops_per_s=4e14"
  )
  assert "--network=h100: 450 GB/s per device each way within a host, 50 GB/s across" in out
  assert (
    "4 workers of 2 device(s) side by side in each process (sweep.devices_per_worker = 0" in out
  )
  assert "the default launch: `ihsweep run`'s auto layout (4 workers of 2 device(s) side by" in out
  assert "faster: " not in out
  assert (
    "\n  sbatch --nodes=8 --ntasks-per-node=1 --gpus-per-task=8 launch/slurm.sbatch "
    "--config=configs/exp1_natural.py --workdir=runs/exp1_natural\n" in out
  )
  code, out, err = _plan(
    capsys, "--config=configs/exp1_natural.py", "--devices=64", "--flops_per_s=4e14",
    "--config.sweep.devices_per_worker=8",
  )  # fmt: skip
  assert "faster: 32 × 2" in out and "all-reduce its gradient every update" in out
  # the phases' launch keeps the config's D; the faster layout's lines pin their own
  halves = out.split("faster: ", 1)
  assert halves[0].count(" --config.sweep.devices_per_worker=8") == 1, halves[0]
  assert halves[1].count(" --config.sweep.devices_per_worker=2") == 2, halves[1]
  assert "devices_per_worker=8" not in halves[1]


def test_a_faster_layout_is_explained_without_communication_too(capsys):
  """On 3 devices (one process of 3, one worker over them) every E = 2 group uses 2 of them in
  the phases; 3 workers
  of 1 keep all 3 busy: the plan says so, with no network priced, and prints the lines that
  start them with the plan's flags; the local one, run in the launcher's dry-run mode, starts
  3 workers of one GPU each whose `ihsweep run` flags the CLI accepts."""
  # in a process of its own: absl defines a --config.FIELD flag once per process, and the test
  # above gives this one too
  r = subprocess.run(
    [sys.executable, "-m", "ihsweep.cli", "plan", "--config=configs/exp1_natural.py",
     "--devices=3", "--flops_per_s=4e14", "--network=none",
     "--config.sweep.grid.train.batch_size=(8, 16, 32)", "--grid=train.context_size=64,1024",
     "--config.sweep.devices_per_worker=3"],  # one worker per process (auto would take 3 × 1)
    cwd=ROOT, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr
  out = r.stdout
  [line] = [x for x in out.splitlines() if x.startswith("faster: ")]
  assert line.startswith("faster: 3 × 1 ") and "busy" in line and "all-reduce" not in line
  assert "…" not in out
  flags_words = (
    "--config=configs/exp1_natural.py '--config.sweep.grid.train.batch_size=(8, 16, 32)' "
    "--grid=train.context_size=64,1024 --workdir=runs/exp1_natural"
  )
  lines = out.split(line, 1)[1].splitlines()[1:3]
  pinned = "--config.sweep.devices_per_worker=1"
  assert lines == [
    f"  sbatch --array=0-2 --gres=gpu:1 launch/slurm_array.sbatch {flags_words} {pinned}",
    f"  IHSWEEP_GPUS=0,1,2 launch/local_multiprocess.sh 3 --independent {flags_words} {pinned}",
  ]
  workers = _dry_run(lines[1])
  assert len(workers) == 3
  for k, w in enumerate(workers):
    assert f"CUDA_VISIBLE_DEVICES={k} " in w, w
    found, positional = flags.split_args(shlex.split(w.split(" ihsweep run ", 1)[1]))
    assert cli._check_flags("run", found, positional) is None and positional == []
    assert [f"--{name}={value}" for name, _, value in found] == shlex.split(flags_words) + [
      "--config.sweep.devices_per_worker=1"
    ]


def _dry_run(line: str) -> list[str]:
  """The per-worker commands a printed launch line runs, from the launcher's --dry-run (run from
  the repository root, as the plan's lines are), with the venv's ihsweep on PATH (its dry run
  checks that the command exists)."""
  path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
  env = {**os.environ, "IHSWEEP": "ihsweep", "XLA_FLAGS": "", "PATH": path}
  r = subprocess.run(
    ["bash", "-c", line.strip() + " --dry-run"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr
  return [x.strip() for x in r.stdout.strip().splitlines()]


def test_launch_lines_start_every_kind_of_layout_with_the_plans_flags(tmp_path):
  """placement.run_flags keeps the plan's config, overrides and axes (not its own flags) and adds
  --workdir; launch_lines: workers spanning hosts are one jax.distributed job with
  sweep.processes_per_worker; a TPU pod runs one process per host (tpu_pod.sh, whose dry run
  accepts the line), so workers narrower than a host get no line and say why."""
  found = flags.split_args(
    ["--config=configs/default.py:tiny", "--config.sweep.grid.train.batch_size=(8, 16)",
     "--config.sweep.processes_per_worker=4", "--zip=seed=0,1", "--devices=64", "--json"]
  )[0]  # fmt: skip
  words = ["--config=configs/default.py:tiny", "--config.sweep.grid.train.batch_size=(8, 16)"]
  words.append("--zip=seed=0,1")
  assert placement.run_flags(found) == words + ["--workdir=runs/default_tiny"]
  assert placement.run_flags(found, "/shared/x") == words + ["--workdir=/shared/x"]
  tpu = placement.run_flags(found, "runs/x", tpu=True)  # kept, under what every host mounts
  assert tpu == words + ["--workdir=/mnt/shared/runs/x"]
  tpu = placement.run_flags(found, tpu=True)
  assert tpu == words + ["--workdir=/mnt/shared/default_tiny"]
  lines, note = launch.launch_lines(words + ["--workdir=/shared/x"], 4, 16, 8)
  assert lines == [
    "sbatch --nodes=8 --ntasks-per-node=1 --gpus-per-task=8 launch/slurm.sbatch "
    "--config=configs/default.py:tiny '--config.sweep.grid.train.batch_size=(8, 16)' "
    "--zip=seed=0,1 --workdir=/shared/x --config.sweep.processes_per_worker=2"
  ]
  assert "one jax.distributed job of 8 processes" in note
  (line,), note = launch.launch_lines(tpu, 2, 8, 4, "tpu")
  assert line.endswith(" --config.sweep.processes_per_worker=2") and "4 host(s)" in note
  (tmp_path / "gcloud").write_text("#!/bin/sh\nexit 0\n")  # the dry run checks for gcloud
  (tmp_path / "gcloud").chmod(0o755)
  path = f"{tmp_path}:{os.environ.get('PATH', '')}"
  env = {**os.environ, "TPU_NAME": "my-tpu", "ZONE": "us-central2-b", "PATH": path}
  r = subprocess.run(["bash", "-c", line + " --dry-run"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=60)  # fmt: skip
  assert r.returncode == 0, r.stderr
  (cmd,) = r.stdout.strip().splitlines()
  assert cmd.startswith("gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central2-b --worker=all")
  assert "--config.sweep.processes_per_worker=2 >> /mnt/shared/default_tiny/logs/host_" in cmd
  # workers of 2 chips: each host's one process runs 2 of them side by side
  (line,), note = launch.launch_lines(tpu, 8, 2, 4, "tpu")
  assert (
    line.endswith(" --config.sweep.processes_per_worker=1 --config.sweep.devices_per_worker=2")
    and "each of its 4 host(s) runs one process of 2 workers of 2 chip(s) side by side" in note
  )
