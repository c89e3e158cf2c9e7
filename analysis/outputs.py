"""The report's output directory: which files in it are the report's own.

``python -m analysis report`` leaves ``OUT/report_manifest.json`` listing every file it wrote
there (path relative to OUT and its SHA-256). A later report into the same OUT removes or
replaces only those files, and only while they are still the regular files it wrote (same
checksum); it refuses, before computing anything, to overwrite any other file with a name it
writes (a user's ``report.md``, ``figures/law.png``, …) or a listed file that was changed since.
Other files in OUT (a user's figures, notes) are never touched.

One exception for directories written before the manifest existed: in a run's own default
output directory ``RUN/analysis`` without a manifest, files with the report's names are taken
as an earlier report's (nothing else writes there).

Each name is entered in the manifest just before its file is written, so a report cut short
(Ctrl-C, a full disk) still owns what it wrote; the checksums are added at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

from ihsweep.base.atomic import atomic_write_json
from ihsweep.base.errors import IhsweepError

MANIFEST = "report_manifest.json"
WRITTEN_BY = "python -m analysis report"
FILES = (
  "report.md",
  "report.html",
  "emergence.csv",
  "curves.csv",
  "law.json",
  "agreement.csv",
  "residuals.csv",
  "censored_check.csv",
  "held_out.csv",
  "emergence_map.csv",
  "frontier.csv",
  "factorial.csv",
  "positions.csv",
  "circuit.csv",
)
FIGURES = (
  "curves_ps_max",
  "curves_pt_max",
  "curves_ar_acc",
  "curves_la_max",
  "loss",
  "attention",
  "law",
  "emergence_bc",
  "emergence_map",
  "factorial",
)
NAMES = FILES + tuple(f"figures/{f}.{ext}" for f in FIGURES for ext in ("png", "pdf"))


class OutputError(IhsweepError, ValueError):
  """The report's output directory cannot be written, or holds files that are not the
  report's where it would write."""


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _is_file(path: str) -> bool:
  """A regular file, not a symbolic link (to be removed or replaced, a path must be one)."""
  try:
    return stat.S_ISREG(os.lstat(path).st_mode)
  except OSError:
    return False


class Outputs:
  """The report's files in ``out_dir`` (module docstring).

  Args:
    out_dir: the output directory (it exists).
    legacy: ``out_dir`` is a run's default ``RUN/analysis``: without a manifest, files with the
      report's names are an earlier report's.

  Raises:
    OutputError: a manifest that cannot be read as this tool's.
  """

  def __init__(self, out_dir: str, legacy: bool = False):
    self.dir, self.path = out_dir, os.path.join(out_dir, MANIFEST)
    self.files: dict[str, str | None] = {}  # this report's: name -> SHA-256 (None: not yet)
    self.previous: dict[str, str | None] = {}
    if os.path.lexists(self.path):
      try:
        with open(self.path) as f:
          manifest = json.load(f)
        if manifest["written_by"] != WRITTEN_BY or not isinstance(manifest["files"], dict):
          raise ValueError("not this report's manifest")
        # Only the names the report writes count: a manifest cannot make it remove other files.
        self.previous = {k: v for k, v in manifest["files"].items() if k in NAMES}
      except Exception:  # noqa: BLE001 — unreadable, damaged, or someone else's file
        raise OutputError(
          f"{self.path} is not a manifest this report wrote (it lists the files "
          f"it may replace); move it away, or give another --out"
        ) from None
    elif legacy:
      self.previous = {name: None for name in NAMES}

  def check_and_clear(self) -> None:
    """Refuses to go on if a name the report writes is taken by a file that is not its own (or
    was changed since it was written); then removes the previous report's files, so that nothing
    stale (a law.json from other settings) survives beside the new ones.

    Raises:
      OutputError: naming the first such file.
    """
    own = []
    for name in NAMES:
      path = os.path.join(self.dir, name)
      if not os.path.lexists(path):
        continue
      if name not in self.previous:
        raise OutputError(
          f"{path} exists and was not written by this report; it is never "
          f"overwritten: move it away, or give another --out"
        )
      sha = self.previous[name]
      if not _is_file(path) or (sha is not None and _sha256(path) != sha):
        raise OutputError(
          f"{path} was changed since the report wrote it (or is no longer a "
          f"plain file); it is never overwritten: move it away, or give "
          f"another --out"
        )
      own.append(path)
    for path in own:
      os.remove(path)
    self._save()

  def claim(self, name: str) -> str:
    """The path of output ``name`` (one of ``NAMES``), entered in the manifest before the
    caller writes it."""
    assert name in NAMES, name
    self.files[name] = None
    self._save()
    return os.path.join(self.dir, name)

  def figure(self, name: str) -> str:
    """The base path (no extension) of figure ``name`` (``FIGURES``): .png and .pdf claimed."""
    for ext in ("png", "pdf"):
      self.claim(f"figures/{name}.{ext}")
    return os.path.join(self.dir, "figures", name)

  def finish(self) -> None:
    """Records the checksums of the files written (names claimed but not written are
    dropped)."""
    self.files = {
      name: _sha256(os.path.join(self.dir, name))
      for name in self.files
      if _is_file(os.path.join(self.dir, name))
    }
    self._save()

  def _save(self) -> None:
    atomic_write_json(
      self.path, {"written_by": WRITTEN_BY, "files": self.files}, indent=1, sort_keys=True
    )
