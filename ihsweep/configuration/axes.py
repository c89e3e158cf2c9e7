"""A sweep's axes: the config fields its grid and zip set (``sweep.grid``, ``sweep.zip``), read
and checked (``grid_points``: the grid points in order), the fields a sweep sets for every cell
(``set_by_sweep``) that an override must not also set (``check_settings``), and the axes the
command line adds (``add_axes``: ``--grid`` / ``--zip``). Pure host work, before any group is
made (``grid.make_plan``)."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from ihsweep.base import schema
from ihsweep.configuration import fields
from ihsweep.configuration.fields import ConfigError

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


def get_field(cfg, path: str):
  node = cfg
  for part in path.split("."):
    node = node[part]
  return node


def _a(kind: type) -> str:
  """'an int', 'a str': a type's name with its article."""
  return f"{'an' if kind.__name__[0] in 'aeiou' else 'a'} {kind.__name__}"


def set_field(cfg, path: str, value, sweep_field: str) -> None:
  *parents, name = path.split(".")
  node = cfg
  for part in parents:
    node = node[part]
  try:
    node[name] = value
  except (TypeError, ValueError, KeyError) as e:
    old = node[name] if name in node else None
    if isinstance(e, TypeError) and old is not None:  # ml_collections keeps a field's type
      allowed = f"{_a(type(old))}, the type of {path} ({value!r} is {_a(type(value))})"
    else:
      allowed = f"a value {path} can hold ({type(e).__name__}: {e})"
    raise ConfigError(sweep_field, value, allowed) from None


def leaves(node, prefix: str = "") -> list[tuple[str, Any]]:
  """(dotted path, value) of a nested ConfigDict's leaves."""
  out = []
  for key in sorted(node.keys()):
    value = node[key]
    if hasattr(value, "keys"):
      out += leaves(value, f"{prefix}{key}.")
    else:
      out.append((f"{prefix}{key}", value))
  return out


def value_key(value) -> str:
  return json.dumps(value, sort_keys=True, default=str)


def _axis_values(section: str, path: str, values, distinct: bool = True) -> list:
  field = f"sweep.{section}.{path}"
  if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
    raise ConfigError(field, values, "a tuple of values, e.g. (8, 16)")
  if len(values) == 0:
    raise ConfigError(field, values, "a non-empty tuple of values (an empty axis has no cells)")
  if distinct and len({value_key(v) for v in values}) != len(values):
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
  grid = [(p, _axis_values("grid", p, v)) for p, v in leaves(sweep.grid)]
  # A zip axis may repeat a value (transitions = ('synthetic', 'synthetic', 'iid')); its
  # points, the tuples across all zip axes, must be distinct (checked below).
  zipped = [(p, _axis_values("zip", p, v, distinct=False)) for p, v in leaves(sweep.zip)]
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
    if len({value_key(p) for p in zip_points}) != n:
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
    if all(value_key(value) != value_key(v) for v in keep):
      allowed = " or ".join([f"{keep[0]!r} (its default)", *map(repr, keep[1:])])
      raise ConfigError(path, value, f"{allowed}: {why}")


def field_section(cfg, path: str) -> str:
  """'grid' or 'zip': which sweep section holds the axis ``path``."""
  try:
    get_field(cfg.sweep.grid, path)
    return "grid"
  except (KeyError, AttributeError):
    return "zip"


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
