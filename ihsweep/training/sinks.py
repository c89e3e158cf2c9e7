"""Live metric writers beside the JSONL record: TensorBoard and Weights & Biases.

``metrics.jsonl`` and ``train_log.jsonl`` (``runner.fit``) stay the run's record; the writers here
are optional copies for watching a run live, chosen in the config's ``log`` section
(``fields.default_log``). Each writer takes ``write_scalars(step, {tag: value})`` with ``step``
in updates and one tag per cell and metric, ``cell_{id}/{metric}`` (``id``: the cell id,
``ensemble.cell_ids``, unique across a sweep): the evaluation metrics of ``metrics.jsonl``
(``ps_max``, ``val_loss``, ``ar_acc``, …: ``metric_scalars``) and the per-call training loss and
gradient norm of ``train_log.jsonl`` (``loss``, ``grad_norm``: ``train_scalars``). A diverged
model's null values are not written. Only the process that writes the JSONL (the team's lead)
writes here.

Layout: TensorBoard event files under ``RUN_DIR/tensorboard/`` (one run directory per sweep
group, so ``tensorboard --logdir SWEEP_DIR`` shows each group as a run, one scalar per cell and
metric); W&B runs under ``RUN_DIR/wandb/`` (offline: upload later with ``wandb sync``), one W&B
run per run directory, its id kept in ``RUN_DIR/wandb/ihsweep_run_id``.

Resuming: every ``fit`` call opens a new event file. A resumed one (from the full-state
checkpoint at update s, before which everything up to s was written and flushed) starts its file
with a ``SessionLog.START`` event at step s + 1, TensorBoard's purge marker: readers drop the
events at steps >= s + 1 from earlier files (what the killed run logged after its checkpoint), so
each step is shown once, and the values logged again equal them anyway (resumed training is
deterministic). ``read_tensorboard`` reads event files back by that rule, without TensorFlow. A
fresh run (no checkpoint) removes the old event files, as it replaces the JSONL. W&B resumes the
same run (``resume="allow"``); it keeps the first value logged at a step.
"""

from __future__ import annotations

import glob
import math
import os
import struct
import uuid
from typing import Mapping, Protocol

SCALAR_SKIP = ("cell", "seed", "step", "tokens", "diverged", "diverged_step")
"""``metrics.jsonl`` fields that are not metrics (ids, positions, flags)."""


class MetricWriter(Protocol):
  """A live metric sink: ``write_scalars(step, {tag: value})`` (step in updates, float values),
  ``flush()`` (to disk or to the service's queue), ``close()`` (idempotent)."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None: ...

  def flush(self) -> None: ...

  def close(self) -> None: ...


def _tag(cell: int, metric: str) -> str:
  return f"cell_{cell}/{metric}"


def _scalar(value) -> float | None:
  """A finite float, or None for what is not a scalar metric (null, bool, lists, NaN)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def metric_scalars(rows: list[dict]) -> dict[str, float]:
  """``{"cell_{id}/{metric}": value}`` from one evaluation's ``metrics.jsonl`` rows (one per
  model): every scalar metric (``train_loss``, ``val_loss``, ``ps_max``, ``ar_acc``, …); lists
  (``ps`` per layer and head, ``*_argmax``), flags and null values are left out."""
  out = {}
  for row in rows:
    for name, value in row.items():
      value = None if name in SCALAR_SKIP else _scalar(value)
      if value is not None:
        out[_tag(row["cell"], name)] = value
  return out


def train_scalars(row: dict, cell_ids: list[int]) -> dict[str, float]:
  """``{"cell_{id}/loss": …, "cell_{id}/grad_norm": …}`` from one ``train_log.jsonl`` row
  (per-model lists in ensemble order; ``cell_ids``: ``train.cell_ids(cfg)``)."""
  out = {}
  for name in ("loss", "grad_norm"):
    for cell, value in zip(cell_ids, row[name]):
      value = _scalar(value)
      if value is not None:
        out[_tag(cell, name)] = value
  return out


class TensorBoardWriter:
  """Scalars into a new event file in ``logdir`` (``tensorboardX.SummaryWriter``, float32 values).

  Args:
    logdir: the event files' directory (made if missing).
    purge_step: with a value s, the file starts with TensorBoard's purge marker at step s:
      readers drop earlier files' events at steps >= s (a resumed run; module docstring).

  Raises:
    ImportError: tensorboardX is not installed (the message says how to install it).
  """

  def __init__(self, logdir: str, purge_step: int | None = None):
    try:
      import tensorboardX
    except ImportError as e:
      raise ImportError(
        "log.tensorboard = True needs tensorboardX: pip install tensorboardX "
        "(or pip install 'ihsweep[logging]')"
      ) from e
    os.makedirs(logdir, exist_ok=True)
    # Event files are named by the second they were opened: a numbered suffix keeps two fit
    # calls within one second apart and in order.
    n = len(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    self._writer = tensorboardX.SummaryWriter(
      logdir, purge_step=purge_step, flush_secs=10, filename_suffix=f".{n:04d}"
    )

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    for tag, value in scalars.items():
      self._writer.add_scalar(tag, value, step)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class WandbWriter:
  """Scalars into a Weights & Biases run (``wandb.init(mode=mode)``), files under
  ``workdir/wandb``; the run's id is kept in ``workdir/wandb/ihsweep_run_id``, so a resumed run
  directory continues the same W&B run.

  Args:
    workdir: the run directory. project: the W&B project. mode: 'offline' (nothing leaves the
      machine; ``wandb sync workdir/wandb/offline-run-*`` uploads) or 'online'. config: the
      resolved run config (a dict), stored with the run. fresh: a run without a checkpoint to
      resume: a new W&B run (new id).

  Raises:
    ImportError: wandb is not installed (the message says how to install it).
  """

  def __init__(
    self, workdir: str, project: str, mode: str, config: dict | None = None, fresh: bool = True
  ):
    try:
      import wandb
    except ImportError as e:
      raise ImportError(
        "log.wandb = True needs wandb: pip install wandb (or pip install 'ihsweep[logging]')"
      ) from e
    root = os.path.join(workdir, "wandb")
    os.makedirs(root, exist_ok=True)
    id_path = os.path.join(root, "ihsweep_run_id")
    if fresh or not os.path.exists(id_path):
      with open(id_path, "w") as f:
        f.write(uuid.uuid4().hex[:8])  # W&B run ids: letters and digits
    with open(id_path) as f:
      run_id = f.read().strip()
    name = os.path.basename(os.path.normpath(workdir))
    self._run = wandb.init(
      project=project, dir=workdir, mode=mode, id=run_id, name=name, config=config, resume="allow"
    )

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    if scalars:
      self._run.log(dict(scalars), step=step)

  def flush(self) -> None:
    pass  # run.log hands values to W&B's own writer process, which writes them as they come

  def close(self) -> None:
    if self._run is not None:
      self._run.finish()
      self._run = None


class Writers:
  """The run's writers as one (``open_writers``): each ``write_scalars`` goes to every writer
  and is flushed, as the JSONL lines are; ``close`` closes them all. Empty: does nothing."""

  def __init__(self, writers: list | None = None):
    self.writers = list(writers or [])

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    for w in self.writers:
      w.write_scalars(step, scalars)
      w.flush()

  def flush(self) -> None:
    for w in self.writers:
      w.flush()

  def close(self) -> None:
    writers, self.writers = self.writers, []
    for w in writers:
      w.close()


def open_writers(cfg, workdir: str, lead: bool, resumed_at: int | None) -> Writers:
  """The writers ``cfg.log`` asks for (none without a ``log`` section, or on a process that is
  not its team's lead). ``resumed_at``: the update a resumed ``fit`` restored (None: a fresh run,
  whose old event files are removed)."""
  log_cfg = cfg.get("log")
  if not lead or log_cfg is None:
    return Writers()
  writers = []
  try:
    if log_cfg.get("tensorboard", False):
      logdir = os.path.join(workdir, "tensorboard")
      if resumed_at is None:
        for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
          os.remove(path)
      writers.append(
        TensorBoardWriter(logdir, purge_step=None if resumed_at is None else resumed_at + 1)
      )
    if log_cfg.get("wandb", False):
      config = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
      writers.append(
        WandbWriter(
          workdir,
          log_cfg.get("wandb_project", "ihsweep"),
          log_cfg.get("wandb_mode", "offline"),
          config,
          fresh=resumed_at is None,
        )
      )
  except BaseException:
    Writers(writers).close()
    raise
  return Writers(writers)


def _records(path: str):
  """The records of a TFRecord file (``uint64 length, uint32 crc, data, uint32 crc``; the CRCs
  are not checked); a record cut short by a kill ends the file."""
  with open(path, "rb") as f:
    while True:
      header = f.read(12)
      if len(header) < 12:
        return
      (length,) = struct.unpack("<Q", header[:8])
      data = f.read(length)
      if len(data) < length or len(f.read(4)) < 4:
        return
      yield data


def read_tensorboard(logdir: str) -> dict[str, dict[int, float]]:
  """``{tag: {step: value}}`` from the event files in ``logdir`` (tensorboardX's protobufs, no
  TensorFlow), read as TensorBoard reads them: files in name order (the order they were opened),
  a ``SessionLog.START`` event at step s drops the values read so far at steps >= s (purge), and
  a later value at a step replaces an earlier one. Values are float32 (TensorBoard's
  ``simple_value``)."""
  from tensorboardX.proto.event_pb2 import Event, SessionLog

  out: dict[str, dict[int, float]] = {}
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    for data in _records(path):
      event = Event.FromString(data)
      if event.HasField("session_log") and event.session_log.status == SessionLog.START:
        for series in out.values():
          for step in [s for s in series if s >= event.step]:
            del series[step]
      for value in event.summary.value:
        if value.HasField("simple_value"):
          out.setdefault(value.tag, {})[event.step] = value.simple_value
  return out
