"""Which updates end a host call, get evaluated, get saved: one home for a run's step schedules.

Every schedule is arithmetic on update counts (steps), decided from the config once:

* evaluation every ``eval_interval`` updates and at the end (``eval_due``);
* params checkpoints at the token-based ``params_steps`` (log-spaced, denser around the
  transition the emergence law predicts, or the study's token counts);
* full-state checkpoints every ``checkpoint.state_every_steps`` and at the end
  (``is_state_step``);
* host calls of at most ``train.steps_per_call`` updates, each ending exactly at every step
  above (``calls``), so that evaluation and saving always see the state after a whole call.

``RunSchedule`` bundles them for one run.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

PARAMS_SCHEDULES = ("log", "study", "none")

# The study's checkpoints (docs/study.md): 0.25M, 0.5M, 1–10M every 1M, 20–100M every 10M,
# 200M–1B every 100M tokens.
STUDY_TOKENS = (
  [250_000, 500_000]
  + [m * 1_000_000 for m in range(1, 11)]
  + [m * 10_000_000 for m in range(2, 11)]
  + [m * 100_000_000 for m in range(2, 11)]
)


def eval_interval(cfg) -> int:
  """Updates between evaluations: ``eval.every_tokens`` converted (rounded up) if set, else
  ``eval.every_steps``; 0 = no online evaluation."""
  tokens = cfg.eval.every_tokens
  if tokens:
    return max(1, math.ceil(tokens / (cfg.train.batch_size * cfg.train.context_size)))
  return cfg.eval.every_steps


def eval_due(step: int, every: int, num_steps: int) -> bool:
  """Whether the models are evaluated after update ``step`` of ``num_steps``: every ``every``
  updates (0: never) and at the end."""
  return bool(every) and (step % every == 0 or step == num_steps)


def params_steps(
  num_steps: int,
  tokens_per_update: int,
  *,
  schedule: str = "log",
  points_per_octave: int = 2,
  law_updates: float | None = None,
  law_window: float = 4.0,
  law_points_per_octave: int = 8,
) -> list[int]:
  """Updates after which params are saved, sorted, always including 0 and ``num_steps``.

  ``log``: tokens log-spaced from one update's ``B · C`` tokens on — update counts
  ``round(2^(k / points_per_octave))`` — plus, if ``law_updates`` is given,
  ``law_points_per_octave`` points per octave centred on it, ``round(law_updates · 2^(k /
  law_points_per_octave))`` within a factor ``law_window`` either side. ``study``: the study's
  token counts (``STUDY_TOKENS``) converted to updates (``round(tokens / tokens_per_update)``,
  at least 1). ``none``: only 0 and the end.

  Raises:
    ValueError: an unknown ``schedule``.
  """
  steps = {0, num_steps}

  if schedule == "log":
    top = math.ceil(math.log2(max(num_steps, 1)) * points_per_octave)
    steps |= {int(round(2 ** (k / points_per_octave))) for k in range(top + 1)}
    if law_updates is not None and law_points_per_octave > 0:
      half = math.floor(math.log2(law_window) * law_points_per_octave)
      steps |= {
        int(round(law_updates * 2 ** (k / law_points_per_octave))) for k in range(-half, half + 1)
      }
  elif schedule == "study":
    steps |= {max(1, int(round(t / tokens_per_update))) for t in STUDY_TOKENS}
  elif schedule != "none":
    raise ValueError(
      f"checkpoint.params_schedule = {schedule!r}: allowed {', '.join(PARAMS_SCHEDULES)}"
    )
  return sorted(s for s in steps if 0 <= s <= num_steps)


def is_state_step(step: int, num_steps: int, every: int) -> bool:
  """Whether the full state is saved after update ``step`` of ``num_steps``: at a multiple of
  ``every`` (0: none) and at the end. Arithmetic, so that a long run with a short interval
  builds no list of its steps."""
  return step == num_steps or (every > 0 and 0 < step < num_steps and step % every == 0)


def calls(num_steps: int, steps_per_call: int, done: int = 0, stops=()) -> list[int]:
  """Lengths of the host calls that take a run from ``done`` to ``num_steps`` updates: at most
  ``steps_per_call`` each, ending exactly at every step in ``stops`` (evaluations,
  checkpoints)."""
  ends = sorted({s for s in stops if done < s < num_steps} | {num_steps})
  out, at = [], done
  for end in ends:
    while at < end:
      k = min(steps_per_call, end - at)
      out.append(k)
      at += k
  return out


@dataclasses.dataclass(frozen=True)
class RunSchedule:
  """One run's schedules (``from_config``).

  num_steps: updates in the run; steps_per_call: K, most updates per host call; eval_every:
  ``eval_interval`` (0: no evaluation); state_every: ``checkpoint.state_every_steps`` (0: only
  at the end); params: the ``params_steps`` (a frozenset).
  """

  num_steps: int
  steps_per_call: int
  eval_every: int
  state_every: int
  params: frozenset

  @classmethod
  def from_config(cls, cfg) -> "RunSchedule":
    """The schedules of ``cfg`` (validated); reads ``checkpoint.law_file`` if set.

    Raises:
      LawError: a law file that cannot be read.
    """
    from ihsweep.base.law import Law

    ck, tr = cfg.checkpoint, cfg.train
    law_file = os.path.expanduser(ck.law_file)
    law = Law.from_json(law_file) if law_file else Law()
    params = params_steps(
      tr.num_steps,
      tr.batch_size * tr.context_size,
      schedule=ck.params_schedule,
      points_per_octave=ck.points_per_octave,
      law_updates=law.updates(tr.batch_size, tr.context_size),
      law_window=ck.law_window,
      law_points_per_octave=ck.law_points_per_octave,
    )
    return cls(
      num_steps=tr.num_steps,
      steps_per_call=tr.steps_per_call,
      eval_every=eval_interval(cfg),
      state_every=ck.state_every_steps,
      params=frozenset(params),
    )

  def eval_due(self, step: int) -> bool:
    return eval_due(step, self.eval_every, self.num_steps)

  def state_due(self, step: int) -> bool:
    return is_state_step(step, self.num_steps, self.state_every)

  def params_due(self, step: int) -> bool:
    return step in self.params

  def last_eval(self, step: int) -> int:
    """The last evaluation step strictly before ``step`` (> 0), 0 if none."""
    return (step - 1) // self.eval_every * self.eval_every if self.eval_every else 0

  def calls(self, done: int = 0) -> list[int]:
    """Lengths of the host calls from update ``done`` to the end, each ending exactly at every
    evaluation and checkpoint step after ``done``."""
    # Evaluation and full-state steps after `done` as lazy ranges: an interval of a few updates
    # in a long run lists no steps beyond those the calls end at.
    later = [
      range(done // n * n + n, self.num_steps, n) for n in (self.eval_every, self.state_every) if n
    ]
    return calls(
      self.num_steps, self.steps_per_call, done, stops=itertools.chain(self.params, *later)
    )


def checkpoint_bytes(cfg, n_params: int, updates: int, seconds: float | None) -> dict:
  """What a group's checkpoints write and keep, estimated for ``ihsweep plan``.

  Sizes per model from ``n_params`` (N) in ``model.param_dtype`` (b bytes): a params checkpoint
  b·N, a full state 3·b·N (the params and AdamW's two moments, which ``optax.adamw`` keeps in
  the params' dtype); orbax stores them uncompressed. Counts: the params schedule's steps up to
  ``updates``; full states every ``checkpoint.state_every_steps`` updates, one per
  ``checkpoint.state_every_minutes`` of ``seconds`` (the plan's predicted time for the group;
  None: not counted; at most one per host call) and the end — an upper bound, a save due both
  ways is written once. Kept: the newest ``checkpoint.keep_state`` states and every params
  checkpoint.

  Returns:
    dict of ints: ``state_saves``, ``params_saves``, ``state_bytes`` and ``params_bytes`` (one
    save, all E models), ``written_bytes``, ``kept_bytes``.
  """
  ck = cfg.checkpoint
  models = int(cfg.ensemble.size)
  width = {"float64": 8, "float32": 4, "bfloat16": 2}[cfg.model.get("param_dtype", "float32")]
  params_each = models * n_params * width
  state_each = 3 * params_each
  run = RunSchedule.from_config(cfg)
  params_saves = sum(1 for s in run.params if s <= updates)
  state_saves = 1 + (max(updates - 1, 0) // ck.state_every_steps if ck.state_every_steps else 0)
  if ck.state_every_minutes and seconds:  # at most one per host call (saves end a call)
    host_calls = sum(1 for _ in itertools.takewhile(lambda end: end <= updates,
                                                    itertools.accumulate(run.calls())))  # fmt: skip
    state_saves += min(int(seconds // (60 * ck.state_every_minutes)), host_calls)
  return {
    "state_saves": state_saves,
    "params_saves": params_saves,
    "state_bytes": state_each,
    "params_bytes": params_each,
    "written_bytes": state_saves * state_each + params_saves * params_each,
    "kept_bytes": min(state_saves, ck.keep_state) * state_each + params_saves * params_each,
  }


def checkpoint_totals(rows: list[dict]) -> dict:
  """Sums of ``checkpoint_bytes`` over a plan's groups: ``written_bytes``, ``kept_bytes``,
  ``state_saves``, ``params_saves``."""
  keys = ("written_bytes", "kept_bytes", "state_saves", "params_saves")
  return {k: sum(r[k] for r in rows) for k in keys}


def describe_checkpoint_totals(totals: dict) -> str:
  """One line for ``ihsweep plan``: the sweep's checkpoint bytes written and kept."""
  return (
    f"checkpoints: {totals['written_bytes'] / 1e9:,.1f} GB written, "
    f"{totals['kept_bytes'] / 1e9:,.1f} GB kept ({totals['state_saves']:,} full-state and "
    f"{totals['params_saves']:,} params saves over the groups; full states by "
    "checkpoint.state_every_minutes of the predicted time and state_every_steps, at most)"
  )
