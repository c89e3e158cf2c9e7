"""What a run directory holds: each group's directory and ``status.json``, the saved steps a run
resumes from, ``cells.csv`` (one row per model, rebuilt from the groups' configs when lost), and
the JSONL logs' reader. Which directories ihsweep may write, and their lock: ``ownership``."""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from typing import Callable

import numpy as np

from ihsweep.base.atomic import atomic_file, atomic_write_json, rewrite_when_free

STATES = ("pending", "running", "done", "failed", "interrupted")


"""The file ``claim_workdir`` writes into a run directory it creates or adopts: JSON ``kind``
(``train`` or ``sweep``), ``created``. Only directories that hold it — or the layout an earlier
ihsweep left (``run_kind``), or nothing at all — are ever written to."""


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
  """(Re)writes ``workdir/cells.csv`` from the plan and the groups' status files, atomically;
  workers finishing groups at the same time never wait on each other for it
  (``atomic.rewrite_when_free``: whoever holds ``.cells.lock`` rewrites it once more for a
  worker that found it held)."""
  path = os.path.join(workdir, "cells.csv")

  def write() -> None:
    with atomic_file(path) as f:
      cells_table(plan, workdir).to_csv(f, index=False)

  rewrite_when_free(os.path.join(workdir, ".cells.lock"), write)
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
  from ihsweep.configuration import axes as axes_lib
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
      values = tuple(axes_lib.get_field(cfg, grid_lib.VALUE_FIELDS[axis]) or ())
    except KeyError:  # not a per-model field, or a config without it
      values = ()
    cells[axis] = list(values) if len(values) == n else axes_lib.get_field(cfg, axis)
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
