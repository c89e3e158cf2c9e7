"""The training loop's hooks (``loop.Trainer``), each a small class with its own state, all
through one interface (levanter's hooks with one step-info record are the model).

A hook acts at two kinds of moment. At an update (``StepInfo``: before the first call, after
each call, when the clock says a state save is due, at the run's last update) the loop asks
``due(info)`` and, where it is, calls ``at_update(info)``: evaluations and checkpoints are
dispatched here, on the schedule's steps. What ``at_update`` returns tells the loop what it did:
values it dispatched (``Unread``, read later), ``STOP`` (train no further), or None; where its
``reads_first(info)`` says so, every dispatched value is read before it acts. ``on_call`` /
``on_eval``: when the loop reads a dispatched call's or evaluation's values, which trails the
devices by one call — logs, sinks, the progress bar and the stop rule's record are written
here. ``time_due()`` asks the loop for a ``"clock"`` moment; ``close`` ends a hook's files. No
hook reads or changes the loop: it gets what it needs in ``StepInfo`` and its arguments. The
loop calls the hooks in the order it is given them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from ihsweep.training import sinks
from ihsweep.training.progress import Throughput

log = logging.getLogger("ihsweep")


class Unread(NamedTuple):
  """Values dispatched to the devices and not yet read by the loop."""

  kind: str  # "train" (a host call's metrics) or "eval" (an evaluation's values)
  step: int  # the update they were computed at
  values: Any  # train: {"loss", "grad_norm"} [K, E]; eval: (Evaluator values, diverged_at [E])
  updates: int  # the call's updates (K or fewer); 0 for an evaluation
  # eval: (step, host values, diverged_at [E]) -> the metrics.jsonl rows (``Evaluate.rows``)
  rows: Callable | None = None


STOP = "stop"  # what a hook's at_update returns to end training at this update (the stop rule)


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What the loop hands each hook at an update.

  Attributes:
    step: updates done.
    state: the ``TrainState`` after them (on the devices; the next call donates it, so a hook
      that keeps values copies them).
    moment: ``"begin"`` (before this run's first call: update 0 of a fresh run, or the restored
      update), ``"call"`` (after the host call ending at ``step``), ``"clock"``
      (``checkpoint.state_every_minutes`` passed, on some process of the team) or ``"final"``
      (the run stops here, early or on request).
    resumed: the run restored its state (``step`` at ``"begin"`` is the restored update).
    first: ``"call"`` after this run's first call (its dispatch compiled the train program).
    calls_left: host calls still to run.
    stopped_early: a hook returned ``STOP`` (the stop rule's budget).
  """

  step: int
  state: Any
  moment: str
  resumed: bool = False
  first: bool = False
  calls_left: int = 0
  stopped_early: bool = False


class Hook:
  """A hook that does nothing: a subclass overrides the moments it needs."""

  def reads_first(self, info: StepInfo) -> bool:
    """Whether the loop reads every dispatched value before ``at_update`` at ``info``."""
    return False

  def due(self, info: StepInfo) -> bool:
    """Whether ``at_update`` acts at ``info``."""
    return False

  def at_update(self, info: StepInfo) -> Unread | str | None:
    """Acts at an update ``due`` chose: returns values it dispatched, ``STOP`` or None."""
    return None

  def time_due(self) -> bool:
    """Whether this process's clock asks for a ``"clock"`` moment (read once per call)."""
    return False

  def on_call(self, row: dict, loss: np.ndarray) -> None:
    """A call's values were read: ``row`` its ``train_log.jsonl`` row (``step``, ``tokens``,
    ``updates``, per-model ``loss`` and ``grad_norm``), ``loss`` its mean loss, ``[E]`` float."""

  def on_eval(self, step: int, rows: list[dict], host: dict, diverged_at: np.ndarray) -> None:
    """An evaluation's values were read: ``rows`` its ``metrics.jsonl`` rows (one per model),
    ``host`` the evaluator's ``[E]`` arrays, ``diverged_at`` ``[E]`` int (-1: not diverged)."""

  def close(self) -> None:
    """The run ends (also on an error)."""


def add_call_loss(loss_sum: np.ndarray, loss: np.ndarray, updates: int) -> None:
  """Adds a call's training loss to ``loss_sum`` (``[E]`` float64, in place): its mean loss
  ``loss`` (``[E]``, the model's ``accum_dtype``: float32, or float64 in a float64 model) times
  its ``updates``, the product rounded to ``loss``'s dtype. The live run (``Evaluate``) and a
  resume (``resume.line_up_logs``, from the logged losses in that dtype) add through here call
  by call, in the same order, so their ``train_loss`` rows are equal to the bit."""
  loss_sum += loss * loss.dtype.type(updates)


class Evaluate(Hook):
  """Dispatches the online evaluation (``Evaluator``) at the schedule's evaluation updates, and
  turns its values into ``metrics.jsonl`` rows when read. Keeps the training loss since the
  last evaluation (per model, summed over updates), which each row averages."""

  def __init__(
    self, evaluator, schedule, cfg, tokens_per_step: int, lined_up: tuple[bool, Any, int]
  ):
    """``lined_up``: ``resume.line_up_logs``' (whether the restored update's evaluation has its
    rows, the training loss summed since the last evaluation ``[E]``, its updates)."""
    self.evaluator, self.schedule, self.cfg = evaluator, schedule, cfg
    self.tokens_per_step = tokens_per_step
    self.evaluated, self.loss_sum, self.loss_updates = lined_up

  def _rows_lost(self, info: StepInfo) -> bool:
    """A resumed run's restored update is an evaluation update whose rows a kill lost."""
    return self.schedule.eval_due(info.step) and not self.evaluated

  def due(self, info: StepInfo) -> bool:
    if info.moment == "begin" and info.resumed:  # its rows lost to a kill, or compile it now
      return self._rows_lost(info) or info.calls_left > 0
    return info.moment in ("begin", "call") and self.schedule.eval_due(info.step)

  def at_update(self, info: StepInfo) -> Unread | None:
    if info.moment == "begin" and info.resumed and not self._rows_lost(info):
      # Compiled in start-up, as a fresh run's evaluation at update 0 is (values discarded):
      # its first compilation would otherwise count as training time (Throughput).
      self.evaluator(info.state.params)
      return None
    return self.dispatch(info.step, info.state)

  def dispatch(self, step: int, state) -> Unread:
    """The evaluation of ``state``'s params at update ``step``, as the loop's unread values."""
    # diverged_at copied: the state is donated to the next call before this is read.
    values = (self.evaluator(state.params), jnp.copy(state.diverged_at))
    return Unread("eval", step, values, 0, self.rows)

  def on_call(self, row: dict, loss: np.ndarray) -> None:
    add_call_loss(self.loss_sum, loss, row["updates"])
    self.loss_updates += row["updates"]

  def rows(self, step: int, host: dict, diverged_at: np.ndarray) -> list[dict]:
    """The ``metrics.jsonl`` rows of the evaluation at ``step``; restarts the training loss."""
    train_loss = self.loss_sum / self.loss_updates if self.loss_updates else None
    rows = self.evaluator.rows(host, step, self.tokens_per_step, self.cfg, train_loss, diverged_at)
    self.loss_sum, self.loss_updates = np.zeros_like(self.loss_sum), 0
    return rows


class StopRule(Hook):
  """The 'until emergence + margin' budget (``EmergenceStop``): records every evaluation's
  metric per model; at an evaluation update before the last, says whether training stops."""

  def __init__(self, rule, schedule, num_steps: int):
    self.rule, self.schedule, self.num_steps = rule, schedule, num_steps

  def reads_first(self, info: StepInfo) -> bool:
    return True  # the evaluation at this update is read (observed) before deciding

  def on_eval(self, step: int, rows: list[dict], host: dict, diverged_at: np.ndarray) -> None:
    self.rule.observe(step, [r[self.rule.metric] for r in rows], diverged_at >= 0)

  def due(self, info: StepInfo) -> bool:
    """The rule decides at evaluation updates after a call."""
    return info.moment == "call" and self.schedule.eval_due(info.step)

  def at_update(self, info: StepInfo) -> str | None:
    """``STOP`` when every model is past its transition by the margin (before the last)."""
    return STOP if info.step < self.num_steps and self.rule.done(info.step) else None


class SaveParams(Hook):
  """Saves the params (``checkpoints/params``) at the schedule's params updates, and at an early
  stop. Reads the dispatched calls first when any is unread: the save waits for the last one
  anyway, and a read after it would time the save as training (``Throughput``)."""

  def __init__(self, ckpts, schedule, tokens_per_step: int):
    self.ckpts, self.schedule, self.tokens_per_step = ckpts, schedule, tokens_per_step
    self.saved: set[int] = set()  # by this run

  def reads_first(self, info: StepInfo) -> bool:
    return info.moment != "begin"  # nothing trained to read before the first call

  def due(self, info: StepInfo) -> bool:
    if info.step in self.saved or (info.moment == "begin" and info.resumed):
      return False
    if info.moment == "final":
      return info.stopped_early or self.schedule.params_due(info.step)
    return info.moment in ("begin", "call") and self.schedule.params_due(info.step)

  def at_update(self, info: StepInfo) -> None:
    step = info.step
    self.ckpts.save_params(step, info.state.params, {"tokens": step * self.tokens_per_step})
    self.saved.add(step)


def _clock() -> float:
  """Seconds on a monotonic clock: the time between full-state checkpoints (a test replaces it)."""
  return time.monotonic()


class SaveState(Hook):
  """Saves the full state (``checkpoints/state``) at the schedule's state updates, at the last
  update of a stop, and when ``checkpoint.state_every_minutes`` have passed (``clock_due``).
  Everything logged up to the step is read and written first, so a resume from it never lacks
  rows."""

  def __init__(self, ckpts, schedule, tokens_per_step: int, every_minutes: float):
    self.ckpts, self.schedule, self.tokens_per_step = ckpts, schedule, tokens_per_step
    self.every_s = 60.0 * every_minutes  # 0: none by time
    self.saved_t = None  # the clock at the last save (or the loop's start)
    self.saved: set[int] = set()  # by this run

  def due(self, info: StepInfo) -> bool:
    """At the schedule's state updates, a ``"clock"`` or ``"final"`` moment, once per update;
    at ``"begin"`` always (the clock starts there)."""
    if info.moment == "begin":
      return True
    if info.step in self.saved:
      return False
    return info.moment in ("clock", "final") or self.schedule.state_due(info.step)

  def _saves(self, info: StepInfo) -> bool:
    return info.moment != "begin" or (not info.resumed and self.schedule.state_due(info.step))

  def reads_first(self, info: StepInfo) -> bool:
    return self._saves(info)  # a resume from the save never lacks a row before it

  def at_update(self, info: StepInfo) -> None:
    """Saves the state at ``info.step`` (everything dispatched was read first); restarts the
    clock. At ``"begin"``, a fresh run's save at update 0 if due, then the clock starts."""
    step = info.step
    if self._saves(info):
      self.ckpts.save_state(step, info.state, {"tokens": step * self.tokens_per_step})
      self.saved.add(step)
    self.saved_t = _clock()

  def time_due(self) -> bool:
    """Whether ``checkpoint.state_every_minutes`` have passed since the last save."""
    return bool(self.every_s) and _clock() - self.saved_t >= self.every_s


def _short(values, limit: int = 8) -> str:
  """Per-model values for a log line: up to ``limit`` of them, 2 decimals."""
  v = [f"{x:.2f}" for x in np.asarray(values)[:limit]]
  return "[" + " ".join(v) + (" …]" if len(values) > limit else "]")


class Log(Hook):
  """Appends each call's row to ``train_log.jsonl`` and each evaluation's rows to
  ``metrics.jsonl`` (the team's lead only; flushed at once), and logs each evaluation in one
  line. ``who`` prefixes the line (a sweep's group id)."""

  def __init__(self, workdir: str, lead: bool, tokens_per_step: int, who: str = ""):
    self.tokens_per_step, self.who = tokens_per_step, who
    self.metrics = open(os.path.join(workdir, "metrics.jsonl"), "a") if lead else None
    self.train_log = open(os.path.join(workdir, "train_log.jsonl"), "a") if lead else None

  def on_call(self, row: dict, loss: np.ndarray) -> None:
    if self.train_log:
      self.train_log.write(json.dumps(row) + "\n")
      self.train_log.flush()

  def on_eval(self, step: int, rows: list[dict], host: dict, diverged_at: np.ndarray) -> None:
    if self.metrics:
      self.metrics.writelines(json.dumps(r) + "\n" for r in rows)
      self.metrics.flush()
    log.info(
      "%seval at update %d (%s tokens per model): ps_max %s, ar_acc %s, val_loss %s%s",
      self.who,
      step,
      f"{step * self.tokens_per_step:,}",
      _short(host["ps_max"]),
      _short(host["ar_acc"]),
      _short(host["val_loss"]),
      f"; diverged: {int((diverged_at >= 0).sum())}" if (diverged_at >= 0).any() else "",
    )

  def close(self) -> None:
    for f in (self.metrics, self.train_log):
      if f:
        f.close()


class Sinks(Hook):
  """Writes the rows as scalars to the live metric writers the config's ``log`` section opens
  (TensorBoard, W&B: ``ihsweep.training.sinks``), lead only."""

  def __init__(self, writers: sinks.Writers, cell_ids: list[int]):
    self.writers, self.cell_ids = writers, cell_ids

  def on_call(self, row: dict, loss: np.ndarray) -> None:
    self.writers.write_scalars(row["step"], sinks.train_scalars(row, self.cell_ids))

  def on_eval(self, step: int, rows: list[dict], host: dict, diverged_at: np.ndarray) -> None:
    self.writers.write_scalars(step, sinks.metric_scalars(rows))

  def close(self) -> None:
    self.writers.close()


class Progress(Hook):
  """The progress bar and the training speed after start-up (``Throughput``). After the first
  call has run (the loop waited for it: the end of start-up), opens the bar at the updates done
  and starts the rate; each later call's read adds to it (the first one's is start-up's, not
  timed). First in the loop's hooks, so that no save or evaluation runs before the origin."""

  def __init__(self, num_steps: int, tokens_per_call_update: int, *, show: bool, desc, keep: bool):
    self.num_steps = num_steps
    self.tokens_per_update = tokens_per_call_update  # all models together
    self.show, self.desc, self.keep = show, desc, keep
    self.rate = Throughput(num_steps)
    self.first_read, self.bar = True, None

  def due(self, info: StepInfo) -> bool:
    return info.first

  def at_update(self, info: StepInfo) -> None:
    """The origin of ``Throughput`` and the bar, at the first call's end."""
    step = info.step
    self.rate.begin(step)
    self.bar = tqdm(
      total=self.num_steps,
      initial=step,
      disable=not self.show,
      unit="upd",
      dynamic_ncols=True,
      desc=self.desc,
      smoothing=0,  # the average since start-up: the rate and ETA Throughput reports
      leave=self.keep,
    )

  def on_call(self, row: dict, loss: np.ndarray) -> None:
    step, k = row["step"], row["updates"]
    if self.first_read:  # the first call is start-up's (Throughput): not timed
      self.first_read = False
    else:
      self.rate.add(step, k, k * self.tokens_per_update)
    if self.bar is None:
      return
    if step > self.bar.n:  # the first call is in the bar's initial count
      self.bar.update(step - self.bar.n)
    finite = loss[np.isfinite(loss)]
    tok_s = self.rate.tokens_per_s
    self.bar.set_postfix(
      loss=f"{finite.mean():.4f}" if finite.size else "nan",
      tok_s="-" if math.isnan(tok_s) else f"{tok_s:,.0f}",
    )
    if step == self.num_steps:  # its last line at the last read, not after the last save
      self.bar.close()

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
