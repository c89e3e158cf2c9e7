"""JAX's persistent compilation cache for ihsweep: a rerun, a resumed sweep or the next group of
the same shapes loads its compiled programs from disk instead of compiling them again.

``enable()`` turns the cache on in ``$IHSWEEP_CACHE/xla`` (default ``~/.cache/ihsweep/xla``;
the corpora live beside it in ``$IHSWEEP_CACHE``), with JAX's thresholds for what is worth
caching at 0, so that small programs (a tiny group compiles in about a second) are cached too.
A cache the user chose is left alone: ``JAX_COMPILATION_CACHE_DIR`` in the environment, or a
``jax_compilation_cache_dir`` already set in this process. Entries are keyed by the program, its
shardings and devices, the compiler options and the JAX/XLA version, so a stale entry is never
used; the directory may be deleted at any time (it only costs the compilations again).

Call it before the first compilation (the CLI does at start-up); ``runner.precompile`` then
fills the cache for a group before its ``fit`` needs the programs.
"""

from __future__ import annotations

import logging
import os

import jax

from ihsweep.data.cache import default_cache_dir

log = logging.getLogger("ihsweep")


def default_dir() -> str:
  """``$IHSWEEP_CACHE/xla`` (``~/.cache/ihsweep/xla`` without ``$IHSWEEP_CACHE``; ihsweep's
  cache root, ``data.cache.default_cache_dir``)."""
  return os.path.join(default_cache_dir(), "xla")


def enable(path: str | None = None) -> str:
  """Turns on JAX's persistent compilation cache in ``path`` (default ``default_dir()``),
  caching every program however small or quick to compile, unless a cache directory was
  already chosen (``JAX_COMPILATION_CACHE_DIR``, or ``jax_compilation_cache_dir`` set in this
  process): then that one stays, with its own thresholds. Idempotent.

  Returns:
    The cache directory in use.

  Raises:
    OSError: ``path`` cannot be created.
  """
  chosen = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if chosen:
    return chosen
  path = os.path.abspath(os.path.expanduser(path or default_dir()))
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  jax.config.update("jax_compilation_cache_dir", path)
  log.debug("persistent compilation cache in %s", path)
  return path


def enabled() -> bool:
  """Whether compiled programs are written to and read from a persistent cache."""
  return bool(jax.config.jax_compilation_cache_dir) and jax.config.jax_enable_compilation_cache
