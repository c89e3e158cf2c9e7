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

import numpy as np

from ihsweep.base import sharding
from ihsweep.compute import train
from ihsweep.training import hooks, resume, sinks, startup
from ihsweep.training.evaluation import json_value
from ihsweep.training.loader import HostLoader
from ihsweep.training.stopping import Interrupted, stop_requested

log = logging.getLogger("ihsweep")


class Trainer:
  """Runs ``calls`` (updates per host call) of ``program`` from ``run.state``. After each call,
  ``at_update`` runs the hooks in order (evaluate, save params, save state); the values of the
  calls before it are then read (``read``) and handed to every hook. Three hooks steer the
  loop: ``evaluate`` makes the rows of what it dispatched, ``stop_rule`` may end training at an
  evaluation update, ``save_state`` saves by the clock. A stop request (``request_stop``) saves
  the state and raises ``Interrupted``.

  ``done``: updates done; ``unread``: dispatched values not yet read (``hooks.Unread``);
  ``last_loss``: the last call read's mean loss ``[E]``; ``first_call_t``, ``compile_s``: when
  the first call had been dispatched (``perf_counter``) and the seconds its dispatch took."""

  def __init__(
    self,
    program,
    run: startup.Start,
    hook_list: list[hooks.Hook],
    *,
    evaluate: hooks.Evaluate | None,
    stop_rule: hooks.StopRule | None,
    save_state: hooks.SaveState,
    progress: hooks.Progress,
    evaluated: bool,
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
    self.arrays, self.schedule, self.start = run.arrays, run.schedule, run.start
    self.evaluate, self.stop_rule, self.evaluated = evaluate, stop_rule, evaluated
    self.save_state, self.progress, self.loader = save_state, progress, loader
    self.started, self.who = started, who  # perf_counter at fit's entry; log-line prefix
    self.num_steps, self.tokens_per_step = num_steps, tokens_per_step  # tokens: per model
    self.unread: list[hooks.Unread] = []
    self.stopped_early, self.last_loss = False, None
    self.first_call_t = self.compile_s = None

  def at_update(self, step: int, final: bool = False) -> None:
    """Every hook's ``at_update`` (``final``: the run stops at ``step``)."""
    for hook in self.hooks:
      hook.at_update(self, step, final)

  def read(self, before: int | None = None) -> None:
    """Reads the unread values (with ``before``: those computed before that update only), in
    the order they were dispatched — the loop's only host syncs — and hands them to the hooks."""
    now = [u for u in self.unread if before is None or u.step < before]
    self.unread = [u for u in self.unread if before is not None and u.step >= before]
    for u in now:
      host = sharding.to_host(u.values)
      if u.kind == "eval":
        values, diverged_at = host
        rows = self.evaluate.rows(u.step, values, diverged_at)
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
    self._before_first_call()
    self.save_state.start_clock()
    for k in self.calls:
      self._call(k)
      if self.stop_rule is not None and self.stop_rule.decides(self.done):
        self.read()  # decide now, before the next call
        self.stopped_early = self.stop_rule.stops(self.done)
      else:
        self.read(before=self.done)  # this call's values stay unread while the next one runs
      # One collective decides both for every process of the team (their clocks differ).
      interrupted, clock_due = sharding.any_process_each(
        (stop_requested(), self.save_state.clock_due()), self.team
      )
      if self.stopped_early or interrupted:
        self.at_update(self.done, final=True)
        if interrupted and self.done < self.num_steps:
          raise Interrupted(self.workdir, self.done)  # after the checkpoint
        break
      if clock_due and self.done not in self.save_state.saved:
        self.save_state.save(self, self.done)
    self.read()

  def _before_first_call(self) -> None:
    """A fresh run's hooks at update 0; a resumed run's evaluation if its rows were lost."""
    if self.start is None:
      self.at_update(0)
    elif self.evaluate is not None and self.schedule.eval_due(self.done) and not self.evaluated:
      self.unread.append(self.evaluate.dispatch(self.done, self.state))  # killed before its rows
    elif self.evaluate is not None and self.calls:
      # Compiled in start-up, as a fresh run's evaluation at update 0 is (values discarded):
      # its first compilation would otherwise count as training time (Throughput).
      self.evaluate.evaluator(self.state.params)
    if self.loader:
      self.loader.prefetch(self.done, self.calls)

  def _call(self, k: int) -> None:
    """Dispatches one call of ``k`` updates, then the hooks due at its last update."""
    data = self.loader.next() if self.loader else self.arrays
    first = self.first_call_t is None
    if first:
      log.info(
        "%scompiling the train program (or loading it from the compilation cache) …", self.who
      )
      dispatched = time.perf_counter()
    self.state, metrics = self.program(self.state, self.hp, data, k)  # runs while we read the last
    self.done += k
    if first:  # the first call's dispatch compiled or loaded the train program
      self.first_call_t = time.perf_counter()
      self.compile_s = self.first_call_t - dispatched
      self.progress.begin(self.done, metrics, self.started, self.compile_s, self.who)
    self.unread.append(hooks.Unread("train", self.done, metrics, k))
    self.at_update(self.done)


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
  run = startup.start(group, workdir, team, who)
  lined_up = resume.line_up_logs(workdir, team, run.start, run.schedule, group.n_models, stop_rule)
  if stop_rule is not None and stop_rule.done(run.done):
    run.calls = []  # stopped here before (emergence budget)
  tokens = train.tokens_per_update(group.tcfg)
  bar = hooks.Progress(
    group.tcfg.num_steps, group.n_models * tokens, show=progress, desc=desc, keep=keep_bar
  )
  trainer = _trainer(group, run, lined_up, bar, workdir, team, stop_rule, started, who)
  sink = hooks.Sinks(sinks.Writers(), train.cell_ids(group.cfg))
  try:
    trainer.hooks += [bar, hooks.Log(workdir, team.leads, trainer.tokens_per_step, who), sink]
    sink.writers = sinks.open_writers(group.cfg, workdir, team.leads, run.start)
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
      group.tcfg.num_steps,
    )
  return _result(trainer, stop_rule, bar.rate)


def _trainer(group, run, lined_up: tuple, bar, workdir, team, stop_rule, started, who) -> Trainer:
  """The loop over ``run`` with the hooks that steer it (evaluate, stop rule, params and state
  saves), the host loader of a host-fed source; ``train_group`` adds those that write."""
  cfg, tcfg = group.cfg, group.tcfg
  evaluated, loss_sum, loss_updates = lined_up
  tokens = train.tokens_per_update(tcfg)
  loader = None
  if group.host_fed:
    loader = HostLoader(group.source, run.state, group.mesh, tcfg.steps_per_call)
  evaluate = stop = None
  if run.evaluator is not None:
    evaluate = hooks.Evaluate(run.evaluator, run.schedule, cfg, tokens, loss_sum, loss_updates)
  if stop_rule is not None:
    stop = hooks.StopRule(stop_rule, run.schedule, tcfg.num_steps)
  every = cfg.checkpoint.state_every_minutes
  save_state = hooks.SaveState(run.ckpts, run.schedule, tokens, every)
  hook_list = [evaluate, stop, hooks.SaveParams(run.ckpts, run.schedule, tokens), save_state]
  return Trainer(
    group.train_program(),
    run,
    [h for h in hook_list if h is not None],
    evaluate=evaluate,
    stop_rule=stop,
    save_state=save_state,
    progress=bar,
    evaluated=evaluated,
    loader=loader,
    team=team,
    workdir=workdir,
    started=started,
    num_steps=tcfg.num_steps,
    tokens_per_step=tokens,
    who=who,
  )


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
