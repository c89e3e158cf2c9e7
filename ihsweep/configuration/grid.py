"""Planning a sweep: a config's grid → cells → groups of equal shapes, with their budgets and
costs. Pure host work: validates every group's config before anything is compiled.

A **cell** is one model: a grid point (values of the config fields in ``sweep.grid`` and
``sweep.zip``) and a seed. Cells whose configs differ only in values the trainer vmaps — the
seed, ``train.lr`` and the Markov knobs ``data.frequency`` / ``data.reliability`` — form one
**group**, trained as one ensemble by one compiled program (``runner.fit``); anything else
(batch size, context size, model shape, vocabulary, schedule, …) makes a separate group.

Groups are ordered by predicted cost, most expensive first: E · updates · B · C · training
FLOPs per token (``model.flops_per_token``), where updates is the group's budget.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os
from typing import Any

import numpy as np

from ihsweep.base import schema
from ihsweep.base.law import Law
from ihsweep.compute import metric_registry
from ihsweep.compute import model as model_lib
from ihsweep.compute.model import Transformer
from ihsweep.configuration import config as config_lib
from ihsweep.configuration import data_rules, fields
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
# Fields a sweep sets itself (not grid axes).
PLANNER_FIELDS = (
  "seed",
  "ensemble.size",
  "ensemble.seeds",
  "ensemble.cell_ids",
  "ensemble.peak_lrs",
  "data.frequencies",
  "data.reliabilities",
  "train.num_steps",
)


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


def get_field(cfg, path: str):
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
    raise ConfigError(
      sweep_field, value, f"a value {path} can hold ({type(e).__name__}: {e})"
    ) from None


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
    raise ConfigError(
      field,
      values,
      "distinct values (a repeated value trains the same cells "
      "twice; use sweep.seeds for replicates)",
    )
  return list(values)


def _check_axis_field(cfg, section: str, path: str) -> None:
  field = f"sweep.{section}.{path}"
  if path.startswith("sweep.") or path in PLANNER_FIELDS:
    raise ConfigError(
      field,
      "(axis)",
      "an axis over any config field except the sweep section "
      "and the fields the planner sets: "
      + ", ".join(PLANNER_FIELDS)
      + " (vary seeds with sweep.seeds, learning rates with sweep.grid.train.lr)",
    )
  try:
    value = get_field(cfg, path)
  except (KeyError, AttributeError):
    raise ConfigError(
      field, "(axis)", f"an existing config field ({path} is not one; see configs/default.py)"
    ) from None
  if hasattr(value, "keys"):
    raise ConfigError(field, "(axis)", f"a field, not the section {path}")
  if path in fields.EXECUTION_FIELDS:
    raise ConfigError(
      field,
      "(axis)",
      f"an axis over a field that changes the trained models; "
      f"{path} only changes how a run executes (so do "
      f"{', '.join(fields.EXECUTION_FIELDS)}): its cells would be copies",
    )


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
    raise ConfigError(
      f"sweep.zip.{path}",
      get_field(sweep.zip, path),
      "an axis of sweep.grid or sweep.zip, not both",
    )
  factors = [[{p: v} for v in values] for p, values in grid]
  if zipped:
    n = len(zipped[0][1])
    for path, values in zipped:
      if len(values) != n:
        raise ConfigError(
          f"sweep.zip.{path}",
          tuple(values),
          f"{n} values, as many as sweep.zip.{zipped[0][0]} (zipped axes vary together)",
        )
    zip_points = [{p: values[i] for p, values in zipped} for i in range(n)]
    if len({_key(p) for p in zip_points}) != n:
      raise ConfigError(
        "sweep.zip",
        {p: tuple(v) for p, v in zipped},
        "distinct points (zipped axes whose tuples repeat a combination train "
        "the same cells twice; use sweep.seeds for replicates)",
      )
    factors.append(zip_points)
  points = [
    {k: v for part in combo for k, v in part.items()} for combo in itertools.product(*factors)
  ]
  return [p for p, _ in grid] + [p for p, _ in zipped], points


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


BUDGET_WORDS = {
  "tokens": "ceil(sweep.tokens / (B·C))",
  "law": "sweep.law_multiple × the law's prediction for its B and C",
  "emergence": "at most sweep.law_multiple × the law's prediction for its B and C, stopping early",
}


def set_by_sweep(cfg) -> list[tuple[str, tuple, str]]:
  """The fields that ``cfg``'s sweep settings set for each group, or never read:
  ``(field, values it may keep, why)``. A value outside those (in the config, from
  ``--config.X=V``, or on an axis) would not reach the groups' config.json; ``check_settings``
  refuses it. (The per-model tuples, ``ensemble.seeds`` …, are ``config.validate_sweep``'s; axes
  over the fields the planner fills, ``PLANNER_FIELDS``, ``grid_points``'.)"""
  sweep = cfg.sweep
  budget, horizon = sweep.budget, sweep.get("schedule_horizon", "budget")
  out = []

  def default(path):
    return (schema.field(path).default,)

  if budget != "updates":
    out.append(
      (
        "train.num_steps",
        default("train.num_steps"),
        f"sweep.budget = {budget!r} sets each group's updates ({BUDGET_WORDS[budget]}); give "
        f"the updates with sweep.budget = 'updates', or leave train.num_steps out",
      )
    )
  if horizon == "tokens":
    out.append(
      (
        "train.schedule_steps",
        default("train.schedule_steps"),
        "sweep.schedule_horizon = 'tokens' sets each group's schedule to ceil(sweep.tokens / "
        "(B·C)) updates; keep yours with sweep.schedule_horizon = 'budget', or leave "
        "train.schedule_steps out",
      )
    )
  if sweep.seeds:
    out.append(
      (
        "ensemble.size",
        (*default("ensemble.size"), int(sweep.seeds)),
        f"sweep.seeds = {sweep.seeds} sets the models per grid point (ensemble.size is read "
        f"only where sweep.seeds is 0); give the number in one of them",
      )
    )
  if budget not in ("law", "emergence"):
    out.append(
      (
        "sweep.law_multiple",
        default("sweep.law_multiple"),
        f"only sweep.budget 'law' or 'emergence' reads it (sweep.budget = {budget!r})",
      )
    )
  if budget != "emergence":
    for name in ("stop_metric", "stop_threshold", "stop_margin"):
      out.append(
        (
          f"sweep.{name}",
          default(f"sweep.{name}"),
          f"only sweep.budget 'emergence' reads it (sweep.budget = {budget!r})",
        )
      )
  if budget != "tokens" and horizon != "tokens":
    out.append(
      (
        "sweep.tokens",
        default("sweep.tokens"),
        f"only sweep.budget 'tokens' or sweep.schedule_horizon 'tokens' reads it "
        f"(sweep.budget = {budget!r}, sweep.schedule_horizon = {horizon!r})",
      )
    )
  return out


def check_settings(cfg) -> None:
  """The one rule for what a user sets: a config field reaches every group's config.json
  unchanged (the value in the config, from ``--config.X=V``, or each value of an axis), or it
  is refused here, before anything is built, naming the field, the value and what sets it
  (``set_by_sweep``). Values equal to the schema's default are taken as not set.

  Raises:
    ConfigError: the first field set that the sweep would overwrite or not read.
  """
  for path, keep, why in set_by_sweep(cfg):
    for section in ("grid", "zip"):
      try:
        values = get_field(cfg.sweep[section], path)
      except (KeyError, AttributeError):
        continue
      raise ConfigError(f"sweep.{section}.{path}", tuple(values), f"no axis over {path}: {why}")
    try:
      value = get_field(cfg, path)
    except (KeyError, AttributeError):  # a config written before the field
      continue
    if all(_key(value) != _key(v) for v in keep):
      allowed = " or ".join([f"{keep[0]!r} (its default)", *map(repr, keep[1:])])
      raise ConfigError(path, value, f"{allowed}: {why}")


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
    path = next(p for p in axes if _key(other.coords[p]) != _key(cell.coords[p]))
    a, b = other.coords[path], cell.coords[path]
    name = path.split(".")[1] if path.startswith("data.") else ""
    if name in unread_fields(cell.cfg.data):
      why = (
        f"data.source = {data_rules.source_words([source_kind(cell.cfg.data)])} does not read "
        f"{path}; only data.source = {data_rules.source_words(readers(name))} does"
      )
    else:
      why = f"{a!r} and {b!r} are the same value {get_field(cell.cfg, path)!r} once {path} holds it"
    section = _section(cfg, path)
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


def n_params(mcfg, context_size: int) -> int:
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
    return [len(v) if isinstance(v, (tuple, list)) else 1 for _, v in _leaves(section)]

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
  sweep section and every group's run config; compiles nothing.

  Raises:
    ConfigError: naming the ``sweep.*`` field (or the config field) and the value at fault.
    DataError: data that cannot be found (e.g. a missing corpus), as ``config.validate``.
  """
  import jax

  if "sweep" not in cfg:
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
      cfg.sweep = fields.default_sweep()
  n_devices = len(jax.devices())
  config_lib.validate_sweep(cfg, n_devices)
  n_seeds = cfg.sweep.seeds or cfg.ensemble.size
  _check_cell_count(cfg, n_seeds)
  axes, points = grid_points(cfg)
  check_settings(cfg)
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
    _validate_group(group, axes, cfg)  # B and C are valid from here on: the law can use them
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
    groups.append(group)
  groups.sort(key=lambda g: (-g.cost_flops, g.cells[0].id))
  for i, group in enumerate(groups):
    group.id = f"g{i:03d}"
    for cell in group.cells:
      cell.group = group.id
  return Plan(cells=cells, groups=groups, axes=axes, budget=cfg.sweep.budget)


def _check_schedule(group: Group, axes: list[str], sweep_cfg) -> None:
  """A ``train.schedule_steps`` of the user's that ends before the group's budget (known only
  now: ``config.validate`` saw the config's ``train.num_steps``)."""
  steps = int(group.cfg.train.get("schedule_steps", 0))
  if steps and steps < group.num_steps:
    path = "train.schedule_steps"
    field = f"sweep.{_section(sweep_cfg, path)}.{path}" if path in axes else path
    raise ConfigError(
      field,
      steps,
      f"0 (= the group's updates) or at least its {group.num_steps:,} updates "
      f"({group.cap_reason}): a schedule that ended before training would train on at a "
      f"learning rate of 0 [{where(group)}]",
    )


def _section(cfg, path: str) -> str:
  """'grid' or 'zip': which sweep section holds the axis ``path``."""
  try:
    get_field(cfg.sweep.grid, path)
    return "grid"
  except (KeyError, AttributeError):
    return "zip"


def _validate_group(group: Group, axes: list[str], sweep_cfg) -> None:
  """``config.validate`` of a group's run config; an error in a field the grid sets is reported
  under the sweep field, with the group's cells."""
  try:
    config_lib.validate(group.cfg, _worker_devices(group.cfg))
  except ConfigError as e:
    field = e.field.split("[")[0]
    reverse = {v: k for k, v in VALUE_FIELDS.items()}
    field = reverse.get(field, field)
    place = where(group)
    if field in axes:
      raise ConfigError(
        f"sweep.{_section(sweep_cfg, field)}.{field}", e.value, f"{e.allowed} [{place}]"
      ) from None
    raise ConfigError(e.field, e.value, f"{e.allowed} [{place}]") from None


def _worker_devices(cfg) -> list:
  """The devices of the worker that will train a group (``sweep`` module: placement 'worker')."""
  import jax

  return jax.local_devices()[: cfg.mesh.num_devices or None]


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
      cfg.sweep = fields.default_sweep()
    for spec in specs:
      path, sep, text = spec.partition("=")
      path = path.strip()
      if path in seen:
        raise ConfigError(
          f"sweep.{section}.{path}",
          spec,
          "one --grid/--zip flag per field (give all its values in one: FIELD=V1,V2,...)",
        )
      seen.add(path)
      if not sep or not path:
        raise ConfigError(
          f"sweep.{section}", spec, "FIELD=V1,V2,... (e.g. --grid=train.batch_size=8,16)"
        )
      items = [item.strip() for item in text.split(",")]
      if not any(items):
        raise ConfigError(
          f"sweep.{section}.{path}",
          spec,
          f"at least one value: the axis has none (FIELD=V1,V2,..., e.g. --grid={path}=V1,V2)",
        )
      if not all(items):
        raise ConfigError(
          f"sweep.{section}.{path}",
          spec,
          "a value between every two commas "
          f"(value {items.index('') + 1} of {len(items)} is empty)",
        )
      values = []
      for item in items:
        try:
          value = ast.literal_eval(item)
        except (ValueError, SyntaxError):
          value = item
        if item.lower().lstrip("+-") in ("nan", "inf", "infinity") or (
          isinstance(value, float) and not math.isfinite(value)
        ):
          raise ConfigError(
            f"sweep.{section}.{path}",
            item,
            f"a finite number (or another value "
            f"{path} can hold): NaN and infinity are not allowed for any field",
          )
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
