"""``ihsweep export``: one model of a run directory as a TransformerLens HookedTransformer or a
Hugging Face GPT-2 (``ihsweep.runs.export.export_run``); each bad flag value is one line naming
it."""

from __future__ import annotations

import logging
import os

from ihsweep.commands.common import fail
from ihsweep.commands.flags import FLAGS

NAME = "export"
DESCRIPTION = "one model of a run as a TransformerLens HookedTransformer or a Hugging Face GPT-2"
FLAG_NAMES = ("workdir", "cell", "step", "to", "out")
FLAGS_ONLY, COMPILES, TRAINS = True, False, False
USAGE = """usage: ihsweep export --workdir=DIR --cell=N [--step=S] --to=transformer_lens|hf
                      [--out=PATH]"""
ABOUT = """\
Writes model N (a cell id of the run: a sweep's cells.csv, or 0 … E-1 of ihsweep train) after
S updates (a saved params checkpoint; default: the last) to a new path (an existing one is
refused): --out, default DIR/analysis/export/cellN_stepS.pt (hf: cellN_stepS_hf/); inside DIR
only under DIR/analysis/export/. The exported model computes the same logits as ihsweep's own
forward. Needs the interop extra: pip install 'ihsweep[interop]'."""


def main(argv) -> int:
  del argv
  from ihsweep.runs import export, notebook

  targets = "|".join(export.TARGETS)
  usage = f"export needs --workdir=DIR --cell=N --to={targets} (--step=S, --out=PATH optional)"
  missing = [f"--{name}" for name in ("workdir", "cell", "to") if getattr(FLAGS, name) is None]
  if missing:
    return fail(f"{usage}; missing {', '.join(missing)}")
  if FLAGS.to not in export.TARGETS:
    return fail(
      f"--to={FLAGS.to} is not allowed: transformer_lens (a TransformerLens HookedTransformer, "
      f"any ihsweep model) or hf (a Hugging Face GPT2LMHeadModel: learned positions with MLPs)"
    )
  logging.getLogger("datasets").setLevel(logging.WARNING)  # imported by transformer_lens
  workdir = FLAGS.workdir
  if not os.path.isdir(workdir):
    return fail(f"--workdir={workdir}: no such directory (a run directory of ihsweep run/train)")
  try:
    run = notebook.load_run(workdir)
  except notebook.NotARun as e:
    return fail(f"--workdir={workdir}: {e}")
  try:
    out, step = export.export_run(run, FLAGS.cell, FLAGS.step, FLAGS.to, FLAGS.out)
  except notebook.UnknownCell as e:
    return fail(f"--cell={FLAGS.cell}: {e}")
  except notebook.StepNotSaved as e:  # with no --step: the cell has no checkpoint at all
    return fail(
      f"--step={FLAGS.step}: {e}" if FLAGS.step is not None else f"--cell={FLAGS.cell}: {e}"
    )
  except notebook.CheckpointUnreadable as e:
    flag = "--step" if FLAGS.step is None else f"--step={FLAGS.step}"
    return fail(f"{flag}: {e}{'; choose one with --step=S' if FLAGS.step is None else ''}")
  except export.ExportError as e:
    text = str(e)
    return fail(text if text.startswith("--") else f"--to={FLAGS.to}: {text}")
  except ModuleNotFoundError as e:
    if export.INSTALL not in str(e):
      raise
    return fail(str(e))
  finally:
    run.close()
  what = "HookedTransformer file" if FLAGS.to == "transformer_lens" else "save_pretrained directory"
  print(f"exported cell {FLAGS.cell} at step {step} of {workdir} to {out} ({what})")
  return 0
