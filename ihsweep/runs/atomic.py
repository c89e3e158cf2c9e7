"""Writes that a reader, a concurrent writer or a kill never sees half done: ``atomic_file`` and
``atomic_write_json``, for every file ihsweep and its analysis write (``rundir`` re-exports
them). A leaf module: it imports nothing of ihsweep."""

from __future__ import annotations

import contextlib
import json
import os


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w"):
  """``with atomic_file(path) as f:`` writes ``f`` to a temporary file beside ``path``, unique to
  this process and thread, renamed over ``path`` once the block completes (removed if it
  raises): a reader, a concurrent writer or a kill never sees half a file. The temporary name
  keeps ``path``'s extension (``np.savez`` and parquet writers look at it)."""
  import threading

  root, ext = os.path.splitext(path)
  tmp = f"{root}.{os.getpid()}-{threading.get_ident()}.tmp{ext}"
  try:
    with open(tmp, mode) as f:
      yield f
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def atomic_write_json(path: str, obj, **dump_args) -> None:
  """Writes ``obj`` as JSON to ``path`` atomically (``atomic_file``); ``dump_args`` go to
  ``json.dump`` (default ``indent=2``)."""
  with atomic_file(path) as f:
    json.dump(obj, f, **{"indent": 2, **dump_args})
