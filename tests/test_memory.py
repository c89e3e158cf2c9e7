"""ihsweep/training/memory.py and runner.resolve_memory: the memory setting chosen from the compiled
programs before anything trains."""

import json

import jax
import numpy as np
import pytest

from ihsweep.compute.model import ModelConfig
from ihsweep.configuration import grid
from ihsweep.training import memory, runner

MIB = 1 << 20


def _fake_compile(per_k, chunk_scale=1.0, remat_scale=1.0, calls=None):
  """A train program whose bytes are ``per_k(k)`` × chunk/local models × remat factor."""

  def compile_train(s: memory.Setting) -> memory.ProgramMemory:
    if calls is not None:
      calls.append(s)
    scale = (chunk_scale if s.vmap_chunk > 1 else 1.0) * (remat_scale if s.remat == "blocks" else 1)
    return memory.ProgramMemory(0, 0, 0, int(per_k(s.gradient_accumulation_steps) * scale), 0)

  return compile_train


def test_choose_takes_the_cheapest_setting_that_fits():
  per_k = lambda k: 1000 * MIB // k  # memory falls as 1/k
  common = dict(batch_size=64, data_axis=2, local_models=4, default_chunk=4)
  # Everything fits at once: one compile, k = 1, all models vmapped.
  calls = []
  c = memory.choose(_fake_compile(per_k, calls=calls), capacity_bytes=2000 * MIB, **common)
  assert c.setting == memory.Setting(1, 4, "none") and len(calls) == 1 and c.fits
  # Fewer models at once is tried before accumulation: chunk 2 halves the bytes here.
  c = memory.choose(_fake_compile(per_k, chunk_scale=2.0), capacity_bytes=1500 * MIB, **common)
  assert c.setting == memory.Setting(1, 1, "none")
  # Accumulation: the smallest k with 1000/k MiB ≤ 90% of 300 MiB → k = 4 (k = 32 keeps 2 rows
  # per microbatch on each of the 2 data devices; k = 64 is not a candidate).
  calls = []
  c = memory.choose(_fake_compile(per_k, calls=calls), capacity_bytes=300 * MIB, **common)
  assert c.setting == memory.Setting(4, 1, "none"), c.tried
  assert c.per_device_bytes == 250 * MIB and len(calls) <= 10
  assert memory.accumulation_candidates(64, 2) == [1, 2, 4, 8, 16, 32]
  # Remat only when no k fits without it.
  c = memory.choose(
    _fake_compile(per_k, remat_scale=0.25),
    capacity_bytes=10 * MIB,
    **{**common, "local_models": 1, "default_chunk": 1},
  )
  # 250 MiB / k ≤ 9 MiB: k = 32 with remat (no k fits the 1000 MiB / k without it)
  assert c.setting.remat == "blocks" and c.setting.gradient_accumulation_steps == 32
  # The config's own values are kept.
  c = memory.choose(
    _fake_compile(per_k), capacity_bytes=10**6 * MIB, fixed_k=8, remat="none", **common
  )
  assert c.setting.gradient_accumulation_steps == 8


def test_a_group_that_fits_at_no_setting_is_refused_naming_bytes():
  with pytest.raises(memory.DoesNotFit) as e:
    memory.choose(
      _fake_compile(lambda k: 1000 * MIB // k),
      capacity_bytes=10 * MIB,
      batch_size=8,
      data_axis=1,
      local_models=1,
      default_chunk=1,
      group="group g007",
    )
  text = str(e.value)
  assert text.startswith("group g007 does not fit its devices: it needs 125.0 MiB per device")
  assert (
    "gradient_accumulation_steps=8" in text and "10.0 MiB" in text and "9.0 MiB usable" in text
  ), text
  assert "\n" not in text


def test_exhausted_bytes_reads_the_tpu_compiler_message():
  msg = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. HLO temporaries 43.71G exceed "
    "available HBM 15.75G"
  )
  assert memory.exhausted_bytes(msg, 1) == int(43.71 * (1 << 30))
  assert memory.exhausted_bytes("RESOURCE_EXHAUSTED: out of memory", 100) == 101


def test_capacity_from_the_environment(monkeypatch):
  monkeypatch.setenv(memory.CAPACITY_ENV, "123456")
  assert memory.device_capacity(jax.devices()[0]) == 123456
  monkeypatch.setenv(memory.CAPACITY_ENV, "lots")
  with pytest.raises(ValueError, match="IHSWEEP_DEVICE_MEMORY='lots'"):
    memory.device_capacity(jax.devices()[0])
  monkeypatch.delenv(memory.CAPACITY_ENV)
  assert memory.device_capacity(jax.devices()[0]) is None  # a CPU reports none


def test_byte_counts_are_printed_in_a_unit_that_shows_them(tiny, monkeypatch):
  """memory.gib: bytes, KiB, MiB or GiB by size; IHSWEEP_DEVICE_MEMORY=1000 is refused with
  numbers that say something (it was "need 0.0 MiB … a device has 0.0 MiB")."""
  assert [memory.gib(n) for n in (0, 1000, 1024, 1536, 10 << 20, 3 * 2**29, 15.75 * 2**30)] == [
    "0 bytes", "1,000 bytes", "1.0 KiB", "1.5 KiB", "10.0 MiB", "1.50 GiB", "15.75 GiB"
  ]  # fmt: skip
  monkeypatch.setenv(memory.CAPACITY_ENV, "1000")
  cfg = tiny()
  with pytest.raises(memory.TooLarge) as e:
    memory.check_possible(cfg, jax.devices()[:1], "group g000")
  need = memory.minimum_bytes(cfg, 1, grid.n_params(ModelConfig.from_config(cfg.model), 32))
  assert f"need {need / 1024:.1f} KiB per device" in str(e.value), str(e.value)
  assert "a device has 1,000 bytes:" in str(e.value), str(e.value)


def _cfg(tiny, **kw):
  return tiny(
    **{
      "model.vocab_size": 512,
      "train.num_steps": 8,
      "train.steps_per_call": 4,
      "train.gradient_accumulation_steps": 0,
      "train.remat": "auto",
      "ensemble.vmap_chunk": 1,
      **kw,
    }
  )


def test_a_run_that_does_not_fit_at_k1_picks_k_records_it_and_trains_the_same(
  tiny, tmp_path, monkeypatch
):
  """Capacity set (test only) just under what k = 1 needs: the run chooses k > 1, writes it to
  config.json, and its losses equal the k = 1 run's. float32 on CPU: k = 2 may sum the batch
  in another order, a ~1e-7 relative change per update that 8 Adam updates of this model keep
  far below 1e-5 (measured: bitwise equal on AMD EPYC); a wrong accumulation changes the
  losses by ~1e-2 (the float64 tests in test_train.py check the accumulation itself)."""
  devices = jax.devices()[:1]
  monkeypatch.setenv(memory.CAPACITY_ENV, str(1 << 40))
  _, whole = runner.resolve_memory(_cfg(tiny), devices)
  assert whole.setting == memory.Setting(1, 1, "none")
  need_k1 = whole.per_device_bytes
  monkeypatch.setenv(memory.CAPACITY_ENV, str(int(0.97 * need_k1 / (1 - memory.HEADROOM))))
  out = runner.fit(_cfg(tiny), str(tmp_path / "auto"), progress=False, devices=devices)
  stored = json.loads((tmp_path / "auto" / "config.json").read_text())
  k = stored["train"]["gradient_accumulation_steps"]
  assert k > 1 and stored["train"]["remat"] == "none"
  assert stored["train"]["attention"] == "explicit"  # 'auto' on a CPU
  monkeypatch.delenv(memory.CAPACITY_ENV)
  ref = runner.fit(
    _cfg(tiny, **{"train.gradient_accumulation_steps": 1, "train.remat": "none"}),
    str(tmp_path / "k1"),
    progress=False,
    devices=devices,
  )
  np.testing.assert_allclose(out.losses, ref.losses, rtol=1e-5)
  assert out.step == ref.step == 8


def test_a_group_that_fits_nowhere_is_refused_before_training(tiny, tmp_path, monkeypatch):
  cfg = _cfg(tiny)
  params = grid.n_params(ModelConfig.from_config(cfg.model), cfg.train.context_size)
  least = memory.minimum_bytes(cfg, 1, params)  # the state and one update's tokens
  monkeypatch.setenv(memory.CAPACITY_ENV, str(least - 1))  # refused by arithmetic, uncompiled
  with pytest.raises(memory.TooLarge, match="cannot fit its devices at any memory setting"):
    runner.fit(cfg, str(tmp_path / "run"), progress=False, devices=jax.devices()[:1])
  assert not (tmp_path / "run").exists()
  monkeypatch.setenv(memory.CAPACITY_ENV, str(least + 1))  # above the bound: the compiler says
  with pytest.raises(memory.DoesNotFit, match=r"does not fit its devices: it needs [\d.]+ [MG]iB"):
    runner.fit(cfg, str(tmp_path / "run"), progress=False, devices=jax.devices()[:1])
  assert not (tmp_path / "run" / "config.json").exists()


def test_a_sweep_refuses_a_group_that_fits_nowhere_before_any_group_trains(
  tiny, tmp_path, monkeypatch
):
  """Two groups (B 4 and B 8); the capacity holds B = 4's programs but not B = 8's at any k:
  the sweep stops before training either, naming the B = 8 group."""
  import ml_collections

  from ihsweep.workers import sweep

  cfg = _cfg(tiny, **{"model.vocab_size": 64})
  cfg.sweep.grid = ml_collections.ConfigDict(
    {"train": ml_collections.ConfigDict({"batch_size": (4, 8)})}
  )
  cfg.sweep.seeds = 2
  devices = jax.devices()[:1]
  monkeypatch.setenv(memory.CAPACITY_ENV, str(1 << 40))
  need = {}
  for b in (4, 8):
    one = _cfg(
      tiny,
      **{"model.vocab_size": 64, "train.batch_size": b, "train.gradient_accumulation_steps": b},
    )  # B/k = 1: the smallest
    need[b] = runner.resolve_memory(one, devices)[1].per_device_bytes
  assert need[8] > need[4]
  capacity = (need[4] + need[8]) / 2 / (1 - memory.HEADROOM)
  monkeypatch.setenv(memory.CAPACITY_ENV, str(int(capacity)))
  monkeypatch.setattr(jax, "local_devices", lambda *a, **k: devices)
  with pytest.raises(memory.DoesNotFit, match=r"^group \S+ does not fit"):
    sweep.run(cfg, str(tmp_path / "sweep"), progress=False)
  assert not list((tmp_path / "sweep").glob("*/checkpoints"))
