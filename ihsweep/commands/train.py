"""``ihsweep train``: one ensemble (config sections model/train/ensemble/data/mesh), by
``ihsweep.training.runner.fit``."""

from __future__ import annotations

import sys

from ihsweep.commands.common import bad_input, config_and_workdir, fail
from ihsweep.commands.flags import ARGV, FLAGS, split_args

NAME = "train"
DESCRIPTION = "train one ensemble (config sections model/train/ensemble/data/mesh)"
FLAG_NAMES = ("config", "workdir", "progress")
FLAGS_ONLY, COMPILES, TRAINS = True, True, True
USAGE = """usage: ihsweep train --config=FILE[:VARIANT] --workdir=DIR [--noprogress]
                     [--config.SECTION.FIELD=VALUE ...]"""
ABOUT = """\
Trains one ensemble and writes config.json, metrics.jsonl, train_log.jsonl and checkpoints
into the run directory; rerunning the same command resumes at its last checkpoint. It reads no
sweep.* field: a --config.sweep.* override is refused (`ihsweep run` trains a sweep). A model
whose loss turns NaN/inf is frozen and named in a warning, as is one whose final loss is above
ln(vocab_size) + 1 (worse than a uniform guess: diverged or did not learn); if every model is
one or the other the command exits with status 1."""


def sweep_override() -> str | None:
  """Why the command line cannot be trained by ``train`` (one line): the first
  ``--config.sweep.*`` override, a field of the sweep section that ``ihsweep train`` never reads
  (it trains the config's one ensemble; seeds, budget, devices_per_worker, stop_threshold, ...
  are ``ihsweep run``'s); None if there is none."""
  for name, flag, value in split_args(ARGV[1:])[0]:
    if flag == "config" and name.split(".")[1:2] == ["sweep"]:
      typed = f"--{name}" if value is None else f"--{name}={value}"
      return (
        f"{typed} is not allowed with `ihsweep train`: it trains one ensemble and reads no "
        f"sweep.* field (only seed and the other sections); use `ihsweep run` to train a "
        f"sweep, or leave the flag out"
      )
  return None


def divergence(diverged_at, ids=None) -> tuple[str | None, bool]:
  """The line that says which models diverged, and whether every one did.

  Args:
    diverged_at: int [E], the update at which each model's loss turned NaN/inf (-1: never).
    ids: the models' names (default 0 … E-1; a sweep's cell ids).

  Returns:
    (None, False) if none diverged, else (one line, all diverged): a diverged model is frozen at
    its last finite parameters, so a run whose every model diverged trained nothing usable.
  """
  at = [int(d) for d in diverged_at]
  ids = list(range(len(at))) if ids is None else list(ids)
  bad = [(i, d) for i, d in zip(ids, at) if d >= 0]
  if not bad:
    return None, False
  every = len(bad) == len(at)
  which = "every model" if every else f"{len(bad)} of {len(at)} models"
  where = ", ".join(f"{i} at update {d:,}" for i, d in bad)
  return (
    f"{which} diverged (loss NaN/inf; frozen at the last finite parameters): {where}; "
    f"lower train.lr or raise train.warmup_frac",
    every,
  )


def main(argv) -> int:
  del argv
  from ihsweep.configuration import config as config_lib
  from ihsweep.configuration import fields
  from ihsweep.data.errors import DataError
  from ihsweep.runs import ownership
  from ihsweep.training import memory
  from ihsweep.training.runner import fit, group_devices, resolve
  from ihsweep.training.stopping import Interrupted

  cfg, failed = config_and_workdir("train")
  if failed is not None:
    return failed
  problem = sweep_override()
  if problem:
    return fail(problem)
  try:
    config_lib.validate(cfg)  # a bad field first: it leaves no directory behind
    # too large for any memory setting: refused before the directory exists, as `ihsweep run`
    memory.check_possible(cfg, group_devices(cfg), FLAGS.workdir)
    ownership.check_workdir(FLAGS.workdir)  # before anything compiles, as `ihsweep run`
    group = resolve(cfg, name=FLAGS.workdir, checked=True)  # its memory chosen, once
    out = fit(group, FLAGS.workdir, progress=FLAGS.progress)
  except Interrupted as e:
    print(f"interrupted: {e}", file=sys.stderr)
    return 143
  except (fields.ConfigError, DataError) as e:
    return bad_input(e)
  if out.losses is None:
    print(f"done: nothing left to train in {FLAGS.workdir} (resumed at its last update)")
    return 0
  losses = ", ".join(f"{x:.4f}" for x in out.losses)
  speed = out.tokens_per_s
  speed = "tokens/s not measured (one call)" if speed != speed else f"{speed:,.0f} tokens/s"
  print(f"done: final loss per model [{losses}]; {speed}; run directory {FLAGS.workdir}")
  from ihsweep.training.evaluation import not_learning_line

  line, every = divergence(out.diverged_at)
  # a finite loss far above a uniform guess (ln V + 1 nat) is a model that did not learn: named
  # as a NaN divergence is, and counted with them for the exit status
  stuck, stuck_ids = not_learning_line(out.losses, int(cfg.model.vocab_size))
  bad = {i for i, d in enumerate(out.diverged_at) if int(d) >= 0} | set(stuck_ids)
  every = len(bad) == len(out.losses) > 0
  for text in (line, stuck):
    if text:  # as `ihsweep run`: a warning, and exit status 1 when no model is usable
      print(f"ihsweep: {'error' if every else 'warning'}: {text}", file=sys.stderr)
  return 1 if every else 0
