"""Sweeps: a config's grid → cells → groups of equal shapes → one vmapped ensemble per group.

A **cell** is one model: a grid point (values of the config fields in ``sweep.grid`` and
``sweep.zip``) and a seed. Cells whose configs differ only in values the trainer vmaps — the
seed, ``train.lr`` and the Markov knobs ``data.frequency`` / ``data.reliability`` — form one
**group**, trained as one ensemble by one compiled program (``runner.fit``); anything else
(batch size, context size, model shape, vocabulary, schedule, …) makes a separate group.

Planning (``make_plan``) is pure host work and validates every group's config before anything
is compiled. Groups are ordered by predicted cost, most expensive first: E · updates · B · C ·
training FLOPs per token (``model.flops_per_token``), where updates is the group's budget.

Scheduling across devices and processes (the rule): every process trains every group together,
one group after another, on one global mesh over all devices (``jax.devices()`` after
``jax.distributed.initialize``); each group is therefore trained exactly once, and its
checkpoints are written jointly (orbax). The mesh's ``ensemble`` axis takes the largest divisor
of the device count that divides E, the ``data`` axis the rest, splitting each model's batch
(``sharding.mesh_shape``), so no device idles. Limits: a group of E models with batch size B can
use at most E · B devices (and only counts that factor as above); a sweep whose groups cannot use
every device is refused before compiling — use fewer processes or devices, or more seeds. A
group never runs beside another, so a sweep of many small groups on a large pod is bounded by
the per-group step time; and the run directory must be on a filesystem every process sees.

Run directory (``ihsweep run --workdir=DIR``)::

  DIR/config.json      the sweep's resolved config
  DIR/cells.csv        one row per cell (written before training; status columns refreshed)
  DIR/sweep.json       summary: per-group state, budget, compute saved by early stops
  DIR/groups/g000/     one group's run directory (runner.fit) + status.json
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import fcntl
import itertools
import json
import logging
import math
import os
import socket
import traceback
from typing import Any, Callable

import numpy as np

from ihsweep import config as config_lib
from ihsweep.config import ConfigError

log = logging.getLogger("ihsweep")

BUDGETS = ("updates", "tokens", "law", "emergence")
STOP_METRICS = ("ps_max", "la_max", "dla_max", "ar_acc", "ar_data_acc")
# Config fields the trainer vmaps (one value per model) → the per-model field it fills.
VALUE_FIELDS = {"seed": "ensemble.seeds", "train.lr": "ensemble.peak_lrs",
                "data.frequency": "data.frequencies", "data.reliability": "data.reliabilities"}
# Fields a sweep sets itself (not grid axes).
PLANNER_FIELDS = ("seed", "ensemble.size", "ensemble.seeds", "ensemble.cell_ids", "ensemble.peak_lrs",
                  "data.frequencies", "data.reliabilities", "train.num_steps")
STATES = ("pending", "running", "done", "failed", "interrupted")


@dataclasses.dataclass
class Cell:
  """One model of the sweep: ``id`` (row of cells.csv, grid order with the seed innermost),
  its grid ``coords`` (field path → value), ``seed`` and group."""

  id: int
  coords: dict
  seed: int
  cfg: Any  # the cell's full config (one model)
  group: str = ""


@dataclasses.dataclass
class Group:
  """Cells sharing every config value but the vmapped ones; ``cfg`` is their ensemble's run
  config (``ensemble.seeds``/``cell_ids``/``peak_lrs``… filled, ``train.num_steps`` = budget)."""

  id: str
  cells: list
  cfg: Any
  num_steps: int
  cap_reason: str  # where num_steps comes from (the budget)
  cost_flops: float
  law_updates: float
  n_params: int


@dataclasses.dataclass
class Plan:
  cells: list
  groups: list
  axes: list  # grid field paths, in order
  budget: str


def _get(cfg, path: str):
  node = cfg
  for part in path.split("."):
    node = node[part]
  return node


def _set(cfg, path: str, value, sweep_field: str) -> None:
  *parents, name = path.split(".")
  node = cfg
  for part in parents:
    node = node[part]
  try:
    node[name] = value
  except (TypeError, ValueError, KeyError) as e:
    raise ConfigError(sweep_field, value,
                      f"a value {path} can hold ({type(e).__name__}: {e})") from None


def _leaves(node, prefix: str = "") -> list[tuple[str, Any]]:
  """(dotted path, value) of a nested ConfigDict's leaves."""
  out = []
  for key in sorted(node.keys()):
    value = node[key]
    if hasattr(value, "keys"):
      out += _leaves(value, f"{prefix}{key}.")
    else:
      out.append((f"{prefix}{key}", value))
  return out


def _key(value) -> str:
  return json.dumps(value, sort_keys=True, default=str)


def _axis_values(section: str, path: str, values, distinct: bool = True) -> list:
  field = f"sweep.{section}.{path}"
  if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
    raise ConfigError(field, values, "a tuple of values, e.g. (8, 16)")
  if len(values) == 0:
    raise ConfigError(field, values, "a non-empty tuple of values (an empty axis has no cells)")
  if distinct and len({_key(v) for v in values}) != len(values):
    raise ConfigError(field, values, "distinct values (a repeated value trains the same cells "
                      "twice; use sweep.seeds for replicates)")
  return list(values)


def _check_axis_field(cfg, section: str, path: str) -> None:
  field = f"sweep.{section}.{path}"
  if path.startswith("sweep.") or path in PLANNER_FIELDS:
    raise ConfigError(field, "(axis)", "an axis over any config field except the sweep section "
                      "and the fields the planner sets: " + ", ".join(PLANNER_FIELDS) +
                      " (vary seeds with sweep.seeds, learning rates with sweep.grid.train.lr)")
  try:
    value = _get(cfg, path)
  except (KeyError, AttributeError):
    raise ConfigError(field, "(axis)", f"an existing config field ({path} is not one; see "
                      f"configs/default.py)") from None
  if hasattr(value, "keys"):
    raise ConfigError(field, "(axis)", f"a field, not the section {path}")
  if path in config_lib.EXECUTION_FIELDS:
    raise ConfigError(field, "(axis)", f"an axis over a field that changes the trained models; "
                      f"{path} only changes how a run executes (so do "
                      f"{', '.join(config_lib.EXECUTION_FIELDS)}): its cells would be copies")


def grid_points(cfg) -> tuple[list[str], list[dict]]:
  """``(axis paths, points)``: the product of ``sweep.grid`` axes (in field-path order, the first
  outermost) with the
  ``sweep.zip`` axes varying together as one more axis; each point maps path → value.

  Raises:
    ConfigError: an empty or non-tuple axis, an unknown field, zip axes of unequal length.
  """
  sweep = cfg.sweep
  grid = [(p, _axis_values("grid", p, v)) for p, v in _leaves(sweep.grid)]
  # A zip axis may repeat a value (transitions = ('synthetic', 'synthetic', 'iid')); its
  # points, the tuples across all zip axes, must be distinct (checked below).
  zipped = [(p, _axis_values("zip", p, v, distinct=False)) for p, v in _leaves(sweep.zip)]
  for section, axes in (("grid", grid), ("zip", zipped)):
    for path, _ in axes:
      _check_axis_field(cfg, section, path)
  both = {p for p, _ in grid} & {p for p, _ in zipped}
  if both:
    path = sorted(both)[0]
    raise ConfigError(f"sweep.zip.{path}", _get(sweep.zip, path),
                      f"an axis of sweep.grid or sweep.zip, not both")
  factors = [[{p: v} for v in values] for p, values in grid]
  if zipped:
    n = len(zipped[0][1])
    for path, values in zipped:
      if len(values) != n:
        raise ConfigError(f"sweep.zip.{path}", tuple(values),
                          f"{n} values, as many as sweep.zip.{zipped[0][0]} (zipped axes vary "
                          f"together)")
    zip_points = [{p: values[i] for p, values in zipped} for i in range(n)]
    if len({_key(p) for p in zip_points}) != n:
      raise ConfigError("sweep.zip", {p: tuple(v) for p, v in zipped},
                        "distinct points (zipped axes whose tuples repeat a combination train "
                        "the same cells twice; use sweep.seeds for replicates)")
    factors.append(zip_points)
  points = [{k: v for part in combo for k, v in part.items()}
            for combo in itertools.product(*factors)]
  return [p for p, _ in grid] + [p for p, _ in zipped], points


def _validate_sweep(cfg, n_devices: int) -> None:
  sub = {"sweep": cfg.sweep}
  config_lib._int(sub, "sweep", "seeds", 0, hint=" (0 = ensemble.size)")
  budget = config_lib._choice(sub, "sweep", "budget", BUDGETS)
  if budget == "tokens":
    config_lib._int(sub, "sweep", "tokens", 1, hint=" (tokens per model for budget 'tokens')")
  if budget in ("law", "emergence"):
    config_lib._real(sub, "sweep", "law_multiple", 0.0, lo_open=True)
    if cfg.sweep.law_file:
      from ihsweep.law import Law, LawError
      try:
        Law.from_json(os.path.expanduser(cfg.sweep.law_file))
      except LawError as e:
        raise ConfigError("sweep.law_file", cfg.sweep.law_file, str(e)) from None
  if budget == "emergence":
    metric = config_lib._choice(sub, "sweep", "stop_metric", STOP_METRICS)
    if metric == "dla_max":  # nats of logit
      config_lib._real(sub, "sweep", "stop_threshold", -math.inf)
    else:  # scores and accuracies in [0, 1]; every model has reached 0 at update 0
      config_lib._real(sub, "sweep", "stop_threshold", 0.0, 1.0, lo_open=True, hi_open=False)
    config_lib._real(sub, "sweep", "stop_margin", 1.0)
    if not cfg.eval.every_steps and not cfg.eval.every_tokens:
      raise ConfigError("eval.every_steps", cfg.eval.every_steps,
                        "> 0 for sweep.budget = 'emergence' (the stop rule reads the online "
                        "metrics)")
  for field in ("ensemble.peak_lrs", "ensemble.seeds", "ensemble.cell_ids", "data.frequencies",
                "data.reliabilities"):
    section, name = field.split(".")
    value = cfg[section].get(name, ())
    if value:
      raise ConfigError(field, value, "empty in a sweep: the planner fills it per group (vary "
                        "learning rates and data knobs with sweep.grid, seeds with sweep.seeds)")
  import jax
  if jax.process_count() > 1 and cfg.mesh.num_devices not in (0, n_devices):
    raise ConfigError("mesh.num_devices", cfg.mesh.num_devices,
                      f"0 (all {n_devices} devices) with {jax.process_count()} processes: every "
                      f"group runs on the global mesh")


def budget_updates(cfg, batch_size: int, context_size: int, law) -> tuple[int, str]:
  """``(updates, why)`` for a cell of a sweep with ``cfg.sweep.budget``."""
  sweep = cfg.sweep
  if sweep.budget == "updates":
    return int(cfg.train.num_steps), "train.num_steps"
  if sweep.budget == "tokens":
    n = math.ceil(sweep.tokens / (batch_size * context_size))
    return n, f"{sweep.tokens:,} tokens"
  n = max(1, math.ceil(sweep.law_multiple * law.updates(batch_size, context_size)))
  what = "cap: " if sweep.budget == "emergence" else ""
  return n, f"{what}{sweep.law_multiple:g} × law"


def _model_key(cell_cfg) -> str:
  """What decides the model a cell trains: its config without execution-only fields and the
  data fields its source does not read."""
  from ihsweep.data import unread_fields
  d = json.loads(cell_cfg.to_json_best_effort())
  for path in config_lib.EXECUTION_FIELDS:
    section, name = path.split(".")
    d.get(section, {}).pop(name, None)
  for name in unread_fields(cell_cfg.data) if "data" in d else ():
    d["data"].pop(name, None)
  return json.dumps(d, sort_keys=True)


def _refuse_copies(cfg, cells: list, axes: list[str]) -> None:
  """Two cells that would train the same model (values equal once cast to the field's type, or
  an axis over a field the cell's data source does not read) are refused, naming the axis."""
  from ihsweep.data import readers, source_kind, unread_fields
  first: dict[str, Cell] = {}
  for cell in cells:
    other = first.setdefault(_model_key(cell.cfg), cell)
    if other is cell:
      continue
    path = next(p for p in axes if _key(other.coords[p]) != _key(cell.coords[p]))
    a, b = other.coords[path], cell.coords[path]
    name = path.split(".")[1] if path.startswith("data.") else ""
    if name in unread_fields(cell.cfg.data):
      why = (f"data.source = {config_lib._kinds([source_kind(cell.cfg.data)])} does not read "
             f"{path}; only data.source = {config_lib._kinds(readers(name))} does")
    else:
      why = f"{a!r} and {b!r} are the same value {_get(cell.cfg, path)!r} once {path} holds it"
    section = _section(cfg, path)
    raise ConfigError(f"sweep.{section}.{path}", tuple(_get(cfg.sweep[section], path)),
                      f"values that train different models: cells {other.id} and {cell.id} "
                      f"would be the same model ({why})")


def uniform_ps(block_len: int) -> float:
  """The prefix-matching score of uniform causal attention on probes of block length L: the
  mean of 1/(i + 1) over second-block positions i ∈ [L, 2L) (an untrained model's level)."""
  return float(np.mean(1.0 / (np.arange(block_len, 2 * block_len) + 1.0)))


def _check_stop_threshold(cfg, group: "Group", where: str) -> None:
  """Under the 'emergence' budget with ps_max, a threshold an untrained model already reaches
  would stop the group at update 0."""
  from ihsweep.data.probes import block_length
  if cfg.sweep.budget != "emergence" or cfg.sweep.stop_metric != "ps_max":
    return
  context = int(group.cfg.train.context_size)
  block = block_length(context, int(group.cfg.eval.probe_len))
  base = uniform_ps(block)
  if cfg.sweep.stop_threshold <= base:
    raise ConfigError("sweep.stop_threshold", cfg.sweep.stop_threshold,
                      f"above {base:.4f}, the ps_max of uniform attention on probe blocks of "
                      f"L = {block} (C = {context}): an untrained model reaches it, so the "
                      f"group would stop at update 0 [{where}]")


def _group_key(cell_cfg) -> str:
  d = json.loads(cell_cfg.to_json_best_effort())
  for path in VALUE_FIELDS:
    *parents, name = path.split(".")
    node = d
    for part in parents:
      node = node[part]
    node.pop(name, None)
  return json.dumps(d, sort_keys=True)


def _n_params(mcfg, context_size: int) -> int:
  import jax
  import jax.numpy as jnp
  from ihsweep.model import Transformer
  shapes = jax.eval_shape(lambda: Transformer(mcfg).init(
      jax.random.PRNGKey(0), jnp.zeros((1, context_size), jnp.int32))["params"])
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


def make_plan(cfg) -> Plan:
  """Cells and groups of ``cfg`` (a config with an optional ``sweep`` section; without one, or
  with an empty grid, the sweep is one grid point with ``ensemble.size`` seeds). Validates the
  sweep section and every group's run config; compiles nothing.

  Raises:
    ConfigError: naming the ``sweep.*`` field (or the config field) and the value at fault.
    DataError: data that cannot be found (e.g. a missing corpus), as ``config.validate``.
  """
  import jax
  from ihsweep import model as model_lib
  from ihsweep.law import Law
  if "sweep" not in cfg:
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
      cfg.sweep = config_lib.default_sweep()
  n_devices = len(jax.devices())
  _validate_sweep(cfg, n_devices)
  axes, points = grid_points(cfg)
  n_seeds = cfg.sweep.seeds or cfg.ensemble.size
  law = Law.from_json(os.path.expanduser(cfg.sweep.law_file)) if cfg.sweep.law_file else Law()

  base = copy.deepcopy(cfg)
  with base.unlocked():
    del base["sweep"]
  cells: list[Cell] = []
  for point in points:
    for k in range(n_seeds):
      c = copy.deepcopy(base)
      with c.unlocked():
        for path, value in point.items():
          _set(c, path, value, f"sweep.{_section(cfg, path)}.{path}")
        c.seed = int(c.seed) + k
      cells.append(Cell(id=len(cells), coords=dict(point), seed=int(c.seed), cfg=c))

  _refuse_copies(cfg, cells, axes)
  by_key: dict[str, list[Cell]] = {}
  for cell in cells:
    by_key.setdefault(_group_key(cell.cfg), []).append(cell)

  groups = []
  for members in by_key.values():
    g = copy.deepcopy(members[0].cfg)
    with g.unlocked():
      g.ensemble.size = len(members)
      g.ensemble.seeds = tuple(m.seed for m in members)
      g.ensemble.cell_ids = tuple(m.id for m in members)
      g.ensemble.peak_lrs = tuple(float(m.cfg.train.lr) for m in members)
      if g.data.source == "markov":
        g.data.frequencies = tuple(float(m.cfg.data.frequency) for m in members)
        g.data.reliabilities = tuple(float(m.cfg.data.reliability) for m in members)
      g.seed = members[0].seed
    group = Group(id="", cells=members, cfg=g, num_steps=0, cap_reason="", cost_flops=0.0,
                  law_updates=0.0, n_params=0)
    _validate_group(group, axes, cfg)  # B and C are valid from here on: the law can use them
    _check_stop_threshold(cfg, group, _where(group))
    b, c_size = int(g.train.batch_size), int(g.train.context_size)
    group.num_steps, group.cap_reason = budget_updates(cfg, b, c_size, law)
    group.law_updates = law.updates(b, c_size)
    with g.unlocked():
      g.train.num_steps = group.num_steps
    mcfg = model_lib.ModelConfig.from_config(g.model)
    group.cost_flops = (len(members) * group.num_steps * b * c_size
                        * model_lib.flops_per_token(mcfg, c_size))
    group.n_params = _n_params(mcfg, c_size)
    groups.append(group)
  groups.sort(key=lambda g: (-g.cost_flops, g.cells[0].id))
  for i, group in enumerate(groups):
    group.id = f"g{i:03d}"
    for cell in group.cells:
      cell.group = group.id
  return Plan(cells=cells, groups=groups, axes=axes, budget=cfg.sweep.budget)


def _section(cfg, path: str) -> str:
  """'grid' or 'zip': which sweep section holds the axis ``path``."""
  try:
    _get(cfg.sweep.grid, path)
    return "grid"
  except (KeyError, AttributeError):
    return "zip"


def _validate_group(group: Group, axes: list[str], sweep_cfg) -> None:
  """``config.validate`` of a group's run config; an error in a field the grid sets is reported
  under the sweep field, with the group's cells."""
  try:
    config_lib.validate(group.cfg)
  except ConfigError as e:
    field = e.field.split("[")[0]
    reverse = {v: k for k, v in VALUE_FIELDS.items()}
    field = reverse.get(field, field)
    where = _where(group)
    if field in axes:
      raise ConfigError(f"sweep.{_section(sweep_cfg, field)}.{field}", e.value,
                        f"{e.allowed} [{where}]") from None
    if e.field == "mesh.num_devices":
      import jax
      raise ConfigError(
          "mesh.num_devices", e.value,
          f"{e.allowed} [{where}; every group runs on all {len(jax.devices())} devices of "
          f"{jax.process_count()} process(es), so it must be able to use them all: a group uses "
          f"at most E · B devices; use fewer processes or devices, or more seeds]") from None
    raise ConfigError(e.field, e.value, f"{e.allowed} [{where}]") from None


def _where(group: Group) -> str:
  return (f"the group of cells {_ranges([c.id for c in group.cells])}: B = "
          f"{group.cfg.train.batch_size}, C = {group.cfg.train.context_size}, E = "
          f"{group.cfg.ensemble.size} models")


def _ranges(ids: list[int]) -> str:
  out, start = [], None
  ids = sorted(ids)
  for i, v in enumerate(ids):
    if start is None:
      start = v
    if i + 1 == len(ids) or ids[i + 1] != v + 1:
      out.append(f"{start}" if start == v else f"{start}-{v}")
      start = None
  return ",".join(out)


# ----------------------------------------------------------------------------------------------
# Run directory: cells.csv, group status files, summary.


def group_dir(workdir: str, group_id: str) -> str:
  return os.path.join(workdir, "groups", group_id)


def read_status(workdir: str, group_id: str) -> dict:
  """A group's ``status.json`` (``{"state": "pending"}`` when there is none or it is
  unreadable)."""
  path = os.path.join(group_dir(workdir, group_id), "status.json")
  if not os.path.exists(path):
    return {"state": "pending"}
  try:
    with open(path) as f:
      status = json.load(f)
    if isinstance(status, dict) and status.get("state") in STATES:
      return status
  except (OSError, ValueError):
    pass
  # Damaged (e.g. cut by a full disk): the group is treated as not done, so a rerun resumes it
  # from its checkpoints.
  return {"state": "pending", "unreadable": True}


def write_status(workdir: str, group_id: str, **fields) -> dict:
  """Replaces a group's ``status.json`` atomically (``state`` plus ``fields``)."""
  path = os.path.join(group_dir(workdir, group_id), "status.json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  status = {"group": group_id, **fields,
            "host": socket.gethostname(), "pid": os.getpid(),
            "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
  _write_json(path, status)
  return status


def cells_table(plan: Plan, workdir: str | None = None):
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
      row.update({"batch_size": b, "context_size": c, "peak_lr": float(cell.cfg.train.lr),
                  "n_params": group.n_params, "law_updates": round(group.law_updates, 1),
                  "law_tokens": round(group.law_updates * b * c),
                  "budget_updates": group.num_steps, "budget_tokens": group.num_steps * b * c,
                  "status": status["state"], "steps_done": status.get("step", 0),
                  "diverged": str(cell.id) in diverged,
                  "diverged_step": diverged.get(str(cell.id)),
                  "online_crossing_step": status.get("crossed", {}).get(str(cell.id))})
      rows.append(row)
  table = pd.DataFrame(rows).sort_values("cell").reset_index(drop=True)
  for col in ("diverged_step", "online_crossing_step"):  # integers with gaps, not floats
    table[col] = table[col].astype("Int64")
  return table


def write_cells(plan: Plan, workdir: str) -> str:
  """(Re)writes ``workdir/cells.csv`` from the plan and the groups' status files, atomically and
  under a lock (processes finishing groups may refresh it at the same time)."""
  path = os.path.join(workdir, "cells.csv")
  with open(os.path.join(workdir, ".cells.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    tmp = f"{path}.{os.getpid()}.tmp"
    cells_table(plan, workdir).to_csv(tmp, index=False)
    os.replace(tmp, path)
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
    note(f"cells.csv rows {[int(i) + 2 for i in np.flatnonzero(bad)][:10]} (file lines) are "
         f"cut short or have missing or non-numeric {', '.join(required)} or group; skipped")
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
  from ihsweep import train
  ids, seeds, lrs = train.cell_ids(cfg), train.model_seeds(cfg), train.peak_lrs(cfg)
  n = int(cfg.ensemble.size)
  rows = [{"cell": int(ids[i]), "group": group_id, "seed": int(seeds[i]),
           "batch_size": int(cfg.train.batch_size), "context_size": int(cfg.train.context_size),
           "peak_lr": float(lrs[i])} for i in range(n)]
  cells = pd.DataFrame(rows)
  for axis in axes:
    try:
      values = tuple(_get(cfg, VALUE_FIELDS[axis]) or ())
    except KeyError:  # not a per-model field, or a config without it
      values = ()
    cells[axis] = list(values) if len(values) == n else _get(cfg, axis)
  mcfg, _ = train.model_and_train_config(cfg)
  cells["n_params"] = _n_params(mcfg, int(cfg.train.context_size))
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
      rows = config_cells(gcfg, gid, axes).assign(budget_updates=int(gcfg.train.num_steps))
    except Exception as e:  # no config, or not an ihsweep one
      if gid not in set(cells["group"]):
        note(f"group {gid} is skipped: cells.csv has no rows for it, and its config.json "
             f"cannot be read to rebuild them ({type(e).__name__}: {str(e)[:100]})")
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
    note(f"cells.csv lacks {len(new)} cell(s) of group(s) {', '.join(new['group'].unique())} "
         f"whose directories exist (cut short?); their rows are rebuilt from each group's "
         f"config.json and status.json")
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
  from ihsweep import rundir
  rundir.claim_workdir(workdir, kind)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write-test.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise config_lib.WorkdirError(workdir, f"a directory this process can write "
                                  f"({e.strerror or e})") from None


class GroupFailed(RuntimeError):
  """A group raised under several processes (recorded in its status.json); the sweep ends."""

  def __init__(self, group_id: str, error: Exception):
    self.group_id = group_id
    super().__init__(f"group {group_id} failed: {type(error).__name__}: {error}")


@dataclasses.dataclass
class SweepResult:
  groups: dict  # group id → status dict
  summary: dict
  interrupted: bool = False


def run(cfg, workdir: str, *, progress: bool = True) -> SweepResult:
  """Plans and trains a sweep into ``workdir`` (module docstring: layout and scheduling rule).

  Groups already ``done`` are skipped, partial ones resume from their checkpoints, failed ones
  are retried. A group that raises is recorded as ``failed`` (error and traceback in its
  ``status.json``) and the sweep goes on. A stop request (SIGTERM) checkpoints the running group,
  marks it ``interrupted`` and returns with ``interrupted=True``.

  Raises:
    ConfigError / DataError: before anything is compiled (``make_plan``; an unwritable
      workdir; a workdir holding a sweep with a different config).
  """
  from ihsweep import rundir
  plan = make_plan(cfg)
  check_workdir(workdir, "sweep")
  with rundir.workdir_lock(workdir):
    return _run(cfg, plan, workdir, progress)


def _run(cfg, plan: Plan, workdir: str, progress: bool) -> SweepResult:
  import jax
  from ihsweep import runner, sharding
  lead = jax.process_index() == 0
  if os.path.exists(os.path.join(workdir, "cells.csv")):
    runner.check_resumable(cfg, workdir)
  states = {g.id: read_status(workdir, g.id) for g in plan.groups}
  sharding.barrier("ihsweep-sweep-planned")  # every process read the statuses
  if lead:
    runner.write_resolved_config(cfg, workdir)
    write_cells(plan, workdir)
  n = len(plan.groups)
  log.info("sweep: %d cells in %d groups (%s budget) on %d device(s) in %d process(es); "
           "cells.csv in %s", len(plan.cells), n, plan.budget, len(jax.devices()),
           jax.process_count(), workdir)
  interrupted = False
  for i, group in enumerate(plan.groups):
    gdir = group_dir(workdir, group.id)
    common = {"cells": [c.id for c in group.cells], "num_steps": group.num_steps,
              "batch_size": int(group.cfg.train.batch_size),
              "context_size": int(group.cfg.train.context_size)}
    if states[group.id]["state"] == "done":
      log.info("group %s (%d/%d) done before: skipped", group.id, i + 1, n)
      continue
    if sharding.any_process(runner.stop_requested()):  # a signal between groups
      interrupted = True
      break
    attempts = int(states[group.id].get("attempts", 0)) + 1
    common["attempts"] = attempts  # how many times a process started (or resumed) this group
    if lead:
      write_status(workdir, group.id, state="running", **common, processes=jax.process_count())
      write_cells(plan, workdir)
    log.info("group %s (%d/%d): cells %s, E = %d, B = %d, C = %d, %s updates (%s); law: "
             "transition near update %s", group.id, i + 1, n, _ranges(common["cells"]),
             len(group.cells), common["batch_size"], common["context_size"],
             f"{group.num_steps:,}", group.cap_reason, f"{group.law_updates:,.0f}")
    stop_rule = None
    if cfg.sweep.budget == "emergence":
      stop_rule = runner.EmergenceStop(cfg.sweep.stop_metric, cfg.sweep.stop_threshold,
                                       cfg.sweep.stop_margin, len(group.cells))
    desc = (f"p{jax.process_index()} {group.id} {i + 1}/{n} B={group.cfg.train.batch_size} "
            f"C={group.cfg.train.context_size} E={len(group.cells)}")
    try:  # a peer that stops answering ends this process: the group is then marked failed
      with sharding.when_peer_lost(lambda reason: write_status(
          workdir, group.id, state="failed", **common, error=reason, process=jax.process_index())):
        out = runner.fit(group.cfg, gdir, progress=progress, desc=desc, stop_rule=stop_rule)
    except runner.Interrupted as e:
      states[group.id] = write_status(workdir, group.id, state="interrupted", step=e.step,
                                      **common) if lead else {"state": "interrupted"}
      interrupted = True
      if lead:
        write_cells(plan, workdir)
      break
    except runner.checkpoint.DiskFull:  # every later group would fail too; a rerun resumes
      raise
    except Exception as e:  # noqa: BLE001 — recorded, and the sweep goes on
      log.error("group %s failed: %s: %s", group.id, type(e).__name__, e)
      states[group.id] = write_status(
          workdir, group.id, state="failed", **common, error=f"{type(e).__name__}: {e}",
          traceback=traceback.format_exc(), process=jax.process_index())
      if jax.process_count() > 1:
        # The other processes may wait for this one inside the group's collectives, so they
        # cannot agree to skip it: end the sweep (the launcher stops the rest; a rerun retries).
        raise GroupFailed(group.id, e) from e
    else:
      ids = [c.id for c in group.cells]
      diverged = {str(ids[j]): int(d) for j, d in enumerate(out["diverged_at"]) if d >= 0}
      crossed = {str(ids[j]): c for j, c in enumerate(out["crossed"] or []) if c is not None}
      done = dict(state="done", **common, step=out["step"], stopped_early=out["stopped_early"],
                  diverged=diverged, resumed_from=out["resumed_from"], crossed=crossed)
      states[group.id] = write_status(workdir, group.id, **done) if lead else done
      if diverged:
        log.warning("group %s: cells %s diverged (loss NaN/inf; frozen)", group.id,
                    ", ".join(diverged))
    if lead:
      write_cells(plan, workdir)
  summary = summarize(plan, workdir) if lead else {}
  if lead:
    _write_json(os.path.join(workdir, "sweep.json"), summary)
  return SweepResult(groups=states, summary=summary, interrupted=interrupted)


def _write_json(path: str, obj) -> None:
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def summarize(plan: Plan, workdir: str) -> dict:
  """Per-group state and totals: cells by state, diverged cells, and the compute the
  'emergence' budget saved (tokens not trained because a group stopped before its cap)."""
  groups, totals = [], {s: 0 for s in STATES}
  budget_tokens = used_tokens = 0
  for group in plan.groups:
    status = read_status(workdir, group.id)
    b, c = int(group.cfg.train.batch_size), int(group.cfg.train.context_size)
    e = len(group.cells)
    step = status.get("step")
    budget_tokens += e * group.num_steps * b * c
    if status["state"] == "done":
      used_tokens += e * step * b * c
    totals[status["state"]] += e
    groups.append({"group": group.id, "state": status["state"], "cells": e, "batch_size": b,
                   "context_size": c, "budget_updates": group.num_steps, "step": step,
                   "stopped_early": status.get("stopped_early", False),
                   "diverged": status.get("diverged", {}), "error": status.get("error")})
  done_budget = sum(g["cells"] * g["budget_updates"] * g["batch_size"] * g["context_size"]
                    for g in groups if g["state"] == "done")
  return {"cells": len(plan.cells), "groups": groups, "cells_by_state": totals,
          "diverged_cells": sum(len(g["diverged"]) for g in groups),
          "budget": plan.budget, "budget_tokens": budget_tokens,
          "done_budget_tokens": done_budget, "trained_tokens_done_groups": used_tokens,
          "saved_fraction": (1 - used_tokens / done_budget) if done_budget else 0.0}


def format_summary(summary: dict) -> str:
  """The lines ``ihsweep run`` prints at the end."""
  by = summary["cells_by_state"]
  lines = [f"sweep: {summary['cells']} cells in {len(summary['groups'])} groups; cells "
           + ", ".join(f"{s}: {n}" for s, n in by.items() if n)]
  if summary["diverged_cells"]:
    lines.append(f"diverged cells (loss NaN/inf, frozen): {summary['diverged_cells']}")
  if summary["budget"] == "emergence" and summary["done_budget_tokens"]:
    lines.append(f"early stops saved {summary['saved_fraction']:.1%} of the finished groups' "
                 f"budget ({summary['done_budget_tokens'] - summary['trained_tokens_done_groups']:,}"
                 f" of {summary['done_budget_tokens']:,} tokens)")
  for g in summary["groups"]:
    if g["state"] == "failed":
      lines.append(f"  {g['group']} failed: {g['error']}")
  return "\n".join(lines)


class NotASweep(ValueError):
  """A directory without a sweep's cells.csv."""


def _last_step(path: str) -> int | None:
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


def _alive(status: dict) -> bool | None:
  """Whether a 'running' group's process still exists (None: another host, cannot tell)."""
  if status.get("host") != socket.gethostname() or "pid" not in status:
    return None
  try:
    os.kill(int(status["pid"]), 0)
    return True
  except ProcessLookupError:
    return False
  except PermissionError:
    return True


def status_rows(workdir: str, notes: list[str] | None = None) -> list[dict]:
  """Per-group state of a sweep directory, from its files only: ``group``, ``state`` (a
  'running' group whose process is gone on this host reads 'stopped'), ``cells``, ``B``,
  ``C``, ``step`` (last logged update), ``budget``, ``diverged`` cell ids, ``error``.

  A damaged or truncated cells.csv is read as the analysis reads it (``read_cells``,
  ``recover_cells``): the cells it lacks are rebuilt from the group directories, and one line
  naming the file and what was recovered is appended to ``notes``.

  Raises:
    NotASweep: no cells.csv in ``workdir``, or neither readable rows nor group directories.
  """
  import pandas as pd
  path = os.path.join(workdir, "cells.csv")
  found: list[str] = []
  cells, why = read_cells(path, found.append)
  if cells is None and not (os.path.exists(path) and os.path.isdir(os.path.join(workdir,
                                                                              "groups"))):
    raise NotASweep(f"{workdir} is not a sweep run directory (no readable cells.csv: {why}); "
                    f"`ihsweep run --config=FILE --workdir={workdir}` makes one")
  if cells is None:
    found.append(f"it cannot be read as a cells table ({why})")
    cells = pd.DataFrame({c: pd.Series(dtype=int) for c in (*REQUIRED_CELL_COLUMNS, "group")})
  cells = recover_cells(workdir, cells, (), found.append)
  if found and notes is not None:
    notes.append(f"{path} is damaged or cut short: {'; '.join(found)}")
  if cells.empty:
    raise NotASweep(f"{path}: no usable rows, and no group directory to rebuild them from")
  rows = []
  for gid, members in cells.groupby("group", sort=True):
    status = read_status(workdir, gid)
    state = status["state"]
    if state == "running" and _alive(status) is False:
      state = "stopped"
    step = _last_step(os.path.join(group_dir(workdir, gid), "train_log.jsonl"))
    first = members.iloc[0]
    budget = pd.to_numeric(members.get("budget_updates", pd.Series(dtype=float)),
                           errors="coerce").max()
    rows.append({"group": gid, "state": state, "cells": len(members),
                 "B": int(first["batch_size"]), "C": int(first["context_size"]),
                 "step": status.get("step", step) if state == "done" else (step or 0),
                 "budget": int(status.get("num_steps", 0) if pd.isna(budget) else budget),
                 "stopped_early": bool(status.get("stopped_early", False)),
                 "diverged": sorted(int(c) for c in status.get("diverged", {})),
                 "error": status.get("error"), "unreadable": status.get("unreadable", False)})
  return rows


def format_status(workdir: str) -> str:
  """``ihsweep status``: one line per group and a count of cells by state (after a warning
  line when cells.csv is damaged: ``status_rows``)."""
  notes: list[str] = []
  rows = status_rows(workdir, notes)
  lines = [f"warning: {n}" for n in notes]
  lines.append(f"{'group':6s} {'state':11s} {'cells':>5s} {'B':>5s} {'C':>6s} "
               f"{'updates':>17s}  notes")
  counts: dict[str, int] = {}
  for r in rows:
    counts[r["state"]] = counts.get(r["state"], 0) + r["cells"]
    notes = []
    if r["stopped_early"]:
      notes.append("stopped early (emergence)")
    if r["diverged"]:
      notes.append(f"diverged cells {','.join(map(str, r['diverged']))}")
    if r["state"] == "stopped":
      notes.append("its process is gone: rerun the command to resume")
    if r["unreadable"]:
      notes.append("status.json unreadable: a rerun resumes it from its checkpoints")
    if r["error"]:
      notes.append(r["error"].splitlines()[0][:120])
    lines.append(f"{r['group']:6s} {r['state']:11s} {r['cells']:5d} {r['B']:5d} {r['C']:6d} "
                 f"{r['step']:>8,d}/{r['budget']:<8,d}  {'; '.join(notes)}")
  lines.append("cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
  return "\n".join(lines)


def add_axes(cfg, specs, section: str = "grid"):
  """Adds (or replaces) sweep axes given as ``FIELD=V1,V2,…`` strings (the ``--grid`` and
  ``--zip`` flags of ``ihsweep run``); each value is read as a Python literal, else kept as a
  string. Returns ``cfg`` (changed in place).

  Raises:
    ConfigError: a spec without ``=``, without values, with an empty value, or with NaN or
      infinity (no config field allows them).
  """
  import ast
  import ml_collections
  if not specs:
    return cfg
  seen = set()
  with cfg.unlocked():
    if "sweep" not in cfg:
      cfg.sweep = config_lib.default_sweep()
    for spec in specs:
      path, sep, text = spec.partition("=")
      path = path.strip()
      if path in seen:
        raise ConfigError(f"sweep.{section}.{path}", spec, "one --grid/--zip flag per field "
                          "(give all its values in one: FIELD=V1,V2,...)")
      seen.add(path)
      if not sep or not path:
        raise ConfigError(f"sweep.{section}", spec, "FIELD=V1,V2,... (e.g. "
                          "--grid=train.batch_size=8,16)")
      items = [item.strip() for item in text.split(",")]
      if not any(items):
        raise ConfigError(f"sweep.{section}.{path}", spec, f"at least one value: the axis has "
                          f"none (FIELD=V1,V2,..., e.g. --grid={path}=V1,V2)")
      if not all(items):
        raise ConfigError(f"sweep.{section}.{path}", spec, "a value between every two commas "
                          f"(value {items.index('') + 1} of {len(items)} is empty)")
      values = []
      for item in items:
        try:
          value = ast.literal_eval(item)
        except (ValueError, SyntaxError):
          value = item
        if item.lower().lstrip("+-") in ("nan", "inf", "infinity") or (
            isinstance(value, float) and not math.isfinite(value)):
          raise ConfigError(f"sweep.{section}.{path}", item, f"a finite number (or another value "
                            f"{path} can hold): NaN and infinity are not allowed for any field")
        values.append(value)
      node = cfg.sweep[section]
      *parents, name = path.split(".")
      for part in parents:
        if part not in node:
          node[part] = ml_collections.ConfigDict()
        node = node[part]
      if name in node:
        del node[name]  # a new tuple may differ in length and type
      node[name] = tuple(values)
  return cfg
