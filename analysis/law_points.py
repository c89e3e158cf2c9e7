"""Emergence points as the law fit reads them: a CSV or table of cells (``read_points``), checked
and cleaned (``clean_points``: counts, censoring flags, censor steps), and models moved to
censored (``censor``). Bad values raise ``FitError`` naming the line."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ihsweep.base.errors import IhsweepError

# The law's columns are counts (updates, sequences, tokens, parameters): a value past what a
# 64-bit counter holds is a unit or typing error, and would drag the fit. A term's column may
# be no count (a frequency, a learning rate): only n_params among them is held to it.
MAX_COUNT = 2**63 - 1
COUNTS = ("batch_size", "context_size", "emergence_step", "censor_step", "n_params")

# Columns that are no term + γ ln x of the law: B and C are in it already, the others say when
# (or whether) a cell emerged.
NOT_TERMS = (
  "batch_size",
  "context_size",
  "emergence_step",
  "emergence_tokens",
  "censor_step",
  "censored",
)


class FitError(IhsweepError, ValueError):
  """Emergence points from which the law cannot be fitted (too few, not identifiable, bad
  values)."""


def clean_points(points: pd.DataFrame, terms: tuple = ()) -> tuple[pd.DataFrame, np.ndarray]:
  """The rows as numbers and a censored mask (bool, len(rows)): censored = empty
  ``emergence_step`` or a true ``censored``; censored rows need a positive ``censor_step``;
  each column of ``terms`` (the law's + γ ln x beyond B and C) needs a positive number in every
  row and more than one value among the emerged cells.

  Raises:
    FitError: as ``check_term_names``; a missing, non-numeric or non-positive column (naming a
      line), or a term that does not vary among the emerged cells (naming its value).
  """
  terms = tuple(terms)
  check_term_names(terms)
  need = ["batch_size", "context_size", "emergence_step"]
  missing = [c for c in need if c not in points]
  if missing:
    raise FitError(f"emergence points need columns {', '.join(need)}; missing {', '.join(missing)}")
  absent = [c for c in terms if c not in points]
  if absent:
    raise FitError(f"no column {absent[0]!r} for a term; {_term_columns(points)}")
  if points.empty:
    raise FitError("no emergence points (the table has no rows)")
  pts = points.copy()
  need += terms
  for c in need + (["censor_step"] if "censor_step" in pts else []):
    values = pd.to_numeric(pts[c], errors="coerce")
    text = values.isna() & pts[c].notna() & (pts[c].astype(str).str.strip() != "")
    if c == "emergence_step" and "censored" in pts:  # 'NaN' beside censored true: no step
      nan_text = pts[c].astype(str).str.strip().str.lower() == "nan"
      text &= ~(nan_text & as_bool(pts["censored"], pts))
    if text.any() and c in terms:
      row = int(np.flatnonzero(text)[0])
      raise FitError(
        f"term column {c} is not numeric ({_where(pts, row)} has {str(pts[c].iloc[row])!r}): "
        f"a term enters as ln {c}; {_term_columns(points)}"
      )
    if text.any():
      row = int(np.flatnonzero(text)[0])
      raise FitError(
        f"column {c}: {_where(pts, row)} has {str(pts[c].iloc[row])!r}, not a "
        f"number"
        + (
          " (leave emergence_step empty, or set censored true, for a censored cell)"
          if c == "emergence_step"
          else ""
        )
      )
    pts[c] = values.astype(float)
  censored = pts["emergence_step"].isna().to_numpy().copy()
  if "censored" in pts:
    censored = censored | as_bool(pts["censored"], pts).to_numpy()
  checks = [(c, np.ones(len(pts), bool)) for c in need if c != "emergence_step"]
  checks += [("emergence_step", ~censored)]
  if censored.any():
    if "censor_step" not in pts:
      row = int(np.flatnonzero(censored)[0])
      raise FitError(
        f"column censor_step is missing: {_where(pts, row)} is censored (empty "
        f"emergence_step or censored true) and enters the fit at its censor_step, "
        f"the last update at which it was seen not to have emerged (an analysis "
        f"emergence.csv has the column); add it, or drop the censored rows"
      )
    checks += [("censor_step", censored)]
  for c, rows in checks:
    v = pts[c].to_numpy(float)
    too_large = np.flatnonzero(rows & np.isfinite(v) & (v > MAX_COUNT) & (c in COUNTS))
    if len(too_large):
      raise FitError(
        f"column {c}: {_where(pts, int(too_large[0]))} has {float(v[too_large[0]])!r}, more "
        f"than any step or size counter holds (at most 2^63 - 1 = {MAX_COUNT:.3g}); is the "
        f"column in another unit?"
      )
    bad = np.flatnonzero(rows & ~(np.isfinite(v) & (v > 0)))
    if len(bad) and c == "censor_step" and np.isnan(v[bad[0]]):
      raise FitError(
        f"column censor_step: {_where(pts, int(bad[0]))} is censored (empty "
        f"emergence_step or censored true) but has no censor_step; give the last "
        f"update at which it had not emerged, or drop the row"
      )
    if len(bad):
      what = " (a censored row's last update without emergence)" if c == "censor_step" else ""
      what = f" (a term enters as ln {c})" if c in terms else what
      raise FitError(
        f"column {c} must be positive and finite{what}; {_where(pts, int(bad[0]))} "
        f"has {float(v[bad[0]])!r}"
      )
  for c in terms:
    values = pts.loc[~censored, c].unique()
    if len(values) == 1:  # its γ would be ln T's
      raise FitError(
        f"term {c} does not vary among the emerged cells (all {values[0]:g}): its "
        f"coefficient gamma[{c}] cannot be told from ln T"
      )
  return pts, censored


def law_terms(terms, with_params: bool = False) -> tuple:
  """The law's terms beyond B and C: ``terms`` (columns), or ("n_params",) for
  ``with_params`` (the model-size term alone).

  Raises:
    FitError: ``with_params`` beside other terms; as ``check_term_names``.
  """
  terms = tuple(terms)
  if with_params and terms not in ((), ("n_params",)):
    raise FitError(
      f"with_params (the n_params term alone) beside the terms {', '.join(terms)}: give the "
      f"terms alone, with n_params among them for the model size"
    )
  check_term_names(terms)
  return terms or (("n_params",) if with_params else ())


def check_term_names(terms: tuple) -> None:
  """Raises ``FitError`` for a term (a column of + γ ln x) that is B or C (in the law already),
  says when a cell emerged (``NOT_TERMS``), has no name, or is given twice."""
  for i, c in enumerate(terms):
    if c in ("batch_size", "context_size"):
      symbol = "alpha ln B" if c == "batch_size" else "beta ln C"
      raise FitError(f"term {c}: in the law already ({symbol}); a term is a column beyond B and C")
    if c in NOT_TERMS:
      raise FitError(f"term {c}: says when a cell emerged; a term is a property of the cell")
    if not c.strip():
      raise FitError("a term with an empty column name")
    if c in terms[:i]:
      raise FitError(f"term {c}: given twice; give each column once")


def _term_columns(points: pd.DataFrame) -> str:
  """The columns of ``points`` that could serve as terms, in words: numeric and positive in
  every row, none of ``NOT_TERMS``."""
  fit = [
    c
    for c in points.columns
    if c not in NOT_TERMS
    and points[c].dtype != bool
    and (pd.to_numeric(points[c], errors="coerce") > 0).all()
  ]
  return f"numeric columns that could serve: {', '.join(map(str, fit)) or 'none'}"


def duplicated_lines(points: pd.DataFrame) -> list[str]:
  """The rows of ``points`` equal in every column to an earlier row, named as ``_where`` does
  ('line N'); empty if none."""
  return [_where(points, int(i)) for i in np.flatnonzero(points.duplicated().to_numpy())]


def _where(points: pd.DataFrame, position: int) -> str:
  """Names the row at ``position``: 'line N' (of the CSV file, the header being line 1) when the
  index holds file line numbers (index name 'line', as ``read_points`` makes it), else the row's
  index label."""
  label = points.index[position]
  return f"line {label}" if points.index.name == "line" else f"the row with index {label!r}"


def read_points(path: str) -> pd.DataFrame:
  """A CSV of emergence points, indexed by each row's line number in the file (the header is
  line 1; blank lines are skipped but counted), so that errors name the line a user sees. Only
  an empty field is missing: text such as 'NaN' stays text, and ``clean_points`` refuses it in a
  number column (but an emergence_step 'NaN' where ``censored`` is true).

  Raises:
    OSError, ValueError: the file cannot be read as a CSV.
  """
  import csv

  # Only an empty field is missing: pandas' default reads 'NaN', 'NA', 'null', ... as empty too,
  # and an emergence_step 'NaN' would pass silently as a censored cell.
  points = pd.read_csv(path, keep_default_na=False, na_values=[""])
  with open(path, newline="", encoding="utf-8", errors="replace") as f:
    reader, lines, start = csv.reader(f), [], 1
    for row in reader:
      if any(field.strip() for field in row) or len(row) > 1:  # pandas skips empty lines only
        lines.append(start)
      start = reader.line_num + 1
  if len(lines) - 1 == len(points):  # else an unusual layout: rows are named by number
    points.index = pd.Index(lines[1:], name="line")
  return points


def as_bool(column: pd.Series, points: pd.DataFrame | None = None) -> pd.Series:
  """A ``censored`` column as booleans: true/false, 1/0, yes/no (any case); empty = False.

  Raises:
    FitError: any other value (naming its row, ``_where``).
  """
  if column.dtype == bool:
    return column
  text = column.astype(str).str.strip().str.lower()
  mapping = {
    "true": True,
    "1": True,
    "1.0": True,
    "yes": True,
    "false": False,
    "0": False,
    "0.0": False,
    "no": False,
    "": False,
    "nan": False,
    "none": False,
  }
  unknown = ~text.isin(list(mapping))
  if unknown.any():
    row = int(np.flatnonzero(unknown)[0])
    where = f"{_where(points, row)} has " if points is not None else ""
    raise FitError(f"column censored: {where}{column.iloc[row]!r}, not true/false")
  return text.map(mapping).astype(bool)


def censor(points: pd.DataFrame, mask, at: str = "last_step") -> pd.DataFrame:
  """``points`` with the rows of ``mask`` (bool, len(points)) turned censored at their column
  ``at`` (updates; default ``last_step``, each model's last checkpoint: its cap or end of
  training), as if their jump had not been seen: ``censored`` True, ``emergence_step`` and
  ``emergence_tokens`` NaN, ``censor_step`` = ``at``. For ``fit_law``'s sensitivity to points
  that emerged just before the end of training (``analysis.emergence.caution``).

  Raises:
    FitError: ``at`` is not a column of ``points``.
  """
  if at not in points:
    raise FitError(f"cannot censor at {at!r}: the emergence points have no such column")
  mask = np.asarray(mask, bool)
  out = points.copy()
  out["censored"] = (
    as_bool(out["censored"], out).to_numpy() if "censored" in out else out["emergence_step"].isna()
  ) | mask
  if "censor_step" not in out:
    out["censor_step"] = math.nan
  out["censor_step"] = out["censor_step"].astype(float).mask(mask, out[at].astype(float))
  out["emergence_step"] = out["emergence_step"].astype(float).mask(mask, math.nan)
  if "emergence_tokens" in out:
    out["emergence_tokens"] = out["emergence_tokens"].astype(float).mask(mask, math.nan)
  return out
