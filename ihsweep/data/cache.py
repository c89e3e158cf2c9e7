"""The cache directory and the rules for writing into it (shared by the corpus fetcher, the
tokenized-corpus cache and the compile cache).

Root: ``data.cache_dir``, else ``$IHSWEEP_CACHE``, else ``$XDG_CACHE_HOME/ihsweep``, else
``~/.cache/ihsweep``. Builders write into a temporary directory named after their host and
process (``temp_prefix``) and rename it into place, so a killed build leaves no half-written entry
and ``remove_stale_temp_dirs`` can tell a dead builder's leftovers from a live concurrent build.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile

from ihsweep.base import environment
from ihsweep.data.errors import CorpusError


def default_cache_dir() -> str:
  """``$IHSWEEP_CACHE``, else ``$XDG_CACHE_HOME/ihsweep``, else ``~/.cache/ihsweep``."""
  chosen = environment.get("IHSWEEP_CACHE")
  if chosen:
    return chosen
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "ihsweep")


def resolve_cache_dir(data_cfg) -> str:
  return os.path.expanduser(data_cfg.cache_dir) if data_cfg.cache_dir else default_cache_dir()


def check_dir_or_absent(path: str, what: str) -> None:
  """Checks that ``path`` is a directory or can become one (its nearest existing ancestor is a
  directory).

  Raises:
    CorpusError: ``what`` (e.g. ``config.data.cache_dir = '/etc/hostname'``) is not a
      directory.
  """
  at = os.path.abspath(path)
  while not os.path.exists(at) and os.path.dirname(at) != at:
    at = os.path.dirname(at)
  if not os.path.isdir(at):
    raise CorpusError(
      f"{what} is not a directory ({at} is a file); set config.data.cache_dir "
      f"or $IHSWEEP_CACHE to a directory",
      "data.cache_dir",
    )


def writable_dir(path: str, field: str) -> str:
  """Creates ``path`` if needed and checks it is a writable directory.

  Raises:
    CorpusError: naming ``field`` (e.g. data.cache_dir) when it is not.
  """
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
      pass
  except OSError as e:
    raise CorpusError(
      f"config.{field}: cannot use {path} as a cache directory "
      f"({e.strerror or e}); set config.{field} or $IHSWEEP_CACHE to a writable "
      f"directory",
      field,
    ) from None
  return path


def temp_prefix(kind: str) -> str:
  """Names temporary build directories after their host and process, so that a later run can
  tell a dead builder's leftovers from a live concurrent build."""
  return f".{kind}-{socket.gethostname()}-{os.getpid()}-"


def remove_stale_temp_dirs(root: str) -> None:
  """Removes ``.build-*`` / ``.fetch-*`` directories left in ``root`` by killed processes of
  this host."""
  host = socket.gethostname()
  for entry in glob.glob(os.path.join(root, ".build-*")) + glob.glob(
    os.path.join(root, ".fetch-*")
  ):
    parts = os.path.basename(entry).split("-")
    if len(parts) < 4 or "-".join(parts[1:-2]) != host or not parts[-2].isdigit():
      continue
    try:
      os.kill(int(parts[-2]), 0)
    except ProcessLookupError:
      shutil.rmtree(entry, ignore_errors=True)
    except PermissionError:  # alive, another user's
      pass
