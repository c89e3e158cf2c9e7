"""A placement prediction (``Prediction``, made by ``placement.predict``) as ``ihsweep plan``
prints it: JSON (``Prediction.to_json``) or text (``format_text``), with the durations and group
lists the text (and ``ihsweep run``'s progress) writes."""

from __future__ import annotations

import dataclasses
from typing import Any

from ihsweep.base import sharding
from ihsweep.compute import schedule
from ihsweep.compute import schedule as schedule_lib
from ihsweep.configuration.grid import ranges
from ihsweep.planning.launch import default_launch_lines, launch_lines
from ihsweep.planning.list_schedule import Schedule, Slot
from ihsweep.planning.phases import PhasedSchedule


@dataclasses.dataclass
class Prediction:
  """What ``ihsweep plan`` prints: the jobs, the throughput model, the phases
  (``phased``; ``phases_reason``: where they came from) on ``n_processes`` × ``devices_per_process``
  devices, and every one-phase layout tried (``layouts``; ``chosen_layout``: the one the phases
  are, where they are one phase and it is timed, else None; ``layout``: the best,
  ``placement.best_layout``: the chosen one unless another beats the phases)."""

  n_devices: int
  budget: str
  n_cells: int
  jobs: list
  model: Any
  phased: PhasedSchedule
  phases_reason: str
  layouts: list
  layout: Schedule
  n_processes: int = 1
  devices_per_process: int = 1
  updates_note: str = ""
  schedule_note: str = ""  # the groups' learning-rate schedule and its horizon
  run_flags: list = dataclasses.field(default_factory=list)  # placement.run_flags: the launch's
  platform: str = "gpu"  # what the launch lines start workers on (gpu | tpu)
  default_launch: bool = True  # the phases are `ihsweep run`'s (no --devices_per_worker)
  pinned_devices_per_worker: int = 0  # the config's sweep.devices_per_worker (0: auto)
  chosen_layout: Schedule | None = None

  def slot(self, job) -> Slot:
    return next(s for s in self.phased.slots if s.group == job.id)

  def communication(self, slots) -> dict:
    """Of ``slots``' device-time (Σ m · t): the share spent in gradient all-reduces
    (``comm_share``, 0 where the model prices none), and how many groups have a data axis."""
    by_id = {j.id: j for j in self.jobs}
    held = comm = 0.0
    with_data_axis = 0
    for s in slots:
      job = by_id[s.group]
      t = self.model.seconds(job, s.devices)
      held += s.devices * t.total_s
      comm += s.devices * t.comm_s
      with_data_axis += sharding.mesh_shape(job.n_models, job.batch_size, s.devices)[1] > 1
    return {"comm_share": comm / held if held else 0.0, "groups_with_data_axis": with_data_axis}

  def checkpoints(self, job) -> dict:
    """``schedule.checkpoint_bytes`` of ``job`` over its predicted time on its slot."""
    seconds = self.model.seconds(job, self.slot(job).devices).total_s
    return schedule.checkpoint_bytes(job.cfg, job.n_params, job.updates, seconds)

  def to_json(self) -> dict:
    rows = []
    phases = self.phased.phases
    for job in self.jobs:
      slot = self.slot(job)
      m = slot.devices
      times = self.model.seconds(job, m)
      row = {
        "group": job.id,
        "cells": list(job.cells),
        "n_models": job.n_models,
        "batch_size": job.batch_size,
        "context_size": job.context_size,
        "updates": job.updates,
        "cap_updates": job.cap_updates,
        "schedule_updates": _schedule_updates(job),
        "cost_flops": job.cost_flops,
        "eval_flops": job.eval_flops,
        "n_params": job.n_params,
        "phase": slot.phase,
        "devices_per_worker": phases[slot.phase].devices_per_worker,
        "devices": m,
        "mesh": list(sharding.mesh_shape(job.n_models, job.batch_size, m)),
        "seconds": times.total_s,
        "times": times.to_json(),
        "checkpoints": self.checkpoints(job),
      }
      rows.append(row)
    one = phases[0] if len(phases) == 1 else None
    return {
      "n_devices": self.n_devices,
      "n_processes": self.n_processes,
      "devices_per_process": self.devices_per_process,
      "budget": self.budget,
      "n_cells": self.n_cells,
      "n_groups": len(self.jobs),
      "throughput": self.model.to_json(),
      "updates_note": self.updates_note,
      "schedule_note": self.schedule_note,
      "groups": rows,
      "checkpoints": schedule.checkpoint_totals([r["checkpoints"] for r in rows]),
      "phases_reason": self.phases_reason,
      "phases": [p.to_json() for p in phases],
      "devices_per_worker": one.devices_per_worker if one else None,
      "n_workers": one.n_workers if one else None,
      "schedule": [dataclasses.asdict(s) for s in self.phased.slots],
      "makespan_s": self.phased.makespan_s,
      "utilisation": self.phased.utilisation,
      **self.communication(self.phased.slots),
      "layouts": [
        {
          "devices_per_worker": s.devices_per_worker,
          "n_workers": s.n_workers,
          "processes_per_worker": max(1, s.devices_per_worker // self.devices_per_process),
          "makespan_s": s.makespan_s,
          "utilisation": s.utilisation,
          **self.communication(s.slots),
          "refused": s.refused,
          "best": s is self.layout,
          "chosen": s is self.chosen_layout,
        }
        for s in self.layouts
      ],
    }


def duration(seconds: float | None) -> str:
  """``42 s``, ``3.5 min``, ``2.1 h``, ``3.2 d``."""
  if seconds is None:
    return "—"
  for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
    if seconds >= size:
      return f"{seconds / size:.{1 if seconds < 100 * size else 0}f} {unit}"
  return f"{seconds:.1f} s" if 0 < seconds < 10 else f"{seconds:.0f} s"


def _percent(x: float | None) -> str:
  return "—" if x is None else f"{100 * x:.1f}%"


def group_list(ids) -> str:
  """``g000–g004, g007``: group ids with runs of consecutive numbers shortened."""
  import re

  nums = [re.fullmatch(r"g(\d+)", i) for i in ids]
  if not all(nums):
    return ", ".join(ids)
  width = len(ids[0]) - 1
  values = sorted(int(m.group(1)) for m in nums)
  runs, start = [], values[0] if values else None
  for a, b in zip(values, values[1:] + [None]):
    if b != a + 1:
      runs.append(f"g{start:0{width}d}" + (f"–g{a:0{width}d}" if a != start else ""))
      start = b
  return ", ".join(runs)


def _layout_name(devices_per_worker: int, n_workers: int, per_process: int) -> str:
  teams = devices_per_worker // per_process
  return f"{n_workers} × {devices_per_worker}" + (
    f" ({teams} processes each)" if devices_per_worker > per_process else ""
  )


def format_text(p: Prediction) -> str:
  """The plan as ``ihsweep plan`` prints it."""
  lines = [
    f"{p.n_cells} cells in {len(p.jobs)} groups (budget '{p.budget}') on N = "
    f"{p.n_devices} devices: {p.n_processes} process(es) × {p.devices_per_process}",
    f"throughput: {p.model.describe()}",
  ]
  if p.updates_note:
    lines.append(f"updates: {p.updates_note}")
  if p.schedule_note:
    lines.append(f"learning-rate schedule: {p.schedule_note}")
  lines += _group_lines(p)
  lines += _layout_lines(p)
  lines += _phase_lines(p)
  lines += _schedule_lines(p)
  lines += _outcome_lines(p)
  return "\n".join(lines)


def _schedule_updates(job) -> int:
  """The updates the group's learning-rate schedule spans (``train.schedule_steps``, else its
  budget's updates)."""
  tr = job.cfg.train if job.cfg is not None else {}
  return int(tr.get("schedule_steps", 0) or 0) or int(job.cap_updates)


def _group_lines(p: Prediction) -> list[str]:
  """The groups' table (updates, FLOPs, phase, devices, time) and their checkpoints."""
  lines = [
    "",
    f"{'group':6} {'cells':>9} {'E':>3} {'B':>5} {'C':>5} {'updates':>10} "
    f"{'(cap)':>10} {'FLOPs':>9} {'phase':>5}  {'devices (e×d)':>13} {'time':>9}",
  ]
  for job in p.jobs:
    slot = p.slot(job)
    m = slot.devices
    e, dd = sharding.mesh_shape(job.n_models, job.batch_size, m)
    lines.append(
      f"{job.id:6} {ranges(list(job.cells)):>9} {job.n_models:>3} "
      f"{job.batch_size:>5} {job.context_size:>5} {job.updates:>10,} "
      f"{f'({job.cap_updates:,})':>10} {job.cost_flops:>9.3g} {slot.phase + 1:>5}  "
      f"{f'{m} ({e}×{dd})':>13} {duration(p.model.seconds(job, m).total_s):>9}"
    )
  totals = schedule_lib.checkpoint_totals([p.checkpoints(job) for job in p.jobs])
  return lines + [schedule_lib.describe_checkpoint_totals(totals)]


def _layout_lines(p: Prediction) -> list[str]:
  """Every one-phase layout tried: refused, not predicted, or its makespan and utilisation."""
  lines = ["", "one-phase layouts (workers × devices each):"]
  for s in p.layouts:
    name = _layout_name(s.devices_per_worker, s.n_workers, p.devices_per_process)
    mark = _layout_mark(p, s) if len(p.layouts) > 1 else ""
    lines.append(
      f"  {name:<28} "
      + (
        f"refused: {s.refused}"
        if s.refused
        else f"not predicted: {s.unpredicted}"
        if s.unpredicted
        else f"makespan {duration(s.makespan_s):>9}, utilisation {_percent(s.utilisation):>6}"
        + _comm_text(p, s.slots)
        + mark
      )
    )
  return lines


def _layout_mark(p: Prediction, s) -> str:
  """'  <- best', '  <- best, the phases' layout' or '  <- the phases' layout' (a faster one is
  then best: the plan says why and how to run it), or ''."""
  marks = ["best"] if s is p.layout else []
  if s is p.chosen_layout:
    marks.append("the phases' layout")
  return "  <- " + ", ".join(marks) if marks else ""


def _phase_lines(p: Prediction) -> list[str]:
  """Where the phases came from, and each phase's teams, groups, start, end and utilisation."""
  lines = [
    "",
    f"phases: {p.phases_reason}",
    f"  {'phase':>5}  {'workers × devices':<28} {'groups':>6} {'start':>9} {'end':>9} "
    f"{'utilisation':>11}  groups",
  ]
  for k, ph in enumerate(p.phased.phases):
    name = _layout_name(ph.devices_per_worker, ph.n_workers, p.devices_per_process)
    lines.append(
      f"  {k + 1:>5}  {name:<28} {len(ph.groups):>6} {duration(ph.start_s):>9} "
      f"{duration(ph.end_s):>9} {_percent(ph.utilisation):>11}  "
      f"{group_list(ph.groups)}"
    )
  return lines


def _schedule_lines(p: Prediction) -> list[str]:
  """Each group's slot: phase, worker, devices, start and end."""
  lines = [
    "",
    "schedule (in each phase the groups most expensive first, each to "
    "the worker free first; a phase starts when the previous one ends):",
    f"  {'phase':>5} {'worker':>6}  {'group':6} {'devices':>7} {'start':>9} {'end':>9}",
  ]
  for s in sorted(p.phased.slots, key=lambda s: (s.phase, s.start_s, s.worker)):
    lines.append(
      f"  {s.phase + 1:>5} {s.worker:>6}  {s.group:6} {s.devices:>7} "
      f"{duration(s.start_s):>9} {duration(s.end_s):>9}"
    )
  return lines


def _outcome_lines(p: Prediction) -> list[str]:
  """The sweep's makespan and utilisation, the best one-phase layout's, and why it is faster."""
  phased, phases, d, best = p.phased, p.phased.phases, p.devices_per_process, p.layout
  shape = ", then ".join(_layout_name(ph.devices_per_worker, ph.n_workers, d) for ph in phases)
  lines = [
    "",
    f"the sweep ({len(phases)} phase(s): {shape}): "
    f"makespan {duration(phased.makespan_s)}, utilisation "
    f"{_percent(phased.utilisation)}" + _comm_text(p, phased.slots),
    *_default_launch(p),
    f"best one-phase layout, {_layout_name(best.devices_per_worker, best.n_workers, d)}"
    f": makespan {duration(best.makespan_s)}, utilisation "
    f"{_percent(best.utilisation)}" + _comm_text(p, best.slots),
  ]
  why = _why_best(p)
  if why:
    lines.append(why)
  return lines


def local_workers(devices_per_process: int, devices_per_worker: int) -> str:
  """A process's process-local workers in words: '4 workers of 2 device(s) side by side in
  each process', or 'one worker of 8 device(s) per process'."""
  count = devices_per_process // devices_per_worker
  if count > 1:
    return f"{count} workers of {devices_per_worker} device(s) side by side in each process"
  return f"one worker of {devices_per_worker} device(s) per process"


def _default_launch(p: Prediction) -> list[str]:
  """How to start the sweep as its phases are planned: ``ihsweep run``'s phases
  (``launch.default_launch_lines``, the config's ``sweep.devices_per_worker`` kept), or the
  one phase of a fixed D (``launch.launch_lines``); [] without run flags."""
  if not p.run_flags:
    return []
  if not p.default_launch:
    (phase,) = p.phased.phases
    lines, note = launch_lines(
      p.run_flags, phase.n_workers, phase.devices_per_worker, p.devices_per_process, p.platform
    )
    return [f"  to run it ({note}):", *(f"  {line}" for line in lines)]
  pinned = p.pinned_devices_per_worker
  flags = p.run_flags + ([f"--config.sweep.devices_per_worker={pinned}"] if pinned else [])
  lines, note = default_launch_lines(flags, p.n_processes, p.devices_per_process, p.platform)
  local = next((x for x in p.phased.phases if x.processes_per_worker == 1), None)
  what = (
    local_workers(p.devices_per_process, local.devices_per_worker)
    if local
    else "workers of several processes"
  )
  layout = (
    f"layout ({what}, the config's sweep.devices_per_worker)"
    if pinned
    else f"auto layout ({what}) on chips it prices this way (timing.runtime_model)"
  )
  head = f"  the default launch: `ihsweep run`'s {layout}; to run it ({note}):"
  return [head, *(f"  {line}" for line in lines)]


def _comm_text(p: Prediction, slots) -> str:
  """', of which all-reduces 61% (24 groups with a data axis)' where the model prices them."""
  if getattr(p.model, "network", None) is None:
    return ""
  c = p.communication(slots)
  return (
    f", of which all-reduces {_percent(c['comm_share'])} ({c['groups_with_data_axis']} "
    f"group(s) with a data axis)"
  )


def _why_best(p: Prediction) -> str:
  """Why the best one-phase layout beats the phases (which a jax.distributed job of these
  processes would run), and how to run it; '' when it does not."""
  best, phased = p.layout, p.phased
  if not phased.beaten_by(best):  # as placement.best_layout decides
    return ""
  d, per_process = best.devices_per_worker, p.devices_per_process
  ours, theirs = p.communication(best.slots), p.communication(phased.slots)
  reasons = []
  if theirs["comm_share"] > ours["comm_share"] + 0.01:
    reasons.append(
      f"in the phases {theirs['groups_with_data_axis']} of {len(p.jobs)} groups split each "
      f"model's batch over a data axis and all-reduce its gradient every update "
      f"({_percent(theirs['comm_share'])} of their device-time), here "
      f"{ours['groups_with_data_axis']} do ({_percent(ours['comm_share'])})"
    )
  if (best.utilisation or 0) > phased.utilisation + 0.01:
    reasons.append(
      f"its devices are busy {_percent(best.utilisation)} of the time, the phases' "
      f"{_percent(phased.utilisation)} (workers of whole processes leave devices idle beside "
      f"groups that cannot use them all, or wait for the last groups)"
    )
  lines, note = launch_lines(p.run_flags, best.n_workers, d, per_process, p.platform)
  return "\n  ".join(
    [
      f"faster: {_layout_name(d, best.n_workers, per_process)} "
      f"({phased.makespan_s / best.makespan_s:.1f}× the phases' speed): "
      + "; ".join(reasons or ["a better balance of the groups over the workers"])
      + f"; to run it ({note}):",
      *lines,
    ]
  )
