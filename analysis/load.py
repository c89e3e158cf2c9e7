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

Partial input is skipped with a warning (``Run.warnings``), never a crash: a group directory that
is missing or whose config is unreadable, a group that has not started. A directory that is not a
run raises ``NotARun``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger("analysis")

# cells.csv columns that are not grid axes (ihsweep.sweep.cells_table).
CELL_COLUMNS = ("cell", "group", "seed", "batch_size", "context_size", "peak_lr", "n_params",
                "law_updates", "law_tokens", "budget_updates", "budget_tokens", "status",
                "steps_done", "diverged", "diverged_step", "online_crossing_step")
SINGLE_RUN_GROUP = "run"


class GroupError(ValueError):
  """A group whose files cannot be used (damaged probes, a config that does not match its
  checkpoints); the analysis skips it with a warning."""


class NotARun(ValueError):
  """A directory that holds neither a sweep (cells.csv) nor a single run (config.json with
  checkpoints or metrics.jsonl)."""


def _read_config(path: str):
  import ml_collections
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


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
    """The group's ``ihsweep.checkpoint.RunCheckpoints``, opened read-only (None if it has no
    params checkpoints directory)."""
    from ihsweep.checkpoint import RunCheckpoints
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

  def online_metrics(self) -> pd.DataFrame:
    """The group's ``metrics.jsonl`` (online evaluations) as a DataFrame; unreadable lines (a
    write cut short) are skipped. Empty if there is none."""
    path = os.path.join(self.dir, "metrics.jsonl")
    rows = []
    if os.path.exists(path):
      with open(path) as f:
        for line in f:
          try:
            row = json.loads(line)
            if isinstance(row, dict) and int(row["step"]) >= 0 and int(row["cell"]) >= 0:
              rows.append(row)
          except (ValueError, KeyError, TypeError):
            continue
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
      raise GroupError(f"group {self.id}: {path} cannot be read ({type(e).__name__}: "
                       f"{str(e)[:160]}); move it away to have the probes made again from the "
                       f"config") from None

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


def _single_run_cells(cfg, group_dir: str) -> pd.DataFrame:
  """The cells table of an ``ihsweep train`` directory, from its config (and per-model data knobs
  from its first checkpoint's metadata when there is one)."""
  from ihsweep import train
  ids, seeds, lrs = train.cell_ids(cfg), train.model_seeds(cfg), train.peak_lrs(cfg)
  rows = [{"cell": int(ids[i]), "group": SINGLE_RUN_GROUP, "seed": int(seeds[i]),
           "batch_size": int(cfg.train.batch_size), "context_size": int(cfg.train.context_size),
           "peak_lr": float(lrs[i])} for i in range(cfg.ensemble.size)]
  cells = pd.DataFrame(rows)
  freqs, rels = tuple(cfg.data.get("frequencies", ())), tuple(cfg.data.get("reliabilities", ()))
  if cfg.data.source == "markov":
    cells["data.frequency"] = list(freqs) if freqs else cfg.data.frequency
    cells["data.reliability"] = list(rels) if rels else cfg.data.reliability
  cells["n_params"] = _n_params(cfg)
  cells["diverged"] = False
  cells["diverged_step"] = pd.array([None] * len(cells), dtype="Int64")
  return cells


def _n_params(cfg) -> int:
  from ihsweep import sweep, train
  mcfg, _ = train.model_and_train_config(cfg)
  return sweep._n_params(mcfg, int(cfg.train.context_size))


def _single_run_state(path: str, cfg) -> str:
  train_log = os.path.join(path, "train_log.jsonl")
  from ihsweep.sweep import _last_step
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
    raise NotARun(f"{path} is not a directory; give a run directory written by `ihsweep run` "
                  f"or `ihsweep train`")
  warnings: list[str] = []
  cells_path = os.path.join(path, "cells.csv")
  config_path = os.path.join(path, "config.json")
  if os.path.exists(cells_path):
    return _load_sweep(path, cells_path, config_path, warnings)
  has_run = os.path.exists(config_path) and (
      os.path.isdir(os.path.join(path, "checkpoints")) or
      os.path.exists(os.path.join(path, "metrics.jsonl")))
  if not has_run:
    raise NotARun(f"{path} is not a run directory: it has no cells.csv (a sweep, `ihsweep run`) "
                  f"and no config.json with checkpoints/ or metrics.jsonl (a run, "
                  f"`ihsweep train`)")
  try:
    cfg = _read_config(config_path)
    cells = _single_run_cells(cfg, path)
  except Exception as e:  # any damage: missing sections, wrong types, unknown fields
    raise NotARun(f"{config_path} cannot be read as an ihsweep config ({type(e).__name__}: "
                  f"{str(e)[:160]})") from None
  group = Group(SINGLE_RUN_GROUP, path, cfg, cells, _single_run_state(path, cfg))
  if group.state == "running":
    warn(warnings, "the run has not reached train.num_steps (still training, or stopped): its "
                    "curves end at its last complete checkpoint, so its cells may be censored "
                    "early")
  axes = [c for c in ("data.frequency", "data.reliability") if c in cells]
  return Run(path, "train", cfg, cells, axes, [group], warnings)


def _load_sweep(path: str, cells_path: str, config_path: str, warnings: list[str]) -> Run:
  from ihsweep import sweep
  try:
    cells = pd.read_csv(cells_path)
    missing = {"cell", "group", "seed", "batch_size", "context_size"} - set(cells)
    if missing or cells.empty:
      raise ValueError(f"no rows or missing columns {sorted(missing)}")
  except (OSError, ValueError) as e:
    raise NotARun(f"{cells_path} cannot be read as a sweep's cells table ({e}); it is written "
                  f"by `ihsweep run`") from None
  try:
    cfg = _read_config(config_path)
  except (OSError, ValueError) as e:
    cfg = None
    warn(warnings, f"{config_path} cannot be read ({e}); using the groups' own configs")
  required = ["cell", "batch_size", "context_size", "seed"]
  numeric = cells[required].apply(pd.to_numeric, errors="coerce")
  bad = numeric.isna().any(axis=1) | cells["group"].isna()
  if bad.any():
    warn(warnings, f"cells.csv rows {[int(i) + 2 for i in np.flatnonzero(bad)][:10]} (file "
                    f"lines) have missing or non-numeric {', '.join(required)} or group; "
                    f"skipped")
    cells = cells[~bad].copy()
    if cells.empty:
      raise NotARun(f"{cells_path}: no usable rows")
  for col in required:
    cells[col] = pd.to_numeric(cells[col]).astype(int)
  axes = [c for c in cells.columns if c not in CELL_COLUMNS]
  for col in ("diverged_step",):
    if col in cells:
      cells[col] = cells[col].astype("Int64")
  if "diverged" not in cells:
    cells["diverged"] = False
  groups = []
  for gid, members in cells.groupby("group", sort=True):
    gdir = sweep.group_dir(path, gid)
    status = sweep.read_status(path, gid)
    state = status["state"]
    if state == "running" and sweep._alive(status) is False:
      state = "stopped"
    if not os.path.isdir(gdir):
      listed = str(members["status"].iloc[0]) if "status" in members else "pending"
      why = (f"it has not started (no directory {gdir})" if listed == "pending" else
             f"cells.csv lists it as {listed}, but its directory {gdir} is missing")
      warn(warnings, f"group {gid} ({len(members)} cells) is skipped: {why}")
      continue
    gconfig_path = os.path.join(gdir, "config.json")
    try:
      gcfg = _read_config(gconfig_path)
      order = [int(c) for c in gcfg.ensemble.get("cell_ids", ())] or list(members["cell"])
      int(gcfg.train.batch_size), int(gcfg.train.context_size), gcfg.model, gcfg.eval
    except Exception as e:  # unreadable, or readable but not an ihsweep config
      warn(warnings, f"group {gid} is skipped: {gconfig_path} cannot be read as an ihsweep "
                      f"config ({type(e).__name__}: {str(e)[:120]})")
      continue
    if sorted(order) != sorted(int(c) for c in members["cell"]):
      warn(warnings, f"group {gid} is skipped: its config's cells {order} do not match "
                      f"cells.csv's {sorted(members['cell'])}")
      continue
    ordered = members.set_index("cell").loc[order].reset_index()
    if state in ("running", "stopped", "interrupted", "failed"):
      warn(warnings, f"group {gid} is {state}: its curves end at its last complete "
                      f"checkpoint, so its cells may be censored early")
    groups.append(Group(gid, gdir, gcfg, ordered, state))
  return Run(path, "sweep", cfg, cells, axes, groups, warnings)


def load_runs(paths: list[str]) -> list[Run]:
  """``load_run`` for each path (several run directories analysed together). A directory given
  twice is read once; runs are told apart by ``Run.name``, the directory's name, or as many
  trailing path components as make the names unique.

  Raises:
    NotARun: as ``load_run``.
  """
  unique = list(dict.fromkeys(os.path.realpath(p) for p in paths))
  if len(unique) < len(paths):
    log.warning("a run directory was given more than once; it is read once")
  runs = [load_run(p) for p in unique]
  parts = [r.dir.strip(os.sep).split(os.sep) for r in runs]
  depth = 1
  while depth < max(len(p) for p in parts) and len({"/".join(p[-depth:]) for p in parts}) < \
      len(parts):
    depth += 1
  for r, p in zip(runs, parts):
    r.name = "/".join(p[-depth:])
  return runs


def device_sharding(n_models: int):
  """A sharding that splits a leading ensemble axis of ``n_models`` over as many local devices as
  divide it (the analysis's mesh: one 'ensemble' axis, the 'data' axis of size 1)."""
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from ihsweep import sharding
  devices = jax.local_devices()
  e = max(k for k in range(1, len(devices) + 1) if n_models % k == 0)
  mesh = Mesh(np.asarray(devices[:e]).reshape(e, 1), sharding.AXES)
  return mesh, NamedSharding(mesh, P("ensemble"))
