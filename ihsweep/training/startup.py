"""A run's start-up, before its first host call: the initial state on the group's mesh, the
checkpoints it resumes from, and the evaluation's probes and program (``start``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import zipfile
from typing import Any

import jax
import numpy as np

from ihsweep.base import sharding
from ihsweep.compute import schedule as schedule_lib
from ihsweep.compute import train
from ihsweep.data import probes as probes_lib
from ihsweep.runs import checkpoint, claims
from ihsweep.training import resume
from ihsweep.training.evaluation import Evaluator

log = logging.getLogger("ihsweep")


def cell_metadata(cfg, mcfg, tcfg, source, n_params: int) -> dict:
  """What every checkpoint of this run records about its models (``custom_metadata``)."""
  lrs, seeds, ids = train.peak_lrs(cfg), train.model_seeds(cfg), train.cell_ids(cfg)
  knobs = {k: np.asarray(v) for k, v in source.data_params(cfg.ensemble.size).items()}
  cells = []
  for i in range(cfg.ensemble.size):
    cell = {"cell": ids[i], "seed": seeds[i], "peak_lr": float(lrs[i])}
    cell.update({k: float(v[i]) for k, v in knobs.items()})
    cells.append(cell)
  return {
    "cells": cells,
    "model": dataclasses.asdict(mcfg),
    "n_params": n_params,
    "batch_size": tcfg.batch_size,
    "context_size": tcfg.context_size,
    "tokens_per_update": train.tokens_per_update(tcfg),
    "num_steps": tcfg.num_steps,
    "data_source": cfg.data.source,
  }


@dataclasses.dataclass
class Start:
  """What start-up hands the loop. ``state``: the TrainState (leading axis E) to train from;
  ``start``: the update restored (None: a fresh run); ``calls``: the host calls' lengths from
  there; ``arrays``: the source's shared arrays on the devices (None: host-fed); ``evaluator``:
  None without evaluation."""

  state: train.TrainState
  hp: train.HParams
  ckpts: checkpoint.RunCheckpoints
  start: int | None
  schedule: schedule_lib.RunSchedule
  calls: list[int]
  host_arrays: Any
  arrays: Any
  evaluator: Evaluator | None = None

  @property
  def done(self) -> int:
    """Updates done before this run's first call."""
    return self.start or 0


def start(group, workdir: str, team: sharding.Team, who: str = "") -> Start:
  """Builds the initial state of ``group`` (a ``runner`` group: mesh, model, source), writes
  ``config.json``, resumes from the latest full-state checkpoint in ``workdir`` if any, and
  makes the evaluation (probes reloaded on resume, else made and saved). ``who`` prefixes the
  log lines."""
  hp, state = _initial_state(group, workdir, team, who)
  cfg, tcfg = group.cfg, group.tcfg
  n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params)) // group.n_models
  ckpts = checkpoint.RunCheckpoints(
    os.path.join(workdir, "checkpoints"),
    cell_metadata(cfg, group.mcfg, tcfg, group.source, n_params),
    keep_state=cfg.checkpoint.keep_state,
    async_save=cfg.checkpoint.async_save,
    read_only=False,
    processes=team.processes,
  )
  # A fallback to an older checkpoint names the group and the worker (workers side by side)
  owner = f"{who.removesuffix(': ')} (worker {claims.worker_id()}): " if who else ""
  restored, state = ckpts.restore_latest_state(state, owner)
  if restored is not None:
    log.info("%sresuming from the full-state checkpoint at update %d", who, restored)
  host_arrays = (
    None if group.host_fed else jax.tree_util.tree_map(np.asarray, group.source.arrays())
  )
  arrays = None if group.host_fed else jax.device_put(host_arrays, sharding.replicated(group.mesh))
  # Evaluation and checkpoint schedules; every one of their steps ends a host call.
  schedule = schedule_lib.RunSchedule.from_config(cfg)
  out = Start(
    state, hp, ckpts, restored, schedule, schedule.calls(restored or 0), host_arrays, arrays
  )
  if schedule.eval_every:
    out.evaluator = _evaluator(group, out, workdir, team.leads, who)
  return out


def _initial_state(group, workdir: str, team: sharding.Team, who: str) -> tuple:
  """Hyper-parameters on the mesh and the initial state; writes ``config.json`` (lead)."""
  cfg, tcfg, mesh = group.cfg, group.tcfg, group.mesh
  log.info("%sdata: %s", who, group.source.describe())
  hp = jax.device_put(group.hparams(), sharding.ensemble_sharding(mesh))
  if team.leads:
    resume.write_resolved_config(cfg, workdir)
  where = ""
  if jax.process_count() > 1:
    where = (
      f" of process {jax.process_index()} (process-local)"
      if team.alone
      else f" in {jax.process_count()} processes"
      if team.is_everyone
      else f" in processes {', '.join(map(str, team.processes))}"
    )
  log.info(
    "%smesh %s over %d %s device(s)%s; E=%d B=%d C=%d",
    who,
    dict(mesh.shape),
    mesh.devices.size,
    jax.default_backend(),
    where,
    group.n_models,
    tcfg.batch_size,
    tcfg.context_size,
  )
  return hp, group.init_fn()(np.asarray(train.model_seeds(cfg), np.int32))


def _evaluator(group, run: Start, workdir: str, lead: bool, who: str) -> Evaluator:
  """The probes (reloaded on resume, else made and saved) and the evaluation program."""
  probes, path = None, os.path.join(workdir, "probes.npz")
  if run.start is not None and os.path.exists(path):
    try:
      probes = probes_lib.Probes.load(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
      log.warning("%s is unreadable (%s): making the probes again from eval.probe_seed", path, e)
  if probes is None:  # from host values, so that every process computes the same probes
    probes = probes_lib.make_probes(
      group.source,
      group.data_params,
      run.host_arrays,
      group.cfg.eval,
      group.n_models,
      group.tcfg.context_size,
    )
    if lead:
      probes.save(path)
  log.info(
    "%seval every %d updates: %d repeated-token probes (L = %d; %s), %d held-out "
    "sequences per model (%d associative-recall prompts in model 0's)",
    who,
    run.schedule.eval_every,
    len(probes.repeated),
    probes.block_len,
    probes.candidates,
    probes.sequences.shape[1],
    int(probes.recall[0].sum()),
  )
  return group.evaluator(probes)
