"""A run directory's config and logs across a resume: ``config.json`` written at the start
(``write_resolved_config``), the check that a resumed config keeps the run's numbers
(``check_resumable``), and the logs cut back to the restored step (``line_up_logs``)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ihsweep import data
from ihsweep.base import atomic, sharding
from ihsweep.configuration import fields
from ihsweep.runs import rundir
from ihsweep.training import hooks
from ihsweep.training.evaluation import replay

log = logging.getLogger("ihsweep")


def _jsonable(cfg) -> dict:
  return json.loads(cfg.to_json_best_effort()) if hasattr(cfg, "to_json_best_effort") else cfg


def write_resolved_config(cfg, workdir: str) -> str:
  """Writes ``workdir/config.json`` (every field, after command-line overrides)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  atomic.atomic_write_json(path, _jsonable(cfg), sort_keys=True)
  return path


RESUME_FREE_FIELDS = (*fields.EXECUTION_FIELDS, "checkpoint.")
"""Fields a resumed run may change (a trailing dot: a whole section): they move work between
devices, calls and workers, or choose what is saved, not the numbers (a run directory made
before such a field existed resumes under any value of it). Everything else — including
``train.num_steps``, which sets the learning-rate schedule — must match."""


def _flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_resumable(cfg, workdir: str) -> None:
  """Refuses to resume a run directory under a config that changes its numbers.

  Raises:
    ConfigError: naming the first field whose value differs from the stored ``config.json``
      (fields in ``RESUME_FREE_FIELDS`` may differ); ``WorkdirError`` if that file is missing
      or unreadable, or if the sweep's axes differ (``_check_same_axes``).
  """
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      old = _flatten(json.load(f))
  except (OSError, ValueError) as e:
    raise fields.WorkdirError(
      workdir,
      f"a run directory whose config.json can be read to check the resumed "
      f"config ({e}); its checkpoints cannot be verified: use a new --workdir",
    ) from None
  new = _flatten(_jsonable(cfg))
  _check_same_axes(old, new, workdir)
  for field in sorted(set(old) | set(new)):
    free = any(field == f or (f.endswith(".") and field.startswith(f)) for f in RESUME_FREE_FIELDS)
    if free or old.get(field) == new.get(field):
      continue
    if field not in old and new.get(field) == _added_field_default(field):
      continue  # a field added after the run was made, at its default: the run's behaviour
    if field in old:
      was = f"{old[field]!r}, as in the run being resumed in {workdir}"
    else:
      default = _added_field_default(field)
      was = f"absent from the run being resumed in {workdir} (made before the field existed" + (
        f"; its default {default!r} reproduces that run)" if default is not _MISSING else ")"
      )
    raise fields.ConfigError(
      field,
      new.get(field, "(absent)"),
      f"{was} (it has checkpoints); use a new --workdir to train with a different value",
    )


def _axes(flat: dict, section: str) -> dict:
  """The axes of ``sweep.<section>`` (grid or zip) in a flattened config: field -> values."""
  prefix = f"sweep.{section}."
  return {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}


def _check_same_axes(old: dict, new: dict, workdir: str) -> None:
  """Refuses a rerun whose sweep axes (``sweep.grid``, ``sweep.zip``: the config's and the
  ``--grid``/``--zip`` flags') differ from those of the run in ``workdir``, naming each axis
  added, dropped or changed with its values: its checkpoints are of its own cells."""
  shown = lambda v: "(" + ", ".join(map(str, v)) + ")" if isinstance(v, list) else repr(v)  # noqa: E731
  changes, had = [], []
  for section in ("grid", "zip"):
    was, now = _axes(old, section), _axes(new, section)
    kind = "axis" if section == "grid" else "zip axis"
    had += [f"{axis} = {shown(v)}" for axis, v in sorted(was.items())]
    for axis in sorted(set(was) | set(now)):
      if axis not in was:
        changes.append(f"adds the {kind} {axis} = {shown(now[axis])}")
      elif axis not in now:
        changes.append(f"drops the {kind} {axis} = {shown(was[axis])}")
      elif was[axis] != now[axis]:
        changes.append(f"changes the {kind} {axis} from {shown(was[axis])} to {shown(now[axis])}")
  if changes:
    raise fields.WorkdirError(
      workdir,
      "",
      f"--workdir={workdir} holds a sweep over another grid: this run "
      f"{'; '.join(changes)} (the run directory's axes: {', '.join(had) or 'none'}); its "
      f"checkpoints are of that grid's cells: rerun with its axes to resume it, or use a new "
      f"--workdir for this grid",
    )


_MISSING = object()
# Fields of other sections added after runs were made, at the value that reproduces those runs.
ADDED_FIELDS = {"train.schedule_steps": 0, "sweep.schedule_horizon": "budget"}


def _added_field_default(field: str):
  """The default of a ``data``/``eval`` field (``data.default_config``,
  ``fields.default_eval``) or of one in ``ADDED_FIELDS``, or a sentinel equal to nothing. Such
  a field added to ihsweep defaults to what runs did before it existed (e.g.
  ``data.induction_start`` 'half', ``eval.probe_position`` 'start', ``train.schedule_steps``
  0), so a run directory made before it resumes at that value."""
  if field in ADDED_FIELDS:
    return ADDED_FIELDS[field]
  section, _, rest = field.partition(".")
  defaults = {"data": data.default_config, "eval": fields.default_eval}.get(section)
  node = defaults() if defaults else None
  for key in rest.split("."):
    if node is None or not hasattr(node, "keys") or key not in node:
      return _MISSING
    node = node[key]
  return tuple(node) if isinstance(node, list) else node


def _rewrite_jsonl(path: str, rows: list[dict]) -> None:
  with atomic.atomic_file(path) as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def line_up_logs(
  workdir: str, team, start, schedule, n_models: int, stop_rule=None, loss_dtype=np.float32
) -> tuple:
  """Starts the logs afresh (``start`` None), or cuts them back to the restored update
  ``start`` (what was logged after it will be logged again, identically); the stop rule's
  record is replayed from them. Every process of ``team`` reads; its lead writes.
  ``loss_dtype``: the dtype the run computes its loss in (``ModelConfig.accum_dtype``), which
  its logged losses hold exactly.

  Returns:
    ``(evaluated, loss_sum, loss_updates)``: whether all of update ``start``'s evaluation rows
    were logged before; the training loss (per model, ``[E]`` float64, summed over updates by
    ``hooks.add_call_loss`` as the live run sums it) and the updates since the last evaluation
    logged, which its next row averages.
  """
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  log_path = os.path.join(workdir, "train_log.jsonl")
  done, every, evaluated = start or 0, schedule.eval_every, False
  if start is None:
    train_rows = []
    sharding.barrier("ihsweep-fit-fresh", team)  # nobody still reads the old files
    if team.leads:
      for path in (metrics_path, log_path):
        if os.path.exists(path):
          log.warning("replacing %s: no checkpoint to resume from in %s", path, workdir)
          os.remove(path)
  else:
    train_rows = [r for r in rundir.read_jsonl(log_path, warn=True) if r["step"] <= done]
    rows = [r for r in rundir.read_jsonl(metrics_path, warn=True) if r["step"] <= done]
    # The resumed step's evaluation rows, if all were logged before the kill.
    evaluated = sum(r["step"] == done for r in rows) == n_models
    if not evaluated:
      rows = [r for r in rows if r["step"] < done]
    if stop_rule is not None:
      replay(stop_rule, rows, stop_rule.metric)
    sharding.barrier("ihsweep-fit-read", team)  # all have read before the rewrite
    if team.leads:
      _rewrite_jsonl(log_path, train_rows)
      _rewrite_jsonl(metrics_path, rows)
  last_eval = 0  # the last evaluation logged: at `done` if its rows were, else the one before
  if every and done:
    last_eval = done if evaluated and schedule.eval_due(done) else schedule.last_eval(done)
  loss_sum, loss_updates = np.zeros(n_models), 0
  for r in train_rows:
    if r["step"] > last_eval:
      # The live run's float32 (not the JSON's float64) products, so the next row's mean
      # is bit-equal to an uninterrupted run's; null (diverged) -> NaN.
      hooks.add_call_loss(loss_sum, np.asarray(r["loss"], loss_dtype), r["updates"])
      loss_updates += r["updates"]
  return evaluated, loss_sum, loss_updates


def check_config(cfg, workdir: str) -> None:
  """``check_resumable`` when ``workdir`` holds checkpoints (params-only too: saved steps are
  never overwritten); nothing for a fresh directory."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if any(
    os.path.isdir(os.path.join(ckpt_dir, kind)) and os.listdir(os.path.join(ckpt_dir, kind))
    for kind in ("params", "state")
  ):
    check_resumable(cfg, workdir)
