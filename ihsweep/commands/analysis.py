"""``ihsweep report`` and ``ihsweep fit-law``: the analysis package's commands (``python -m
analysis``) under its installed name, ihsweep_analysis, so from any directory. Their flags are
the analysis package's own (argparse: ``ihsweep report --help``). The training package never
imports analysis; only this command does, lazily."""

from __future__ import annotations

from ihsweep.commands.common import fail

COMMANDS = {
  "report": "curves, emergence points, law fit, figures and report.md/.html from run dirs",
  "fit-law": "fit the emergence law to a CSV of emergence points (one JSON object)",
}


def main(argv) -> int:
  """``argv``: ``["ihsweep", "report" | "fit-law", ...]``."""
  try:
    from ihsweep_analysis.__main__ import main as analysis_main
  except ModuleNotFoundError as e:
    if e.name != "ihsweep_analysis":
      raise
    return fail(
      f"{argv[1]}: the analysis package (ihsweep_analysis) is not installed: "
      f"`pip install -e .` in the repository installs it, or run `python -m analysis "
      f"{argv[1]}` from the repository"
    )
  return analysis_main(argv[1:], prog="ihsweep")
