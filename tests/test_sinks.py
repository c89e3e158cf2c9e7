"""Live metric writers (ihsweep/training/sinks.py): TensorBoard event files and W&B runs hold the
values of metrics.jsonl and train_log.jsonl, one scalar per cell and metric, each step once."""

import glob
import importlib.util
import json
import os
import shutil
import struct

import ml_collections
import numpy as np
import pytest

from ihsweep.configuration import config as config_lib
from ihsweep.configuration import fields
from ihsweep.training import sinks
from ihsweep.training.runner import fit

HAVE_WANDB = importlib.util.find_spec("wandb") is not None
# 30 updates in calls of 10, evaluated every 10; cells with sweep-style ids.
RUN = {
  "train.num_steps": 30,
  "eval.every_steps": 10,
  "eval.n_probes": 8,
  "eval.n_sequences": 4,
  "ensemble.cell_ids": (7, 3),
  "checkpoint.state_every_steps": 10,
  "checkpoint.keep_state": 3,
  "checkpoint.async_save": False,
  "log.tensorboard": True,
}


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def _expected(workdir) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} from the run's JSONL record."""
  out: dict[str, dict[int, float]] = {}
  for row in _rows(os.path.join(workdir, "metrics.jsonl")):
    for name in ("train_loss", "val_loss", "ps_max", "ar_acc", "icl_score"):
      if row[name] is not None:
        out.setdefault(f"cell_{row['cell']}/{name}", {})[row["step"]] = row[name]
  for row in _rows(os.path.join(workdir, "train_log.jsonl")):
    for name in ("loss", "grad_norm"):
      for cell, value in zip((7, 3), row[name]):
        out.setdefault(f"cell_{cell}/{name}", {})[row["step"]] = value
  return out


def _assert_equal(got, expected):
  for tag, series in expected.items():
    assert tag in got, (tag, sorted(got))
    assert sorted(got[tag]) == sorted(series), tag
    for step, value in series.items():  # TensorBoard's simple_value is float32
      assert got[tag][step] == np.float32(value), (tag, step, got[tag][step], value)


def test_tensorboard_scalars_equal_the_jsonl_and_a_resume_logs_each_step_once(tiny, tmp_path):
  workdir = str(tmp_path / "run")
  fit(tiny(**RUN), workdir, progress=False)
  logdir = os.path.join(workdir, "tensorboard")
  got = sinks.read_tensorboard(logdir)
  expected = _expected(workdir)
  assert sorted(expected["cell_7/ps_max"]) == [0, 10, 20, 30]
  assert sorted(expected["cell_3/loss"]) == [10, 20, 30]
  _assert_equal(got, expected)
  # One scalar per cell and metric: the two cells' tags, nothing else.
  assert {t.split("/")[0] for t in got} == {"cell_7", "cell_3"}
  assert {"cell_7/ps_max", "cell_3/ps_max", "cell_7/ar_data_n", "cell_7/grad_norm"} <= set(got)
  assert not any(t.split("/")[1] in ("seed", "step", "tokens", "diverged", "ps") for t in got)

  # A kill after the checkpoint at 20 with rows up to 30 logged: the rerun resumes at 20 (also
  # under other values of the log fields) and logs 30 again into a new event file that starts
  # with TensorBoard's purge marker at 21.
  for kind in ("state", "params"):
    shutil.rmtree(os.path.join(workdir, "checkpoints", kind, "30"), ignore_errors=True)
  with open(os.path.join(workdir, "config.json")) as f:
    stored = json.load(f)
  del stored["log"]  # as a run directory made before the log section existed
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(stored, f)
  result = fit(tiny(**RUN, **{"log.wandb_project": "other"}), workdir, progress=False)
  assert result.resumed_from == 20
  files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
  assert len(files) == 2
  from tensorboardX.proto.event_pb2 import Event, SessionLog

  events = [Event.FromString(d) for d in sinks._records(files[1])]
  starts = [e.step for e in events if e.session_log.status == SessionLog.START]
  assert starts == [21]
  assert {e.step for e in events if e.summary.value} == {30}
  _assert_equal(sinks.read_tensorboard(logdir), _expected(workdir))
  assert _expected(workdir) == expected  # the resumed run's JSONL: the same numbers


def test_log_fields_are_checked_before_compiling(tiny, no_compile, tmp_path):
  for field, value, allowed in (
    ("log.tensorboard", "yes", "True or False"),
    ("log.wandb_mode", "cloud", "'offline', 'online'"),
    ("log.wandb_project", "", "a non-empty string"),
    ("log.tensorbord", True, "did you mean log.tensorboard"),
  ):
    cfg = tiny()
    cfg.log = ml_collections.ConfigDict({**cfg.log, field.split(".")[1]: value})  # any type
    with pytest.raises(fields.ConfigError, match=allowed) as e:
      fit(cfg, str(tmp_path / "x"), progress=False)
    assert e.value.field == field and e.value.value == value
  assert {"log.tensorboard", "log.wandb"} <= set(fields.EXECUTION_FIELDS)  # resume-free
  cfg = tiny()
  del cfg["log"]  # a config without the section (made before it existed): JSONL only
  config_lib.validate(cfg)
  assert sinks.open_writers(cfg, str(tmp_path), True, None).writers == []


@pytest.mark.skipif(HAVE_WANDB, reason="wandb is installed: the offline run is tested instead")
def test_wandb_without_the_package_is_refused_naming_the_install(tiny, no_compile, tmp_path):
  with pytest.raises(fields.ConfigError, match=r"pip install wandb") as e:
    fit(tiny(**{"log.wandb": True}), str(tmp_path / "x"), progress=False)
  assert e.value.field == "log.wandb"
  with pytest.raises(ImportError, match=r"log.wandb = True needs wandb: pip install wandb"):
    sinks.WandbWriter(str(tmp_path), "ihsweep", "offline")


def _wandb_records(path):
  """The records of a W&B run file (``run-ID.wandb``: a 7-byte header, then LevelDB's log
  format: 32 KiB blocks of records ``crc uint32, length uint16, type uint8, data``, type 1 =
  whole, 2/3/4 = first/middle/last part)."""
  with open(path, "rb") as f:
    buf = f.read()
  assert buf[:4] == b":W&B", buf[:7]
  pos, parts = 7, []
  while pos + 7 <= len(buf):
    left = 32768 - pos % 32768
    if left < 7:  # a block's tail too short for a header: zero padding
      pos += left
      continue
    length, kind = struct.unpack("<HB", buf[pos + 4 : pos + 7])
    data, pos = buf[pos + 7 : pos + 7 + length], pos + 7 + length
    if kind:
      parts.append(data)
    if kind in (1, 4):
      yield b"".join(parts)
      parts = []


@pytest.mark.skipif(not HAVE_WANDB, reason="wandb is not installed (pip install wandb)")
def test_wandb_offline_run_holds_the_jsonl_values(tiny, tmp_path, monkeypatch):
  from wandb.proto import wandb_internal_pb2

  monkeypatch.setenv("WANDB_SILENT", "true")
  workdir = str(tmp_path / "run")
  fit(
    tiny(**{**RUN, "train.num_steps": 20, "log.tensorboard": False, "log.wandb": True}),
    workdir,
    progress=False,
  )
  (path,) = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))
  got: dict[str, dict[int, float]] = {}
  for data in _wandb_records(path):
    record = wandb_internal_pb2.Record.FromString(data)
    if record.WhichOneof("record_type") == "history":
      items = {
        i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
      }
      for tag, value in items.items():
        if tag.startswith("cell_"):
          got.setdefault(tag, {})[items["_step"]] = value
  expected = _expected(workdir)
  assert sorted(expected["cell_3/ps_max"]) == [0, 10, 20]
  assert {t.split("/")[0] for t in got} == {"cell_7", "cell_3"}
  for tag, series in expected.items():
    assert got[tag] == pytest.approx(series, rel=1e-12), tag
