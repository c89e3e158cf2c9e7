"""``ihsweep train``: one ensemble (config sections model/train/ensemble/data/mesh), by
``ihsweep.training.runner.fit``."""

from __future__ import annotations

import sys

from ihsweep.commands.common import bad_input, config_and_workdir
from ihsweep.commands.flags import FLAGS

NAME = "train"
DESCRIPTION = "train one ensemble (config sections model/train/ensemble/data/mesh)"
FLAG_NAMES = ("config", "workdir", "progress")
FLAGS_ONLY, COMPILES, TRAINS = True, True, True
USAGE = """usage: ihsweep train --config=FILE[:VARIANT] --workdir=DIR [--noprogress]
                     [--config.SECTION.FIELD=VALUE ...]"""
ABOUT = """\
Trains one ensemble and writes config.json, metrics.jsonl, train_log.jsonl and checkpoints
into the run directory; rerunning the same command resumes at its last checkpoint."""


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
  return 0
