"""The one builder of a group's programs (``GroupBuild``): from a run's config on its devices, the
mesh, the model, the data source, the hyper-parameters and the jitted programs (initialisation,
the ensemble's train program, the evaluation), each made once. Training (``runner.fit`` and its
compile-ahead, ``runner.precompile``), the memory choice (``runner.resolve_memory``), the plan's
measured timing (``ihsweep.planning.timing``) and the benchmarks build a group here, so what
they compile, measure or time is the program training runs; and a program compiled ahead of
time is the very ``jax.jit`` object whose first call in ``fit`` then neither traces nor compiles
again."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ihsweep.base import sharding
from ihsweep.compute import train
from ihsweep.data import make_source
from ihsweep.training.evaluation import Evaluator


class GroupBuild:
  """A group's parts and programs, built from its run config on its devices (module docstring).

  Args:
    cfg: the run's config (its model, train, data, ensemble and eval sections), with its memory
      setting made (``runner.resolve_memory``: nothing left 0 or auto that memory decides).
    devices: the mesh's devices, in order (compile-only devices too: nothing is placed here).
    source: the data source (default: the one ``cfg.data`` names, built here).

  Attributes: ``cfg``, ``mcfg`` / ``tcfg`` (``ModelConfig`` / ``TrainConfig``), ``n_models``
  (E), ``mesh`` (axes ensemble × data), ``model`` (attention resolved for the devices),
  ``source``, ``host_fed``, ``data_params`` (numpy, leading axis E).
  """

  def __init__(self, cfg, devices: list, source=None):
    self.cfg = cfg
    self.mcfg, self.tcfg = train.model_and_train_config(cfg)
    self.n_models = cfg.ensemble.size
    self.mesh = sharding.make_mesh(self.n_models, self.tcfg.batch_size, devices)
    self.model = train.training_model(self.mcfg, self.tcfg, self.mesh.devices.flat[0])
    self.source = source or make_source(
      cfg.data, self.mcfg.vocab_size, self.tcfg.batch_size, self.tcfg.context_size
    )
    self.host_fed = not self.source.on_device
    self.data_params = jax.tree_util.tree_map(np.asarray, self.source.data_params(self.n_models))
    self._programs: dict = {}

  def hparams(self) -> train.HParams:
    """Per-model peak learning rates and data knobs (numpy, leading axis E)."""
    return train.HParams(
      peak_lr=np.asarray(train.peak_lrs(self.cfg), np.float32), data=self.data_params
    )

  def init_fn(self):
    """``init(seeds int32 [E]) -> TrainState`` on the mesh (``train.make_init_fn``), made once."""
    if "init" not in self._programs:
      self._programs["init"] = train.make_init_fn(self.model, self.tcfg, self.mesh)
    return self._programs["init"]

  def train_program(self):
    """The ensemble's train program (``train.make_ensemble_train_fn``), made once: one
    compilation serves every call length up to ``train.steps_per_call``, the short last call
    included."""
    if "train" not in self._programs:
      self._programs["train"] = self.train_program_at(
        self.tcfg.gradient_accumulation_steps, self.tcfg.remat, self.cfg.ensemble.vmap_chunk
      )
    return self._programs["train"]

  def evaluator(self, probes, capacity_bytes: int | None = None) -> Evaluator:
    """The evaluation with ``probes`` (None: of their shapes, for ``lower``) on the mesh, its
    program made once per layout (``Evaluator``'s ``programs``); ``capacity_bytes``: a device's
    memory where the devices cannot say (compile-only ones)."""
    return Evaluator(
      self.cfg, self.mcfg, probes, self.mesh, capacity_bytes, programs=self._programs
    )

  def train_program_at(self, gradient_accumulation_steps: int, remat: str, vmap_chunk: int):
    """The train program at another memory setting (``runner.resolve_memory`` compiles each it
    tries against the devices' capacity); not kept."""
    tcfg = dataclasses.replace(
      self.tcfg, gradient_accumulation_steps=gradient_accumulation_steps, remat=remat
    )
    return train.make_ensemble_train_fn(
      train.training_model(self.mcfg, tcfg, self.mesh.devices.flat[0]),
      tcfg,
      None if self.host_fed else self.source.sample,
      self.mesh,
      min(tcfg.steps_per_call, tcfg.num_steps),
      vmap_chunk,
    )

  def abstract_state(self) -> train.TrainState:
    """The initial state as ``jax.ShapeDtypeStruct`` with the ensemble sharding (from lowering
    the initialisation: nothing is computed)."""
    return self.init_fn().lower(jax.ShapeDtypeStruct((self.n_models,), np.int32)).out_info

  def abstract_hparams(self) -> train.HParams:
    """``hparams`` as ``jax.ShapeDtypeStruct`` with the ensemble sharding."""
    return abstract_like(self.hparams(), sharding.ensemble_sharding(self.mesh))

  def abstract_data(self):
    """The train program's ``data`` argument as ``jax.ShapeDtypeStruct``: the source's shared
    arrays replicated, or a call's host-fed batches ``[E, K, B, C + 1]``."""
    tcfg = self.tcfg
    if self.host_fed:  # one tiny gather for the corpus's dtype
      keys = np.zeros((self.n_models, 2), np.uint32)
      dtype = np.asarray(self.source.host_batches(keys, 0, 1)).dtype
      shape = (
        self.n_models,
        min(tcfg.steps_per_call, tcfg.num_steps),
        tcfg.batch_size,
        tcfg.context_size + 1,
      )
      return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.host_batch_sharding(self.mesh))
    return abstract_like(self.source.arrays(), sharding.replicated(self.mesh))


def abstract_like(tree, where):
  """``jax.ShapeDtypeStruct`` of each numpy leaf of ``tree`` as ``jax.device_put(tree, where)``
  would place it (the dtype JAX gives it: float64 becomes float32 without x64)."""
  return jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(
      np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype), sharding=where
    ),
    tree,
  )


def per_device_bytes(tree) -> int:
  """Bytes of one device's shards of the ``jax.ShapeDtypeStruct`` leaves of ``tree``."""
  total = 0
  for x in jax.tree_util.tree_leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
  return total
