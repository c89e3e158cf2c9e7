"""The training loop of one group (``train_group``): start-up, then ``Trainer`` — one host call
of the compiled train program after another, each followed by the hooks (``ihsweep.training.hooks``)
due at its last update.

The loop dispatches host call i+1 before it reads call i's values (as nanodo does), so the
device never waits on Python; all per-step values come back as ``[K, E]`` arrays once per call.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax
import numpy as np

from ihsweep.base import sharding
from ihsweep.compute import train
from ihsweep.training import hooks, resume, sinks, startup
from ihsweep.training.evaluation import json_value
from ihsweep.training.loader import HostLoader
from ihsweep.training.stopping import Interrupted, stop_requested

log = logging.getLogger("ihsweep")


class Trainer:
  """Runs ``calls`` (updates per host call) of ``program`` from ``run.state``. At each moment
  (``hooks.StepInfo``: before the first call, after each call, when a hook's clock asks, at the
  last update) the hooks due act in order, each handed what it needs; what they dispatched is
  read later (``read``) and handed to every hook (``on_call``, ``on_eval``). A hook's ``STOP``
  ends training at that update (the stop rule); a stop request (``request_stop``) saves the state
  (the ``"final"`` moment) and raises ``Interrupted``.

  ``done``: updates done; ``unread``: dispatched values not yet read (``hooks.Unread``);
  ``last_loss``: the last call read's mean loss ``[E]``; ``first_call_t``, ``compile_s``: when
  the first call had been dispatched (``perf_counter``) and the seconds its dispatch took."""

  def __init__(
    self,
    program,
    run: startup.Start,
    hook_list: list[hooks.Hook],
    *,
    loader: HostLoader | None,
    team: sharding.Team,
    workdir: str,
    started: float,
    num_steps: int,
    tokens_per_step: int,
    who: str = "",
  ):
    self.program, self.hooks, self.team, self.workdir = program, hook_list, team, workdir
    self.state, self.hp, self.calls, self.done = run.state, run.hp, run.calls, run.done
    self.arrays, self.start, self.resumed = run.arrays, run.start, run.start is not None
    self.num_steps = num_steps
    self.loader, self.started, self.who = loader, started, who  # perf_counter at fit's entry
    self.tokens_per_step = tokens_per_step  # per model
    self.unread: list[hooks.Unread] = []
    self.stopped_early, self.last_loss = False, None
    self.first_call_t = self.compile_s = None

  def at_update(self, moment: str, calls_left: int = 0, first: bool = False) -> None:
    """The hooks due at ``moment`` of update ``done`` act, in order (``hooks.StepInfo``)."""
    for hook in self.hooks:
      info = hooks.StepInfo(
        self.done, self.state, moment, self.resumed, first, calls_left, self.stopped_early
      )
      if not hook.due(info):
        continue
      if hook.reads_first(info):
        self.read()
      out = hook.at_update(info)
      if out is hooks.STOP:
        self.stopped_early = True
      elif out is not None:
        self.unread.append(out)

  def read(self, before: int | None = None) -> None:
    """Reads the unread values (with ``before``: those computed before that update only), in
    the order they were dispatched — the loop's only host syncs — and hands them to the hooks."""
    now = [u for u in self.unread if before is None or u.step < before]
    self.unread = [u for u in self.unread if before is not None and u.step >= before]
    for u in now:
      host = sharding.to_host(u.values)
      if u.kind == "eval":
        values, diverged_at = host
        rows = u.rows(u.step, values, diverged_at)
        for hook in self.hooks:
          hook.on_eval(u.step, rows, values, diverged_at)
        continue
      k = u.updates
      self.last_loss = host["loss"][:k].mean(axis=0)
      row = {
        "step": u.step,
        "tokens": u.step * self.tokens_per_step,
        "updates": k,
        "loss": json_value(self.last_loss),
        "grad_norm": json_value(host["grad_norm"][:k].mean(axis=0)),
      }
      for hook in self.hooks:
        hook.on_call(row, self.last_loss)

  def run(self) -> None:
    """The loop, until the last call, an early stop, or a stop request."""
    self.at_update("begin", calls_left=len(self.calls))
    if self.loader:
      self.loader.prefetch(self.done, self.calls)
    for i, k in enumerate(self.calls):
      self._call(k, calls_left=len(self.calls) - i - 1)
      self.read(before=self.done)  # this call's values stay unread while the next one runs
      # One collective decides both for every process of the team (their clocks differ).
      interrupted, clock_due = sharding.any_process_each(
        (stop_requested(), any(hook.time_due() for hook in self.hooks)), self.team
      )
      if self.stopped_early or interrupted:
        self.at_update("final")
        if interrupted and self.done < self.num_steps:
          raise Interrupted(self.workdir, self.done)  # after the checkpoint
        break
      if clock_due:
        self.at_update("clock")
    self.read()

  def _call(self, k: int, calls_left: int) -> None:
    """Dispatches one call of ``k`` updates, then the hooks due at its last update. The first
    call's dispatch compiles (or loads) the train program; the loop waits for that call — the
    end of start-up — before its hooks."""
    data = self.loader.next() if self.loader else self.arrays
    first = self.first_call_t is None
    if first:
      log.info(
        "%scompiling the train program (or loading it from the compilation cache) …", self.who
      )
      dispatched = time.perf_counter()
    self.state, metrics = self.program(self.state, self.hp, data, k)  # runs while we read the last
    self.done += k
    if first:
      self.first_call_t = time.perf_counter()
      self.compile_s = self.first_call_t - dispatched
      jax.block_until_ready(metrics)
      log.info(
        "%sstart-up took %.1f s up to the end of the first call, %.1f s of it compiling (or "
        "loading) the train program; training from update %d of %d",
        self.who,
        time.perf_counter() - self.started,
        self.compile_s,
        self.done,
        self.num_steps,
      )
    self.unread.append(hooks.Unread("train", self.done, metrics, k))
    self.at_update("call", calls_left, first)


def train_group(
  group,
  workdir: str,
  *,
  team,
  who: str,
  progress: bool,
  desc,
  stop_rule,
  started: float,
  keep_bar: bool,
) -> FitResult:
  """Trains ``group`` (a ``runner`` group) in ``workdir`` as ``runner.fit`` documents, once the
  directory is locked: start-up (``startup.start``), the logs lined up with the restored step
  (``resume.line_up_logs``), then the loop with its hooks; returns ``fit``'s result. ``who``
  prefixes its log lines (a sweep's group id and a colon, or nothing)."""
  cfg, tcfg = group.cfg, group.tcfg
  run = startup.start(group, workdir, team, who)
  lined_up = resume.line_up_logs(
    workdir, team, run.start, run.schedule, group.n_models, stop_rule, group.mcfg.accum_dtype
  )
  if stop_rule is not None and stop_rule.done(run.done):
    run.calls = []  # stopped here before (emergence budget)
  tokens = train.tokens_per_update(tcfg)
  loader = None
  if group.host_fed:
    loader = HostLoader(group.source, run.state, group.mesh, tcfg.steps_per_call)
  bar = hooks.Progress(
    tcfg.num_steps, group.n_models * tokens, show=progress, desc=desc, keep=keep_bar
  )
  sink = hooks.Sinks(sinks.Writers(), train.cell_ids(cfg))
  # The order they act in at an update: the bar's origin first, then the evaluation, the stop
  # rule (which reads that evaluation), the saves (after everything before them was read).
  hook_list = [bar]
  if run.evaluator is not None:
    hook_list.append(hooks.Evaluate(run.evaluator, run.schedule, cfg, tokens, lined_up))
  if stop_rule is not None:
    hook_list.append(hooks.StopRule(stop_rule, run.schedule, tcfg.num_steps))
  hook_list += [
    hooks.SaveParams(run.ckpts, run.schedule, tokens),
    hooks.SaveState(run.ckpts, run.schedule, tokens, cfg.checkpoint.state_every_minutes),
  ]
  trainer = Trainer(
    group.train_program(),
    run,
    hook_list,
    loader=loader,
    team=team,
    workdir=workdir,
    started=started,
    num_steps=tcfg.num_steps,
    tokens_per_step=tokens,
    who=who,
  )
  try:
    trainer.hooks += [hooks.Log(workdir, team.leads, tokens, who), sink]
    sink.writers = sinks.open_writers(cfg, workdir, team.leads, run.start)
    trainer.run()
  finally:
    for hook in trainer.hooks:
      hook.close()
    if trainer.loader:
      trainer.loader.close()
    run.ckpts.close()  # waits for asynchronous writes
  if trainer.stopped_early:
    log.info(
      "%severy model past its transition by the margin: stopped at update %d of %d",
      who,
      trainer.done,
      tcfg.num_steps,
    )
  return _result(trainer, stop_rule, bar.rate)


@dataclasses.dataclass(frozen=True)
class Timings:
  """Wall seconds of one ``fit``.

  Attributes:
    setup_s: from entry until the first training call is dispatched (validating, building,
      restoring, compiling; the whole call if nothing was left to train).
    train_s: the rest (training calls, evaluations, checkpoints, waiting for the last writes).
    total_s: both.
    compile_s: the first training call's dispatch, which compiles the train program or loads
      it (part of ``setup_s``); None when no call was made.
  """

  setup_s: float
  train_s: float
  total_s: float
  compile_s: float | None = None

  def to_json(self) -> dict:
    """``{"setup_s", "train_s", "total_s"[, "compile_s"]}``, rounded to ms (``status.json``)."""
    return {k: round(float(v), 3) for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class FitResult:
  """What ``runner.fit`` returns.

  Attributes:
    state: the final ``TrainState`` (leading axis E).
    losses: [E] losses of the last call (None if nothing was left to train).
    resumed_from: the update count restored, or None.
    step: updates done.
    stopped_early: whether training ended before ``train.num_steps`` (the stop rule).
    diverged_at: int [E] update counts at which each model's loss turned NaN/inf (-1: never).
    crossed: the stop rule's first evaluation step at or above its threshold per model (None
      without a stop rule).
    tokens_per_s, updates_per_s: throughput after start-up (all models' tokens;
      ``progress.Throughput``; NaN when only one call was trained).
    timings: ``Timings``.
  """

  state: Any
  losses: Any
  resumed_from: int | None
  step: int
  stopped_early: bool
  diverged_at: np.ndarray
  crossed: list | None
  tokens_per_s: float
  updates_per_s: float
  timings: Timings


def _result(trainer: Trainer, stop_rule, rate) -> FitResult:
  """``fit``'s result from the loop's end state."""
  end = time.perf_counter()
  first = trainer.first_call_t or end
  stopped = trainer.stopped_early or (stop_rule is not None and trainer.done < trainer.num_steps)
  return FitResult(
    state=trainer.state,
    losses=trainer.last_loss,
    resumed_from=trainer.start,
    step=trainer.done,
    stopped_early=stopped,
    diverged_at=np.asarray(sharding.to_host(trainer.state.diverged_at)),
    crossed=list(stop_rule.crossed) if stop_rule is not None else None,
    tokens_per_s=rate.tokens_per_s,
    updates_per_s=rate.updates_per_s,
    timings=Timings(first - trainer.started, end - first, end - trainer.started, trainer.compile_s),
  )
