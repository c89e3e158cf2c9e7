"""Keeps a C++ stack trace of JAX's runtime out of the user's log: one line instead.

When JAX's distributed runtime gives up on a job (a peer that stopped sending heartbeats, a
coordinator gone) it ends the process from C++: an absl ``F`` (fatal) log line, the status over
several lines, ``*** Check failure stack trace: ***`` and a frame per line, then SIGABRT. The
peer watchdog (``sharding._Watchdog``) ends the process with one line before that, given half
JAX's time; a process starved of CPU on a loaded machine may still lose that race. So a process
of a multi-process job writes its stderr through this filter (``start``, a process of its own,
which outlives an abort and ends at the end of its input): everything passes unchanged except a
fatal line and what follows it, which become one ``ihsweep:`` line.

A leaf module: it imports nothing of ihsweep or JAX, so that the filter starts at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

# absl's prefix: severity, MMDD hh:mm:ss.micros, thread id, file:line]
FATAL = re.compile(rb"^F\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]*\] ?(.*)")
TRACE = re.compile(rb"^(\*\*\* |\s+@ |PC: @ )")


def filter_stream(source, sink, who: str) -> None:
  """Copies ``source`` to ``sink`` (binary files), line by line, flushed, until the end of
  ``source``; a fatal absl line and what follows it (the status, the stack trace) become one
  line, ``ihsweep: <who> ended by JAX's runtime: <the status, on one line>``."""
  fatal, said = None, False  # the fatal message's lines; whether its line has been written
  for line in iter(source.readline, b""):
    if fatal is None:
      m = FATAL.match(line)
      if m is None:
        sink.write(line)
        sink.flush()
        continue
      fatal = [m.group(1)]
    elif said:
      continue  # the stack trace
    elif TRACE.match(line):
      _say(sink, who, fatal)
      said = True
    else:
      fatal.append(line)
  if fatal is not None and not said:
    _say(sink, who, fatal)


def _say(sink, who: str, lines: list[bytes]) -> None:
  text = b" ".join(b" ".join(lines).split()).decode(errors="replace")
  text = text.split(" [type.googleapis.com")[0]
  sink.write(f"ihsweep: {who} ended by JAX's runtime: {text[:600]}\n".encode())
  sink.flush()


def start(who: str) -> None:
  """Routes this process's stderr (file descriptor 2: Python's and the C++ runtime's) through
  ``filter_stream`` in a process of its own that writes to the stderr this process had; it
  ignores the terminal's signals (it ends when this process has ended, at the end of its
  input). Call once, before JAX's runtime starts."""
  read, write = os.pipe()
  stderr = os.dup(2)
  sys.stderr.flush()
  subprocess.Popen(
    [sys.executable, "-I", os.path.abspath(__file__), who],
    stdin=read,
    stdout=stderr,
    stderr=subprocess.DEVNULL,
    close_fds=True,
    start_new_session=True,  # Ctrl-C and the launcher's signals are this process's to act on
  )
  for fd in (read, stderr):
    os.close(fd)
  os.dup2(write, 2)
  os.close(write)


if __name__ == "__main__":
  filter_stream(sys.stdin.buffer, sys.stdout.buffer, sys.argv[1])
