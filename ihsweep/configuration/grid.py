"""Planning a sweep: a config's grid → cells → groups of equal shapes, with their budgets and
costs. Pure host work: validates every group's config before anything is compiled.

A **cell** is one model: a grid point (values of the config fields in ``sweep.grid`` and
``sweep.zip``) and a seed. Cells whose configs differ only in values the trainer vmaps — the
seed, ``train.lr`` and the Markov knobs ``data.frequency`` / ``data.reliability`` — form one
**group**, trained as one ensemble by one compiled program (``runner.fit``); anything else
(batch size, context size, model shape, vocabulary, schedule, …) makes a separate group.

Groups are ordered by predicted cost, most expensive first: E · updates · B · C · training
FLOPs per token (``model.flops_per_token``), where updates is the group's budget.

A plan is made for no devices in particular: the rules that depend on the devices a group's
worker has (``sweep.devices_per_worker``, the mesh, the memory choices and ``ensemble.vmap_chunk``
on it, the memory a group needs at least) are ``ihsweep.training.worker_fit.check_sweep``'s, which
``ihsweep run`` applies for its process's devices and ``ihsweep plan`` for the devices it plans.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
from typing import Any

import numpy as np

from ihsweep.base.law import Law
from ihsweep.compute import metric_registry
from ihsweep.compute import model as model_lib
from ihsweep.compute.model import Transformer
from ihsweep.configuration import config as config_lib
from ihsweep.configuration import data_rules, fields
from ihsweep.configuration.axes import (
  check_settings,
  field_section,
  get_field,
  grid_points,
  leaves,
  set_field,
  value_key,
)
from ihsweep.configuration.fields import ConfigError
from ihsweep.data import unread_fields
from ihsweep.data.probes import eval_layout

# Config fields the trainer vmaps (one value per model) → the per-model field it fills.
VALUE_FIELDS = {
  "seed": "ensemble.seeds",
  "train.lr": "ensemble.peak_lrs",
  "data.frequency": "data.frequencies",
  "data.reliability": "data.reliabilities",
}


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


def budget_updates(cfg, batch_size: int, context_size: int, law) -> tuple[int, str]:
  """``(updates, why)`` for a cell of a sweep with ``cfg.sweep.budget``."""
  sweep = cfg.sweep
  if sweep.budget == "updates":
    return int(cfg.train.num_steps), "train.num_steps"
  cell = f"B = {batch_size}, C = {context_size}"
  if sweep.budget == "tokens":
    n = math.ceil(sweep.tokens / (batch_size * context_size))
    if n > fields.INT32_MAX:
      raise ConfigError(
        "sweep.tokens",
        sweep.tokens,
        f"a budget of at most {fields.INT32_MAX:,} updates per cell (the update counter is "
        f"int32): {n:,} updates at {cell}",
      )
    return n, f"{sweep.tokens:,} tokens"
  predicted = law.updates(batch_size, context_size)
  updates = sweep.law_multiple * predicted
  if not updates <= fields.INT32_MAX:  # inf and NaN too
    raise ConfigError(
      "sweep.law_multiple",
      sweep.law_multiple,
      f"a multiple that keeps every cell within {fields.INT32_MAX:,} updates (the update "
      f"counter is int32): the law predicts {predicted:.4g} updates at {cell}, so at most "
      f"{fields.INT32_MAX / predicted:.4g} there (or a law with a smaller T: sweep.law_file)",
    )
  n = max(1, math.ceil(updates))
  what = "cap: " if sweep.budget == "emergence" else ""
  return n, f"{what}{sweep.law_multiple:g} × law"


def schedule_updates(cfg, batch_size: int, context_size: int) -> int:
  """The updates a cell's learning-rate schedule spans under ``sweep.schedule_horizon``
  'tokens': ceil(sweep.tokens / (B·C)), the experiment's token budget, whatever stops
  training (an 'emergence' budget's early stop ends training, not the schedule); 0 for
  'budget' (the schedule spans the cell's updates, ``train.schedule_steps`` 0)."""
  if cfg.sweep.get("schedule_horizon", "budget") != "tokens":
    return 0
  n = math.ceil(cfg.sweep.tokens / (batch_size * context_size))
  if n > fields.INT32_MAX:
    raise ConfigError(
      "sweep.tokens",
      cfg.sweep.tokens,
      f"a schedule of at most {fields.INT32_MAX:,} updates per cell (the update counter "
      f"is int32): {n:,} updates at B = {batch_size}, C = {context_size}",
    )
  return n


def _model_key(cell_cfg) -> str:
  """What decides the model a cell trains: its config without execution-only fields and the
  data fields its source does not read."""
  d = json.loads(cell_cfg.to_json_best_effort())
  for path in fields.EXECUTION_FIELDS:
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
    path = next(p for p in axes if value_key(other.coords[p]) != value_key(cell.coords[p]))
    a, b = other.coords[path], cell.coords[path]
    name = path.split(".")[1] if path.startswith("data.") else ""
    if name in unread_fields(cell.cfg.data):
      why = (
        f"data.source = {data_rules.source_words([source_kind(cell.cfg.data)])} does not read "
        f"{path}; only data.source = {data_rules.source_words(readers(name))} does"
      )
    else:
      why = f"{a!r} and {b!r} are the same value {get_field(cell.cfg, path)!r} once {path} holds it"
    section = field_section(cfg, path)
    raise ConfigError(
      f"sweep.{section}.{path}",
      tuple(get_field(cfg.sweep[section], path)),
      f"values that train different models: cells {other.id} and {cell.id} "
      f"would be the same model ({why})",
    )


def _check_stop_threshold(cfg, group: "Group", where: str) -> None:
  """Under the 'emergence' budget, a threshold an untrained model already reaches (the stop
  metric's ``StopRule.untrained`` level for this group's probes, e.g. ps_max of uniform
  attention) would stop the group at update 0."""
  if cfg.sweep.budget != "emergence":
    return
  rule = metric_registry.get(cfg.sweep.stop_metric).stop
  if rule is None or rule.untrained is None:
    return
  context = int(group.cfg.train.context_size)
  block, length = eval_layout(group.cfg.eval, context)
  base = rule.untrained(block, length)
  if cfg.sweep.stop_threshold <= base:
    raise ConfigError(
      "sweep.stop_threshold",
      cfg.sweep.stop_threshold,
      f"above {base:.4f}, {rule.untrained_text} on probe blocks of "
      f"L = {block}{' after filler' if length > 2 * block else ''} (C = {context}): an "
      f"untrained model reaches it, so the group would stop at update 0 [{where}]",
    )


def _group_key(cell_cfg) -> str:
  d = json.loads(cell_cfg.to_json_best_effort())
  for path in VALUE_FIELDS:
    *parents, name = path.split(".")
    node = d
    for part in parents:
      node = node[part]
    node.pop(name, None)
  return json.dumps(d, sort_keys=True)


@functools.lru_cache(maxsize=1024)
def n_params(mcfg, context_size: int) -> int:
  """Parameters of one model of ``mcfg`` (a ``model.ModelConfig``) at ``context_size``, from
  the shapes of its initialisation (nothing is computed); remembered, as a plan's groups share
  a few model shapes and ``ihsweep plan`` plans twice (its own check and the prediction)."""
  import jax
  import jax.numpy as jnp

  shapes = jax.eval_shape(
    lambda: Transformer(mcfg).init(jax.random.PRNGKey(0), jnp.zeros((1, context_size), jnp.int32))[
      "params"
    ]
  )
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


MAX_CELLS = 100_000  # models in one sweep: each keeps its resolved config and a cells.csv row


def _check_cell_count(cfg, n_seeds: int) -> None:
  """Refuses, before anything is built, a sweep of more than ``MAX_CELLS`` models (grid points ×
  seeds, from the axes' lengths: time independent of the count)."""

  def lengths(section):  # a malformed axis counts 1 here; grid_points names it
    return [len(v) if isinstance(v, (tuple, list)) else 1 for _, v in leaves(section)]

  sizes, zipped = lengths(cfg.sweep.grid), lengths(cfg.sweep.zip)
  n = math.prod(sizes) * (zipped[0] if zipped else 1) * int(n_seeds)
  if n > MAX_CELLS:
    field = "sweep.seeds" if cfg.sweep.seeds else "ensemble.size"
    raise ConfigError(
      field,
      int(n_seeds),
      f"a sweep of at most {MAX_CELLS:,} models: {n:,} = {' × '.join(map(str, sizes + zipped[:1]))}"
      f"{' × ' if sizes or zipped else ''}{int(n_seeds):,} seeds (grid points × seeds)",
    )


def make_plan(cfg) -> Plan:
  """Cells and groups of ``cfg`` (a config with an optional ``sweep`` section; without one, or
  with an empty grid, the sweep is one grid point with ``ensemble.size`` seeds). Validates the
  sweep section and every group's run config apart from the rules that depend on the devices
  of the worker that trains it (``validate_group`` without devices: those are
  ``worker_fit.check_sweep``'s, module docstring); compiles nothing.

  Raises:
    ConfigError: naming the ``sweep.*`` field (or the config field) and the value at fault.
    DataError: data that cannot be found (e.g. a missing corpus), as ``config.validate``.
  """
  if "sweep" not in cfg:
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
      cfg.sweep = fields.default_sweep()
  config_lib.validate_sweep(cfg)
  n_seeds = cfg.sweep.seeds or cfg.ensemble.size
  _check_cell_count(cfg, n_seeds)
  axes, points = grid_points(cfg)
  check_settings(cfg)
  law = Law.from_json(os.path.expanduser(cfg.sweep.law_file)) if cfg.sweep.law_file else Law()

  cells = _cells(cfg, points, n_seeds)
  _refuse_copies(cfg, cells, axes)
  by_key: dict[str, list[Cell]] = {}
  for cell in cells:
    by_key.setdefault(_group_key(cell.cfg), []).append(cell)
  groups = [_group(cfg, members, axes, law) for members in by_key.values()]
  groups.sort(key=lambda g: (-g.cost_flops, g.cells[0].id))
  for i, group in enumerate(groups):
    group.id = f"g{i:03d}"
    for cell in group.cells:
      cell.group = group.id
  return Plan(cells=cells, groups=groups, axes=axes, budget=cfg.sweep.budget)


def _cells(cfg, points: list[dict], n_seeds: int) -> list[Cell]:
  """One cell per grid point and seed: the config without its sweep section, the point's
  values set and the seed advanced by the seed's index."""
  base = copy.deepcopy(cfg)
  with base.unlocked():
    del base["sweep"]
  cells: list[Cell] = []
  for point in points:
    for k in range(n_seeds):
      c = copy.deepcopy(base)
      with c.unlocked():
        for path, value in point.items():
          set_field(c, path, value, f"sweep.{field_section(cfg, path)}.{path}")
        c.seed = int(c.seed) + k
      cells.append(Cell(id=len(cells), coords=dict(point), seed=int(c.seed), cfg=c))
  return cells


def _group(cfg, members: list[Cell], axes: list[str], law: Law) -> Group:
  """The group of ``members`` (cells that differ only in what the trainer vmaps): its ensemble
  config, validated, with its budget in updates (capped at the schedule's horizon), cost and
  parameter count; its id is given once the groups are ordered."""
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
  group = Group(
    id="",
    cells=members,
    cfg=g,
    num_steps=0,
    cap_reason="",
    cost_flops=0.0,
    law_updates=0.0,
    n_params=0,
  )
  validate_group(group, axes, cfg)  # B and C are valid from here on: the law can use them
  _check_stop_threshold(cfg, group, where(group))
  b, c_size = int(g.train.batch_size), int(g.train.context_size)
  group.num_steps, group.cap_reason = budget_updates(cfg, b, c_size, law)
  group.law_updates = law.updates(b, c_size)
  horizon = schedule_updates(cfg, b, c_size)
  if horizon and group.num_steps > horizon:  # never train past the experiment's budget
    if cfg.sweep.budget == "updates":  # the user's train.num_steps: refused, not cut
      raise ConfigError(
        "train.num_steps",
        group.num_steps,
        f"at most {horizon:,} at B = {b}, C = {c_size}: sweep.schedule_horizon = 'tokens' "
        f"ends each group's schedule at ceil(sweep.tokens / (B·C)) updates "
        f"({cfg.sweep.tokens:,} tokens), and training past it would go on at the schedule's end; "
        f"lower train.num_steps or raise sweep.tokens",
      )
    group.num_steps = horizon
    group.cap_reason += f", at most the schedule's {cfg.sweep.tokens:,} tokens"
  with g.unlocked():
    g.train.num_steps = group.num_steps
    if horizon:  # a train.schedule_steps of the user's is honoured (check_settings)
      # Recorded only where it differs, so that a budget-long schedule reads as before (0).
      g.train.schedule_steps = horizon if horizon != group.num_steps else 0
  _check_schedule(group, axes, cfg)
  mcfg = model_lib.ModelConfig.from_config(g.model)
  group.cost_flops = (
    len(members) * group.num_steps * b * c_size * model_lib.flops_per_token(mcfg, c_size)
  )
  group.n_params = n_params(mcfg, c_size)
  return group


def _check_schedule(group: Group, axes: list[str], sweep_cfg) -> None:
  """A ``train.schedule_steps`` of the user's that ends before the group's budget (known only
  now: ``config.validate`` saw the config's ``train.num_steps``)."""
  steps = int(group.cfg.train.get("schedule_steps", 0))
  if steps and steps < group.num_steps:
    path = "train.schedule_steps"
    field = f"sweep.{field_section(sweep_cfg, path)}.{path}" if path in axes else path
    raise ConfigError(
      field,
      steps,
      f"0 (= the group's updates) or at least its {group.num_steps:,} updates "
      f"({group.cap_reason}): a schedule that ended before training would train on at a "
      f"learning rate of 0 [{where(group)}]",
    )


def validate_group(group: Group, axes: list[str], sweep_cfg, devices=None) -> None:
  """Validates a group's run config, an error in a field the grid sets reported under the sweep
  field (``sweep.grid.train.batch_size``, a vmapped field under its own: ``train.lr``), with the
  group's cells. ``devices``: those of the worker that would train it (a list; a plan's
  stand-ins are only counted): ``config.validate`` on them; None: the rules that do not depend
  on the devices (``config.validate_settings``).

  Raises:
    ConfigError: naming the field, the value and what is allowed [the group's cells, B, C, E].
    DataError: data that cannot be found, as ``config.validate``.
  """
  try:
    if devices is None:
      config_lib.validate_settings(group.cfg)
    else:
      config_lib.validate(group.cfg, devices)
  except ConfigError as e:
    field = e.field.split("[")[0]
    reverse = {v: k for k, v in VALUE_FIELDS.items()}
    field = reverse.get(field, field)
    place = where(group)
    if field in axes:
      raise ConfigError(
        f"sweep.{field_section(sweep_cfg, field)}.{field}", e.value, f"{e.allowed} [{place}]"
      ) from None
    raise ConfigError(e.field, e.value, f"{e.allowed} [{place}]") from None


def where(group: Group) -> str:
  return (
    f"the group of cells {ranges([c.id for c in group.cells])}: B = "
    f"{group.cfg.train.batch_size}, C = {group.cfg.train.context_size}, E = "
    f"{group.cfg.ensemble.size} models"
  )


def ranges(ids: list[int]) -> str:
  out, start = [], None
  ids = sorted(ids)
  for i, v in enumerate(ids):
    if start is None:
      start = v
    if i + 1 == len(ids) or ids[i + 1] != v + 1:
      out.append(f"{start}" if start == v else f"{start}-{v}")
      start = None
  return ",".join(out)
