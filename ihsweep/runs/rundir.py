"""The run directory: which directories ihsweep may write (a new or empty one, or a run it made)
and the lock that keeps two runs out of one.

A run directory is ihsweep's once it holds ``RUN_MARKER``; runs made before the marker existed
are recognised by their layout (``run_kind``). Nothing else is ever written to: a user's
directory is refused untouched (``claim_workdir``).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from typing import Callable

import numpy as np

from ihsweep.base.atomic import LOCK_FILE, atomic_file, atomic_write_json, lock_text
from ihsweep.configuration import fields

STATES = ("pending", "running", "done", "failed", "interrupted")


RUN_MARKER = ".ihsweep-run"
"""The file ``claim_workdir`` writes into a run directory it creates or adopts: JSON ``kind``
(``train`` or ``sweep``), ``created``. Only directories that hold it — or the layout an earlier
ihsweep left (``run_kind``), or nothing at all — are ever written to."""
# Our own files (lock, marker, write probes): a directory holding only these is empty.
_OURS = (".ihsweep.lock", RUN_MARKER, ".write-test.")


def _process_index() -> int:
  """This process's index in its jax.distributed job (0 alone). JAX is imported here, not at
  module level: ``ihsweep status`` reads run directories without it."""
  import jax

  return jax.process_index()


def _theirs(workdir: str) -> list[str]:
  """The entries of ``workdir`` ihsweep did not write before claiming it: all but ``_OURS`` and
  a ``logs/`` of launcher logs only (``launch/local_multiprocess.sh`` appends
  ``logs/process_<k>.log`` or ``logs/worker_<k>.log`` before the processes start)."""
  names = [n for n in os.listdir(workdir) if not n.startswith(_OURS)]
  logs = os.path.join(workdir, "logs")
  if (
    "logs" in names
    and os.path.isdir(logs)
    and all(re.fullmatch(r"(process|worker)_\d+\.log", n) for n in os.listdir(logs))
  ):
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
  marked = _marker_kind(workdir)
  if marked:
    return marked
  if sweep_group(workdir):
    return "train"
  if not names:
    return "empty"
  return _layout_kind(workdir)


def _marker_kind(path: str) -> str | None:
  """The ``kind`` in ``path``'s ``RUN_MARKER`` (``train`` or ``sweep``); None without one."""
  try:
    with open(os.path.join(path, RUN_MARKER)) as f:
      kind = json.load(f).get("kind")
    return kind if kind in ("train", "sweep") else None
  except (OSError, ValueError, AttributeError):
    return None


def run_identity(path: str) -> str | None:
  """What stays the same when a run directory is copied (``cp -a``, rsync) and differs between
  two runs: the ``run_id`` its ``RUN_MARKER`` holds (a random id written when the run was
  created), else, for a run made before ids, the marker's creation time with the resolved
  ``config.json``. None when there is no marker."""
  try:
    with open(os.path.join(path, RUN_MARKER)) as f:
      marker = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(marker, dict):
    return None
  if marker.get("run_id"):
    return str(marker["run_id"])
  try:
    with open(os.path.join(path, "config.json"), "rb") as f:
      config = hashlib.sha256(f.read()).hexdigest()
  except OSError:
    return None
  return f"{marker.get('created')}|{config}"


def _layout_kind(path: str) -> str | None:
  """``sweep`` or ``train`` by the layout a run made before the marker existed leaves: an
  ihsweep-resolved ``config.json`` beside ``cells.csv`` or ``checkpoints/``; else None."""
  if _ihsweep_config(path):
    if os.path.exists(os.path.join(path, "cells.csv")):
      return "sweep"
    if os.path.isdir(os.path.join(path, "checkpoints")):
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


def enclosing_run(workdir: str) -> tuple[str, str] | None:
  """``(run directory, kind)`` of the nearest ihsweep run that holds ``workdir`` below it, else
  None. A sweep's own group directories (``SWEEP/groups/gNNN``, which the sweep creates and
  trains) do not count as inside it. Both the path as given and with symbolic links resolved
  are checked, so a link into a run is found too."""
  for path in dict.fromkeys((os.path.abspath(workdir), os.path.realpath(workdir))):
    child, parent = path, os.path.dirname(path)
    while parent != child:  # up to the root, whose dirname is itself
      kind = _marker_kind(parent) or _layout_kind(parent)
      if kind is not None:
        rel = os.path.relpath(path, parent).split(os.sep)
        own_group = (
          kind == "sweep" and len(rel) == 2 and rel[0] == "groups" and re.fullmatch(r"g\d+", rel[1])
        )
        if not own_group:
          return parent, kind
      child, parent = parent, os.path.dirname(parent)
  return None


def claim_workdir(workdir: str, kind: str | None = None, local: bool = False) -> None:
  """Checks that ``workdir`` may hold a run of ``kind`` (``train``, ``sweep``; None: either)
  and, given a kind, on process 0 (on this process with ``local``: a worker's process-local
  group) creates it and writes ``RUN_MARKER``. Refuses, touching
  nothing, a directory holding anything else: nothing of the user's is overwritten or deleted.

  Raises:
    WorkdirError: a non-empty directory that is no ihsweep run, a run of the other kind, a
      group directory of a sweep (unless ``kind`` is ``train``: the sweep trains it), a
      directory anywhere inside another run (``enclosing_run``: that run would later read or
      delete what is written there, e.g. its old full-state checkpoints), a symbolic link to
      nothing, or a directory that cannot be created or written.
  """
  outer = enclosing_run(workdir)
  if outer is not None:
    what = {"sweep": "an `ihsweep run` sweep", "train": "an `ihsweep train` run"}[outer[1]]
    raise fields.WorkdirError(
      workdir,
      "a directory outside every run directory",
      f"--workdir={workdir} is inside {outer[0]}, the run directory of {what}: that run reads "
      f"and deletes what it finds under its own directory; nothing was changed: give a "
      f"--workdir outside {outer[0]}",
    )
  if os.path.islink(workdir) and not os.path.exists(workdir):
    raise fields.WorkdirError(
      workdir,
      "an existing target",
      f"--workdir={workdir} is a symbolic link to "
      f"{os.readlink(workdir)}, which does not exist: create that directory, or give another "
      f"--workdir",
    )
  try:
    found = run_kind(workdir)
    # "train": the sweep's own fit. The path with links resolved too: a link to a sweep's
    # groups/ directory is that sweep's group all the same.
    group = (
      (sweep_group(workdir) or sweep_group(os.path.realpath(workdir))) if kind != "train" else None
    )
  except OSError as e:  # a file, a path through a file, an unreadable directory
    raise fields.WorkdirError(
      workdir, f"a directory this process can read and write ({e.strerror or e})"
    ) from None
  if group:
    raise fields.WorkdirError(
      workdir,
      "no group directory of a sweep",
      f"--workdir={workdir} is group {group[1]} of the sweep in {group[0]}: resume it with "
      f"`ihsweep run --workdir={group[0]}`",
    )
  if found is None or (kind and found not in ("empty", kind)):
    names = _theirs(workdir)
    what = {
      "train": "an `ihsweep train` run (use `ihsweep train` with it)",
      "sweep": "a sweep of `ihsweep run` (use `ihsweep run` with it)",
    }.get(found) or (
      f"files of its own ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) and no "
      f"ihsweep run"
    )
    runs = {"train": "an earlier train run", "sweep": "an earlier sweep"}.get(kind, "a run")
    raise fields.WorkdirError(
      workdir,
      f"a new or empty directory, or one that holds {runs} to resume; it "
      f"holds {what}; nothing was changed: use a new --workdir",
    )
  if kind is None or (_process_index() != 0 and not local):
    return
  path = os.path.join(workdir, RUN_MARKER)
  try:
    os.makedirs(workdir, exist_ok=True)
    if not os.path.exists(path):
      marker = {
        "kind": kind,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_id": uuid.uuid4().hex,  # run_identity: tells a copy of this run from another run
      }
      atomic_write_json(path, marker, indent=None)
  except OSError as e:
    raise fields.WorkdirError(
      workdir, f"a directory this process can write ({e.strerror or e})"
    ) from None


@contextlib.contextmanager
def workdir_lock(workdir: str, local: bool = False):
  """Holds an exclusive lock on ``workdir/.ihsweep.lock`` so that two runs never write one
  directory (``fcntl.flock``: released when the process ends, even by SIGKILL). In a
  multi-process run process 0 takes it for all (this process with ``local``: a worker's
  process-local group). Tries for a quarter of a second before giving up: another worker's
  ``atomic.lock_holder`` probe holds it for an instant.

  Raises:
    WorkdirError: another live process holds it.
  """
  if _process_index() != 0 and not local:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  f = open(os.path.join(workdir, LOCK_FILE), "a+")
  for attempt in range(6):
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      break
    except BlockingIOError:
      if attempt < 5:
        time.sleep(0.05)
        continue
      f.seek(0)
      holder = f.read().strip() or "another process"
      f.close()
      raise fields.WorkdirError(
        workdir,
        f"a directory no other run is using (in use by {holder}); wait for "
        f"that run or stop it (its progress: ihsweep status)",
      ) from None
  try:
    f.seek(0)
    f.truncate()
    f.write(f"{lock_text()}\n")
    f.flush()
    yield
  finally:
    f.close()


# ----------------------------------------------------------------------------------------------
# A sweep's files: group status files, cells.csv, atomic writes.


def group_dir(workdir: str, group_id: str) -> str:
  return os.path.join(workdir, "groups", group_id)


def read_status(workdir: str, group_id: str) -> dict:
  """A group's ``status.json`` (``{"state": "pending"}`` when there is none or it is
  unreadable). A ``done`` is believed only with the evidence a finished group leaves
  (``unfinished``); without it the group reads ``pending`` with ``unverified`` saying why, so a
  rerun resumes it from its checkpoints (or trains it), and a warning names it once."""
  path = os.path.join(group_dir(workdir, group_id), "status.json")
  if not os.path.exists(path):
    return {"state": "pending"}
  try:
    with open(path) as f:
      status = json.load(f)
    if isinstance(status, dict) and status.get("state") in STATES:
      why = unfinished(group_dir(workdir, group_id), status) if status["state"] == "done" else None
      if why is None:
        return status
      if path not in _warned_unverified:
        _warned_unverified.add(path)
        logging.getLogger("ihsweep").warning(
          "group %s: status.json says done, but %s: not counted as done; a rerun resumes or "
          "trains it",
          group_id,
          why,
        )
      return {"state": "pending", "unverified": why, "attempts": status.get("attempts", 0)}
  except (OSError, ValueError):
    pass
  # Damaged (e.g. cut by a full disk): the group is treated as not done, so a rerun resumes it
  # from its checkpoints.
  return {"state": "pending", "unreadable": True}


_warned_unverified: set[str] = set()


def saved_steps(directory: str) -> list[int]:
  """The steps of the complete checkpoints in an orbax step directory (``…/checkpoints/state``):
  its subdirectories named by a number alone (orbax writes ``<step>.orbax-checkpoint-tmp-…``
  and renames it when complete) that hold orbax's ``_CHECKPOINT_METADATA``, ascending; [] if
  there is none."""
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  meta = lambda n: os.path.join(directory, n, "_CHECKPOINT_METADATA")
  return sorted(int(n) for n in names if n.isdigit() and os.path.isfile(meta(n)))


def unfinished(gdir: str, status: dict) -> str | None:
  """Why the group in ``gdir`` whose ``status`` says done is not shown to be finished; None when
  it is. A finished group (``runner.fit`` to its last update, or an early stop) leaves its final
  ``step`` (at least ``num_steps`` unless ``stopped_early``) as the last row of
  ``train_log.jsonl`` and as a full-state checkpoint (an early stop also as a params one)."""
  step, budget = status.get("step"), status.get("num_steps")
  if not isinstance(step, int) or isinstance(step, bool):
    return "it names no final update"
  if isinstance(budget, int) and step < budget and not status.get("stopped_early"):
    return f"its update {step:,} is short of its {budget:,} and it did not stop early"
  if step not in saved_steps(os.path.join(gdir, "checkpoints", "state")):
    return f"there is no full-state checkpoint at its update {step:,}"
  if status.get("stopped_early") and step not in saved_steps(
    os.path.join(gdir, "checkpoints", "params")
  ):
    return f"it stopped early without the params checkpoint an early stop saves at {step:,}"
  logged = last_step(os.path.join(gdir, "train_log.jsonl"))
  if logged != step:
    ends = "has no rows" if logged is None else f"ends at update {logged:,}"
    return f"its train_log.jsonl {ends}, not at its update {step:,}"
  return None


def write_status(workdir: str, group_id: str, **fields) -> dict:
  """Replaces a group's ``status.json`` atomically (``state`` plus ``fields``)."""
  path = os.path.join(group_dir(workdir, group_id), "status.json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  status = {
    "group": group_id,
    **fields,
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }
  atomic_write_json(path, status)
  return status


def cells_table(plan, workdir: str | None = None):
  """cells.csv as a pandas DataFrame: ``cell``, ``group``, ``seed``, one column per grid axis
  (its field path), ``batch_size``, ``context_size``, ``peak_lr``, ``n_params``, the law's
  predicted emergence ``law_updates``/``law_tokens``, ``budget_updates``/``budget_tokens``,
  and (from the groups' status files when ``workdir`` is given) ``status``, ``steps_done``,
  ``diverged``, ``diverged_step`` and, under the 'emergence' budget, ``online_crossing_step``
  (the first online evaluation at which ``sweep.stop_metric`` reached ``sweep.stop_threshold``:
  a coarse marker; the analysis package fits emergence points from the checkpoints)."""
  import pandas as pd

  rows = []
  for group in plan.groups:
    status = read_status(workdir, group.id) if workdir else {"state": "pending"}
    diverged = status.get("diverged", {})
    b, c = int(group.cfg.train.batch_size), int(group.cfg.train.context_size)
    for cell in group.cells:
      row = {"cell": cell.id, "group": group.id, "seed": cell.seed}
      row.update({axis: cell.coords[axis] for axis in plan.axes})
      row.update(
        {
          "batch_size": b,
          "context_size": c,
          "peak_lr": float(cell.cfg.train.lr),
          "n_params": group.n_params,
          "law_updates": round(group.law_updates, 1),
          "law_tokens": round(group.law_updates * b * c),
          "budget_updates": group.num_steps,
          "budget_tokens": group.num_steps * b * c,
          "status": status["state"],
          "steps_done": status.get("step", 0),
          "diverged": str(cell.id) in diverged,
          "diverged_step": diverged.get(str(cell.id)),
          "online_crossing_step": status.get("crossed", {}).get(str(cell.id)),
        }
      )
      rows.append(row)
  table = pd.DataFrame(rows).sort_values("cell").reset_index(drop=True)
  for col in ("diverged_step", "online_crossing_step"):  # integers with gaps, not floats
    table[col] = table[col].astype("Int64")
  return table


def write_cells(plan, workdir: str) -> str:
  """(Re)writes ``workdir/cells.csv`` from the plan and the groups' status files, atomically and
  under a lock (processes finishing groups may refresh it at the same time)."""
  path = os.path.join(workdir, "cells.csv")
  with open(os.path.join(workdir, ".cells.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    with atomic_file(path) as f:
      cells_table(plan, workdir).to_csv(f, index=False)
  return path


# cells.csv columns every usable row needs (besides ``group``).
REQUIRED_CELL_COLUMNS = ("cell", "batch_size", "context_size", "seed")


def read_config_json(path: str):
  """A resolved config written as JSON (``config.json``) as a ConfigDict.

  Raises:
    OSError / ValueError: unreadable, or not JSON.
  """
  import ml_collections

  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def read_cells(path: str, note: Callable[[str], None]):
  """cells.csv's usable rows as a DataFrame, and '' — or (None, why) if the file cannot be read
  as a cells table. Rows with a missing or non-numeric id, B, C, seed or group are dropped,
  and so is a last line without its newline (a write cut short: its last value may be cut
  too); ``note`` is called with one line saying which."""
  import pandas as pd

  try:
    with open(path, "rb") as f:
      size = f.seek(0, os.SEEK_END)
      f.seek(max(0, size - 1))
      cut = size > 0 and f.read(1) != b"\n"
    cells = pd.read_csv(path)
  except (OSError, ValueError) as e:
    return None, str(e)
  missing = {*REQUIRED_CELL_COLUMNS, "group"} - set(cells)
  if missing:
    return None, f"missing columns {sorted(missing)}"
  required = list(REQUIRED_CELL_COLUMNS)
  numeric = cells[required].apply(pd.to_numeric, errors="coerce")
  bad = numeric.isna().any(axis=1) | cells["group"].isna()
  if cut and len(cells):
    bad.iloc[-1] = True
  if bad.any():
    note(
      f"cells.csv rows {[int(i) + 2 for i in np.flatnonzero(bad)][:10]} (file lines) are "
      f"cut short or have missing or non-numeric {', '.join(required)} or group; skipped"
    )
    cells = cells[~bad].copy()
  for col in required:
    cells[col] = pd.to_numeric(cells[col]).astype(int)
  return cells, ""


def config_cells(cfg, group_id: str, axes=()):
  """The cells (rows in ensemble order) of one group, from its resolved config: ids, seeds, peak
  learning rates, B, C, n_params and the value of each grid axis in ``axes`` (a per-model value
  where the config holds one: ``VALUE_FIELDS``). Also the cells table of an ``ihsweep train``
  directory, and the rows a truncated cells.csv lost.

  Raises:
    Exception: a config that is not an ihsweep config (missing sections, wrong types).
  """
  import pandas as pd

  from ihsweep.compute import train
  from ihsweep.configuration import grid as grid_lib

  ids, seeds, lrs = train.cell_ids(cfg), train.model_seeds(cfg), train.peak_lrs(cfg)
  n = int(cfg.ensemble.size)
  rows = [
    {
      "cell": int(ids[i]),
      "group": group_id,
      "seed": int(seeds[i]),
      "batch_size": int(cfg.train.batch_size),
      "context_size": int(cfg.train.context_size),
      "peak_lr": float(lrs[i]),
    }
    for i in range(n)
  ]
  cells = pd.DataFrame(rows)
  for axis in axes:
    try:
      values = tuple(grid_lib.get_field(cfg, grid_lib.VALUE_FIELDS[axis]) or ())
    except KeyError:  # not a per-model field, or a config without it
      values = ()
    cells[axis] = list(values) if len(values) == n else grid_lib.get_field(cfg, axis)
  mcfg, _ = train.model_and_train_config(cfg)
  cells["n_params"] = grid_lib.n_params(mcfg, int(cfg.train.context_size))
  cells["diverged"] = False
  cells["diverged_step"] = pd.array([None] * len(cells), dtype="Int64")
  return cells


def recover_cells(workdir: str, cells, axes, note: Callable[[str], None]):
  """``cells`` plus rows for the cells of groups whose directories exist
  (``groups/*/config.json``) but which cells.csv lacks (a truncated or damaged cells.csv),
  rebuilt from each group's config.json (ids, seeds, B, C, learning rates, budget, grid axes)
  and status.json (state, steps, divergence); sorted by cell. ``note`` is called with one line
  per group that cannot be rebuilt and one naming the rebuilt cells."""
  import pandas as pd

  root = os.path.join(workdir, "groups")
  names = sorted(os.listdir(root)) if os.path.isdir(root) else []
  listed = set(int(c) for c in cells["cell"])
  found = []
  for gid in names:
    gdir = group_dir(workdir, gid)
    if not os.path.isdir(gdir):
      continue
    try:
      gcfg = read_config_json(os.path.join(gdir, "config.json"))
      if cells.loc[cells["group"] == gid, "cell"].nunique() >= int(gcfg.ensemble.size):
        continue  # every cell listed: nothing to rebuild (and no JAX to import for it)
      rows = config_cells(gcfg, gid, axes).assign(budget_updates=int(gcfg.train.num_steps))
    except Exception as e:  # no config, or not an ihsweep one
      if gid not in set(cells["group"]):
        note(
          f"group {gid} is skipped: cells.csv has no rows for it, and its config.json "
          f"cannot be read to rebuild them ({type(e).__name__}: {str(e)[:100]})"
        )
      continue
    rows = rows[~rows["cell"].isin(listed)].copy()
    if rows.empty:
      continue
    status = read_status(workdir, gid)
    diverged = status.get("diverged", {}) if isinstance(status.get("diverged"), dict) else {}
    rows["status"], rows["steps_done"] = status["state"], status.get("step", 0)
    rows["diverged"] = [str(c) in diverged for c in rows["cell"]]
    rows["diverged_step"] = pd.array([diverged.get(str(c)) for c in rows["cell"]], dtype="Int64")
    found.append(rows)
  if found:
    new = pd.concat(found, ignore_index=True)
    note(
      f"cells.csv lacks {len(new)} cell(s) of group(s) {', '.join(new['group'].unique())} "
      f"whose directories exist (cut short?); their rows are rebuilt from each group's "
      f"config.json and status.json"
    )
    cells = pd.concat([cells, new], ignore_index=True).sort_values("cell", kind="stable")
  return cells.reset_index(drop=True)


def check_workdir(workdir: str, kind: str | None = None) -> None:
  """Checks that ``workdir`` is new, empty or an ihsweep run to resume — of ``kind`` (``sweep``,
  ``train``) if given, which then marks it as one (``rundir.claim_workdir``); anything else is
  refused untouched — then creates it and checks that files can be written in it.

  Raises:
    WorkdirError: when it holds files that are no ihsweep run (of ``kind``) or is not a
      writable directory.
  """
  claim_workdir(workdir, kind)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write-test.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise fields.WorkdirError(
      workdir, f"a directory this process can write ({e.strerror or e})"
    ) from None


def read_jsonl(path: str, warn: bool = False) -> list[dict]:
  """The JSON objects of a JSONL log (``metrics.jsonl``, ``train_log.jsonl``), in order; [] if
  the file is missing or cannot be read. A line that is not a JSON object (cut short by a kill,
  or damaged) is skipped, with a warning naming the file if ``warn``."""
  rows = []
  try:
    with open(path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except ValueError:
          row = None
        if isinstance(row, dict):
          rows.append(row)
        elif warn:
          logging.getLogger("ihsweep").warning("skipping an unreadable line in %s", path)
  except OSError:
    pass
  return rows


def last_step(path: str) -> int | None:
  """The ``step`` of the last readable line of a JSONL log (None if none)."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 65536))
      lines = f.read().decode(errors="replace").splitlines()
  except OSError:
    return None
  for line in reversed(lines):
    try:
      return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      continue
  return None
