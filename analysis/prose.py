"""Small pieces of the report's generated prose (``analysis.summary``,
``analysis.limitations``): config fields, numbers and spans of them, seeds per grid point, a
law's intervals, sentences."""

from __future__ import annotations

import numpy as np
import pandas as pd


def config_field(cfg, path: str, default=None):
  """``cfg``'s field at a dotted path (ConfigDict or nested dicts), else ``default``."""
  node = cfg
  for part in path.split("."):
    try:
      node = node[part]
    except (KeyError, TypeError, AttributeError, IndexError):
      return default
  return node


def number(v: float) -> str:
  """A count or update number for prose: 1,234; 12.3k is not used."""
  if v is None or not np.isfinite(v):
    return "?"
  return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.3g}"


def number_span(lo: float, hi: float) -> str:
  """'1,200–3,400', or '1,200' when both ends print alike."""
  a, b = number(lo), number(hi)
  return a if a == b else f"{a}–{b}"


def seeds_per_point(points: pd.DataFrame, keys: list[str]) -> tuple[int, int]:
  """The fewest and most cells (seeds) per grid point of ``keys``."""
  per = points.groupby(keys, dropna=False).size()
  return int(per.min()), int(per.max())


def interval_of(law: dict, name: str):
  """The 95% interval of a law's coefficient ``name`` as ``(lo, hi)``, None without one."""
  ci = (law.get("ci") or {}).get(name)
  if ci is None or len(ci) != 2 or not all(np.isfinite(ci)):
    return None
  return float(ci[0]), float(ci[1])


def sentence(text: str) -> str:
  """A clause as a sentence: first letter capitalised, a full stop at the end."""
  text = text.strip()
  return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
