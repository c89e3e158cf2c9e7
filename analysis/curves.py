"""Metric curves: every checkpoint of every model re-evaluated with ihsweep's own metrics.

For each group the ensemble evaluation (``ihsweep.compute.metrics.make_eval_fn``, vmapped over the
group's models and compiled once per group) runs on the group's saved probes at every params
checkpoint, restored lazily one step at a time onto the devices present. The result is one tidy
DataFrame, one row per (cell, step):

  run, group, cell, seed, <grid axes>, batch_size, context_size, n_params, law_updates, step,
  tokens, <metrics>, {ps,la,dla}_layer / _head (the best head), diverged, diverged_step,
  source, n_probes, n_sequences

where <metrics> are the metrics of ``ihsweep.compute.metric_registry`` (``METRICS``, read from it
at call time): ps_max, la_max (the study's logit attribution), dla_max (direct logit
attribution), ar_acc, ar_rank (repeated-token probes), ar_data_acc, ar_data_rank (prompts from
the run's data), icl_score, val_loss, and any metric registered there.

``source`` is 'checkpoint' (recomputed) or 'online' (the run's ``metrics.jsonl``, used for a group
without params checkpoints, or for every group with ``source='online'``). Recomputed rows use the
first ``n_probes`` repeated-token probes and ``n_sequences`` held-out sequences of the run
(``DEFAULT_PROBES``/``DEFAULT_SEQUENCES``; None = all, as online). A model's rows from the update
at which it diverged (cells.csv ``diverged_step``) on have NaN metrics.

Recomputed rows are cached in ``DIR/analysis/curves.parquet`` (written after each group, so an
interrupted analysis keeps what it finished); a rerun only evaluates checkpoints not in the cache,
e.g. those a still-running sweep has written since.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time

import numpy as np
import pandas as pd

from ihsweep.base import sharding as sharding_lib
from ihsweep.base.atomic import atomic_file
from ihsweep.compute import metric_registry, train
from ihsweep.data import make_source
from ihsweep.data import probes as probes_lib
from ihsweep.data.probes import MIN_BLOCK, MIN_BLOCK_REASON, block_length
from ihsweep.runs import checkpoint
from ihsweep.runs.reader import Group, GroupError, Run, device_sharding, unwritable, warn
from ihsweep.training.evaluation import Evaluator

log = logging.getLogger("analysis")


def __getattr__(name: str):
  # METRICS: the registered metrics' names, read from the registry at access time.
  if name == "METRICS":
    return metric_registry.names()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


HEAD_COLUMNS = tuple(
  f"{name}_{part}" for name in metric_registry.HEAD_SCORES for part in ("layer", "head")
)
SOURCES = ("auto", "checkpoints", "online")
# The analysis's evaluation budget per model and checkpoint: the first 12 of the run's 100
# repeated-token probes (12 × 50 scored positions for each head's PS and LA; the study uses 100)
# and 8 of its 32 held-out sequences, about a fifth of the online evaluation's work: 16
# reference-size models × 30 checkpoints in under a minute on 2 CPU cores
# (benchmarks/analysis.py). None = all, exactly the online evaluation.
DEFAULT_PROBES, DEFAULT_SEQUENCES = 12, 8
CACHE_NAME = "curves.parquet"


def _cache_path(run: Run, out_dir: str | None = None) -> str:
  return os.path.join(out_dir or os.path.join(run.dir, "analysis"), CACHE_NAME)


def cache_dir(run: Run, fallback: str) -> str:
  """Where a run's cache lives: ``DIR/analysis`` if it can be written there, else
  ``fallback/cache/<run name>`` (a read-only run directory analysed with ``--out``)."""
  own = os.path.join(run.dir, "analysis")
  if unwritable(own) is None:
    return own
  return os.path.join(fallback, "cache", run.name.replace(os.sep, "_"))


CACHE_KEYS = ("group", "cell", "step", "n_probes", "n_sequences")


def read_cache(path: str, warnings: list[str] | None = None) -> pd.DataFrame:
  """Cached recomputed rows. Empty if there is none; a cache that cannot be read, or whose
  columns are not this version's (e.g. a metric registered since), is recomputed (with a
  warning)."""
  if not os.path.exists(path):
    return pd.DataFrame()
  metrics = metric_registry.names()
  try:
    table = pd.read_parquet(path)
    missing = [c for c in (*CACHE_KEYS, *metrics) if c not in table]
    if missing:
      raise ValueError(f"no columns {missing}")
    for col in CACHE_KEYS[1:]:
      table[col] = pd.to_numeric(table[col], errors="raise").astype(int)
    table["group"] = table["group"].astype(str)
    for col in metrics:
      table[col] = pd.to_numeric(table[col], errors="raise").astype(float)
    return table
  except Exception as e:  # pyarrow and pandas raise several kinds for a damaged file
    warn(
      warnings, f"the cache {path} cannot be used ({type(e).__name__}: {str(e)[:120]}); recomputing"
    )
    return pd.DataFrame()


def _write_cache(path: str, table: pd.DataFrame, warnings: list[str] | None = None) -> bool:
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_file(path, "wb") as f:
      table.to_parquet(f, index=False)
    return True
  except Exception as e:  # OSError, or pyarrow refusing a column
    warn(
      warnings,
      f"cannot write the cache {path} ({type(e).__name__}: {str(e)[:120]}); "
      f"results are kept in memory only",
    )
    return False


def _want_sizes(group: Group, n_probes, n_sequences) -> tuple[int, int]:
  """The (probes, sequences per model) a group is evaluated on: the counts asked for, at most
  what the run has.

  Raises:
    GroupError: the group's probes.npz cannot be read.
  """
  probes = group.probes()
  _check_block(group, probes)
  have_p = len(probes.repeated) if probes is not None else int(group.config.eval.n_probes)
  have_s = probes.sequences.shape[1] if probes is not None else int(group.config.eval.n_sequences)
  return min(n_probes or have_p, have_p), min(n_sequences or have_s, have_s)


def _check_block(group: Group, probes) -> None:
  """Refuses a group whose repeated-token probes are too short to score
  (``ihsweep.data.probes.MIN_BLOCK``).

  Raises:
    GroupError: naming the block length L and the context size C (or eval.probe_len) that
      gives it.
  """
  cannot = (
    f"so the probe metrics (prefix-matching score, logit attribution, associative "
    f"recall) cannot be computed for group {group.id}"
  )
  try:
    if probes is None:
      block_length(group.context_size, int(group.config.eval.get("probe_len", 0)))
    elif probes.block_len < MIN_BLOCK:
      raise ValueError(
        f"the run's probes have blocks of L = {probes.block_len} (train."
        f"context_size = {group.context_size}): {MIN_BLOCK_REASON}"
      )
  except ValueError as e:
    raise GroupError(f"{e}; {cannot}") from None


def _rows_from_host(host: dict, group: Group, step: int) -> list[dict]:
  tokens_per_update = group.batch_size * group.context_size
  rows = []
  for i, cell in enumerate(group.cells["cell"]):
    row = {
      "group": group.id,
      "cell": int(cell),
      "step": int(step),
      "tokens": int(step) * tokens_per_update,
    }
    row.update({m: float(host[m][i]) for m in metric_registry.names()})
    for name in metric_registry.HEAD_SCORES:
      layer, head = (int(v) for v in host[f"{name}_argmax"][i])
      row[f"{name}_layer"], row[f"{name}_head"] = layer, head
    rows.append(row)
  return rows


def _group_probes(group: Group, n_probes: int | None = None, n_sequences: int | None = None):
  """The group's saved probes, or the same probes made again from its config (evaluation was
  off while training); with ``n_probes`` / ``n_sequences``, the first that many repeated-token
  probes / held-out sequences per model."""
  probes = group.probes()
  if probes is None:
    log.warning(
      "group %s has no probes.npz (evaluation was off): making the probes from its "
      "config's eval section",
      group.id,
    )
    try:
      probes = _make_probes(group)
    except Exception as e:  # e.g. a corpus that is not on this machine
      raise GroupError(
        f"group {group.id}: no probes.npz, and they cannot be made again from "
        f"its config ({type(e).__name__}: {str(e)[:160]})"
      ) from None
  return dataclasses.replace(
    probes,
    repeated=probes.repeated[: n_probes or None],
    sequences=probes.sequences[:, : n_sequences or None],
    recall=probes.recall[:, : n_sequences or None],
  )


def _make_probes(group: Group):
  import jax

  cfg = group.config
  mcfg, tcfg = train.model_and_train_config(cfg)
  source = make_source(cfg.data, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  n = group.n_models
  data_params = jax.tree_util.tree_map(np.asarray, source.data_params(n))
  arrays = jax.tree_util.tree_map(np.asarray, source.arrays()) if source.on_device else None
  return probes_lib.make_probes(source, data_params, arrays, cfg.eval, n, tcfg.context_size)


def evaluate_group(
  group: Group,
  steps: list[int],
  *,
  n_probes: int | None = None,
  n_sequences: int | None = None,
  bar=None,
  warnings: list[str] | None = None,
) -> pd.DataFrame:
  """Recomputes the metrics of every model of ``group`` at ``steps`` (params checkpoints).

  One evaluation program is compiled for the group (``ihsweep.training.evaluation.Evaluator``: the
  metric functions vmapped over the ensemble, split over the local devices); while step k is
  evaluated on the devices, step k + 1's params are read from disk. A checkpoint that cannot be
  restored (damaged by hand, deleted while reading) is skipped with a warning; one whose orbax
  metadata file is damaged but whose params restore is used, with a warning naming the file and
  what was wrong (``damaged_metadata_warnings``). ``n_probes`` /
  ``n_sequences``: evaluate on the first that many of the run's probes / held-out sequences
  (None: all, exactly as online).

  Returns:
    DataFrame with columns ``group, cell, step, tokens``, the registered metrics
    (``METRICS``) and ``HEAD_COLUMNS``.
  """
  import jax

  if not steps:
    return pd.DataFrame()
  warnings = [] if warnings is None else warnings
  _check_block(group, group.probes())
  mesh, ens = device_sharding(group.n_models)
  mcfg, _ = train.model_and_train_config(group.config)
  probes = _group_probes(group, n_probes, n_sequences)
  evaluator = Evaluator(group.config, mcfg, probes, mesh)
  sizes = {"n_probes": len(probes.repeated), "n_sequences": probes.sequences.shape[1]}
  rows: list[dict] = []
  pending = None
  restored: list[int] = []

  def collect(item):
    step, out = item
    rows.extend(dict(r, **sizes) for r in _rows_from_host(sharding_lib.to_host(out), group, step))
    if bar is not None:
      bar.update(1)

  def restore(step):
    try:
      return group.params(step, sharding=ens), None
    except Exception as e:  # orbax raises many kinds for a damaged step
      return None, e

  # One reader thread: step k + 1 is restored from disk while step k is evaluated.
  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="restore") as reader:
    future = reader.submit(restore, steps[0])
    for k, step in enumerate(steps):
      params, error = future.result()
      if k + 1 < len(steps):
        future = reader.submit(restore, steps[k + 1])
      if error is not None:
        msg = (
          f"group {group.id}: the checkpoint at update {step} cannot be restored "
          f"({checkpoint.error_text(error)}); skipped"
        )
        log.warning("%s", msg)
        warnings.append(msg)
        if bar is not None:
          bar.update(1)
        continue
      lead = {x.shape[0] for x in jax.tree_util.tree_leaves(params)}
      if lead != {group.n_models}:
        raise GroupError(
          f"group {group.id}: its checkpoints hold {sorted(lead)} models but its "
          f"config and cells list {group.n_models}; skipped"
        )
      restored.append(step)
      out = evaluator(params)  # dispatched asynchronously
      if pending is not None:
        collect(pending)
      pending = (step, out)
    if pending is not None:
      collect(pending)
  for msg in damaged_metadata_warnings(group, restored):
    log.warning("%s", msg)
    warnings.append(msg)
  return pd.DataFrame(rows)


def damaged_metadata_warnings(group: Group, steps: list[int]) -> list[str]:
  """One line per orbax metadata file of ``group``'s params checkpoints at ``steps`` (restored)
  that orbax could not parse or read (``checkpoint.damaged_metadata``): group, update, file,
  what was wrong. Orbax restores the arrays without it (a checkpoint's ``_CHECKPOINT_METADATA``
  holds its custom metadata and timestamps)."""
  root = os.path.join(group.checkpoints().directory, "params")
  out = []
  for path, what in sorted(checkpoint.damaged_metadata(root).items()):
    step = os.path.relpath(path, root).split(os.sep)[0]
    if step.isdigit() and int(step) in steps:
      out.append(
        f"group {group.id}: the checkpoint at update {step} has a damaged metadata file "
        f"{os.path.relpath(path, group.dir)} ({what}); its params were read without it"
      )
  return out


def _online_rows(group: Group, warnings: list[str]) -> pd.DataFrame:
  online = group.online_metrics(warnings)
  if online.empty:
    return online
  online = online.copy()
  online["group"] = group.id
  for name in metric_registry.HEAD_SCORES:
    col = f"{name}_argmax"
    if col in online:
      pairs = online[col].apply(
        lambda v: v if isinstance(v, list) and len(v) == 2 else [None, None]
      )
      online[f"{name}_layer"] = pairs.str[0]
      online[f"{name}_head"] = pairs.str[1]
  keep = ["group", "cell", "step", "tokens", *metric_registry.names(), *HEAD_COLUMNS]
  online = online[[c for c in keep if c in online]]
  return online


def compute_curves(
  run: Run,
  *,
  source: str = "auto",
  cache: bool = True,
  n_probes: int | None = DEFAULT_PROBES,
  n_sequences: int | None = DEFAULT_SEQUENCES,
  out_dir: str | None = None,
  progress: bool = True,
) -> pd.DataFrame:
  """The run's metric curves (module docstring), recomputing only checkpoints not yet cached.

  Args:
    run: from ``ihsweep.runs.reader.load_run``.
    source: 'auto' (checkpoints where a group has them, its metrics.jsonl otherwise),
      'checkpoints' (groups without checkpoints are skipped with a warning) or 'online'.
    cache: read and update ``<out_dir or DIR/analysis>/curves.parquet``.
    n_probes / n_sequences: how many of the run's repeated-token probes / held-out sequences per
      model to evaluate (the first ones; None = all, exactly the online evaluation). The
      defaults trade the study's 100 probes for speed (see ``DEFAULT_PROBES``); cached rows
      computed with other counts are recomputed.
    progress: a tqdm bar over the checkpoints to evaluate.

  Raises:
    ValueError: unknown ``source``.
  """
  from tqdm.auto import tqdm

  if source not in SOURCES:
    raise ValueError(f"source = {source!r}: allowed {', '.join(SOURCES)}")
  path = _cache_path(run, out_dir)
  store = read_cache(path, run.warnings) if cache and source != "online" else pd.DataFrame()
  todo, sizes, on_disk, online_groups = _checkpoints_to_evaluate(
    run, source, store, n_probes, n_sequences
  )

  def skip(group: Group, error: Exception) -> None:
    warn(run.warnings, f"{error}; the group is skipped")
    todo.pop(group.id, None)

  total = sum(len(v) for v in todo.values())
  if total:
    log.info(
      "recomputing metrics at %d checkpoint(s) of %d group(s) in %s",
      total,
      sum(1 for v in todo.values() if v),
      run.dir,
    )
  t0 = time.perf_counter()
  with tqdm(
    total=total,
    disable=not progress or not total,
    unit="ckpt",
    desc=f"metrics {run.name}",
    dynamic_ncols=True,
  ) as bar:
    for group in run.groups:
      steps = todo.get(group.id)
      if not steps:
        continue
      try:
        fresh = evaluate_group(
          group, steps, n_probes=n_probes, n_sequences=n_sequences, bar=bar, warnings=run.warnings
        )
      except GroupError as e:
        skip(group, e)
        continue
      if fresh.empty:
        continue
      if not store.empty:
        store = store[~(_matching(store, group.id, sizes) & store["step"].isin(fresh["step"]))]
      store = pd.concat([store, fresh], ignore_index=True) if not store.empty else fresh
      if cache:
        _write_cache(path, store.sort_values(list(CACHE_KEYS)), run.warnings)
  if total:
    log.info("metrics recomputed in %.1f s", time.perf_counter() - t0)
  return _curves_table(run, store, todo, sizes, on_disk, online_groups)


def _curves_table(
  run: Run, store, todo: dict, sizes: dict, on_disk: dict, online_groups
) -> pd.DataFrame:
  """The recomputed rows of the checkpoints still on disk (the cache may also hold steps whose
  checkpoints are gone: not shown) and the online groups' rows, with the cells' columns."""
  parts = []
  for gid in todo:
    if not store.empty:
      parts.append(store[_matching(store, gid, sizes) & store["step"].isin(on_disk[gid])])
  recomputed = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
  if not recomputed.empty:
    recomputed["source"] = "checkpoint"
  online = _online_curves(online_groups, run)
  table = (
    pd.concat([recomputed, *online], ignore_index=True)
    if (not recomputed.empty or online)
    else pd.DataFrame(columns=["group", "cell", "step"])
  )
  return _with_cells(table, run)


def _matching(table: pd.DataFrame, gid: str, sizes: dict) -> pd.Series:
  """Rows of ``table`` for group ``gid`` computed with its wanted probe and sequence counts."""
  want_p, want_s = sizes[gid]
  return (table["group"] == gid) & (table["n_probes"] == want_p) & (table["n_sequences"] == want_s)


def _checkpoints_to_evaluate(run: Run, source: str, store: pd.DataFrame, n_probes, n_sequences):
  """``(todo, sizes, on_disk, online groups)`` for ``compute_curves``: per group with params
  checkpoints the steps not yet in ``store``, its (probes, sequences) counts and every saved
  step; the groups read from their metrics.jsonl instead."""
  todo: dict[str, list[int]] = {}
  sizes: dict[str, tuple[int, int]] = {}
  on_disk: dict[str, set] = {}
  online_groups = []
  for group in run.groups:
    steps = [] if source == "online" else group.steps()
    if not steps:
      if source == "checkpoints":
        warn(run.warnings, f"group {group.id} has no params checkpoints yet; skipped")
      else:
        online_groups.append(group)
      continue
    try:
      sizes[group.id] = _want_sizes(group, n_probes, n_sequences)
    except GroupError as e:
      warn(run.warnings, f"{e}; the group is skipped")
      todo.pop(group.id, None)
      continue
    on_disk[group.id] = set(steps)
    done = set()
    if not store.empty:
      mine = store[_matching(store, group.id, sizes)]
      done = {s for s, n in mine.groupby("step").size().items() if n == group.n_models}
    todo[group.id] = [s for s in steps if s not in done]
  return todo, sizes, on_disk, online_groups


def _online_curves(online_groups: list, run: Run) -> list:
  """The metrics.jsonl rows of groups without params checkpoints (``source`` 'online')."""
  online = []
  for g in online_groups:
    rows = _online_rows(g, run.warnings)
    if rows.empty:
      warn(
        run.warnings, f"group {g.id} has neither params checkpoints nor metrics.jsonl rows; skipped"
      )
    else:
      online.append(rows.assign(source="online"))
  return online


def _with_cells(table: pd.DataFrame, run: Run) -> pd.DataFrame:
  """Joins the cells' coordinates and blanks metrics after a model diverged."""
  cell_cols = [
    "cell",
    "seed",
    *run.axes,
    "batch_size",
    "context_size",
    "n_params",
    "law_updates",
    "diverged",
    "diverged_step",
  ]
  cells = run.cells[[c for c in cell_cols if c in run.cells]]
  out = table.drop(columns=[c for c in cells.columns if c != "cell" and c in table])
  out = out.merge(cells, on="cell", how="left")
  out.insert(0, "run", run.name)
  metric_cols = [m for m in metric_registry.names() if m in out]
  if "diverged_step" in out:
    # From the update at which its loss turned NaN/inf on, a model's params are not a model's.
    after = out["diverged_step"].notna() & (out["step"] >= out["diverged_step"].fillna(0))
    out.loc[after.to_numpy(dtype=bool), metric_cols] = np.nan
  for m in metric_cols:
    out[m] = pd.to_numeric(out[m], errors="coerce").astype(float)
  return out.sort_values(["run", "cell", "step"]).reset_index(drop=True)


def load_curves(runs: list[Run], out_dir: str | None = None, **kwargs) -> pd.DataFrame:
  """``compute_curves`` for several runs, concatenated (the ``run`` column tells them apart);
  each run's cache in ``cache_dir(run, out_dir)`` when ``out_dir`` is given."""
  tables = [
    compute_curves(r, out_dir=cache_dir(r, out_dir) if out_dir else None, **kwargs) for r in runs
  ]
  return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
