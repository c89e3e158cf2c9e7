"""``ihsweep run``: a sweep, the config's sweep.grid × seeds, one ensemble per group of cells
with equal shapes (``ihsweep.workers.sweep.run``)."""

from __future__ import annotations

import os
import sys

from ihsweep.commands.common import add_axis_flags, bad_input, config_and_workdir, fail
from ihsweep.commands.flags import FLAGS

NAME = "run"
DESCRIPTION = "run a sweep: the config's sweep.grid × seeds, one ensemble per group of equal shapes"
FLAG_NAMES = ("config", "workdir", "progress", "grid", "zip")
FLAGS_ONLY, COMPILES, TRAINS = True, True, True
USAGE = """usage: ihsweep run --config=FILE[:VARIANT] --workdir=DIR [--noprogress]
                   [--grid=FIELD=V1,V2,...] [--zip=FIELD=V1,V2,...]
                   [--config.SECTION.FIELD=VALUE ...]"""
ABOUT = """\
Trains every cell of the config's sweep section (grid × zip × seeds; no section: one grid
point with ensemble.size seeds), one compiled ensemble per group of cells with equal shapes,
and writes DIR/cells.csv, DIR/groups/gNNN/ (each a run directory), DIR/sweep.json.
Rerunning the same command skips finished groups and resumes the others. SIGTERM saves the
running group's state and exits with status 143. A cell whose loss turns NaN/inf is frozen and
counted in the last lines, as is one whose final loss is above ln(vocab_size) + 1 (diverged or
did not learn); if every cell is one or the other the command exits with status 1. Several
processes on one run directory are workers that take groups side by side (launch/*.sh:
independent processes, or the processes of one jax.distributed job, in phases of workers of
sweep.processes_per_worker processes).
--config.sweep.grid.train.batch_size="(8,16)"   change an axis the config file defines
--config.sweep.budget=updates|tokens|law|emergence (fields: ihsweep/configuration/fields.py
default_sweep)"""


def main(argv) -> int:
  from ihsweep.workers import sweep_status

  del argv
  import jax

  from ihsweep.base.law import LawError
  from ihsweep.configuration.fields import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.workers import sweep

  cfg, failed = config_and_workdir("run")
  if failed is not None:
    return failed
  try:
    problem = add_axis_flags(cfg)
    if problem:
      return fail(problem)
    result = sweep.run(cfg, FLAGS.workdir, progress=FLAGS.progress)
  except sweep.GroupFailed as e:
    fail(
      f"{e} (process {jax.process_index()}); details in its status.json; rerun the command "
      f"to retry it"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # not jax.distributed's shutdown barrier: a peer may be gone
  except (ConfigError, DataError) as e:
    return bad_input(e)
  except LawError as e:  # a cell's (B, C) outside the budget's law
    return fail(f"sweep.budget = {cfg.sweep.budget!r}: {e}")
  failed_groups = [g for g, s in result.groups.items() if s["state"] == "failed"]
  if jax.process_index() == 0:
    print(sweep_status.format_summary(result.summary))
  if result.interrupted:
    saved = [g for g, s in result.groups.items() if s["state"] == "interrupted"]
    print(
      f"interrupted: state saved; rerun the same command to resume ({FLAGS.workdir})"
      if saved  # a stop before any group started saved nothing: say so
      else f"interrupted before any group started training: nothing to save; rerun the same "
      f"command to start ({FLAGS.workdir})",
      file=sys.stderr,
    )
    return 143
  if failed_groups:
    print(
      f"ihsweep: groups {', '.join(failed_groups)} failed (errors in their status.json; "
      f"`ihsweep status --workdir={FLAGS.workdir}`); rerun to retry them",
      file=sys.stderr,
    )
    return 1
  # as `ihsweep train`: no cell trained a usable model (NaN/inf, or a final loss above ln V + 1)
  bad = result.summary["diverged_cells"] + result.summary.get("not_learning_cells", 0)
  every = bad == result.summary["cells"] > 0
  if every:
    print(
      f"ihsweep: error: every one of the sweep's {result.summary['cells']} cells diverged (loss "
      f"NaN/inf; frozen at the last finite parameters) or did not learn (final loss above "
      f"ln V + 1, worse than a uniform guess over the vocabulary); lower train.lr or raise "
      f"train.warmup_frac",
      file=sys.stderr,
    )
    return 1
  return 0
