"""The training loop's one hook interface (``loop.Trainer``, ``hooks.Hook``) with a fake program:
the moments each hook is handed, in order; what a hook returns (values to read later, STOP);
reads before a hook that asks for them. No compilation: the program adds K to an integer."""

import types

import numpy as np

from ihsweep.base import sharding
from ihsweep.training import hooks, loop

E = 2


def _program(state, hp, data, k):
  """The fake train program: ``state`` counts updates; per-update loss 1 / (update + 1)."""
  steps = state.step + 1 + np.arange(k)
  loss = np.repeat((1.0 / steps)[:, None], E, axis=1)
  return types.SimpleNamespace(step=state.step + k), {"loss": loss, "grad_norm": loss}


class Recorder(hooks.Hook):
  """Records every moment it is handed and what it has read by then; acts where ``acts``."""

  def __init__(self, seen, name, acts=lambda info: False, reads=False, returns=None, clock=()):
    self.seen, self.name, self.acts, self.reads = seen, name, acts, reads
    self.returns, self.clock, self.read_steps = returns, set(clock), []
    self.step = 0

  def due(self, info):
    self.seen.append((self.name, info.moment, info.step, info.first, info.calls_left))
    self.step = info.step
    return self.acts(info)

  def reads_first(self, info):
    return self.reads

  def at_update(self, info):
    self.seen.append((self.name, "acts", info.step, tuple(self.read_steps)))
    return self.returns(info) if self.returns else None

  def on_call(self, row, loss):
    self.read_steps.append(row["step"])

  def on_eval(self, step, rows, host, diverged_at):
    self.read_steps.append(("eval", step, rows))

  def time_due(self):
    return self.step in self.clock


def _trainer(hook_list, calls=(10, 10, 10), start=None):
  run = types.SimpleNamespace(
    state=types.SimpleNamespace(step=start or 0),
    hp=None,
    calls=list(calls),
    done=start or 0,
    arrays=None,
    start=start,
  )
  return loop.Trainer(
    _program,
    run,
    hook_list,
    loader=None,
    team=sharding.Team((0,)),
    workdir="unused",
    started=0.0,
    num_steps=(start or 0) + sum(calls),
    tokens_per_step=64,
  )


def test_each_hook_is_handed_every_moment_in_order_and_the_clock_adds_one():
  seen = []
  trainer = _trainer([Recorder(seen, "a", clock={20}), Recorder(seen, "b")])
  trainer.run()
  asked = [s for s in seen if s[1] != "acts"]
  assert asked == [
    ("a", "begin", 0, False, 3),
    ("b", "begin", 0, False, 3),
    ("a", "call", 10, True, 2),
    ("b", "call", 10, True, 2),
    ("a", "call", 20, False, 1),
    ("b", "call", 20, False, 1),
    ("a", "clock", 20, False, 0),  # a's clock asked for it after the call ending at 20
    ("b", "clock", 20, False, 0),
    ("a", "call", 30, False, 0),
    ("b", "call", 30, False, 0),
  ]
  assert trainer.done == 30 and not trainer.stopped_early
  assert trainer.hooks[1].read_steps == [10, 20, 30]  # every call read once, in order
  np.testing.assert_allclose(trainer.last_loss, [np.mean(1 / np.arange(21, 31))] * E)


def test_a_hook_that_reads_first_sees_every_call_and_stop_ends_the_run_with_a_final_moment():
  seen = []
  saver = Recorder(seen, "save", acts=lambda info: info.moment == "final", reads=True)
  stop = Recorder(
    seen,
    "stop",
    acts=lambda info: info.moment == "call" and info.step == 20,
    reads=True,
    returns=lambda info: hooks.STOP,
  )
  trainer = _trainer([stop, saver])
  trainer.run()
  acted = [s for s in seen if s[1] == "acts"]
  # the stop rule read the calls up to its own (20) before deciding; the final save too
  assert acted == [("stop", "acts", 20, (10, 20)), ("save", "acts", 20, (10, 20))]
  finals = [s for s in seen if s[1] == "final"]
  assert [s[0] for s in finals] == ["stop", "save"] and trainer.stopped_early
  assert trainer.done == 20  # the call to 30 never ran


def test_values_a_hook_dispatches_are_read_later_into_rows_every_hook_gets():
  seen = []

  def evaluation(info):
    rows = lambda step, values, diverged_at: [{"step": step, "value": float(values["x"])}]  # noqa: E731
    return hooks.Unread("eval", info.step, ({"x": np.float32(info.step)}, np.full(E, -1)), 0, rows)

  evaluate = Recorder(seen, "eval", acts=lambda info: info.step in (0, 20), returns=evaluation)
  other = Recorder(seen, "other")
  trainer = _trainer([evaluate, other])
  trainer.run()
  # the evaluation at 0 is read with the first call's values (after it, not before); the one at
  # 20 after the call ending at 20, as its values were dispatched: dispatch order is read order
  assert other.read_steps == [
    ("eval", 0, [{"step": 0, "value": 0.0}]),
    10,
    20,
    ("eval", 20, [{"step": 20, "value": 20.0}]),
    30,
  ]


def test_a_resumed_run_begins_at_the_restored_update():
  seen = []
  trainer = _trainer([Recorder(seen, "a")], calls=(10,), start=20)
  trainer.run()
  assert seen[0] == ("a", "begin", 20, False, 1) and trainer.resumed and trainer.done == 30
