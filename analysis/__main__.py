"""``python -m analysis``: reports from run directories, and the law fitted to a CSV.

  python -m analysis report DIR [DIR ...] [--out OUT] [--metric ps_max] [--method threshold]
  python -m analysis fit-law --csv FILE [--terms=COLUMN,...] [--n_boot 2000] [--fix alpha=0.37]

One module per command in ``analysis/commands/`` (its flags, help and ``main``); this module
builds the parser from them and dispatches. Exit status: 0 done, 2 bad input (a directory that
is not a run, a CSV that cannot be fitted), with one line on stderr saying what and why.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .commands import fit_law, report
from .commands.common import fail, modern_spellings

COMMANDS = {m.NAME: m for m in (report, fit_law)}


def _parser(prog: str) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=prog, description="Analyse ihsweep run directories.")
  sub = p.add_subparsers(dest="command", required=True)
  for name, module in COMMANDS.items():
    module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION))
  return p


def _empty_value(args) -> str | None:
  """The first flag or directory given as an empty string (``--out=``), which would otherwise
  read as not given (the default) or as the current directory."""
  for name in ("out", "csv", "metric", "method", "terms"):
    if getattr(args, name, None) == "":
      return f"--{name}= is empty: give a value, or leave the flag out for its default"
  if "" in getattr(args, "dirs", ()):
    return "an empty DIR: give a run directory written by `ihsweep run` or `ihsweep train`"
  return None


def main(argv=None, prog: str = "python -m analysis") -> int:
  """``prog``: the command named in usage, help and messages (``ihsweep`` when run as ``ihsweep
  report``)."""
  args = _parser(prog).parse_args(modern_spellings(sys.argv[1:] if argv is None else argv, prog))
  args.prog = prog
  if _empty_value(args):
    return fail(args, _empty_value(args))
  logging.basicConfig(
    level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
  )
  logging.getLogger("jax").setLevel(logging.WARNING)  # backend probing
  # orbax's per-restore lines and its notes that a read-only manager will not save
  logging.getLogger("absl").setLevel(logging.ERROR)
  module = COMMANDS[args.command]
  if module.USES_DEVICES:
    from ihsweep.base.sharding import use_one_cpu_device_per_core

    use_one_cpu_device_per_core()  # CPU: the ensemble split over cores, as in training
  return module.main(args)


if __name__ == "__main__":
  from ihsweep.base.errors import quiet_on_closed_pipe

  sys.exit(quiet_on_closed_pipe(main))  # `| head`: exit 141, no traceback
