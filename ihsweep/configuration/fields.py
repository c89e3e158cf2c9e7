"""The config's fields one at a time: the sections' defaults, ``ConfigError``, and the schema's
simple check of a field (``check``: its kind and its range or choices, ``ihsweep.base.schema``).
The rules between fields are ``config`` (models, training, devices, budgets) and
``data_rules`` (data sources, probes, evaluation).
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from ihsweep.base import schema
from ihsweep.base.errors import IhsweepError

# Fields that change how a run executes but not the models it trains (the same batches and
# updates; results equal up to float rounding): a sweep axis over one would train copies.
EXECUTION_FIELDS = (
  "train.steps_per_call",
  "train.gradient_accumulation_steps",
  "train.remat",
  "train.attention",
  "ensemble.vmap_chunk",
  "mesh.num_devices",
  "checkpoint.async_save",
  "checkpoint.state_every_steps",
  "checkpoint.state_every_minutes",
  "checkpoint.keep_state",
  "data.cache_dir",
  "data.loader",
  "data.device_budget_mb",
  "sweep.placement",
  "sweep.wait_to_take_over",
  "sweep.processes_per_worker",
  "sweep.devices_per_worker",
  "log.tensorboard",
  "log.wandb",
  "log.wandb_project",
  "log.wandb_mode",
)


def default_eval():
  """The ``eval`` section (online evaluation, ``ihsweep.compute.metrics`` /
  ``ihsweep.data.probes``).

  every_steps: updates between evaluations (0 = none); every_tokens: the same in tokens per
    model (overrides every_steps when > 0). The end of training is always evaluated.
  n_probes: repeated-token probes (the study: 100); probe_len: block length L (0 = min(50, C/2));
    probe_position: where the two blocks sit, 'start' (the whole input is the 2L block tokens,
    as in the study), 'middle' (the second block starts at position C/2, after C/2 − L random
    filler ids) or 'end' (the last 2L of C positions, after C − 2L filler ids): with a fixed
    probe_len, 'middle' and 'end' measure every C at the same place relative to its context,
    so the C effect is not the probe's; probe_top_k: draw probe ids from the K
    most frequent training tokens (0 = whole vocabulary, as in the study); probe_seed: the
    probes' seed (shared by all models and runs).
  n_sequences: held-out sequences per model (validation loss, ICL score, data-drawn
    associative recall).
  icl_early / icl_late: positions of the ICL score (0 = C/10 and C − 1).
  """
  return schema.defaults("eval")


def default_checkpoint():
  """The ``checkpoint`` section (``ihsweep.runs.checkpoint``).

  params_schedule: 'log' (log-spaced, points_per_octave, plus law_points_per_octave points per
    octave within a factor law_window of the law's predicted transition), 'study' (the study's
    token schedule) or 'none' (start and end only); law_file: a fitted law JSON ('' = the
    study's law).
  state_every_minutes: wall-clock minutes between full-state checkpoints for resume (taken at
    the first host call that ends after them; 0 = none by time); state_every_steps: updates
    between them (0 = none by count); either way also at the end and on a stop. keep_state:
    how many to keep; async_save: write in the background. By time, not by update count: an
    accelerator runs 500 small updates in seconds, so a count that suits one cell makes disk
    I/O set the pace of another (levanter's checkpointer saves by time too).
  """
  return schema.defaults("checkpoint")


def default_sweep():
  """The ``sweep`` section: what ``ihsweep run`` trains (``ihsweep.workers.sweep``).

  grid: config fields as nested sections whose leaves are tuples of values; the grid points
    are their product, e.g. ``grid.train.batch_size = (8, 16)`` and ``grid.train.context_size
    = (32, 64)`` give 4 points. zip: the same layout, tuples of one common length that vary
    together (one axis of the product). seeds: models per grid point, with seeds ``seed, seed
    + 1, …`` (0 = ensemble.size). A cell is one model: a grid point and a seed.
  budget (updates per cell): 'updates' = train.num_steps; 'tokens' = ``tokens`` per model,
    rounded up to whole updates; 'law' = ``law_multiple`` × the emergence law's predicted
    updates for the cell's B and C (``law_file``, '' = the study's law); 'emergence' = at most
    law_multiple × the prediction, stopping a group early once every model's online
    ``stop_metric`` has reached ``stop_threshold`` and training has gone on to ``stop_margin``
    × the update at which it did (diverged models count as done). The threshold must lie above
    the untrained level: for ps_max, above the score of uniform attention on the probes
    (refused before compiling); a model already past it at update 0 is warned about and counts
    only once it has been seen below it (``evaluation.EmergenceStop``).
  placement (how groups meet devices; ``ihsweep.workers.sweep``): 'worker' = every ``ihsweep run``
    process on the run directory is a worker taking groups one at a time onto its own local
    devices (several processes, or the processes of one jax.distributed job, train groups side
    by side; a worker spanning several processes trains a group on all their devices:
    processes_per_worker). wait_to_take_over: a worker with nothing left to take waits while
    other workers hold groups, to take over any whose worker dies (False: it exits; a rerun
    takes over). processes_per_worker (inside one jax.distributed job of several processes;
    'worker' placement): 0 = phases chosen from the groups' costs
    (``phases.plan_phases``): in each phase the processes form workers of a size the
    phase's groups fill (1: process-local groups; several: a worker spanning hosts trains a
    group on all their devices; all: one global mesh); k = one phase, workers of k
    consecutive processes.
    devices_per_worker: D = a process's devices (``mesh.num_devices`` of them where set) split
    into workers of D consecutive devices in its phases of process-local workers, each a thread
    of the process claiming and training groups as a separate process would
    (``sweep._side_by_side``), so that small groups train side by side instead of splitting
    their batch over every device; D = all of them: one worker; 0 = auto, the D the plan's
    model finds fastest for the groups' costs (``phases.choose_local_devices``, with
    ``timing.runtime_model``: on a known accelerator its FLOP/s and network).
  """
  return schema.defaults("sweep")


def default_log():
  """The ``log`` section (optional; absent = JSONL only): live metric writers beside the record,
  ``metrics.jsonl`` and ``train_log.jsonl`` (``ihsweep.training.sinks``: one scalar per cell and
  metric, tagged ``cell_{id}/{metric}``, step = updates). Execution fields: they never block a
  resume.

  tensorboard: TensorBoard event files in each run directory's ``tensorboard/`` (needs
    tensorboardX: ``pip install 'ihsweep[logging]'``). wandb: a Weights & Biases run per run
    directory (needs wandb), in project wandb_project; wandb_mode: 'offline' (files under the
    run directory's ``wandb/``; upload with ``wandb sync``) or 'online'.
  """
  return schema.defaults("log")


class ConfigError(IhsweepError, ValueError):
  """A config field has a value that is not allowed."""

  def __init__(self, field: str, value, allowed: str):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f"config.{field} = {value!r} is not allowed: {allowed}")


class WorkdirError(ConfigError):
  """The ``--workdir`` flag (a flag, not a config field: ``field`` "workdir") names a directory
  that cannot hold the run. The message reads "--workdir=DIR is not allowed: {allowed}", or
  ``message`` if given."""

  def __init__(self, workdir: str, allowed: str, message: str | None = None):
    super().__init__("workdir", workdir, allowed)
    self.args = (message or f"--workdir={workdir} is not allowed: {allowed}",)

  def __str__(self) -> str:
    return self.args[0]


INT32_MAX = schema.INT32_MAX  # seeds and the update counter are int32 on the device


def section_fields(section: str) -> tuple[str, ...] | None:
  """The fields a run config's ``section`` may have (``seed`` and the section names for
  ``"config"``; ``data.synthetic`` for that sub-section); None for a section whose keys are
  free (``sweep.grid``, ``sweep.zip``: axes named by field paths) or unknown."""
  names = schema.names("" if section == "config" else section)
  return None if names is None else tuple(sorted(names))


def check_known_fields(cfg, section: str = "config") -> None:
  """Refuses a key no code reads (a typo such as ``train.batchsize``, which would otherwise be
  ignored and stored in config.json), naming it, the section's fields and the closest one."""
  import difflib

  fields = section_fields(section)
  if fields is None:
    return
  parent = "" if section == "config" else f"{section}."
  for key in cfg.keys():
    if key not in fields:
      close = difflib.get_close_matches(key, fields, n=1)
      hint = f"; did you mean {parent}{close[0]}?" if close else ""
      raise ConfigError(
        parent + key,
        cfg[key],
        f"no such field{hint} ({parent[:-1] or 'the config'} has: {', '.join(fields)})",
      )
    if hasattr(cfg[key], "keys"):
      check_known_fields(cfg[key], parent + key)


_UNSET = object()


def check(cfg, path: str, value=_UNSET, *, lo=None, hi=None, hint: str | None = None):
  """The schema's simple check of the field ``path`` ('train.lr'): its kind and its range or
  choices (``ihsweep.base.schema``); ``lo``/``hi``/``hint`` replace the schema's, and must
  be given for a bound that depends on other fields. ``value``: the field's, unless given (a default
  for a field an older config lacks). Returns the value (an int or float as such)."""
  f = schema.field(path)
  if value is _UNSET:
    value = cfg
    for part in path.split("."):
      value = value[part]
  if f.kind == "bool" and not isinstance(value, bool):
    raise ConfigError(path, value, "True or False")
  if f.kind == "str" and not isinstance(value, str):
    raise ConfigError(path, value, "a string")
  if f.kind == "choice":
    return check_choice(path, value, f.choices)
  if f.kind not in ("int", "float"):
    return value
  lo, hi = f.lo if lo is None else lo, f.hi if hi is None else hi
  if isinstance(lo, str) or isinstance(hi, str):
    raise TypeError(f"config.{path}: the bound {lo if isinstance(lo, str) else hi} is not given")
  if f.kind == "int":
    return check_int(path, value, lo, hi, f.hint if hint is None else hint)
  check_real(path, value, lo, math.inf if hi is None else hi, f.lo_open, f.hi_open)
  return float(value)


def check_int(
  field: str, value, lo: int | None = None, hi: int | None = None, hint: str = ""
) -> int:
  if isinstance(value, bool) or not isinstance(value, Integral):
    raise ConfigError(field, value, "an integer")
  if (lo is not None and value < lo) or (hi is not None and value > hi):
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise ConfigError(field, value, f"an integer {rng}{hint}")
  return int(value)


def check_real(field, value, lo, hi, lo_open, hi_open):
  ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
  if ok:
    ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
  if not ok:
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    raise ConfigError(field, value, f"a finite number in {left}{lo}, {hi}{right}")


def check_choice(field: str, value, allowed):
  if value not in allowed:
    raise ConfigError(field, value, f"one of {', '.join(map(repr, allowed))}")
  return value
