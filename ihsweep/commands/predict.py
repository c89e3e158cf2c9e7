"""``ihsweep predict``: updates and tokens until induction heads form at (B, C), by the
emergence law (``ihsweep.base.law.Law``)."""

from __future__ import annotations

import json
import sys

from ihsweep.commands.common import empty_law, fail
from ihsweep.commands.flags import FLAGS

NAME = "predict"
DESCRIPTION = "updates and tokens until induction heads form, by the emergence law"
FLAG_NAMES = ("batch_size", "context_size", "law", "term", "json")
FLAGS_ONLY, COMPILES, TRAINS = True, False, False
USES_DEVICES = False  # reads files only: no JAX imported (tests/test_cli.py checks)
USAGE = (
  "usage: ihsweep predict --batch_size=B --context_size=C [--law=FILE] "
  "[--term=COLUMN=VALUE ...] [--json]"
)
ABOUT = """\
Updates (UPT = T / (B^alpha · C^beta)) and tokens (UPT · B · C) until induction heads form; a
law fitted with terms beyond B and C (law.json's "terms") takes each term's value by --term."""


def main(argv) -> int:
  """The law's updates and tokens at (B, C); with a fitted law that stores its uncertainty
  (``cov``, ``sigma``: ``python -m analysis fit-law``), the 95% interval of the median and the
  95% prediction interval for one cell (``Law.interval``); a warning (stderr, and ``warnings``
  in --json) for a B, C or term value outside the law's fitted ``range``. A law with terms
  beyond B and C (``fit-law --terms``) needs ``--term=COLUMN=VALUE`` for each of them, and no
  other: refused in one line otherwise."""
  del argv
  from ihsweep.base.law import STUDY_BATCH_RANGE, STUDY_CONTEXT_RANGE, Law, LawError

  if FLAGS.batch_size is None or FLAGS.context_size is None:
    return fail("predict needs --batch_size=B and --context_size=C")
  failed = empty_law("study's")
  if failed is not None:
    return failed
  terms, problem = _terms(FLAGS.term)
  if problem:
    return fail(problem)
  try:
    if FLAGS.law:
      law = Law.from_json(FLAGS.law)
    else:  # the study's law, with the grid it was fitted on
      law = Law(batch_range=STUDY_BATCH_RANGE, context_range=STUDY_CONTEXT_RANGE)
    problem = _term_problem(law, terms)
    if problem:
      return fail(problem)
    b, c = FLAGS.batch_size, FLAGS.context_size
    updates, tokens = law.updates(b, c, **terms), law.tokens(b, c, **terms)
    median = law.interval(b, c, **terms) if law.cov is not None else None
    cell = law.interval(b, c, cell=True, **terms) if median and law.sigma is not None else None
  except LawError as e:
    return fail(str(e))
  note = None
  if median is None:
    note = "the study's law is published without intervals" if not FLAGS.law else _no_cov(FLAGS.law)
  warnings = law.range_warnings(b, c, **terms)
  warnings += shape_warnings(FLAGS.law) if FLAGS.law else []
  for w in warnings:
    print(f"ihsweep: warning: {w}", file=sys.stderr)
  if FLAGS.json:
    print(json.dumps(_as_json(law, b, c, terms, median, cell, warnings, note, updates, tokens)))
  else:
    print(_as_text(law, b, c, terms, median, cell, note, updates, tokens))
  return 0


def _terms(specs: list[str]) -> tuple[dict, str | None]:
  """``({column: value} of the --term=COLUMN=VALUE flags, None)``, or ``({}, why not)``: not
  COLUMN=NUMBER, or a column given twice. (The law checks that each value is positive.)"""
  out = {}
  for spec in specs:
    name, eq, value = (part.strip() for part in spec.partition("="))
    try:
      number = float(value) if eq and name else None
    except ValueError:
      number = None
    if number is None:
      return {}, f"--term={spec}: expected COLUMN=NUMBER, e.g. --term=data.frequency=0.8"
    if name in out:
      return {}, f"--term {name} is given twice ({out[name]:g} and {number:g}): give it once"
    out[name] = number
  return out, None


def _term_problem(law, terms: dict) -> str | None:
  """Why ``terms`` (from --term) do not suit ``law``: a term of the law without a value, or a
  value for a column that is no term of it; None when they suit."""
  missing, unknown = law.term_problems(terms)
  which = f"the law in {FLAGS.law}" if FLAGS.law else "the study's law"
  if unknown:
    has = f"its terms: {', '.join(law.terms)}" if law.terms else "it takes B and C only"
    return f"--term={unknown[0]}={terms[unknown[0]]:g}: {which} has no term in {unknown[0]} ({has})"
  if missing:
    flags = " ".join(f"--term={k}=VALUE" for k in missing)
    return f"{which} also depends on {', '.join(missing)} (fit-law --terms): give {flags}"
  return None


def shape_warnings(path: str) -> list[str]:
  """One sentence per test of the law's form that its fit (``python -m analysis fit-law`` or
  the report's law.json) rejected — lack of fit along B or C, separability — and, for a fit
  that ran none of them (coefficients held fixed, terms beyond B and C), why; [] for a law
  whose tests all passed or one written by hand (no test fields)."""
  try:
    with open(path, encoding="utf-8-sig") as f:
      obj = json.load(f)
  except (OSError, ValueError):  # Law.from_json read it: only a race fails
    return []
  if not isinstance(obj, dict):
    return []
  out = []
  exponent = {"B": "alpha", "C": "beta"}
  tests = obj.get("lack_of_fit")
  for t in tests if isinstance(tests, list) else []:
    if not isinstance(t, dict) or t.get("symbol") not in exponent:
      continue
    sym = t.get("symbol")
    if t.get("lacks_fit") is True:
      out.append(
        f"{path}: the power law in {sym} was rejected by its fit's lack-of-fit test "
        f"({t.get('numbers')}): {exponent.get(sym, 'its exponent')} averages a shape the law "
        f"cannot take, so predictions across {sym} follow that average, not the grid"
      )
    elif t.get("tested") is False:
      out.append(f"{path}: lack of fit in {sym} not tested: {t.get('reason')}")
  sep = obj.get("separability")
  if isinstance(sep, dict) and sep.get("lacks_fit") is True:
    out.append(
      f"{path}: the law's separable form was rejected by its fit ({sep.get('numbers')}): one "
      f"alpha at every C does not describe the grid it was fitted on"
    )
  elif isinstance(sep, dict) and sep.get("tested") is False:
    out.append(f"{path}: separability not tested: {sep.get('reason')}")
  fixed = obj.get("fixed") if isinstance(obj.get("fixed"), dict) else {}
  if "lack_of_fit" not in obj and obj.get("terms") and not fixed:
    out.append(
      f"{path}: its fit has terms beyond B and C ({', '.join(map(str, obj['terms']))}), so it "
      f"ran no lack-of-fit or separability test (they compare levels of B and C alone)"
    )
  if "lack_of_fit" not in obj and fixed:
    held = ", ".join(f"{k} = {v}" for k, v in fixed.items())
    out.append(
      f"{path}: its fit held {held} fixed (--fix), so it ran no lack-of-fit or separability "
      f"test: nothing says the power law describes the axes it was fitted on"
    )
  return out


def _no_cov(path: str) -> str:
  """Why the law in ``path`` gives no interval: the reason its fit stored (``ci_note``: too few
  cells or grid points with emerged cells, too few resamples, an exact fit, ...; written by
  ``python -m analysis fit-law`` and the report beside an empty ``ci``), or, without one, a law
  that no fit of this version wrote."""
  try:
    with open(path, encoding="utf-8-sig") as f:
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


def _as_json(law, b, c, terms, median, cell, warnings, note, updates, tokens) -> dict:
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
    "terms": terms,
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


def _as_text(law, b, c, terms, median, cell, note, updates, tokens) -> str:
  """The prediction in words: updates and tokens, the intervals, the law."""
  bc = float(b) * float(c)
  at = "".join(f", {k} = {v:g}" for k, v in terms.items())
  lines = [
    f"B = {b:g}, C = {c:g}{at}: induction heads predicted after {_count(updates)} updates "
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
    f"law: UPT = T / (B^{law.alpha:g} · C^{law.beta:g})"
    + "".join(f" · {k}^{g:g}" for k, g in law.gammas)
    + f", ln T = {law.log_T:g} "
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
