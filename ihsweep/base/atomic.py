"""Writes that a reader, a concurrent writer or a kill never sees half done: ``atomic_file`` and
``atomic_write_json``, for every file ihsweep and its analysis write (callers import them from
here); the lock that says which live process writes a directory (``lock_holder``); and brief
locks that never wait on a paused holder (``brief_lock``, ``rewrite_when_free``). It imports
nothing of ihsweep but ``errors`` (a leaf)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time

from ihsweep.base.errors import IhsweepError

# ``ownership.workdir_lock`` holds an exclusive ``flock`` on this file of a run (or a sweep group's)
# directory while a process writes it, and writes ``pid P on HOST`` into it.
LOCK_FILE = ".ihsweep.lock"


_thread_worker = threading.local()  # .name: the sweep worker this thread works for, if any


def name_thread_worker(name: str | None) -> None:
  """Names the sweep worker the calling thread works for (``claims.set_thread_worker``: several
  workers side by side in one process), so that the locks it takes name it."""
  _thread_worker.name = name


def lock_text() -> str:
  """What the holder of a lock writes into it: ``pid P on HOST``, with ``, worker W`` for a
  thread of one of several workers in its process (``name_thread_worker``)."""
  text = f"pid {os.getpid()} on {socket.gethostname()}"
  name = getattr(_thread_worker, "name", None)
  return f"{text}, worker {name}" if name else text


_lock_times: list = [None]  # where brief locks' hold times go, if anywhere (record_lock_times)


def record_lock_times(path: str | None) -> None:
  """From now on, appends each brief lock's hold and wait to ``path`` as ``<lock file name>
  <seconds held> <seconds waited>`` lines (``IHSWEEP_LOCK_TIMES``, which ``ihsweep run`` passes
  here; benchmarks/claims_lock.py reads them); None: no more."""
  _lock_times[0] = path


_NAME_BYTES = 160  # a brief lock's holder record, space-padded


def _flock_pid(f) -> int | None:
  """The pid holding an ``flock`` on open file ``f`` as Linux's /proc/locks lists it (None
  elsewhere, or not found: another host's process on a network filesystem)."""
  st = os.fstat(f.fileno())
  dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
  try:
    with open("/proc/locks") as locks:
      for line in locks:
        parts = line.split()
        if "FLOCK" in parts and dev in parts:
          return int(parts[parts.index(dev) - 1])
  except (OSError, ValueError, IndexError):
    return None
  return None


def _holder_of(f) -> str:
  """Who holds the brief lock on ``f``: its record (``lock_text``), unless /proc/locks names
  another pid (the holder stopped between taking the lock and writing its name)."""
  f.seek(0)
  text = f.read().strip()
  pid = _flock_pid(f)
  if pid is not None and not text.startswith(f"pid {pid} "):
    return f"pid {pid} on {socket.gethostname()}"
  return text or "another process"


class LockBusy(IhsweepError):
  """A brief lock (``brief_lock``) another holder kept past the caller's patience.

  Attributes:
    holder: the holder's ``lock_text`` (``pid P on HOST[, worker W]``), or "another process".
    waited: seconds the caller tried, a float.
  """

  def __init__(self, path: str, holder: str, waited: float):
    self.path, self.holder, self.waited = path, holder, waited
    super().__init__(f"{path} held by {holder} for over {waited:g} s (not answering)")


@contextlib.contextmanager
def brief_lock(path: str, patience: float = 2.0):
  """Holds an exclusive ``flock`` on ``path`` (created if missing) for a few small file reads and
  writes, writing this holder's ``lock_text`` into it. Never blocks past ``patience`` seconds:
  a holder that is paused (SIGSTOP) or hung keeps its lock, and the caller goes on without it.

  Raises:
    LockBusy: not taken within ``patience`` seconds (0: one try); names the holder.
  """
  f = open(path, "a+")
  start, start_perf = time.monotonic(), time.perf_counter()
  try:
    while True:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        waited = time.monotonic() - start
        if waited >= patience:
          raise LockBusy(path, _holder_of(f), round(waited, 3)) from None
        time.sleep(min(0.002 + waited / 10, 0.05))
    taken = time.perf_counter()
    try:
      # one write of a fixed-size record, never truncated: a reader always finds a whole name
      os.pwrite(f.fileno(), lock_text().ljust(_NAME_BYTES)[:_NAME_BYTES].encode(), 0)
      yield
    finally:
      held = time.perf_counter() - taken
      fcntl.flock(f, fcntl.LOCK_UN)
      times_path = _lock_times[0]
      if times_path:
        waited = taken - start_perf
        with open(times_path, "a") as times:
          times.write(f"{os.path.basename(path)} {held:.6f} {waited:.6f}\n")
  finally:
    f.close()


def rewrite_when_free(lock_path: str, write) -> bool:
  """Runs ``write()`` (which rewrites a file derived from others, e.g. cells.csv from every
  group's status) under ``lock_path`` without ever waiting for it: a caller that finds the lock
  held leaves a request beside it (``lock_path + ".again"``), and whoever holds the lock runs
  ``write`` again until no request is left, so the last rewrite sees every change made before
  its request, even where the holder is paused for a while. Returns whether this call wrote.
  ``write``'s errors propagate."""
  again = lock_path + ".again"
  wrote = False
  while True:
    with open(again, "a"):
      pass  # the request: one more rewrite, by this caller or the lock's holder
    try:
      with brief_lock(lock_path, patience=0):
        while os.path.exists(again):
          with contextlib.suppress(FileNotFoundError):
            os.remove(again)
          write()
          wrote = True
    except LockBusy:
      return wrote  # the holder sees the request
    # a request made between the last check and the release: its maker found the lock held
    if not os.path.exists(again):
      return wrote


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
