"""The sweep's progress line and ETA (``SweepProgress``), logged as ``ihsweep run``'s workers
train the groups."""

from __future__ import annotations

import logging
import os

from ihsweep.configuration.grid import Plan
from ihsweep.planning import placement, timing
from ihsweep.planning.prediction import duration
from ihsweep.runs import claims, rundir
from ihsweep.runs.rundir import group_dir, read_status
from ihsweep.training import runner

log = logging.getLogger("ihsweep")


class SweepProgress:
  """The sweep's progress, logged at its start and after each group this process trains (and
  drawn as a bar over the groups with ``progress``): the run directory's groups done / running
  / pending (a group whose worker is gone counts as pending: it is taken over), the tokens
  trained so far in all of them (done: up to their last update; others: their last logged
  update), and an ETA for the rest.

  The ETA ("~": an estimate) is the runtime model's seconds (``timing.runtime_model``: FLOPs at
  a share of the chip's peak, or the groups' compiled times where ``ihsweep plan --target`` left
  them; relative FLOPs on CPUs and unknown chips) for the updates left —
  each unfinished group's predicted updates (``placement.jobs_from_plan``: an 'emergence'
  budget's predicted stop) less those logged — scaled by measured / predicted seconds of the
  groups trained here (start-up included), and shared by the workers now training (this one
  and those holding groups). A group that stops early adds nothing more: its remaining updates
  are freed; with an 'emergence' budget the groups left are also expected to stop at the share
  of their predicted updates at which the groups finished here stopped (at most all of them).
  Before a group has finished here, the model's own seconds on a known chip, else no ETA."""

  def __init__(self, cfg, plan: Plan, workdir: str, devices: list, local: bool, progress: bool):
    import threading

    from tqdm.auto import tqdm

    self.plan, self.workdir = plan, workdir
    self.lock = threading.Lock()  # workers of one process share it (sweep.devices_per_worker)
    self.model = timing.runtime_model(devices)
    self.known_chip = self.model.flops_per_s > 1.0  # FlopsModel(1.0): relative FLOPs
    try:
      self.jobs = {j.id: j for j in placement.jobs_from_plan(cfg, plan)}
      self.model = self.model.compiled_for(self.jobs.values())  # as the auto layout prices them
      self.devices = {g.id: len(runner.group_devices(g.cfg, devices, local)) for g in plan.groups}
    except Exception as e:  # noqa: BLE001 — the progress line must never stop a sweep
      log.debug("no runtime prediction for the sweep's progress: %s", e)
      self.jobs, self.devices = {}, {}
    self.measured_s = self.predicted_s = 0.0  # over the groups trained here
    self.trained_here = 0
    # Emergence budget: updates at which finished groups stopped, and their predicted updates.
    self.emergence = cfg.sweep.get("budget") == "emergence"
    self.stopped_at = self.planned = 0
    self.bar = tqdm(
      total=len(plan.groups),
      disable=not progress,
      desc="sweep",
      unit="group",
      dynamic_ncols=True,
      bar_format="{desc}: {n_fmt}/{total_fmt} groups done |{bar}| {elapsed}{postfix}",
    )

  def _seconds(self, group_id: str, updates: float) -> float:
    """The runtime model's seconds for ``updates`` of a group (its job's linear share)."""
    job = self.jobs[group_id]
    total = self.model.seconds(job, self.devices[group_id]).total_s
    return total * updates / max(job.updates, 1)

  def finished(self, group, out, devices: int) -> None:
    """A group this process trained to its end (or early stop; ``out``: its ``FitResult``): its
    measured seconds against the model's for the updates it trained in this run."""
    with self.lock:
      self._finished(group, out, devices)

  def _finished(self, group, out, devices: int) -> None:
    updates = int(out.step) - int(out.resumed_from or 0)
    seconds = out.timings.total_s
    if group.id not in self.jobs or updates <= 0 or not seconds:
      return
    self.devices[group.id] = devices
    self.measured_s += float(seconds)
    self.predicted_s += self._seconds(group.id, updates)
    self.trained_here += 1
    self.stopped_at += int(out.step)
    self.planned += self.jobs[group.id].updates

  def report(self) -> None:
    """Logs the progress line and refreshes the bar."""
    with self.lock:
      self._report()

  def _report(self) -> None:
    counts = {"done": 0, "running": 0, "pending": 0, "failed": 0}
    tokens, left_s, early = 0, 0.0, 0
    for group in self.plan.groups:
      status = read_status(self.workdir, group.id)
      state = claims.group_state(self.workdir, group.id, status)
      per_update = (
        len(group.cells) * int(group.cfg.train.batch_size) * int(group.cfg.train.context_size)
      )
      if state == "done":
        step = int(status.get("step") or 0)
        early += bool(status.get("stopped_early"))
      else:
        step = rundir.last_step(os.path.join(group_dir(self.workdir, group.id), "train_log.jsonl"))
        step = int(step or 0)
        if group.id in self.jobs and state != "failed":
          planned = self.jobs[group.id].updates * self._stop_share()
          left_s += self._seconds(group.id, max(planned - step, 0))
      counts[state if state in counts else "pending"] += 1
      tokens += step * per_update
    eta, basis = self._eta(left_s, counts)
    log.info(
      "sweep progress: %d/%d groups done%s, %d running, %d pending%s; %s tokens trained; %s",
      counts["done"],
      len(self.plan.groups),
      f" ({early} stopped early)" if early else "",
      counts["running"],
      counts["pending"],
      f", {counts['failed']} failed" if counts["failed"] else "",
      f"{tokens:,}",
      basis,
    )
    self.bar.n = counts["done"]
    self.bar.set_postfix_str(f"{tokens:,} tokens; ETA {eta}", refresh=True)

  def _stop_share(self) -> float:
    """With an 'emergence' budget, the share of their predicted updates at which the groups
    finished here stopped (1 before any, or without that budget)."""
    if not self.emergence or not self.planned:
      return 1.0
    return min(self.stopped_at / self.planned, 1.0)

  def _eta(self, left_s: float, counts: dict) -> tuple[str, str]:
    """``(ETA as the bar shows it, the log line's ETA with what it is based on)``."""
    if not counts["running"] and not counts["pending"]:
      return "—", "nothing left"
    if not self.jobs:
      return "?", "no ETA (no runtime prediction for this plan)"
    # Those holding groups, and this one while groups are left to take.
    workers = max(counts["running"] + (1 if counts["pending"] else 0), 1)
    if self.predicted_s > 0:
      ratio = self.measured_s / self.predicted_s
      eta = duration(left_s * ratio / workers)
      speed = self.model.flops_per_s / ratio  # what the model's FLOP/s per device came to
      share = self._stop_share()
      stops = (
        f", the groups left stopping at {share:.0%} of their predicted updates as those did"
        if share < 1
        else ""
      )
      return f"~{eta}", (
        f"ETA ~{eta}: the updates left at the {speed:.3g} FLOP/s per device (runtime model's "
        f"FLOPs) measured over the {self.trained_here} group(s) trained here, start-up "
        f"included{stops}; {workers} worker(s)"
      )
    if self.known_chip:
      eta = duration(left_s / workers)
      return f"~{eta}", (
        f"ETA ~{eta}: the updates left at the runtime model's {self.model.flops_per_s:.3g} FLOP/s "
        f"per device, no start-up; {workers} worker(s); measured speeds replace it as groups "
        f"finish"
      )
    return "?", "ETA once a group has finished here (no speed known for these devices yet)"

  def close(self) -> None:
    self.bar.close()
