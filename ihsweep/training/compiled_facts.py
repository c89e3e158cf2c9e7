"""What a compile-only target's compiler said about a program, kept on disk: a plan rerun
(``--compare_attention`` after a plan without it, the same plan tomorrow) reads each program's
memory and cost instead of compiling it again. A program is the same only with the same shapes
and constants: a group's seeds are among them, so a plan of a single cell does not reuse the
programs of the grid's plan.

JAX's persistent compilation cache keeps no program compiled for devices that do not exist here
(TPU topologies and deviceless GPUs, ``ihsweep.planning.toolchain``): each plan recompiled every
group, minutes per study-scale cell on a CPU. What a plan reads from a compile is small — the
``memory.ProgramMemory`` (``memory_analysis()``, the cost analysis, kernels per update) or the
compiler's RESOURCE_EXHAUSTED — so that is what is kept, one JSON file per program in
``$IHSWEEP_CACHE/compiled`` (``~/.cache/ihsweep/compiled``; ``default_dir``).

An entry is keyed by the program and everything its compile depended on: the lowered StableHLO
(without source locations: shapes, shardings and the mesh are in it), the target (its name, the
devices' platform and kind, their count, their capacity, the GPU target description), the
versions of jax, jaxlib and the compiler plugins (libtpu, jax-cuda12-plugin), ``XLA_FLAGS`` and
``LIBTPU_INIT_ARGS``, and this module's ``FORMAT``. A stale entry is never read; the directory
may be deleted at any time (it only costs the compiles again). Real devices never use it: their
programs go through JAX's own cache (``ihsweep.workers.compile_cache``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Callable

from ihsweep.base.atomic import atomic_write_json
from ihsweep.data.cache import default_cache_dir
from ihsweep.training import memory

log = logging.getLogger("ihsweep")

# Bumped whenever what is stored, or how it is computed from a compiled program, changes.
FORMAT = 1


def default_dir() -> str:
  """``$IHSWEEP_CACHE/compiled`` (``~/.cache/ihsweep/compiled`` without ``$IHSWEEP_CACHE``)."""
  return os.path.join(default_cache_dir(), "compiled")


def _versions() -> dict:
  """The versions of what compiles (jax, jaxlib, the TPU and CUDA compiler plugins) and the
  environment that steers it."""
  import importlib.metadata as metadata

  found = {}
  for dist in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
    try:
      found[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
      found[dist] = None
  for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
    found[var] = os.environ.get(var, "")
  return found


@dataclasses.dataclass
class CompiledFacts:
  """Compiles ``jax.stages.Lowered`` programs for one compile-only target, or reads what an
  earlier compile of the same program for the same target found (module docstring).

  Args:
    target: what names the target: its name, its devices' platform and kind, how its memory is
      known and, for a GPU, the target description's text (part of every key, with the
      number of devices each program is split over and the hosts those span, not the target's
      size: a program over 2 devices of one host is the same on a node of 8 as on a pair, so a
      plan for 8 devices reuses a plan for 1's programs).
    capacity_bytes: the target's bytes per device (read from a RESOURCE_EXHAUSTED message's
      fallback, ``memory.exhausted_bytes``).
    directory: where entries live (default ``default_dir()``); None keeps nothing on disk.
    devices_per_host: the target's devices per host (0: one host holds them all).
  """

  target: str
  capacity_bytes: int
  directory: str | None = dataclasses.field(default_factory=default_dir)
  devices_per_host: int = 0
  hits: int = 0
  misses: int = 0
  own_hits: int = 0  # of the hits, programs this object compiled and wrote itself
  written: set = dataclasses.field(default_factory=set)

  def analyse(
    self, lowered, n_devices: int, count_kernels: Callable[[str], int] | None = None
  ) -> memory.ProgramMemory:
    """``memory.ProgramMemory`` of ``lowered`` compiled for the target (split over
    ``n_devices``), with ``kernels_per_update`` from ``count_kernels(compiled HLO text)`` where
    given; a program the compiler refuses with RESOURCE_EXHAUSTED gets the bytes its message
    names (``memory.exhausted_bytes``) and no others. From the cache when the same program was
    compiled for the same target before.

    Raises:
      Whatever the compiler raises other than RESOURCE_EXHAUSTED (not cached).
    """
    path = self._path(lowered, n_devices, count_kernels)
    found = self._read(path)
    if found is not None:
      self.hits += 1
      self.own_hits += path in self.written
      return found
    self.misses += 1
    try:
      compiled = lowered.compile()
      found = memory.analyse(compiled, lowered, n_devices)
      if count_kernels is not None:
        found = dataclasses.replace(found, kernels_per_update=count_kernels(compiled.as_text()))
    except Exception as e:  # the compiler's own refusal (a TPU's RESOURCE_EXHAUSTED)
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      found = memory.ProgramMemory(0, 0, 0, memory.exhausted_bytes(str(e), self.capacity_bytes), 0)
    self._write(path, found)
    self.written.add(path)
    return found

  def _path(self, lowered, n_devices: int, count_kernels) -> str | None:
    if self.directory is None:
      return None
    key = {
      "format": FORMAT,
      "target": self.target,
      "capacity_bytes": self.capacity_bytes,
      "n_devices": n_devices,
      "hosts": -(-n_devices // self.devices_per_host) if self.devices_per_host else 1,
      "kernels": getattr(count_kernels, "__qualname__", None),
      "versions": _versions(),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    digest.update(lowered.as_text(debug_info=False).encode())
    return os.path.join(self.directory, f"{digest.hexdigest()}.json")

  @staticmethod
  def _read(path: str | None) -> memory.ProgramMemory | None:
    if path is None:
      return None
    try:
      with open(path) as f:
        return memory.ProgramMemory(**json.load(f))
    except FileNotFoundError:
      return None
    except (OSError, ValueError, TypeError) as e:  # a damaged entry: compiled again
      log.debug("compiled facts: ignoring %s (%s)", path, e)
      return None

  @staticmethod
  def _write(path: str | None, found: memory.ProgramMemory) -> None:
    if path is None:
      return
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      atomic_write_json(path, dataclasses.asdict(found))
    except OSError as e:  # a read-only cache costs the next plan its compiles, nothing else
      log.debug("compiled facts: not kept in %s (%s)", path, e)
