"""The run directory: which directories ihsweep may write (a new or empty one, or a run it made)
and the lock that keeps two runs out of one.

A run directory is ihsweep's once it holds ``RUN_MARKER``; runs made before the marker existed
are recognised by their layout (``run_kind``). Nothing else is ever written to: a user's
directory is refused untouched (``claim_workdir``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time

import jax

from ihsweep import config as config_lib


RUN_MARKER = ".ihsweep-run"
"""The file ``claim_workdir`` writes into a run directory it creates or adopts: JSON ``kind``
(``train`` or ``sweep``), ``created``. Only directories that hold it — or the layout an earlier
ihsweep left (``run_kind``), or nothing at all — are ever written to."""
# Our own files (lock, marker, write probes): a directory holding only these is empty.
_OURS = (".ihsweep.lock", RUN_MARKER, ".write-test.")


def _theirs(workdir: str) -> list[str]:
  """The entries of ``workdir`` ihsweep did not write before claiming it: all but ``_OURS`` and
  a ``logs/`` of launcher logs only (``launch/local_multiprocess.sh`` appends
  ``logs/process_<k>.log`` before the processes start)."""
  names = [n for n in os.listdir(workdir) if not n.startswith(_OURS)]
  logs = os.path.join(workdir, "logs")
  if "logs" in names and os.path.isdir(logs) and all(
      re.fullmatch(r"process_\d+\.log", n) for n in os.listdir(logs)):
    names.remove("logs")
  return sorted(names)


def _ihsweep_config(workdir: str) -> bool:
  """Whether ``workdir/config.json`` is a config ihsweep resolved (its model/train/data
  sections)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      cfg = json.load(f)
  except (OSError, ValueError):
    return False
  return isinstance(cfg, dict) and {"model", "train", "data"} <= set(cfg)


def run_kind(workdir: str) -> str | None:
  """What ``workdir`` holds: ``"empty"`` (missing, or nothing but ihsweep's lock), ``"train"``
  (an ``ihsweep train`` run, or a group of a sweep), ``"sweep"`` (an ``ihsweep run`` sweep), or
  None (other files: not an ihsweep run). A run is recognised by ``RUN_MARKER``; one made
  before the marker existed by its ihsweep-resolved ``config.json`` beside ``cells.csv``
  (sweep) or ``checkpoints/`` (train); a sweep's not-yet-trained group directory
  (``SWEEP/groups/gNNN``) by its place.

  Raises:
    OSError: ``workdir`` is a file or cannot be listed.
  """
  try:
    names = _theirs(workdir)
  except FileNotFoundError:
    return "empty"
  try:
    with open(os.path.join(workdir, RUN_MARKER)) as f:
      kind = json.load(f).get("kind")
    if kind in ("train", "sweep"):
      return kind
  except (OSError, ValueError, AttributeError):
    pass
  if sweep_group(workdir):
    return "train"
  if not names:
    return "empty"
  if _ihsweep_config(workdir):
    if os.path.exists(os.path.join(workdir, "cells.csv")):
      return "sweep"
    if os.path.isdir(os.path.join(workdir, "checkpoints")):
      return "train"
  return None


def sweep_group(workdir: str) -> tuple[str, str] | None:
  """``(sweep directory, group id)`` when ``workdir`` is a group directory of a sweep
  (``SWEEP/groups/gNNN``, recognised by its place), else None.

  Raises:
    OSError: the would-be sweep directory is a file or cannot be listed.
  """
  path = os.path.abspath(workdir)
  groups = os.path.dirname(path)
  if os.path.basename(groups) == "groups" and run_kind(os.path.dirname(groups)) == "sweep":
    return os.path.dirname(groups), os.path.basename(path)
  return None


def claim_workdir(workdir: str, kind: str | None = None) -> None:
  """Checks that ``workdir`` may hold a run of ``kind`` (``train``, ``sweep``; None: either)
  and, given a kind, on process 0 creates it and writes ``RUN_MARKER``. Refuses, touching
  nothing, a directory holding anything else: nothing of the user's is overwritten or deleted.

  Raises:
    WorkdirError: a non-empty directory that is no ihsweep run, a run of the other kind, a
      group directory of a sweep (unless ``kind`` is ``train``: the sweep trains it), a
      symbolic link to nothing, or a directory that cannot be created or written.
  """
  if os.path.islink(workdir) and not os.path.exists(workdir):
    raise config_lib.WorkdirError(
        workdir, "an existing target", f"--workdir={workdir} is a symbolic link to "
        f"{os.readlink(workdir)}, which does not exist: create that directory, or give another "
        f"--workdir")
  try:
    found = run_kind(workdir)
    group = sweep_group(workdir) if kind != "train" else None  # "train": the sweep's own fit
  except OSError as e:  # a file, a path through a file, an unreadable directory
    raise config_lib.WorkdirError(workdir, f"a directory this process can read and write "
                                  f"({e.strerror or e})") from None
  if group:
    raise config_lib.WorkdirError(
        workdir, "no group directory of a sweep",
        f"--workdir={workdir} is group {group[1]} of the sweep in {group[0]}: resume it with "
        f"`ihsweep run --workdir={group[0]}`")
  if found is None or (kind and found not in ("empty", kind)):
    names = _theirs(workdir)
    what = {"train": "an `ihsweep train` run (use `ihsweep train` with it)",
            "sweep": "a sweep of `ihsweep run` (use `ihsweep run` with it)"}.get(found) or (
        f"files of its own ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) and no "
        f"ihsweep run")
    runs = {"train": "an earlier train run", "sweep": "an earlier sweep"}.get(kind, "a run")
    raise config_lib.WorkdirError(
        workdir, f"a new or empty directory, or one that holds {runs} to resume; it "
        f"holds {what}; nothing was changed: use a new --workdir")
  if kind is None or jax.process_index() != 0:
    return
  path = os.path.join(workdir, RUN_MARKER)
  try:
    os.makedirs(workdir, exist_ok=True)
    if not os.path.exists(path):
      with open(path + ".tmp", "w") as f:
        json.dump({"kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
      os.replace(path + ".tmp", path)
  except OSError as e:
    raise config_lib.WorkdirError(workdir, f"a directory this process can write "
                                  f"({e.strerror or e})") from None


@contextlib.contextmanager
def workdir_lock(workdir: str):
  """Holds an exclusive lock on ``workdir/.ihsweep.lock`` so that two runs never write one
  directory (``fcntl.flock``: released when the process ends, even by SIGKILL). In a
  multi-process run process 0 takes it for all.

  Raises:
    WorkdirError: another live process holds it.
  """
  if jax.process_index() != 0:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  f = open(os.path.join(workdir, ".ihsweep.lock"), "a+")
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    holder = f.read().strip() or "another process"
    f.close()
    raise config_lib.WorkdirError(
        workdir, f"a directory no other run is using (in use by {holder}); wait for "
        f"that run or stop it (its progress: ihsweep status)") from None
  try:
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    yield
  finally:
    f.close()
