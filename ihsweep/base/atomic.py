"""Writes that a reader, a concurrent writer or a kill never sees half done: ``atomic_file`` and
``atomic_write_json``, for every file ihsweep and its analysis write (callers import them from
here); and the lock that says which live process writes a directory (``lock_holder``). A leaf
module: it imports nothing of ihsweep."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket

# ``ownership.workdir_lock`` holds an exclusive ``flock`` on this file of a run (or a sweep group's)
# directory while a process writes it, and writes ``pid P on HOST`` into it.
LOCK_FILE = ".ihsweep.lock"


def lock_text() -> str:
  """What the holder of a directory's lock writes into it: ``pid P on HOST``."""
  return f"pid {os.getpid()} on {socket.gethostname()}"


def lock_holder(directory: str) -> str | None:
  """Who holds ``directory``'s lock (``LOCK_FILE``'s text, e.g. ``pid 12 on host``), or None
  when no live process holds it. The lock dies with its process (SIGKILL included), so a held
  lock means a live holder; a stopped (SIGSTOP) process still holds it. The probe takes the
  lock for an instant when it is free (``ownership.workdir_lock`` retries briefly for that)."""
  path = os.path.join(directory, LOCK_FILE)
  try:
    f = open(path)
  except OSError:
    return None
  with f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      return f.read().strip() or "another process"
    fcntl.flock(f, fcntl.LOCK_UN)
    return None


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
