"""Host-fed batches for a source whose tokens stay in host memory (``HostLoader``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ihsweep.base import sharding
from ihsweep.compute import train
from ihsweep.data.source import host_batch_array


class HostLoader:
  """Feeds host-gathered batches ``[E, K, B, C + 1]`` for a source whose tokens stay in host
  memory, one call ahead: while the devices train on call i, a worker thread gathers call
  i + 1's windows from the memory-mapped corpus and copies them to the devices. The windows are
  those the in-graph path would draw (same per-model keys and steps). Each process reads only
  the rows of its own devices (``host_batch_array``); the thread issues no collective."""

  def __init__(self, source, state: train.TrainState, mesh, steps_per_call: int):
    import concurrent.futures

    self._source = source
    self._k = steps_per_call
    self._keys = sharding.to_host(state.data_key)  # [E, 2], fixed for the run
    self._sharding = sharding.host_batch_sharding(mesh)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ihsweep-loader")
    self._queue: list = []
    self._plan: list[tuple[int, int]] = []
    self._pads: dict = {}

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
    batch = host_batch_array(self._source, self._keys, first_step, k, self._sharding)
    if k < self._k:  # a short call: only its k rows cross to the devices, padded there
      batch = self._padder(k)(batch)  # to the program's K-row shape (rows past k unused)
    return batch

  def _padder(self, k: int):
    """A program that pads ``[E, k, B, C + 1]`` batches to K rows on the devices (one per k)."""
    if k not in self._pads:
      widths = ((0, 0), (0, self._k - k), (0, 0), (0, 0))
      self._pads[k] = jax.jit(lambda b: jnp.pad(b, widths), out_shardings=self._sharding)
    return self._pads[k]

  def next(self):
    """The next call's batches (on device), starting the gather of the one after."""
    future = self._queue.pop(0)
    self._submit()
    return future.result()

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
