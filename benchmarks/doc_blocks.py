"""Generated blocks in the docs: the text between ``<!-- TOOL NAME -->`` and ``<!-- /TOOL NAME
-->`` in a Markdown file, written and checked by the script named TOOL (docs_tables.py,
demo_docs.py), so that a number in the docs is the one a command printed. A block is lines
between markers on lines of their own, or inline: a few words between markers within a line."""

from __future__ import annotations

import difflib
import re


def markers(tool: str, name: str) -> tuple[str, str]:
  """The opening and closing marker of block ``name`` of ``tool``."""
  return f"<!-- {tool} {name} -->", f"<!-- /{tool} {name} -->"


def read(path: str, tool: str, name: str) -> str:
  """The block's text as ``path`` has it now (without its markers).

  Raises:
    SystemExit: the file has no such block.
  """
  with open(path) as f:
    text = f.read()
  begin, end = markers(tool, name)
  m = _find(text, begin, end)
  if not m:
    raise SystemExit(f"{tool}: {path} has no {begin} ... {end} block")
  return m.group(2).rstrip("\n")


def _find(text: str, begin: str, end: str) -> re.Match | None:
  """The block: group 1 the newline after its opening marker (empty where the block is inline,
  within a line of prose: ``<!-- TOOL NAME -->12,078<!-- /TOOL NAME -->``), group 2 its text."""
  return re.search(re.escape(begin) + r"(\n?)(.*?)" + re.escape(end), text, re.S)


def write(path: str, tool: str, name: str, body: str) -> None:
  """Replaces the block's text in ``path`` with ``body``.

  Raises:
    SystemExit: the file has no such block.
  """
  read(path, tool, name)  # the block exists
  with open(path) as f:
    text = f.read()
  begin, end = markers(tool, name)
  m = _find(text, begin, end)
  if not m.group(1) and "\n" in body:
    raise SystemExit(f"{tool}: {name}: an inline block in {path} cannot take several lines")
  new = f"{begin}\n{body}\n{end}" if m.group(1) else f"{begin}{body}{end}"
  text = text[: m.start()] + new + text[m.end() :]
  with open(path, "w") as f:
    f.write(text)


def compare(path: str, tool: str, name: str, body: str, shown: str) -> bool:
  """Prints whether the block in ``path`` (``shown``: the name printed for the file) equals
  ``body``, with a diff where not; True where equal."""
  old = read(path, tool, name)
  if old == body:
    print(f"{name}: {shown} matches")
    return True
  diff = difflib.unified_diff(old.splitlines(), body.splitlines(), shown, "now", lineterm="")
  print(f"{name}: {shown} differs from what the commands print now:\n" + "\n".join(diff))
  return False
