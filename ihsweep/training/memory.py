"""Device memory of a group's programs, known before anything trains.

A group's train program is compiled ahead of time (``jax.jit(...).lower(shapes).compile()``) and
the compiler's own ``memory_analysis()`` gives the bytes it needs per device: its arguments
(the train state of the device's models, their hyper-parameters, a call's batches), outputs,
temporaries and code, less the donated state that the outputs reuse. For
``train.gradient_accumulation_steps = 0`` (and ``train.remat = 'auto'``, ``ensemble.vmap_chunk =
0``) ``choose`` searches, cheapest first, for the first setting that fits the device with
``HEADROOM`` to spare:

  1. everything at once: k = 1, no rematerialisation, the vmap chunk by its usual rule;
  2. fewer models vmapped at once (the chunk halved down to 1);
  3. gradient accumulation: the smallest k (a divisor of B that keeps B/k divisible by the mesh's
     'data' axis) that fits, by bisection (memory falls as k grows);
  4. the same with block rematerialisation (~1/3 more compute).

The evaluation program runs beside the resident train state; it is compiled once and its
temporaries are added to the state's bytes. A group that fits at no setting is refused with
``DoesNotFit``, one line naming the group, the bytes it needs and those available.

Capacity: ``device.memory_stats()['bytes_limit']`` (GPUs, TPUs), the ``IHSWEEP_DEVICE_MEMORY``
environment variable (bytes; overrides it: a smaller budget, or a CPU, where JAX reports none and
nothing is checked without it), or a ``Target``'s table for compile-only TPU devices.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable

from ihsweep.base import environment
from ihsweep.base.numbers import divisors
from ihsweep.compute.model import ModelConfig
from ihsweep.configuration import grid
from ihsweep.configuration.fields import ConfigError

log = logging.getLogger("ihsweep")

HEADROOM = 0.10  # of capacity kept free: the runtime's own buffers, fragmentation
CAPACITY_ENV = "IHSWEEP_DEVICE_MEMORY"
GIB = 1 << 30


def gib(n_bytes: float) -> str:
  """A byte count in the unit its size calls for: ``15.75 GiB``; below one GiB ``125.0 MiB``,
  below one MiB ``12.5 KiB``, below one KiB ``1,000 bytes``."""
  if n_bytes >= GIB:
    return f"{n_bytes / GIB:.2f} GiB"
  if n_bytes >= 1 << 20:
    return f"{n_bytes / (1 << 20):.1f} MiB"
  if n_bytes >= 1 << 10:
    return f"{n_bytes / (1 << 10):.1f} KiB"
  return f"{n_bytes:,.0f} bytes"


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  """One compiled program's bytes per device (``jax.stages.Compiled.memory_analysis()``) and its
  cost (``cost_analysis()``: FLOPs and bytes accessed per device, as XLA counts them)."""

  argument_bytes: int
  output_bytes: int
  alias_bytes: int  # outputs written into donated arguments
  temp_bytes: int
  code_bytes: int
  flops: float = 0.0
  bytes_accessed: float = 0.0
  cost_from: str = "compiled program"  # or "lowered HLO" (analyse)
  kernels_per_update: int = 0  # XLA:GPU programs: launches per update (planning.kernels)

  @property
  def peak_bytes(self) -> int:
    """Arguments + outputs − aliased + temporaries + code: what the program holds at once."""
    return (
      self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes
    )

  def to_json(self) -> dict:
    return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes}


def _cost(stage) -> dict:
  cost = stage.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else {}
  return cost


def _lowered_cost(lowered, n_devices: int) -> dict:
  """XLA's HLO cost analysis of a ``jax.stages.Lowered`` program, per device: its own
  ``cost_analysis`` where the backend gives one, else the same analysis run by this machine's
  CPU client on the lowered module (PJRT plugins such as JAX's CUDA plugin implement none; the
  analysis reads the HLO alone), whose global (unpartitioned) counts are divided by the
  ``n_devices`` the program is split over."""
  try:
    cost = _cost(lowered)
    if cost:
      return cost
  except NotImplementedError:
    pass
  import jax
  from jax._src.lib import _jax

  module = lowered._lowering.hlo().as_hlo_module()
  cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
  return {k: float(v) / n_devices for k, v in cost.items() if k in ("flops", "bytes accessed")}


def analyse(compiled, lowered=None, n_devices: int = 1) -> ProgramMemory:
  """``ProgramMemory`` of a ``jax.stages.Compiled`` (or an object with ``executable``). Where the
  compiled program reports no FLOPs or bytes accessed (XLA:GPU compiled deviceless reports
  none), they are XLA's HLO cost analysis of ``lowered`` (its ``jax.stages.Lowered``, split over
  ``n_devices``: ``_lowered_cost``): the program before the compiler's fusions, so its bytes
  count every op's operands and results (more than fused kernels move: the roofline's memory
  term is then an over-estimate, said by ``cost_from`` = "lowered HLO")."""
  compiled = getattr(compiled, "executable", compiled)
  m = compiled.memory_analysis()
  cost, cost_from = _cost(compiled), "compiled program"
  if lowered is not None and not (cost.get("flops") and cost.get("bytes accessed")):
    found = _lowered_cost(lowered, n_devices)
    cost, cost_from = {**found, **{k: v for k, v in cost.items() if v}}, "lowered HLO"
  return ProgramMemory(
    argument_bytes=int(m.argument_size_in_bytes),
    output_bytes=int(m.output_size_in_bytes),
    alias_bytes=int(m.alias_size_in_bytes),
    temp_bytes=int(m.temp_size_in_bytes),
    code_bytes=int(m.generated_code_size_in_bytes),
    flops=float(cost.get("flops", 0.0)),
    bytes_accessed=float(cost.get("bytes accessed", 0.0)),
    cost_from=cost_from,
  )


def exhausted_bytes(message: str, capacity_bytes: int) -> int:
  """The bytes a compiler's RESOURCE_EXHAUSTED message says a program needs (XLA TPU: "HLO
  temporaries 43.71G exceed available HBM 15.75G" and the like: the first size in it), else
  just over ``capacity_bytes``."""
  import re

  sizes = re.findall(r"(\d+(?:\.\d+)?)\s*([KMGT])i?B?\b", message)
  scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
  values = [float(v) * scale[u] for v, u in sizes]
  return int(max(values)) if values else capacity_bytes + 1


def device_capacity(device) -> int | None:
  """Bytes a program may use on ``device``: ``$IHSWEEP_DEVICE_MEMORY`` if set, else the
  device's ``bytes_limit`` (None on a CPU, where JAX reports no limit).

  Raises:
    EnvironmentVariableError: ``$IHSWEEP_DEVICE_MEMORY`` is not a number of bytes >= 1.
  """
  value = environment.get(CAPACITY_ENV)
  if value is not None:
    return value
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 — compile-only or CPU devices
    return None
  return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


@dataclasses.dataclass(frozen=True)
class Setting:
  """The memory choices of one compile: k microbatches, models vmapped at once, remat."""

  gradient_accumulation_steps: int
  vmap_chunk: int
  remat: str

  def describe(self) -> str:
    return (
      f"gradient_accumulation_steps={self.gradient_accumulation_steps}, "
      f"vmap_chunk={self.vmap_chunk}, remat={self.remat}"
    )


@dataclasses.dataclass
class Choice:
  """What ``choose`` found: the setting, its programs' memory, the bytes per device it needs
  (train program, or resident state + evaluation, whichever is larger; plus a prefetched
  call's batches for host-fed data) against ``capacity_bytes``; ``tried`` every setting
  compiled, with its bytes and compile seconds."""

  setting: Setting
  train: ProgramMemory
  eval: ProgramMemory | None
  per_device_bytes: int
  capacity_bytes: int | None
  tried: list

  @property
  def fits(self) -> bool:
    return self.capacity_bytes is None or self.per_device_bytes <= usable(self.capacity_bytes)

  def to_json(self) -> dict:
    return {
      "per_device_bytes": self.per_device_bytes,
      "capacity_bytes": self.capacity_bytes,
      "usable_bytes": usable(self.capacity_bytes) if self.capacity_bytes else None,
      "fits": self.fits,
      "train": self.train.to_json(),
      "eval": self.eval.to_json() if self.eval else None,
      "tried": [
        {**dataclasses.asdict(s), "per_device_bytes": b, "compile_s": round(t, 2)}
        for s, b, t in self.tried
      ],
    }


def usable(capacity_bytes: int) -> int:
  return int(capacity_bytes * (1.0 - HEADROOM))


def host_memory_bytes() -> int | None:
  """This machine's physical memory (``sysconf``), or None where it cannot be read."""
  try:
    return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
  except (ValueError, OSError, AttributeError):
    return None


def minimum_bytes(cfg, n_devices: int, n_params: int) -> int:
  """A lower bound, per device, on the bytes any memory setting needs for a group on
  ``n_devices`` (its mesh on as many of them as it can use: ``sharding.usable_count``): the train
  state of the device's models
  (parameters and AdamW's two moments, float32: 12 bytes a parameter) and one update's token
  batch of its share of B (``[B, C + 1]`` int32: what gradient accumulation splits, not what it
  avoids). Arithmetic only: it answers at once at any size, before anything is compiled."""
  from ihsweep.base.sharding import mesh_shape, usable_count

  size, batch = int(cfg.ensemble.size), int(cfg.train.batch_size)
  n_ens, n_data = mesh_shape(size, batch, usable_count(size, batch, n_devices))
  models = size // n_ens
  tokens = (batch // n_data) * (int(cfg.train.context_size) + 1)
  return models * (12 * n_params + 4 * tokens)


def check_possible(cfg, devices: list, name: str, capacity=None, n_params=None) -> None:
  """Refuses a group that cannot fit ``devices`` at any setting by arithmetic alone
  (``shortfall``), before its run directory or a program exists.

  Raises:
    TooLarge: the lower bound exceeds the capacity.
  """
  short = shortfall(cfg, devices, capacity, n_params)
  if short is not None:
    raise TooLarge(name, cfg, *short)


def shortfall(cfg, devices: list, capacity=None, n_params=None) -> tuple[int, int] | None:
  """``(bytes needed, capacity)`` per device where a group cannot fit ``devices`` at any
  setting (``minimum_bytes`` above the capacity), else None: against ``capacity`` (bytes per
  device), else the devices' own (``device_capacity``), else on CPU devices this machine's
  memory shared by the process's CPU devices (None where none is known). ``n_params``: the
  model's parameter count where the caller has it (a plan's ``Group.n_params``), else
  computed."""
  import jax

  if capacity is None:
    capacity = device_capacity(devices[0])
  if capacity is None and devices[0].platform == "cpu":
    host = host_memory_bytes()
    capacity = host // max(1, len(jax.local_devices(backend="cpu"))) if host else None
  if capacity is None:
    return None
  if n_params is None:
    n_params = grid.n_params(ModelConfig.from_config(cfg.model), int(cfg.train.context_size))
  need = minimum_bytes(cfg, len(devices), n_params)
  return (need, capacity) if need > capacity else None


class TooLarge(ConfigError):
  """A group whose train state and token batch alone exceed a device (one line)."""

  def __init__(self, name: str, cfg, need: int, capacity: int):
    message = (
      f"{name} cannot fit its devices at any memory setting: its models' train state and one "
      f"update's tokens alone need {gib(need)} per device (B = {cfg.train.batch_size}, C = "
      f"{cfg.train.context_size}, E = {cfg.ensemble.size}, d_model = {cfg.model.d_model}, "
      f"V = {cfg.model.vocab_size}), a device has {gib(capacity)}: lower train.batch_size, "
      f"the model's size or ensemble.size, or use more devices"
    )
    super().__init__("train.batch_size", cfg.train.batch_size, message)
    self.args = (message,)


class DoesNotFit(ConfigError):
  """A group whose programs fit its devices at no memory setting (one line)."""

  def __init__(self, group: str, choice: Choice):
    self.choice = choice
    best = min(choice.tried, key=lambda t: t[1])
    message = (
      f"{group} does not fit its devices: it needs {gib(best[1])} per device at the smallest "
      f"setting tried ({best[0].describe()}); a device has {gib(choice.capacity_bytes)}, of "
      f"which {gib(usable(choice.capacity_bytes))} usable ({HEADROOM:.0%} headroom): lower "
      f"train.batch_size or train.context_size, or spread the group over more devices "
      f"(mesh.num_devices)"
    )
    super().__init__("train.gradient_accumulation_steps", 0, message)
    self.args = (message,)

  def __str__(self) -> str:
    return self.args[0]


def accumulation_candidates(batch_size: int, data_axis: int) -> list[int]:
  """k that divide B with B/k a multiple of the 'data' axis (each microbatch on every device)."""
  return [k for k in divisors(batch_size) if (batch_size // k) % data_axis == 0]


def choose(
  compile_train: Callable[[Setting], ProgramMemory],
  *,
  batch_size: int,
  data_axis: int,
  local_models: int,
  default_chunk: int,
  fixed_k: int = 0,
  fixed_chunk: int = 0,
  remat: str = "auto",
  capacity_bytes: int | None,
  resident_extra_bytes: int = 0,
  eval_memory: ProgramMemory | None = None,
  group: str = "the group",
) -> Choice:
  """The cheapest setting whose programs fit (module docstring), compiling as few as needed.

  Args:
    compile_train: compiles the train program for a ``Setting`` and returns its memory.
    batch_size / data_axis / local_models: B, the mesh's 'data' axis, models per device.
    default_chunk: the vmap chunk of ``ensemble.vmap_chunk = 0`` (``train.auto_vmap_chunk``).
    fixed_k / fixed_chunk / remat: the config's values (0 / 0 / 'auto': chosen here).
    capacity_bytes: per device; None = unknown (nothing compiled: the first setting is taken).
    resident_extra_bytes: bytes beside the train program's (a prefetched call's batches).
    eval_memory: the evaluation program's, run beside the resident train state.

  Raises:
    DoesNotFit: with the capacity known, no setting fits.
  """
  ks = [fixed_k] if fixed_k else accumulation_candidates(batch_size, data_axis)
  chunks = [fixed_chunk] if fixed_chunk else _halvings(default_chunk, local_models)
  remats = [remat] if remat != "auto" else ["none", "blocks"]
  first = Setting(ks[0], chunks[0], remats[0])
  tried: list = []
  memo: dict = {}

  def need(setting: Setting) -> int:
    if setting not in memo:
      start = time.perf_counter()
      train_mem = compile_train(setting)
      eval_need = 0
      if eval_memory is not None:  # the state stays resident while the evaluation runs
        eval_need = train_mem.alias_bytes + eval_memory.peak_bytes
      memo[setting] = (train_mem, max(train_mem.peak_bytes, eval_need) + resident_extra_bytes)
      tried.append((setting, memo[setting][1], time.perf_counter() - start))
    return memo[setting][1]

  def result(setting: Setting) -> Choice:
    need(setting)
    train_mem, n = memo[setting]
    return Choice(setting, train_mem, eval_memory, n, capacity_bytes, tried)

  if capacity_bytes is None:
    return result(first)
  limit = usable(capacity_bytes)
  if need(first) <= limit:
    return result(first)
  for chunk in chunks[1:]:  # 2. fewer models at once
    s = Setting(ks[0], chunk, remats[0])
    if need(s) <= limit:
      return result(s)
  chunk = chunks[-1]
  for r in remats:  # 3., 4. the smallest k that fits, by bisection
    lo, hi = 0, len(ks) - 1
    if need(Setting(ks[hi], chunk, r)) > limit:
      continue
    while lo < hi:
      mid = (lo + hi) // 2
      if need(Setting(ks[mid], chunk, r)) <= limit:
        hi = mid
      else:
        lo = mid + 1
    return result(Setting(ks[lo], chunk, r))
  raise DoesNotFit(group, result(min(tried, key=lambda t: t[1])[0]))


def _halvings(chunk: int, local_models: int) -> list[int]:
  """``chunk``, then smaller divisors of ``local_models`` down to 1, about halving each time."""
  out = [chunk]
  for d in sorted(divisors(local_models), reverse=True):
    if d < out[-1] and d <= out[-1] // 2 or (d == 1 and out[-1] != 1):
      out.append(d)
  return out
