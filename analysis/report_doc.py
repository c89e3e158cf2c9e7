"""The report's document (``Doc``): its Markdown and the matching self-contained HTML (figures
embedded as base64 PNG), built section by section, with the tables' numbers formatted once
(``fmt``: counts as integers, other numbers to 3 significant digits)."""

from __future__ import annotations

import base64
import html
import os
import re

import numpy as np
import pandas as pd

# Integer columns that count updates, tokens or parameters get thousands separators like floats.
_COUNT_COLUMN = re.compile(r"step|tokens|updates|n_params")


# A cell of a table that reads as a number ('', 3,937, -0.12, 1e-05, '> 797'): right-aligned.
_NUMBER = r"(> )?[-+]?[\d,]*\.?\d*(e[-+]?\d+)?|nan"


def _float_text(v: float, digits: int = 3) -> str:
  """One float as every table writes it (``fmt``)."""
  if pd.isna(v):
    return ""
  if abs(v) < 1e-9:
    return "0"
  return f"{v:,.0f}" if abs(v) >= 10**digits else f"{v:.{digits}g}"


def fmt(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
  """Numbers for display, one way in every table: floats to ``digits`` significant digits, and
  from 10^digits on whole, with thousands separators (3,937, as ``_median_all`` writes them);
  integer columns of updates, tokens or parameters (``step``, ``tokens``, ``updates``,
  ``n_params`` in the name) with separators too; other integers (B, C, seeds, counts of models)
  as they are. A column of text and numbers (a median beside '> 995') has its floats written
  the same way and its text as it is."""
  out = df.copy()
  for c in out.columns:
    if pd.api.types.is_float_dtype(out[c]):
      out[c] = out[c].map(lambda v: _float_text(v, digits))
    elif pd.api.types.is_integer_dtype(out[c]) and _COUNT_COLUMN.search(str(c)):
      out[c] = out[c].map(lambda v: f"{v:,}")
    elif pd.api.types.is_object_dtype(out[c]):
      out[c] = out[c].map(
        lambda v: _float_text(float(v), digits) if isinstance(v, (float, np.floating)) else v
      )
  return out


class Doc:
  """A report built once and rendered twice (Markdown, self-contained HTML)."""

  def __init__(self, out_dir: str):
    self.out_dir, self.blocks = out_dir, []

  def h(self, level: int, text: str):
    self.blocks.append(("h", level, text))

  def p(self, text: str):
    self.blocks.append(("p", text))

  def table(self, df: pd.DataFrame, max_rows: int = 60):
    note = ""
    if len(df) > max_rows:
      note = f"(first {max_rows} of {len(df)} rows; all in the CSV files)"
      df = df.head(max_rows)
    shown = fmt(df)
    # Right-aligned where the column holds numbers; the text is fmt's (tabulate would re-parse
    # "11,843" in a column of floats and print 11843).
    align = tuple(
      "right"
      if pd.api.types.is_numeric_dtype(df[c]) or shown[c].astype(str).str.fullmatch(_NUMBER).all()
      else "left"
      for c in df.columns
    )
    self.blocks.append(("table", shown, note, align))

  def figure(self, png: str, caption: str):
    self.blocks.append(("figure", png, caption))

  def mark(self) -> int:
    """A place in the document, for ``insert``."""
    return len(self.blocks)

  def insert(self, at: int, build) -> None:
    """Runs ``build(doc)`` and moves the blocks it added to position ``at``."""
    start = len(self.blocks)
    build(self)
    added = self.blocks[start:]
    del self.blocks[start:]
    self.blocks[at:at] = added

  def markdown(self) -> str:
    out = []
    for b in self.blocks:
      if b[0] == "h":
        out.append("#" * b[1] + " " + b[2])
      elif b[0] == "p":
        out.append(b[1])
      elif b[0] == "table":
        table = b[1].to_markdown(index=False, disable_numparse=True, colalign=b[3])
        out.append(table + (f"\n\n{b[2]}" if b[2] else ""))
      else:
        out.append(f"![{b[2]}]({os.path.relpath(b[1], self.out_dir)})\n\n*{b[2]}*")
    return "\n\n".join(out) + "\n"

  def html(self, title: str) -> str:
    body = []
    for b in self.blocks:
      if b[0] == "h":
        body.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
      elif b[0] == "p":
        body.append(f"<p>{_inline_html(b[1])}</p>")
      elif b[0] == "table":
        body.append(
          b[1].to_html(index=False, border=0, classes="t")
          + (f"<p class='note'>{html.escape(b[2])}</p>" if b[2] else "")
        )
      else:
        with open(b[1], "rb") as f:
          data = base64.b64encode(f.read()).decode()
        body.append(
          f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(b[2])}'>"
          f"<figcaption>{html.escape(b[2])}</figcaption></figure>"
        )
    style = (
      "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
      "table.t{border-collapse:collapse;font-size:13px;margin:.5em 0}"
      "table.t td,table.t th{border-bottom:1px solid #ddd;padding:2px 8px;"
      "text-align:right}img{max-width:100%}figcaption,.note{color:#555;font-size:13px}"
    )
    return (
      f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
      f"</title><style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _inline_html(text: str) -> str:
  """A paragraph's Markdown emphasis as HTML: **bold** and `code`; everything else escaped."""
  text = html.escape(text)
  text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
  return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
