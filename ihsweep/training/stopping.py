"""Stopping a run on request: the SIGTERM/SIGINT handler (``request_stop``), the flag the
training loop reads after each host call (``stop_requested``) and what ``fit`` raises once the
state is saved (``Interrupted``)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from ihsweep.base.errors import IhsweepError

log = logging.getLogger("ihsweep")


_STOP_REQUESTED = threading.Event()
_STOP_SIGNALS = [0]  # stop requests so far (signals and calls)


def request_stop(signum=None, frame=None) -> None:
  """Asks a running ``fit`` to checkpoint and stop after its current host call (the SIGTERM and
  SIGINT handler the CLI installs: preemption, Ctrl-C). A second request only says that the
  checkpoint is being saved (it never interrupts a save); a third exits at once with status
  128 + the signal's number (130 for SIGINT), losing the updates since the last complete
  full-state checkpoint (a rerun resumes from it)."""
  del frame
  name = signal.Signals(signum).name if signum else "request_stop"
  _STOP_SIGNALS[0] += 1
  if _STOP_SIGNALS[0] == 1:
    log.warning("stop requested (%s): checkpointing after the current call", name)
  elif _STOP_SIGNALS[0] == 2:
    log.warning(
      "already stopping: saving a checkpoint (%s once more exits at once, losing the "
      "updates since the last complete checkpoint)",
      name,
    )
  elif signum:
    print(
      f"ihsweep: forced exit on a third stop request ({name}): the updates since the last "
      f"complete full-state checkpoint are lost; rerun the same command to resume from it",
      file=sys.stderr,
      flush=True,
    )
    os._exit(128 + signum)
  _STOP_REQUESTED.set()


def stop_requested() -> bool:
  """Whether ``request_stop`` was called in this process (it stays set)."""
  return _STOP_REQUESTED.is_set()


def install_stop_handlers() -> None:
  """SIGTERM and SIGINT → ``request_stop`` (main thread only)."""
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, request_stop)


class Interrupted(IhsweepError):
  """Training stopped on request (SIGTERM) after writing a full-state checkpoint."""

  def __init__(self, workdir: str, step: int):
    self.workdir, self.step = workdir, step
    super().__init__(
      f"stopped at update {step} on request; state saved in {workdir}; rerun "
      f"the same command to resume"
    )
