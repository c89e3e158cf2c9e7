"""The one base class of every error ihsweep raises on purpose, and the storage faults.

``except IhsweepError`` catches what the tool refuses or cannot do (a bad config field, a run
directory that is not a run, a checkpoint that cannot be read, a full disk, a stop on request)
and nothing else: a bug still surfaces as its own exception. Each subclass also derives from the
built-in class callers caught before (``ValueError``, ``RuntimeError``), so existing ``except``
clauses keep working. A leaf module: importing it imports nothing of JAX.
"""

from __future__ import annotations

import errno
import os
import sys


class IhsweepError(Exception):
  """Base of every error ihsweep raises on purpose; its message is one line for the user."""


# What the operating system names a fault of the storage, not of the run: a rerun of the same
# command resumes once it is mended. The one list: checkpoints, logs and records alike.
STORAGE_ERRNOS = tuple(
  code
  for code in (
    errno.ENOSPC,  # no space left on device
    getattr(errno, "EDQUOT", None),  # disk quota exceeded
    errno.EFBIG,  # file too large (ulimit -f, the file system's own limit)
    errno.EROFS,  # read-only file system (remounted read-only after an error, say)
    errno.EIO,  # input/output error
    getattr(errno, "ESTALE", None),  # stale file handle (NFS)
    getattr(errno, "EREMOTEIO", None),  # remote I/O error
  )
  if code is not None
)
# The same faults where only a message carries them: tensorstore (orbax's writer) raises
# ``ValueError("RESOURCE_EXHAUSTED: … No space left on device [os_error_code='28']")``, ``…
# File too large [os_error_code='27']``; the texts are the C library's, as ``os.strerror`` gives.
STORAGE_MESSAGES = {code: (os.strerror(code), f"os_error_code='{code}'") for code in STORAGE_ERRNOS}
_REMEDY = {
  errno.ENOSPC: "free space",
  getattr(errno, "EDQUOT", -1): "free space or raise the quota",
  errno.EFBIG: "raise the file-size limit (ulimit -f)",
  errno.EROFS: "make the file system writable",
}


def storage_errno(error: BaseException | None) -> tuple[BaseException, int] | None:
  """The exception in ``error``'s chain (itself, then its causes and contexts) that reports a
  storage fault, and that fault's errno (one of ``STORAGE_ERRNOS``): a ``StorageFault``, an
  ``OSError`` with such an errno, or an exception whose message carries one's text
  (``STORAGE_MESSAGES``: orbax's tensorstore errors); None if there is none."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, StorageFault):
      return error, error.errno
    if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
      return error, error.errno
    text = str(error)
    for code, texts in STORAGE_MESSAGES.items():
      if any(t in text for t in texts):
        return error, code
    error = error.__cause__ or error.__context__
  return None


def is_storage_message(text: str) -> bool:
  """Whether ``text`` (a log line of orbax's writer threads) reports a storage fault."""
  return any(t in text for texts in STORAGE_MESSAGES.values() for t in texts)


class StorageFault(IhsweepError):
  """A write to ``directory`` failed for a fault of its storage (``STORAGE_ERRNOS``: a full
  disk, a quota, a file-size limit, a read-only or failing device); the message is one line for
  the user. The ``ihsweep`` command prints it and exits with status ``EXIT_CODE`` (75,
  sysexits' EX_TEMPFAIL): rerun the same command once the storage is mended; it resumes from
  the last complete full-state checkpoint. A sweep never records the group failed."""

  EXIT_CODE = 75

  def __init__(self, directory: str, code: int = errno.ENOSPC, detail: str = ""):
    self.directory, self.errno = directory, code
    what = os.strerror(code)
    super().__init__(
      f"{what[:1].lower()}{what[1:]} writing {directory}{f' ({detail})' if detail else ''}"
      f"; {_REMEDY.get(code, 'mend the storage')} and rerun the same command to resume"
    )

  @classmethod
  def of(cls, error: BaseException, directory: str) -> StorageFault | None:
    """``error`` itself if it is a ``StorageFault``, one for ``directory`` if ``error``'s chain
    reports a storage fault (``storage_errno``), else None."""
    if isinstance(error, StorageFault):
      return error
    found = storage_errno(error)
    return None if found is None else cls(directory, found[1])


CLOSED_PIPE_EXIT = 141  # 128 + SIGPIPE, what `yes | head` gives under `set -o pipefail`


def quiet_on_closed_pipe(main, *args) -> int:
  """``main(*args)``'s exit code; a reader that closed the pipe early (``ihsweep status |
  head``) ends it quietly with exit 141 instead of a BrokenPipeError traceback. Stdout is pointed
  at /dev/null so that the interpreter's final flush does not raise again."""
  try:
    code = main(*args)
    sys.stdout.flush()
    return code
  except BrokenPipeError:
    try:
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test's capture)
      pass
    return CLOSED_PIPE_EXIT
