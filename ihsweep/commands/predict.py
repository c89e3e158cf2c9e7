"""``ihsweep predict``: updates and tokens until induction heads form at (B, C), by the
emergence law (``ihsweep.base.law.Law``)."""

from __future__ import annotations

import json
import sys

from ihsweep.commands.common import empty_law, fail
from ihsweep.commands.flags import FLAGS

NAME = "predict"
DESCRIPTION = "updates and tokens until induction heads form, by the emergence law"
FLAG_NAMES = ("batch_size", "context_size", "law", "json")
FLAGS_ONLY, COMPILES, TRAINS = True, False, False
USES_DEVICES = False  # reads files only: no JAX imported (tests/test_cli.py checks)
USAGE = "usage: ihsweep predict --batch_size=B --context_size=C [--law=FILE] [--json]"
ABOUT = """\
Updates (UPT = T / (B^alpha · C^beta)) and tokens (UPT · B · C) until induction heads form."""


def main(argv) -> int:
  """The law's updates and tokens at (B, C); with a fitted law that stores its uncertainty
  (``cov``, ``sigma``: ``python -m analysis fit-law``), the 95% interval of the median and the
  95% prediction interval for one cell (``Law.interval``); a warning (stderr, and ``warnings``
  in --json) for a B or C outside the law's fitted ``range``."""
  del argv
  from ihsweep.base.law import STUDY_BATCH_RANGE, STUDY_CONTEXT_RANGE, Law, LawError

  if FLAGS.batch_size is None or FLAGS.context_size is None:
    return fail("predict needs --batch_size=B and --context_size=C")
  failed = empty_law("study's")
  if failed is not None:
    return failed
  try:
    if FLAGS.law:
      law = Law.from_json(FLAGS.law)
    else:  # the study's law, with the grid it was fitted on
      law = Law(batch_range=STUDY_BATCH_RANGE, context_range=STUDY_CONTEXT_RANGE)
    b, c = FLAGS.batch_size, FLAGS.context_size
    updates, tokens = law.updates(b, c), law.tokens(b, c)
    median = law.interval(b, c) if law.cov is not None else None
    cell = law.interval(b, c, cell=True) if median and law.sigma is not None else None
  except LawError as e:
    return fail(str(e))
  note = None
  if median is None:
    note = "the study's law is published without intervals" if not FLAGS.law else _no_cov(FLAGS.law)
  warnings = law.range_warnings(b, c)
  for w in warnings:
    print(f"ihsweep: warning: {w}", file=sys.stderr)
  if FLAGS.json:
    print(json.dumps(_as_json(law, b, c, median, cell, warnings, note, updates, tokens)))
  else:
    print(_as_text(law, b, c, median, cell, note, updates, tokens))
  return 0


def _no_cov(path: str) -> str:
  """Why the law in ``path`` gives no interval: the reason its fit stored (``ci_note``: too few
  cells or grid points with emerged cells, too few resamples, an exact fit, ...; written by
  ``python -m analysis fit-law`` and the report beside an empty ``ci``), or, without one, a law
  that no fit of this version wrote."""
  try:
    with open(path) as f:
      why = json.load(f).get("ci_note")
  except (OSError, ValueError, AttributeError):  # Law.from_json read it: only a race fails
    why = None
  if why:
    return f"{path} stores no coefficient covariance ('cov'): its fit gave no intervals: {why}"
  return (
    f"{path} stores no coefficient covariance ('cov') and no reason ('ci_note'): a law written "
    f"by hand or by an ihsweep before laws stored intervals (`python -m analysis fit-law` and "
    f"the report store one or the other)"
  )


def _as_json(law, b, c, median, cell, warnings, note, updates, tokens) -> dict:
  """``--json``'s object."""
  bc = float(b) * float(c)

  def span(pair, **extra):
    return (
      None
      if pair is None
      else {"level": 0.95, "updates": list(pair), "tokens": [pair[0] * bc, pair[1] * bc], **extra}
    )

  out = {
    "batch_size": b,
    "context_size": c,
    "updates": updates,
    "tokens": tokens,
    "interval": span(median),
    "prediction_interval": span(cell, sigma=law.sigma),
    "warnings": warnings,
    "law": law.to_dict(),
  }
  if note:
    out["interval_note"] = note
  return out


def _as_text(law, b, c, median, cell, note, updates, tokens) -> str:
  """The prediction in words: updates and tokens, the intervals, the law."""
  bc = float(b) * float(c)
  lines = [
    f"B = {b:g}, C = {c:g}: induction heads predicted after {_count(updates)} updates "
    f"= {_count(tokens, 1e6, 'M')} tokens"
  ]
  sigma = f"sigma = {law.sigma or 0:.2f}"
  for pair, words in (
    (median, "95% interval of the law's median"),
    (cell, f"95% prediction interval for one cell ({sigma})"),
  ):
    if pair is not None:
      lines.append(
        f"  {words}: {_count(pair[0])}–{_count(pair[1])} updates = "
        f"{_count(pair[0] * bc, 1e6, 'M')}–{_count(pair[1] * bc, 1e6, 'M')} tokens"
      )
  if note:
    lines.append(f"  no interval: {note}")
  lines.append(
    f"law: UPT = T / (B^{law.alpha:g} · C^{law.beta:g}), ln T = {law.log_T:g} "
    f"(T = {_count(law.T)}); {law.source}"
  )
  return "\n".join(lines)


def _count(x: float, per: float = 1.0, unit: str = "") -> str:
  """``x / per`` with thousands separators and ``unit`` (``_count(2.5e7, 1e6, "M") ==
  "25.0M"``), or ``x`` in scientific notation where that would be long or round to 0
  (``_count(3.2e20) == "3.2e+20"``)."""
  if per <= x < 1e12 * per:
    return f"{x / per:,.{1 if per > 1 else 0}f}{unit}"
  return f"{x:.3g}"
