"""Reading run directories: the cells table, each group's resolved config, checkpoints and logs.

Two kinds of run directory are understood, both written by ihsweep:

* a **sweep** (``ihsweep run``): ``DIR/cells.csv`` (one row per cell = model), ``DIR/config.json``
  and ``DIR/groups/gNNN/`` — one ensemble each, with its own ``config.json``, ``metrics.jsonl``,
  ``probes.npz``, ``status.json`` and ``checkpoints/params/<step>``;
* a **single run** (``ihsweep train``): the same per-group files at the top level, no cells.csv.
  It is read as one group named ``run`` whose cells are built from its config.

Nothing here writes into the run directory, and a run still training can be read: only complete
checkpoints are listed (orbax renames a step's directory when it is fully written), and their
temporary directories are left alone. Params are loaded lazily, one step at a time, onto the
devices present (``Group.params``): a CPU laptop reads a pod's checkpoints.

A model diverged (loss NaN/inf, frozen by the trainer) when cells.csv says so or its group's logs
do (``logged_divergence``: a single run's, or a group still running); ``diverged_step`` is the
update from which its metrics are masked.

Partial input is skipped with a warning (``Run.warnings``), never a crash: a group directory that
is missing or whose config is unreadable, a group that has not started. Cells that a damaged or
truncated cells.csv lacks are rebuilt from their group's config.json and status.json. A
directory that is not a run raises ``NotARun``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any

import numpy as np
import pandas as pd

from ihsweep.base.errors import IhsweepError

log = logging.getLogger("analysis")

# cells.csv columns that are not grid axes (ihsweep.runs.rundir.cells_table).
CELL_COLUMNS = (
  "cell",
  "group",
  "seed",
  "batch_size",
  "context_size",
  "peak_lr",
  "n_params",
  "law_updates",
  "law_tokens",
  "budget_updates",
  "budget_tokens",
  "status",
  "steps_done",
  "diverged",
  "diverged_step",
  "online_crossing_step",
)
SINGLE_RUN_GROUP = "run"


class GroupError(IhsweepError, ValueError):
  """A group whose files cannot be used (damaged probes, a config that does not match its
  checkpoints); the analysis skips it with a warning."""


class NotARun(IhsweepError, ValueError):
  """A directory that holds neither a sweep (cells.csv) nor a single run (config.json with
  checkpoints or metrics.jsonl)."""


@dataclasses.dataclass
class Group:
  """One ensemble (one compiled program) of a run: its directory, resolved config, cells (rows of
  the cells table in ensemble order) and state ('done', 'running', 'stopped', 'failed',
  'interrupted', 'pending'; 'done' for a single run that finished)."""

  id: str
  dir: str
  config: Any
  cells: pd.DataFrame
  state: str
  _ckpts: Any = dataclasses.field(default=None, repr=False)
  _probes: Any = dataclasses.field(default=None, repr=False)

  @property
  def n_models(self) -> int:
    return len(self.cells)

  @property
  def batch_size(self) -> int:
    return int(self.config.train.batch_size)

  @property
  def context_size(self) -> int:
    return int(self.config.train.context_size)

  def checkpoints(self):
    """The group's ``ihsweep.runs.checkpoint.RunCheckpoints``, opened read-only (None if it has no
    params checkpoints directory)."""
    from ihsweep.runs.checkpoint import RunCheckpoints

    if self._ckpts is None and os.path.isdir(os.path.join(self.dir, "checkpoints", "params")):
      self._ckpts = RunCheckpoints(os.path.join(self.dir, "checkpoints"), read_only=True)
    return self._ckpts

  def steps(self) -> list[int]:
    """Updates at which params were saved (complete checkpoints only), ascending."""
    ckpts = self.checkpoints()
    return sorted(ckpts.params_steps_saved()) if ckpts else []

  def params(self, step: int, sharding=None):
    """The ensemble's params at ``step`` (leading axis E), placed by ``sharding`` (default:
    the first local device).

    Raises:
      Exception: whatever orbax raises for a damaged checkpoint (callers skip the step).
    """
    return self.checkpoints().restore_params(step, sharding=sharding)

  def online_metrics(self, warnings: list[str] | None = None) -> pd.DataFrame:
    """The group's ``metrics.jsonl`` (online evaluations) as a DataFrame. Damaged lines (a write
    cut short: not JSON, or without a non-negative ``step`` and ``cell``) are skipped with a
    warning naming the file, their number and line numbers (recorded in ``warnings`` when
    given). Empty if there is none."""
    path = os.path.join(self.dir, "metrics.jsonl")
    rows, bad = [], []
    if os.path.exists(path):
      with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
          try:
            row = json.loads(line)
            if isinstance(row, dict) and int(row["step"]) >= 0 and int(row["cell"]) >= 0:
              rows.append(row)
              continue
          except (ValueError, KeyError, TypeError):
            pass
          if line.strip():
            bad.append(number)
    if bad:
      warn(
        warnings,
        f"{path}: {len(bad)} damaged line(s) skipped (line(s) "
        f"{', '.join(map(str, bad[:10]))}{', …' if len(bad) > 10 else ''}; a write "
        f"cut short?)",
      )
    return pd.DataFrame(rows)

  def probes(self):
    """The run's saved probes (``probes.npz``), or None if it has none (evaluation was off).

    Raises:
      GroupError: the file exists but cannot be read.
    """
    import zipfile

    from ihsweep.data import probes as probes_lib

    path = os.path.join(self.dir, "probes.npz")
    if not os.path.exists(path):
      return None
    if self._probes is not None:  # read once per analysis
      return self._probes
    try:
      self._probes = probes_lib.Probes.load(path)
      return self._probes
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
      raise GroupError(
        f"group {self.id}: {path} cannot be used ({type(e).__name__}: "
        f"{str(e)[:240]}); if it is damaged, move it away to have the probes "
        f"made again from the config"
      ) from None

  def close(self) -> None:
    if self._ckpts is not None:
      self._ckpts.close()
      self._ckpts = None


@dataclasses.dataclass
class Run:
  """A run directory: ``kind`` ('sweep' or 'train'), resolved ``config``, ``cells`` (one row per
  model: cell, group, seed, grid axes, batch_size, context_size, peak_lr, n_params, diverged,
  diverged_step, …), ``axes`` (the grid's config-field columns), readable ``groups`` and the
  ``warnings`` raised while reading."""

  dir: str
  kind: str
  config: Any
  cells: pd.DataFrame
  axes: list[str]
  groups: list[Group]
  warnings: list[str]

  name: str = ""

  def __post_init__(self):
    self.name = self.name or os.path.basename(os.path.normpath(self.dir))

  def close(self) -> None:
    for g in self.groups:
      g.close()


def warn(warnings: list[str] | None, message: str) -> None:
  """Logs ``message`` and records it for the report (when a list is given)."""
  log.warning("%s", message)
  if warnings is not None:
    warnings.append(message)


def unwritable(directory: str) -> OSError | None:
  """Creates ``directory`` and writes a probe file into it: None if that works, else the
  error (a read-only mount, a path under a file, no permission)."""
  try:
    os.makedirs(directory, exist_ok=True)
    probe = os.path.join(directory, f".write-test.{os.getpid()}")
    open(probe, "w").close()
    os.remove(probe)
    return None
  except OSError as e:
    return e


def logged_divergence(group_dir: str, cell_ids: list[int]) -> dict[int, int]:
  """The models of a group directory whose loss turned NaN/inf, from the trainer's own logs:
  cell id -> update count at divergence (``TrainState.diverged_at``).

  ``metrics.jsonl`` rows marked ``diverged`` carry the exact count (``diverged_step``). Without
  an evaluation since, ``train_log.jsonl`` tells: a model's ``loss`` is null (NaN) from the host
  call in which it diverged on, so a row of ``updates`` k ending at ``step`` S places the
  divergence in [S - k, S); S - k, the earliest, is taken for a model no evaluation marked.
  ``cell_ids``: the group's cells in ensemble order (that of ``train_log.jsonl``'s lists).
  """
  found: dict[int, int] = {}  # exact, from evaluations
  bounds: dict[int, int] = {}  # from the training log
  from ihsweep.runs.rundir import read_jsonl

  for row in read_jsonl(os.path.join(group_dir, "metrics.jsonl")):
    try:
      if row.get("diverged") is True:
        cell, step = int(row["cell"]), int(row["diverged_step"])
        found[cell] = min(step, found.get(cell, step))
    except (KeyError, TypeError, ValueError):
      continue
  for row in read_jsonl(os.path.join(group_dir, "train_log.jsonl")):
    try:
      losses = row["loss"] if isinstance(row["loss"], list) else [row["loss"]]
      start = int(row["step"]) - int(row["updates"])
    except (KeyError, TypeError, ValueError):
      continue
    if len(losses) != len(cell_ids):
      continue
    for cell, loss in zip(cell_ids, losses):
      if loss is None or not np.isfinite(float(loss)):
        bounds[int(cell)] = min(start, bounds.get(int(cell), start))
  return {**bounds, **found}


def _mark_divergence(cells: pd.DataFrame, group_dir: str, members: list[int]) -> None:
  """Marks (in place) the rows of ``cells`` of the group's ``members`` (ensemble order) that its
  logs show diverged (``logged_divergence``); a step the row has already (a sweep's status,
  exact) is kept."""
  for cell, step in logged_divergence(group_dir, members).items():
    at = (cells["cell"] == cell).to_numpy()
    cells.loc[at, "diverged"] = True
    cells.loc[at & cells["diverged_step"].isna().to_numpy(), "diverged_step"] = step


def _single_run_state(path: str, cfg) -> str:
  train_log = os.path.join(path, "train_log.jsonl")
  from ihsweep.runs.rundir import last_step as _last_step

  step = _last_step(train_log)
  return "done" if step is not None and step >= int(cfg.train.num_steps) else "running"


def load_run(path: str) -> Run:
  """Reads one run directory (see the module docstring).

  Raises:
    NotARun: ``path`` is not a directory, or holds neither cells.csv nor a single run's
      config.json, or its cells.csv / config.json cannot be read.
  """
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise NotARun(
      f"{path} is not a directory; give a run directory written by `ihsweep run` or `ihsweep train`"
    )
  warnings: list[str] = []
  cells_path = os.path.join(path, "cells.csv")
  config_path = os.path.join(path, "config.json")
  if os.path.exists(cells_path):
    return _load_sweep(path, cells_path, config_path, warnings)
  has_run = os.path.exists(config_path) and (
    os.path.isdir(os.path.join(path, "checkpoints"))
    or os.path.exists(os.path.join(path, "metrics.jsonl"))
  )
  if not has_run:
    raise NotARun(
      f"{path} is not a run directory: it has no cells.csv (a sweep, `ihsweep run`) "
      f"and no config.json with checkpoints/ or metrics.jsonl (a run, "
      f"`ihsweep train`)"
    )
  from ihsweep.runs import rundir

  try:
    cfg = rundir.read_config_json(config_path)
    axes = ["data.frequency", "data.reliability"] if cfg.data.source == "markov" else []
    cells = rundir.config_cells(cfg, SINGLE_RUN_GROUP, axes)
  except Exception as e:  # any damage: missing sections, wrong types, unknown fields
    raise NotARun(
      f"{config_path} cannot be read as an ihsweep config ({type(e).__name__}: {str(e)[:160]})"
    ) from None
  _mark_divergence(cells, path, list(cells["cell"]))
  group = Group(SINGLE_RUN_GROUP, path, cfg, cells, _single_run_state(path, cfg))
  if group.state == "running":
    warn(
      warnings,
      "the run has not reached train.num_steps (still training, or stopped): its "
      "curves end at its last complete checkpoint, so its cells may be censored "
      "early",
    )
  return Run(path, "train", cfg, cells, axes, [group], warnings)


def _load_sweep(path: str, cells_path: str, config_path: str, warnings: list[str]) -> Run:
  from ihsweep.configuration import axes as axes_lib
  from ihsweep.runs import claims, rundir

  try:
    cfg = rundir.read_config_json(config_path)
  except (OSError, ValueError) as e:
    cfg = None
    warn(warnings, f"{config_path} cannot be read ({e}); using the groups' own configs")
  note = functools.partial(warn, warnings)
  cells, why = rundir.read_cells(cells_path, note)
  if cells is None:
    if not os.path.isdir(os.path.join(path, "groups")):
      raise NotARun(
        f"{cells_path} cannot be read as a sweep's cells table ({why}); it is "
        f"written by `ihsweep run`"
      )
    warn(warnings, f"{cells_path} cannot be read as a sweep's cells table ({why})")
    cells = pd.DataFrame({c: pd.Series(dtype=int) for c in rundir.REQUIRED_CELL_COLUMNS})
    cells["group"] = pd.Series(dtype=object)
    try:
      axes = axes_lib.grid_points(cfg)[0] if cfg is not None and "sweep" in cfg else []
    except Exception:  # a damaged sweep section: the cells get no axis columns
      axes = []
  else:
    axes = [c for c in cells.columns if c not in CELL_COLUMNS]
  cells = rundir.recover_cells(path, cells, axes, note)
  if cells.empty:
    raise NotARun(f"{cells_path}: no usable rows, and no group directory to rebuild them from")
  cells["diverged"] = cells.get("diverged", pd.Series(False, index=cells.index)).map(
    lambda v: str(v).strip().lower() in ("true", "1", "1.0")
  )
  cells["diverged_step"] = cells.get(
    "diverged_step", pd.Series(None, index=cells.index, dtype=object)
  ).astype("Int64")
  groups = []
  for gid in sorted(cells["group"].unique()):
    members = cells[cells["group"] == gid]
    gdir = rundir.group_dir(path, gid)
    status = rundir.read_status(path, gid)
    state = claims.group_state(path, gid, status)
    if not os.path.isdir(gdir):
      listed = str(members["status"].iloc[0]) if "status" in members else "pending"
      why = (
        f"it has not started (no directory {gdir})"
        if listed == "pending"
        else f"cells.csv lists it as {listed}, but its directory {gdir} is missing"
      )
      warn(warnings, f"group {gid} ({len(members)} cells) is skipped: {why}")
      continue
    gconfig_path = os.path.join(gdir, "config.json")
    try:
      gcfg = rundir.read_config_json(gconfig_path)
      order = [int(c) for c in gcfg.ensemble.get("cell_ids", ())] or list(members["cell"])
      int(gcfg.train.batch_size), int(gcfg.train.context_size), gcfg.model, gcfg.eval
    except Exception as e:  # unreadable, or readable but not an ihsweep config
      warn(
        warnings,
        f"group {gid} is skipped: {gconfig_path} cannot be read as an ihsweep "
        f"config ({type(e).__name__}: {str(e)[:120]})",
      )
      continue
    if sorted(order) != sorted(int(c) for c in members["cell"]):
      warn(
        warnings,
        f"group {gid} is skipped: its config's cells {order} do not match "
        f"cells.csv's {sorted(members['cell'])}",
      )
      continue
    _mark_divergence(cells, gdir, order)  # e.g. a group still running: not in its status yet
    ordered = cells[cells["group"] == gid].set_index("cell").loc[order].reset_index()
    if state in ("running", "stopped", "interrupted", "failed"):
      warn(
        warnings,
        f"group {gid} is {state}: its curves end at its last complete "
        f"checkpoint, so its cells may be censored early",
      )
    groups.append(Group(gid, gdir, gcfg, ordered, state))
  return Run(path, "sweep", cfg, cells, axes, groups, warnings)


def dir_identity(path: str) -> tuple[int, int] | None:
  """A directory's identity (device, inode): the same for every path that reaches it (symbolic
  links, bind mounts, ``..``). None if it does not exist."""
  try:
    st = os.stat(path)
    return st.st_dev, st.st_ino
  except OSError:
    return None


def load_runs(paths: list[str]) -> list[Run]:
  """``load_run`` for each path (several run directories analysed together). A directory given
  twice is read once, and so is a sweep's group directory given beside its sweep (its cells are
  the sweep's; a warning says so). Runs are told apart by ``Run.name``, the directory's name, or
  as many trailing path components as make the names unique.

  Raises:
    NotARun: as ``load_run``; or two of the directories are copies of one run
      (``ownership.run_identity``), whose models would be counted twice.
  """
  from ihsweep.runs import ownership, rundir

  seen, unique = set(), []
  for p in paths:
    key = dir_identity(p) or os.path.realpath(p)
    if key not in seen:
      seen.add(key)
      unique.append(os.path.realpath(p))
  if len(unique) < len(paths):
    log.warning("a run directory was given more than once; it is read once")
  copies = {}  # run identity -> the first directory that has it
  for p in unique:
    ident = ownership.run_identity(p)
    if ident is None:
      continue
    if ident in copies:
      raise NotARun(
        f"{p} and {copies[ident]} are copies of one run (the same run id): their models would "
        f"be counted twice; give one of them"
      )
    copies[ident] = p
  runs = [load_run(p) for p in unique]
  group_dirs = {}  # a sweep's group directories -> (sweep, group id)
  for r in runs:
    if r.kind == "sweep":
      for gid in r.cells["group"].unique():
        key = dir_identity(rundir.group_dir(r.dir, gid))
        if key is not None:
          group_dirs[key] = (r, gid)
  kept = []
  for r in runs:
    owner = group_dirs.get(dir_identity(r.dir)) if r.kind == "train" else None
    if owner is None:
      kept.append(r)
      continue
    sweep_run, gid = owner
    warn(
      sweep_run.warnings,
      f"{r.dir} was given as well, but it is this sweep's group {gid}: "
      f"its {len(r.cells)} cells are counted once, as the sweep's",
    )
    r.close()
  runs = kept
  parts = [r.dir.strip(os.sep).split(os.sep) for r in runs]
  depth = 1
  while depth < max(len(p) for p in parts) and len({"/".join(p[-depth:]) for p in parts}) < len(
    parts
  ):
    depth += 1
  for r, p in zip(runs, parts):
    r.name = "/".join(p[-depth:])
  return runs


def device_sharding(n_models: int):
  """A sharding that splits a leading ensemble axis of ``n_models`` over as many local devices as
  divide it (the analysis's mesh: one 'ensemble' axis, the 'data' axis of size 1)."""
  import jax
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from ihsweep.base import sharding

  devices = jax.local_devices()
  e = max(k for k in range(1, len(devices) + 1) if n_models % k == 0)
  mesh = Mesh(np.asarray(devices[:e]).reshape(e, 1), sharding.AXES)
  return mesh, NamedSharding(mesh, P("ensemble"))
