"""What the console shows of a training run: its speed after start-up (``Throughput``) and log
lines written above the progress bars (``logs_above_bars``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time

from tqdm.auto import tqdm


def _progress_clock() -> float:
  """Seconds on a monotonic clock: the training speed the progress shows (a test replaces it)."""
  return time.monotonic()


@dataclasses.dataclass
class Throughput:
  """Training speed after start-up, as the progress bar shows it: the updates and tokens (all
  E models) of the host calls after the first, over the seconds (``_progress_clock``) since
  the first call had finished running. Start-up — building, restoring, compiling, the first
  evaluation and the first call — is outside it; the evaluations and checkpoints between calls
  are in it.

  ``add`` is called once a call's values are read, which waits for the call, so the time
  counted always covers the calls counted: a read that comes late (the host was saving a
  checkpoint while the devices ran on) delays the origin of no rate and cannot inflate one.
  A resumed run therefore shows the speed an uninterrupted one does.

  total: the run's updates (``train.num_steps``); start: the clock when the first call had
  finished (None before); step: the last update read; updates, tokens: counted since start;
  elapsed_s: seconds from start to the last read.
  """

  total: int
  start: float | None = None
  step: int = 0
  updates: int = 0
  tokens: int = 0
  elapsed_s: float = 0.0

  def begin(self, step: int) -> None:
    """The first call (ending at update ``step``) has finished: the clock starts now."""
    self.start, self.step = _progress_clock(), step

  def add(self, step: int, updates: int, tokens: int) -> None:
    """A later call's values were read: ``updates`` more, ending at update ``step``."""
    self.step = step
    self.updates += updates
    self.tokens += tokens
    self.elapsed_s = _progress_clock() - self.start

  @property
  def updates_per_s(self) -> float:
    """Updates per second (NaN before a second call was read)."""
    return self.updates / self.elapsed_s if self.updates and self.elapsed_s > 0 else math.nan

  @property
  def tokens_per_s(self) -> float:
    """Tokens per second, all models together (NaN before a second call was read)."""
    return self.tokens / self.elapsed_s if self.tokens and self.elapsed_s > 0 else math.nan

  @property
  def eta_s(self) -> float:
    """Seconds left to update ``total`` at ``updates_per_s`` (NaN while that is unknown)."""
    return (self.total - self.step) / self.updates_per_s if self.updates else math.nan

  def snapshot(self) -> dict:
    """``{"step", "updates_per_s", "tokens_per_s", "eta_s", "elapsed_s"}`` now."""
    return {
      "step": self.step,
      "updates_per_s": self.updates_per_s,
      "tokens_per_s": self.tokens_per_s,
      "eta_s": self.eta_s,
      "elapsed_s": self.elapsed_s,
    }


class _AboveBars:
  """A console stream that writes through ``tqdm.write``: each write clears the open bars,
  writes the text, and draws them again."""

  def __init__(self, stream):
    self.stream = stream

  def write(self, text: str) -> None:
    tqdm.write(text, file=self.stream, end="")

  def flush(self) -> None:
    self.stream.flush()


@contextlib.contextmanager
def logs_above_bars(on: bool = True):
  """While progress bars are drawn, the log lines that the root logger's console handlers (a
  ``StreamHandler`` on stderr or stdout, absl's included) print go through ``tqdm.write``,
  so that a line never runs into a bar's text; their format, level and filters are kept, and
  restored on exit. Handlers that write elsewhere (files, pytest's capture) are untouched;
  nothing is added where there is none. Nested uses and ``on=False`` change nothing."""
  handlers = []
  if on:
    for h in logging.getLogger().handlers:
      for handler in (h, getattr(h, "python_handler", None)):  # absl's ABSLHandler wraps one
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream in (sys.stderr, sys.stdout):
          handlers.append((handler, stream))
          handler.setStream(_AboveBars(stream))
  try:
    yield
  finally:
    for handler, stream in handlers:
      if isinstance(handler.stream, _AboveBars):
        handler.setStream(stream)
