"""Checkpoints, the run's permanent record and the way a preempted run continues (orbax).

A run directory holds two orbax ``CheckpointManager`` trees:

* ``checkpoints/params/<step>`` — every model's params (leading axis E) on a token-based
  schedule (``schedule.params_steps``): log-spaced from step 0 plus extra density around the
  transition the emergence law predicts for this (B, C), or the study's own token schedule.
  Never pruned: they are what the analysis reads.
* ``checkpoints/state/<step>`` — the full ``TrainState`` (params, optimizer state, step, data
  keys; the step is the data position, since update t draws its batch from ``fold_in(data_key,
  t)``) every ``checkpoint.state_every_minutes`` (or ``state_every_steps``) and at the end;
  the newest ``checkpoint.keep_state`` are kept. A restarted run resumes from the latest one.

Every checkpoint carries the group's metadata (orbax ``custom_metadata``): one entry per model
(cell id, seed, peak lr, data knobs), the model config, n_params, B, C and tokens per update, so
a checkpoint directory is readable without the paths or the config file.

Writes are asynchronous (orbax copies device arrays to host before ``save`` returns, so the
trainer may donate them right after) and atomic: orbax writes into a temporary directory and
renames it when complete, so a step killed half-way is never listed and never restored
(the trainer's manager removes temporary leftovers when it opens; nothing else writes: a
``RunCheckpoints`` is read-only unless opened with ``read_only=False``, so reading a live run is
safe). A save that cannot fit the free space is refused before it starts (``StorageFault``); a
write that fails for its storage (full, over a quota or a file-size limit, read-only, failing:
``errors.STORAGE_ERRNOS``) is one too, once the trainer catches it; the run resumes from its last
complete checkpoint once the storage is mended.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import sys
import types
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ihsweep.base.errors import StorageFault, is_storage_message
from ihsweep.data.errors import DataError

log = logging.getLogger("ihsweep")


class CheckpointError(DataError):
  """A run directory whose checkpoints cannot be restored."""


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.generic,)):
    return x.item()
  return x


def _not_read_only_notice(record: logging.LogRecord) -> bool:
  """Drops orbax's warnings that restate a read-only open (``read_only=True, setting ...``,
  ``Given directory is read only``): the expected consequence of reading, not a problem."""
  message = record.getMessage()
  return not ("read_only=True, setting" in message or "Given directory is read only" in message)


logging.getLogger("absl").addFilter(_not_read_only_notice)

# Orbax's metadata files that it could not read or parse, by path: what was wrong.
_damaged_metadata: dict[str, str] = {}


def _damaged_metadata_notice(record: logging.LogRecord) -> bool:
  """Records and drops orbax's ``Failed to json parse Metadata file: PATH, file content: …``
  (or ``Failed to read …``) errors: orbax goes on without the file (a checkpoint's
  ``_CHECKPOINT_METADATA`` holds its custom metadata and timestamps, not its arrays) and
  printed the whole damaged content each time it looked, with no group or step; its readers
  say it once, in their own words (``damaged_metadata``)."""
  message = str(record.msg)
  if not (
    message.startswith(("Failed to json parse Metadata file", "Failed to read Metadata file"))
    and isinstance(record.args, tuple)
    and len(record.args) >= 2
  ):
    return True
  error = record.args[-1]
  what = error_text(error) if isinstance(error, BaseException) else str(error)[:160]
  _damaged_metadata[os.path.abspath(str(record.args[0]))] = what
  return False


logging.getLogger("absl").addFilter(_damaged_metadata_notice)


def damaged_metadata(directory: str) -> dict[str, str]:
  """Orbax metadata files under ``directory`` that this process found damaged (not JSON, or
  unreadable) while reading checkpoints, path -> what was wrong (``Type: message``)."""
  root = os.path.abspath(directory) + os.sep
  return {p: w for p, w in list(_damaged_metadata.items()) if p.startswith(root)}


def error_text(e: BaseException, limit: int = 160) -> str:
  """``Type: first line`` of an error from orbax or tensorstore, without the tensorstore spec
  that its messages append ("See full TensorStore details: ..."), at most ``limit``
  characters of message."""
  first = (str(e).splitlines() or [""])[0].split(" See full TensorStore details")[0]
  return f"{type(e).__name__}: {first[:limit]}"


def _quiet_abandoned_io() -> None:
  """Silences the "Event loop is closed" errors and the errors of never-awaited orbax read
  coroutines, tasks and gathers (each with a traceback, from ``sys.unraisablehook`` or asyncio's
  "... exception was never retrieved") that orbax's abandoned tensorstore reads and writes
  raise once one of them has failed — a damaged checkpoint, a full disk: the failure itself is
  reported once, by whoever catches it."""
  if getattr(sys.unraisablehook, "ihsweep", False):
    return
  default = sys.unraisablehook

  def hook(unraisable):
    text = str(unraisable.exc_value)
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine never awaited
    orbax_io = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
    if not (orbax_io or "Event loop is closed" in text or "Python is likely shutting down" in text):
      default(unraisable)

  hook.ihsweep = True
  sys.unraisablehook = hook
  # JAX's array serialization (under orbax) leaves its writes' coroutines unawaited when one
  # fails; Python warns of each as it shuts down ("coroutine ... was never awaited").
  warnings.filterwarnings("ignore", r"coroutine 'async_serialize_from_host\.", RuntimeWarning)
  # The same errors, when asyncio collects the failed tasks or gathers first.
  logging.getLogger("asyncio").addFilter(lambda r: not _orbax_never_retrieved(r))


def _orbax_never_retrieved(record: logging.LogRecord) -> bool:
  """An asyncio "... exception was never retrieved" record of an error raised in orbax, or of a
  checkpoint write that failed for a fault of the storage (tensorstore's own futures: a
  file-size limit met while opening an array's zarr driver, whose traceback holds no orbax
  frame) — reported once, in one line, by ``StorageFault``."""
  message = record.getMessage()
  if "exception was never retrieved" not in message:
    return False
  if is_storage_message(message) and ".orbax-checkpoint-tmp" in message:
    return True
  tb = record.exc_info[2] if record.exc_info else None
  while tb is not None:
    if f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return f"{os.sep}orbax{os.sep}" in message


def _seeing_one_process(fn):
  """``fn`` (a function of orbax) run with a view of ``jax`` whose ``process_count()`` is 1."""

  class OneProcessJax(types.ModuleType):
    def __getattr__(self, name):
      return getattr(jax, name)

    @staticmethod
    def process_count() -> int:
      return 1

  view = {**fn.__globals__, "jax": OneProcessJax("jax")}
  out = types.FunctionType(fn.__code__, view, fn.__name__, fn.__defaults__, fn.__closure__)
  out.__kwdefaults__, out.__doc__ = fn.__kwdefaults__, fn.__doc__
  return out


class _ProcessLocalArrayHandler(ocp.type_handlers.ArrayHandler):
  """orbax's ``ArrayHandler`` for a process that alone saves its arrays inside a multi-process
  job (``RunCheckpoints(local=True)``).

  ``ArrayHandler.serialize`` refuses every fully addressable array once ``jax.process_count() >
  1`` ("Cannot serialize host local jax.Array ... in multi-host setting"), also under
  ``MultiprocessingOptions(active_processes={this process})`` (orbax 0.12.8): it takes such an
  array for a pmap-style replica that every host holds and would write. A process-local group's
  arrays are its own and whole, and this process alone writes them, into its own directory; so
  here ``serialize`` is orbax's own code run with a ``jax`` whose ``process_count()`` is 1 (that
  check is its only use of it). Everything else — which shards are written (replica 0), the
  per-process OCDBT files and their merge, the sharding file written by ``primary_host`` — is
  orbax's, unchanged. No ArrayMetadata store (orbax's default handler keeps one for
  replica-parallel writes and typed PRNG keys; neither occurs here)."""

  serialize = _seeing_one_process(ocp.type_handlers.ArrayHandler.serialize)


def _handler_over(
  processes: ocp.options.MultiprocessingOptions, arrays: type = None
) -> ocp.StandardCheckpointHandler:
  """A ``StandardCheckpointHandler`` over ``processes`` whose jax.Arrays go through
  ``arrays(primary_host=processes.primary_host)``: ``_ProcessLocalArrayHandler`` (default; this
  process alone), or orbax's ``ArrayHandler`` for a team of several processes (whose primary
  host, the one writing the arrays' metadata, must be one of them: orbax's default is process
  0). Its class is orbax's own, so its checkpoints and their metadata are those of any other
  run."""
  arrays = arrays or _ProcessLocalArrayHandler
  handler = ocp.StandardCheckpointHandler(multiprocessing_options=processes)
  scalar = ocp.type_handlers.ScalarHandler()
  registry = ocp.type_handlers.create_type_handler_registry(
    (int, scalar),
    (float, scalar),
    (np.number, scalar),
    (np.ndarray, ocp.type_handlers.NumpyHandler()),
    (jax.Array, arrays(primary_host=processes.primary_host)),
  )
  # StandardCheckpointHandler takes no type-handler registry; its work is done by this
  # PyTreeCheckpointHandler (``_impl``), made as its __init__ makes it but with the registry.
  handler._impl = ocp.PyTreeCheckpointHandler(
    save_concurrent_gb=96,
    restore_concurrent_gb=96,
    use_ocdbt=True,
    multiprocessing_options=processes,
    type_handler_registry=registry,
  )
  return handler


class RunCheckpoints:
  """The two managers of one run (or one sweep group) under ``directory``.

  Args:
    directory: e.g. ``WORKDIR/checkpoints`` (created).
    metadata: JSON-able dict stored with every checkpoint (``custom_metadata``).
    keep_state: how many full-state checkpoints to keep (newest first).
    async_save: write in a background thread (``wait`` before reading or exiting).
    read_only: True (the default): open existing checkpoints for reading only — nothing is
      created or deleted, so a live run's in-progress saves (orbax temporary directories) are
      left alone, and saving raises ``ValueError``. The trainer passes False: it creates the
      directories and removes leftovers of an earlier, killed writer (it holds the run's lock).
    local: this process alone saves and reads these checkpoints, with arrays on its own
      devices, inside a multi-process ``jax.distributed`` job (a worker's process-local group):
      the managers run over this process only (orbax ``MultiprocessingOptions(primary_host=this
      process, active_processes={this process})``: no barrier waits for the others) and save
      host-local arrays (``_ProcessLocalArrayHandler``). The files are the same as a
      one-process run's, so any process count reads them. Changes nothing in a one-process job.
    processes: the processes that save these checkpoints together (a group's team,
      ``sharding.Team``); default every process. This process alone is ``local``; some of
      several (a worker spanning hosts): orbax's managers over them
      (``MultiprocessingOptions(primary_host=the first, active_processes=them)``), whose
      barriers the other processes never join.
  """

  def __init__(
    self,
    directory: str,
    metadata: dict | None = None,
    *,
    keep_state: int = 2,
    async_save: bool = True,
    read_only: bool = True,
    local: bool = False,
    processes: tuple[int, ...] | None = None,
  ):
    _quiet_abandoned_io()
    self.read_only = read_only
    self.directory = os.path.abspath(directory)
    self.metadata = _jsonable(metadata or {})
    n = jax.process_count()
    if processes is not None and len(processes) == 1 and n > 1:
      local = True
    alone = local and n > 1
    some = None if alone or processes is None or len(processes) == n else tuple(sorted(processes))

    def manager(name, keep):
      path = os.path.join(self.directory, name)
      if alone or some:
        team = (jax.process_index(),) if alone else some
        # A barrier prefix of its own per directory and team (groups of several workers in one
        # job never share one); with this process the only active one, orbax skips its
        # barriers anyway.
        where = hashlib.sha1(path.encode()).hexdigest()[:12]
        processes = ocp.options.MultiprocessingOptions(
          primary_host=team[0],
          active_processes=set(team),
          barrier_sync_key_prefix=f"ihsweep-{name}-{where}-p{team[0]}",
        )
        handler = _handler_over(processes, None if alone else ocp.type_handlers.ArrayHandler)
        # Step directories created before save returns: orbax's asynchronous creation signals
        # completion through keys of the job's coordination service named by a per-process
        # operation count (awaitable_signals_contract_<n>/...), which the other processes'
        # saves of their own groups share and delete (a save then waited 5 min for its key
        # and failed with DEADLINE_EXCEEDED in some runs of the two-process test).
        asynchronous = ocp.options.AsyncOptions(create_directories_asynchronously=False)
        if not read_only:  # orbax refuses create=True with active_processes
          os.makedirs(path, exist_ok=True)
      else:
        # Own barrier names per manager: under several processes the two managers' background
        # commits would otherwise meet at the same coordination barrier and fail.
        processes = ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=f"ihsweep-{name}")
        handler = ocp.StandardCheckpointHandler()
        # In a one-process job, step directories are created before save returns too: the
        # asynchronous creation's signals are keyed by orbax's one operation counter per
        # process, which concurrent saves in several threads (workers of one process:
        # sweep.devices_per_worker) advance for each other (a save then made or awaited
        # another's directory: FileExistsError, "Directory not empty", a commit never
        # finished). Over every process of a job orbax's synchronous creation asserts from a
        # background thread (multihost assert_equal) and fails: its default is kept there.
        asynchronous = (
          ocp.options.AsyncOptions(create_directories_asynchronously=False) if n == 1 else None
        )
      options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=not read_only and not alone and not some,
        cleanup_tmp_directories=not read_only,
        read_only=read_only,
        enable_async_checkpointing=async_save and not read_only,
        multiprocessing_options=processes,
        async_options=asynchronous,
      )
      # The handler named up front, so that a manager opened only to read (analysis) knows
      # the item's metadata (shapes, dtypes) before any save or restore.
      return ocp.CheckpointManager(path, options=options, item_handlers={name: handler})

    self._params = manager("params", None)
    self._state = manager("state", keep_state)

  def restore_latest_state(self, like: Any, who: str = "") -> tuple[int | None, Any]:
    """``(step, state)`` from the newest full-state checkpoint that restores, trying older ones
    if a newer one is damaged (e.g. files deleted by hand); ``(None, like)`` if there is none.
    Each fallback is one warning line led by ``who`` (the group and worker, e.g. ``"g003
    (worker host:123/w2): "``; by default the checkpoint directory, which names the group), so
    that workers side by side say whose checkpoint it was.

    Raises:
      CheckpointError: checkpoints exist but none can be restored.
    """
    steps = sorted(self._state.all_steps(), reverse=True)
    errors = []
    for step in steps:
      try:
        state = self.restore_state(step, like)
      except Exception as e:  # orbax raises many kinds (NOT_FOUND, KeyError, ValueError…)
        errors.append(f"{step}: {error_text(e, 200)}")
        log.warning(
          "%sfull-state checkpoint %d cannot be restored (%s); trying an older one",
          who or f"{self.directory}: ",
          step,
          errors[-1],
        )
        continue
      where = os.path.join(self.directory, "state", str(step))
      for path, what in sorted(damaged_metadata(where).items()):
        log.warning(
          "%sfull-state checkpoint %d: its metadata file %s is damaged (%s); restored without it",
          who or f"{self.directory}: ",
          step,
          os.path.relpath(path, self.directory),
          what,
        )
      return step, state
    if steps:
      raise CheckpointError(
        f"no full-state checkpoint in {self.directory}/state can be "
        f"restored ({'; '.join(errors)}); move the directory away to start "
        f"again"
      )
    return None, like

  def params_steps_saved(self) -> list[int]:
    return list(self._params.all_steps())

  def latest_state_step(self) -> int | None:
    """The newest complete full-state checkpoint, or None."""
    return self._state.latest_step()

  def _save(self, manager, name: str, step: int, tree: Any, extra: dict | None) -> bool:
    if self.read_only:
      raise ValueError(
        f"{self.directory} was opened read-only (RunCheckpoints' default, so "
        f"that reading never disturbs a live run): open it with "
        f"read_only=False to save"
      )
    # A step already on disk is kept: a resumed run reaching it again computes the same values.
    if step in manager.all_steps():
      return False
    # Refused before orbax starts writing, while the last complete checkpoint is intact (a
    # write that fails half-way floods stderr from orbax's threads).
    need = sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(tree))
    free = shutil.disk_usage(self.directory).free
    if free < need:
      raise StorageFault(
        self.directory,
        errno.ENOSPC,
        f"{need / 2**20:,.1f} MiB to write, {free / 2**20:,.1f} MiB free",
      )
    return manager.save(
      step,
      args=ocp.args.Composite(**{name: ocp.args.StandardSave(tree)}),
      custom_metadata={**self.metadata, "step": step, **(extra or {})},
    )

  @staticmethod
  def _restore(manager, name: str, step: int, abstract: Any) -> Any:
    args = ocp.args.Composite(**{name: ocp.args.StandardRestore(abstract)})
    return manager.restore(step, args=args)[name]

  def save_params(self, step: int, params: Any, extra: dict | None = None) -> bool:
    """Saves the ensemble's params at ``step`` unless that step is already on disk. Returns
    whether it saved."""
    return self._save(self._params, "params", step, params, extra)

  def save_state(self, step: int, state: Any, extra: dict | None = None) -> bool:
    """Saves the full train state at ``step`` unless that step is already on disk."""
    return self._save(self._state, "state", step, state, extra)

  def restore_state(self, step: int, like: Any) -> Any:
    """The full state at ``step``, with the structure, dtypes and shardings of ``like`` (e.g.
    a freshly initialised state on the current mesh)."""
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
    return self._restore(self._state, "state", step, abstract)

  def restore_params(self, step: int, like: Any = None, sharding: Any = None) -> Any:
    """The ensemble's params at ``step``: shaped and sharded like ``like`` if given, else with
    the stored shapes placed by ``sharding`` (one ``jax.sharding.Sharding`` for every array,
    e.g. the ensemble axis split over the devices present), else on this process's first
    device — a laptop can read a pod's checkpoints.

    Raises:
      CheckpointError: no params checkpoint at ``step`` (the message lists the saved steps).
    """
    self._check_saved(self._params, "params", step)
    if like is None:
      where = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
      meta = self._params.item_metadata(step)["params"]
      abstract = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=where), meta
      )
    else:
      abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
    return self._restore(self._params, "params", step, abstract)

  def step_metadata(self, step: int, kind: str = "params") -> dict:
    """The ``custom_metadata`` stored with a checkpoint (``kind`` ``params`` or ``state``).

    Raises:
      CheckpointError: no such checkpoint at ``step``.
    """
    manager = self._params if kind == "params" else self._state
    self._check_saved(manager, kind, step)
    return dict(manager.metadata(step).custom_metadata or {})

  def _check_saved(self, manager, kind: str, step: int) -> None:
    steps = sorted(manager.all_steps())
    if step not in steps:
      shown = ", ".join(map(str, steps[:8])) + (f", ... {steps[-1]}" if len(steps) > 8 else "")
      raise CheckpointError(
        f"no {kind} checkpoint at update {step} in {self.directory}/{kind}; "
        f"saved: {shown or 'none'}"
      )

  def wait(self) -> None:
    """Blocks until every asynchronous write has been committed."""
    self._params.wait_until_finished()
    self._state.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self._params.close()
    self._state.close()
