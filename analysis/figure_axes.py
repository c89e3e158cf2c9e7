"""What the report's figures share: pyplot on the Agg backend (``pyplot``), saving as PNG and PDF
(``save``), and log axes labelled with plain numbers (``tick_number``, ``log_updates_axis``,
``number_axis``, ``grid_axis``)."""

from __future__ import annotations

import math
import os


def pyplot():
  """``matplotlib.pyplot`` on the Agg backend."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def save(fig, out_base: str) -> list[str]:
  """Writes ``fig`` as ``out_base``.png and .pdf and closes it; returns the two paths."""
  os.makedirs(os.path.dirname(out_base) or ".", exist_ok=True)
  paths = []
  for ext in ("png", "pdf"):
    path = f"{out_base}.{ext}"
    fig.savefig(path, dpi=150 if ext == "png" else None, bbox_inches="tight")
    paths.append(path)
  pyplot().close(fig)
  return paths


def tick_number(v: float, _pos=None) -> str:
  """A tick label as a plain number: 8, 16, 1,000 (not 10^1 or 2×10^1)."""
  return f"{v:,.0f}" if v >= 1 and float(v).is_integer() else f"{v:g}"


def log_updates_axis(ax, lo: float, hi: float) -> None:
  """A log x axis over updates [lo, hi] (lo > 0), labelled with plain numbers: decades when the
  range spans more than two of them, else 1, 2, 5 × each decade; minor ticks unlabelled."""
  from matplotlib import ticker

  ax.set_xscale("log")
  ax.set_xlim(lo, hi)
  subs = (1.0,) if hi / lo > 100 else (1.0, 2.0, 5.0)
  ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(tick_number))
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def number_axis(ax, which: str) -> None:
  """Plain-number labels on a log axis (``which`` 'x' or 'y'): 1,000 rather than 10^3; where the
  axis spans less than two decades its minor ticks at 2 and 5 × a power of 10 are labelled too
  (less than one decade: 2, 3, 4, 5, 6 and 8 ×)."""
  from matplotlib import ticker

  axis = ax.xaxis if which == "x" else ax.yaxis
  limits = ax.get_xlim if which == "x" else ax.get_ylim

  def minor(v, _pos=None):
    lo, hi = sorted(limits())
    if lo <= 0 or hi / lo >= 100 or v <= 0:
      return ""
    mantissa = round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6)
    shown = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0) if hi / lo < 10 else (2.0, 5.0)
    return tick_number(v) if mantissa in shown else ""

  axis.set_major_formatter(ticker.FuncFormatter(tick_number))
  axis.set_minor_formatter(ticker.FuncFormatter(minor))


def grid_axis(ax, which: str, values) -> None:
  """A log axis (``which`` 'x' or 'y') whose ticks are exactly the grid's ``values`` (e.g. B 8,
  16, 32), labelled as plain numbers, with no other tick labels."""
  from matplotlib import ticker

  axis = ax.xaxis if which == "x" else ax.yaxis
  (ax.set_xscale if which == "x" else ax.set_yscale)("log")
  values = sorted(float(v) for v in values)
  axis.set_major_locator(ticker.FixedLocator(values))
  axis.set_major_formatter(ticker.FixedFormatter([tick_number(v) for v in values]))
  axis.set_minor_locator(ticker.NullLocator())
