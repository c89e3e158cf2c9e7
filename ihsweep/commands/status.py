"""``ihsweep status``: the per-group state of a sweep's run directory."""

from __future__ import annotations

from ihsweep.commands.common import fail
from ihsweep.commands.flags import FLAGS

NAME = "status"
DESCRIPTION = (
  "per-group state of a sweep's run directory (done, running, stopped, pending, failed, "
  "interrupted)"
)
FLAG_NAMES = ("workdir",)
FLAGS_ONLY, COMPILES, TRAINS = True, False, False
USES_DEVICES = False  # reads files only: no JAX imported (tests/test_cli.py checks)
USAGE = "usage: ihsweep status --workdir=DIR"
ABOUT = """\
Reads a sweep's run directory (cells.csv, groups/*/status.json, train logs) and prints each
group's state — done, running, stopped (running, but its worker is gone: rerun to resume it),
pending, failed, interrupted — with its progress and diverged cells. Touches nothing."""


def main(argv) -> int:
  from ihsweep.workers import sweep_status

  del argv
  from ihsweep.runs import ownership

  if not FLAGS.workdir:
    return fail("status needs --workdir=DIR (a sweep's run directory)")
  try:
    print(sweep_status.format_status(FLAGS.workdir))
  except sweep_status.NotASweep as e:
    workdir = FLAGS.workdir
    try:
      kind, group = ownership.run_kind(workdir), ownership.sweep_group(workdir)
    except OSError:
      kind = group = None
    if group:
      return fail(
        f"--workdir={workdir} is group {group[1]} of the sweep in {group[0]}: its "
        f"status is in `ihsweep status --workdir={group[0]}`"
      )
    if kind == "train":
      return fail(
        f"--workdir={workdir} holds an ihsweep train run, not a sweep: its progress "
        f"is in train_log.jsonl and metrics.jsonl (python -m analysis report "
        f"{workdir} reads it)"
      )
    return fail(str(e))
  return 0
