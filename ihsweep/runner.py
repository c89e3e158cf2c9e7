"""Host side of training one ensemble: validate, build, dispatch, log.

The loop dispatches host call i+1 before it reads call i's metrics (as nanodo does), so the
device never waits on Python; all per-step values come back as ``[K, E]`` arrays once per call.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from ihsweep import config as config_lib
from ihsweep import sharding, train
from ihsweep.data import make_source
from ihsweep.model import Transformer

log = logging.getLogger("ihsweep")


def _jsonable(cfg) -> dict:
  return json.loads(cfg.to_json_best_effort()) if hasattr(cfg, "to_json_best_effort") else cfg


def write_resolved_config(cfg, workdir: str) -> str:
  """Writes ``workdir/config.json`` (every field, after command-line overrides)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(_jsonable(cfg), f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path


def fit(cfg, workdir: str, *, progress: bool = True) -> dict[str, Any]:
  """Trains ``cfg.ensemble.size`` models on ``cfg.data`` for ``cfg.train.num_steps`` updates.

  Writes ``workdir/config.json`` and one row per host call to ``workdir/metrics.jsonl``
  (``step``, ``tokens`` per model, per-model ``loss`` and ``grad_norm`` averaged over the call's
  updates). Returns ``{"state": final TrainState (leading axis E), "losses": [E] last-call
  losses, "tokens_per_s": aggregate throughput after the first (compiling) call}``.

  Raises:
    ConfigError: before anything is compiled, if a field is invalid.
  """
  config_lib.validate(cfg)
  mcfg, tcfg = train.model_and_train_config(cfg)
  n_models = cfg.ensemble.size
  devices = jax.devices()[:cfg.mesh.num_devices or None]
  mesh = sharding.make_mesh(n_models, tcfg.batch_size, devices)
  model = Transformer(mcfg)
  source = make_source(cfg.data, mcfg.vocab_size, tcfg.batch_size, tcfg.context_size)
  host_fed = not getattr(source, "on_device", True)
  if hasattr(source, "describe"):
    log.info("data: %s", source.describe())
  hp = train.HParams(peak_lr=jnp.asarray(train.peak_lrs(cfg), jnp.float32),
                     data=source.data_params(n_models))
  hp = jax.device_put(hp, sharding.ensemble_sharding(mesh))
  write_resolved_config(cfg, workdir)
  log.info("mesh %s over %d %s device(s); E=%d B=%d C=%d", dict(mesh.shape), len(devices),
           jax.default_backend(), n_models, tcfg.batch_size, tcfg.context_size)

  seeds = jnp.arange(n_models, dtype=jnp.int32) + cfg.seed
  state = train.make_init_fn(model, tcfg, mesh)(seeds)
  loader = HostLoader(source, state, mesh) if host_fed else None
  arrays = None if host_fed else jax.device_put(source.arrays(), sharding.replicated(mesh))
  programs: dict[int, Any] = {}
  tokens_per_call_step = n_models * train.tokens_per_update(tcfg)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  bar = tqdm(total=tcfg.num_steps, disable=not progress, unit="upd", dynamic_ncols=True)
  pending = []  # metrics of the call in flight: (updates done after it, metrics, K)
  first_drain_t, tokens_since_first, last_loss = None, 0, None
  if os.path.exists(metrics_path):  # nothing to resume from without checkpoints
    log.warning("replacing %s from an earlier run in this directory", metrics_path)
  with open(metrics_path, "w") as mfile:

    def drain(step: int, metrics, k: int) -> None:
      nonlocal first_drain_t, tokens_since_first, last_loss
      host = jax.tree_util.tree_map(np.asarray, metrics)  # the only host sync
      now = time.perf_counter()
      if first_drain_t is None:  # the first call includes compilation: not timed
        first_drain_t = now
      else:
        tokens_since_first += k * tokens_per_call_step
      last_loss = host["loss"].mean(axis=0)
      row = {"step": step, "tokens": step * train.tokens_per_update(tcfg),
             "loss": last_loss.tolist(), "grad_norm": host["grad_norm"].mean(axis=0).tolist()}
      mfile.write(json.dumps(row) + "\n")
      mfile.flush()
      bar.update(k)
      elapsed = now - first_drain_t
      bar.set_postfix(loss=f"{last_loss.mean():.4f}",
                      tok_s=f"{tokens_since_first / elapsed:,.0f}" if elapsed else "-")

    done = 0
    schedule = train.calls(tcfg.num_steps, tcfg.steps_per_call)
    if loader:
      loader.prefetch(done, schedule)
    for k in schedule:
      if k not in programs:
        programs[k] = train.make_ensemble_train_fn(model, tcfg, None if host_fed else source.sample,
                                                   mesh, k, cfg.ensemble.vmap_chunk)
      data = loader.next() if loader else arrays
      state, metrics = programs[k](state, hp, data)  # dispatched; runs while we log the last call
      done += k
      if pending:
        drain(*pending.pop())
      pending.append((done, metrics, k))
    while pending:
      drain(*pending.pop())
  bar.close()
  if loader:
    loader.close()
  elapsed = time.perf_counter() - first_drain_t if first_drain_t else 0.0
  return {"state": state, "losses": last_loss,
          "tokens_per_s": tokens_since_first / elapsed if tokens_since_first else float("nan")}


class HostLoader:
  """Feeds host-gathered batches ``[E, K, B, C + 1]`` for a source whose tokens stay in host
  memory, one call ahead: while the devices train on call i, a worker thread gathers call
  i + 1's windows from the memory-mapped corpus and copies them to the devices. The windows are
  those the in-graph path would draw (same per-model keys and steps)."""

  def __init__(self, source, state: train.TrainState, mesh):
    import concurrent.futures
    self._source = source
    self._keys = np.asarray(jax.device_get(state.data_key))  # [E, 2], fixed for the run
    self._sharding = sharding.host_batch_sharding(mesh)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ihsweep-loader")
    self._queue: list = []
    self._plan: list[tuple[int, int]] = []

  def prefetch(self, first_step: int, schedule: list[int]) -> None:
    """Plans the calls (their scan lengths, starting at update ``first_step``) and starts the
    first gather."""
    step = first_step
    for k in schedule:
      self._plan.append((step, k))
      step += k
    self._submit()

  def _submit(self) -> None:
    if self._plan:
      first, k = self._plan.pop(0)
      self._queue.append(self._pool.submit(self._load, first, k))

  def _load(self, first_step: int, k: int):
    batch = self._source.host_batches(self._keys, first_step, k)
    return jax.device_put(batch, self._sharding)

  def next(self):
    """The next call's batches (on device), starting the gather of the one after."""
    future = self._queue.pop(0)
    self._submit()
    return future.result()

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
