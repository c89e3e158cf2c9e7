"""Accelerators a sweep can be planned for without them (``ihsweep plan --target=NAME``).

TPU targets are topologies libtpu knows (``v5e:8x8``, ``v4:4x4x4``, ``v5p:4x4x4``, ``v6e:8x8``):
``jax.experimental.topologies.get_topology_desc`` gives compile-only devices, so every group's
programs are compiled by the real TPU compiler on this machine (libtpu from PyPI, which ``make
install`` puts in build/libtpu). A device's capacity is the compiler's own ("exceeds available HBM
(15.75G)" for a v5e core, read from a program made to exceed it). The topology's devices are
what libtpu lists: one per TensorCore (a v4 chip is two devices of 15.25 GiB there; on a v4 VM
JAX's megacore mode shows one of 32 GiB: the plan is the compile-only view).

GPU targets (``h100-80gb``, ``h200-141gb``, ``a100-80gb``, ``l40s-48gb``, with ``--devices=N``)
are compiled by XLA:GPU itself, deviceless: JAX's CUDA plugin (``jax-cuda12-plugin`` and
``jax-cuda12-pjrt``, installed with ``--no-deps`` into build/jax-cuda by ``make install``: no
NVIDIA library, no driver) and a ``GpuTargetConfig`` of the GPU's published properties
(``gpu_targets/NAME.txtpb``, each field's source stated) give compile-only GPU devices, on which
``jit(...).lower(shapes).compile()`` runs the GPU compiler without autotuning. Its memory analysis
is the plan's; its FLOPs too, while the bytes accessed, which the GPU compile does not report,
come from XLA's HLO cost analysis of the lowered program (``memory.analyse``). The capacity is
what a JAX process gets on that GPU (``gpu_capacity``: XLA_PYTHON_CLIENT_MEM_FRACTION, default
0.75, of its memory). Without the plugin the programs are compiled by the XLA CPU compiler for
this machine's CPU devices, labelled an estimate (``memory_from``; 1.5–3.4× the GPU compiler's
bytes on exp1).

Peak numbers (dense bf16 FLOP/s, HBM bandwidth) are the vendors' published specifications:
Google Cloud TPU docs (v4: 275 TFLOP/s, 1,228 GB/s per chip; v5e: 197, 819; v5p: 459, 2,765;
v6e: 918, 1,640 — per chip, shared by the devices libtpu lists for a chip: a v4 chip's two
TensorCores each get half, a v5p chip is one megacore device), NVIDIA data sheets
(H100 SXM 989 TFLOP/s, 3.35 TB/s; H200 989, 4.8 TB/s; A100 80 GB 312, 2.04 TB/s; L40S 362,
0.864 TB/s). The interconnect each gradient all-reduce is priced on: ``Chip.network``, an entry
of ``timing.NETWORKS`` (NVLink, PCIe or ICI, and across hosts, each with its source).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import re

from ihsweep.base import environment, numbers
from ihsweep.base.errors import IhsweepError
from ihsweep.planning import kernels, list_schedule, phases

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Chip:
  """Peak dense bf16 FLOP/s and HBM bytes/s per device, and (GPUs) memory per device."""

  name: str
  platform: str  # tpu | gpu
  peak_flops: float
  hbm_bytes_per_s: float
  capacity_bytes: int = 0  # unused: TPUs read theirs from the compiler, GPUs: gpu_capacity
  cores_per_chip: int = 1  # TPU devices per chip in libtpu's topology (make_target counts them)
  network: str = ""  # its timing.NETWORKS entry ('': no published figure, not priced)


TPU_CHIPS = {
  "v4": Chip("TPU v4", "tpu", 275e12, 1228 * GB, cores_per_chip=2, network="v4"),
  "v5e": Chip("TPU v5e", "tpu", 197e12, 819 * GB, network="v5e"),
  "v5p": Chip("TPU v5p", "tpu", 459e12, 2765 * GB, network="v5p"),  # one device (megacore)
  "v6e": Chip("TPU v6e", "tpu", 918e12, 1640 * GB, network="v6e"),
}
# XLA's GPU client takes this share of a GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION, default
# 0.75: JAX documentation, "GPU memory allocation"): the bytes_limit a run reads on the GPU.
GPU_MEMORY_FRACTION = 0.75
GPU_TARGET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
GPU_COMPILER = "XLA GPU compiler (deviceless: no autotuning)"
CPU_ESTIMATE = "XLA CPU compiler (estimate"


def gpu_target_config(name: str) -> str:
  """The ``GpuTargetConfig`` text proto of GPU ``name`` (``gpu_targets/NAME.txtpb``; each
  field's source in its comments and gpu_targets/README.md)."""
  with open(os.path.join(GPU_TARGET_DIR, f"{name}.txtpb")) as f:
    return f.read()


def gpu_capacity(name: str) -> int:
  """The bytes a JAX process may use on GPU ``name``: ``XLA_PYTHON_CLIENT_MEM_FRACTION``
  (default ``GPU_MEMORY_FRACTION``) of its target config's ``device_memory_size``."""
  total = int(re.search(r"device_memory_size:\s*(\d+)", gpu_target_config(name)).group(1))
  try:
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_MEMORY_FRACTION))
  except ValueError:
    fraction = GPU_MEMORY_FRACTION
  return int(total * fraction)


# Peak dense bf16 tensor FLOP/s and memory bandwidth (the datasheets gpu_targets/README.md names);
# capacity: gpu_capacity.
GPUS = {
  "h100-80gb": Chip("NVIDIA H100 SXM 80 GB", "gpu", 989e12, 3350 * GB, network="h100"),
  "h200-141gb": Chip("NVIDIA H200 141 GB", "gpu", 989e12, 4800 * GB, network="h200"),
  "a100-80gb": Chip("NVIDIA A100 SXM 80 GB", "gpu", 312e12, 2039 * GB, network="a100"),
  "l40s-48gb": Chip("NVIDIA L40S 48 GB", "gpu", 362e12, 864 * GB, network="l40s"),
}


# The slice shapes each TPU generation is sold in (Cloud TPU documentation, "TPU versions":
# v4, v5e, v5p and v6e pages), checked before libtpu sees a name: its compiler aborts the whole
# process (a C++ Check failure) on some shapes that its topology parser accepted, e.g. v5e:32x32.
_2D_SLICES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")  # up to 256 chips
_3D_SMALL = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")
_3D_MAX_CHIPS = {"v4": 4096, "v5p": 8960}


def tpu_topology_problem(chip: str, shape: str) -> str | None:
  """Why ``chip:shape`` is no slice that TPU generation has (one line listing those it has),
  or None."""
  if chip not in _3D_MAX_CHIPS:
    if shape in _2D_SLICES:
      return None
    return f"{chip} slices are 2D: {', '.join(_2D_SLICES)} (chips along each side)"
  dims = shape.split("x")
  most = _3D_MAX_CHIPS[chip]
  rule = (
    f"{chip} slices are 3D: {', '.join(_3D_SMALL)}, or AxBxC with A, B, C multiples of 4 and at "
    f"most {most:,} chips (e.g. 4x4x4, 4x8x8, 8x8x16)"
  )
  if shape in _3D_SMALL:
    return None
  if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 and int(d) % 4 == 0 for d in dims):
    return rule
  if math.prod(int(d) for d in dims) > most:
    return rule
  return None


class TargetError(IhsweepError, ValueError):
  """A target name or device count that cannot be planned for (one line)."""


@dataclasses.dataclass
class Target:
  """Where a plan compiles: ``devices`` (compile-only TPU devices, or this machine's CPU
  devices standing in for GPUs), per device ``capacity_bytes``, ``peak_flops`` and
  ``hbm_bytes_per_s``, and ``devices_per_host``."""

  name: str
  chip: Chip
  devices: list
  capacity_bytes: int
  devices_per_host: int
  estimate: str  # how memory is known: "TPU compiler" | "XLA CPU compiler (estimate)"

  @property
  def peak_flops(self) -> float:
    return self.chip.peak_flops / self.chip.cores_per_chip

  @property
  def hbm_bytes_per_s(self) -> float:
    return self.chip.hbm_bytes_per_s / self.chip.cores_per_chip

  @property
  def network(self):
    """The chip's ``timing.Network`` per device (a chip's links shared by its cores), or None
    where the table has no published figure (communication not priced: ``best_layout``)."""
    from ihsweep.planning import timing

    net = timing.NETWORKS.get(self.chip.network)
    if net is None or self.chip.cores_per_chip == 1:
      return net
    k = self.chip.cores_per_chip
    return dataclasses.replace(
      net,
      intra_host_bytes_per_s=net.intra_host_bytes_per_s / k,
      inter_host_bytes_per_s=net.inter_host_bytes_per_s / k,
    )

  def compiled_facts(self):
    """A ``compiled_facts.CompiledFacts`` for this target's programs: what an earlier plan's
    compile of the same program for the same target found is read back, not compiled again."""
    from ihsweep.training.compiled_facts import CompiledFacts

    d = self.devices[0]
    spec = gpu_target_config(self.name) if d.platform == "gpu" and self.name in GPUS else ""
    described = (self.name, self.estimate, d.platform, d.device_kind, spec)
    return CompiledFacts(
      repr(described), self.capacity_bytes, devices_per_host=self.devices_per_host
    )

  def to_json(self) -> dict:
    return {
      "name": self.name,
      "chip": self.chip.name,
      "devices": len(self.devices),
      "devices_per_host": self.devices_per_host,
      "capacity_bytes": self.capacity_bytes,
      "peak_flops_per_device": self.peak_flops,
      "hbm_bytes_per_s_per_device": self.hbm_bytes_per_s,
      "network": None if self.network is None else dataclasses.asdict(self.network),
      "memory_from": self.estimate,
    }


def names() -> str:
  return (
    "a TPU topology (" + ", ".join(f"{c}:AxB[xC]" for c in TPU_CHIPS) + ", e.g. v5e:8x8) or a GPU "
    "(" + ", ".join(GPUS) + ") with --devices=N"
  )


def tpu_capacity(device) -> int:
  """The bytes the TPU compiler lets one program use on ``device``: the "available HBM" its
  RESOURCE_EXHAUSTED message names for a program made to need far more."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import SingleDeviceSharding

  x = jax.ShapeDtypeStruct((1 << 18, 1 << 18), jnp.float32, sharding=SingleDeviceSharding(device))
  try:
    jax.jit(lambda a: (a * 2).sum(0) + (a + 1).sum(1)).lower(x).compile()
  except Exception as e:  # noqa: BLE001 — the message is the answer
    found = re.search(r"available HBM \(?(\d+(?:\.\d+)?)\s*([KMGT])", str(e))
    if found:
      scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[found.group(2)]
      return int(float(found.group(1)) * scale)
    raise TargetError(f"the TPU compiler did not name its memory: {str(e)[:200]}") from None
  raise TargetError("a 256 GiB program compiled for one TPU device: cannot read its memory")


# Where `make install` puts libtpu (the TPU compiler, from PyPI) in a checkout: not in the venv,
# since with libtpu importable JAX probes for a TPU at every start.
CHECKOUT_LIBTPU = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "libtpu"
)


def _has_module(module: str) -> bool:
  import importlib.util

  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is missing
    return False


def _importable(module: str, directory: str) -> bool:
  """Whether ``module`` imports, after appending ``directory`` (a folder `make install` fills
  under build/) to ``sys.path`` where it holds the module's package and the module is not
  importable otherwise."""
  import importlib
  import sys

  if _has_module(module):
    return True
  if not os.path.isdir(os.path.join(directory, module.split(".")[0])):
    return False
  sys.path.append(directory)
  importlib.invalidate_caches()
  return _has_module(module)


def _find_libtpu() -> bool:
  """Whether libtpu imports (from ``CHECKOUT_LIBTPU`` if not otherwise)."""
  return _importable("libtpu", CHECKOUT_LIBTPU)


def make_target(name: str, n_devices: int | None = None) -> Target:
  """The devices and numbers of target ``name`` (``names()``).

  Raises:
    TargetError: an unknown name, a GPU without ``n_devices`` or with more than this machine's
      CPU devices, or libtpu missing for a TPU topology.
  """
  import jax

  chip_name = name.split(":", 1)[0]
  if chip_name in TPU_CHIPS and ":" in name:
    if n_devices is not None:
      raise TargetError(
        f"--devices={n_devices} is not allowed with --target={name}: a TPU "
        f"topology has its own device count"
      )
    problem = tpu_topology_problem(chip_name, name.split(":", 1)[1])
    if problem:
      raise TargetError(f"--target={name} is not allowed: {problem}")
    if not _find_libtpu():
      raise TargetError(
        f"--target={name} compiles for TPU with libtpu, which is neither importable nor in "
        f"{CHECKOUT_LIBTPU}: `make install` puts it there (or `pip install libtpu`; no TPU "
        f"needed)"
      )
    from jax.experimental import topologies

    # libtpu locks /tmp/libtpu_lockfile for the one process that drives a TPU; compile-only
    # devices drive none, so plans may run side by side (and beside a training on a TPU VM).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # Programs for compile-only devices cannot be loaded back from the persistent compilation
    # cache (JAX warns for each), and no run here would use them.
    jax.config.update("jax_enable_compilation_cache", False)
    try:
      topo = topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as e:  # noqa: BLE001 — libtpu's own words
      raise TargetError(f"--target={name}: libtpu does not know this topology ({e})") from None
    devices = list(topo.devices)
    per_host = sum(1 for d in devices if d.process_index == devices[0].process_index)
    # The chip's peak, HBM and links are shared by the devices libtpu lists per chip: two
    # TensorCores of a v4 chip (15.25 GiB each), one megacore device of a v5p chip (95.74 GiB).
    chips = math.prod(int(x) for x in name.split(":", 1)[1].split("x"))
    chip = dataclasses.replace(TPU_CHIPS[chip_name], cores_per_chip=max(1, len(devices) // chips))
    return Target(name, chip, devices, tpu_capacity(devices[0]), per_host, "TPU compiler")
  if name in GPUS:
    return _gpu_target(name, n_devices)
  raise TargetError(f"--target={name} is not allowed: {names()}")


# Where `make install` puts JAX's CUDA plugin for compile-only GPU devices (jax-cuda12-plugin and
# jax-cuda12-pjrt, --no-deps: no NVIDIA libraries, no driver): off the venv's path, so that no
# other command probes for CUDA.
CHECKOUT_JAX_CUDA = os.path.join(os.path.dirname(CHECKOUT_LIBTPU), "jax-cuda")


def use_gpu_compiler() -> str | None:
  """Makes JAX's CUDA plugin (``CHECKOUT_JAX_CUDA``) discoverable for compile-only GPU devices;
  call before anything starts JAX's backends. Returns None when it is, else why not (the plan
  then falls back to the CPU compiler's estimate). Computation stays on the CPU
  (``jax_platforms`` 'cpu' unless the user chose)."""
  import jax
  from jax._src import xla_bridge

  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  plugin = "jax_plugins.xla_cuda12"  # jax_plugins is a namespace package: found in any folder
  if xla_bridge._plugins_registered and not _has_module(plugin):
    return "JAX's plugins were discovered before the CUDA plugin was put on the path"
  if not _importable(plugin, CHECKOUT_JAX_CUDA):
    return f"JAX's CUDA plugin is neither importable nor in {CHECKOUT_JAX_CUDA} (make install)"
  _find_cudnn()
  return None


def _find_cudnn() -> None:
  """JAX looks for its CUDA plugin's version module (which reports cuDNN's version, and
  without which jax.nn.dot_product_attention(implementation='cudnn') refuses) once, when jax is
  imported, before the plugin was on the path: look again, and give it to the module that
  imported the name (jax._src.cudnn.fused_attention_stablehlo)."""
  import importlib

  from jax._src import lib

  if lib.cuda_versions is not None:
    return
  try:
    versions = importlib.import_module("jax_cuda12_plugin._versions")
  except ImportError:
    return
  from jax._src.cudnn import fused_attention_stablehlo

  lib.cuda_versions = fused_attention_stablehlo.cuda_versions = versions


@contextlib.contextmanager
def _quiet_stderr():
  """Silences file descriptor 2 inside the block (C++ logging that Python cannot filter); a
  Python exception raised inside still carries its message."""
  import sys

  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as null:
      os.dup2(null.fileno(), 2)
      yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def _gpu_target(name: str, n_devices: int | None) -> Target:
  """N compile-only devices of GPU ``name`` (XLA:GPU, deviceless), or, without JAX's CUDA
  plugin, N of this machine's CPU devices standing in for them (the CPU compiler's estimate)."""
  import jax

  if n_devices is None:
    raise TargetError(f"--target={name} needs --devices=N (the GPUs the sweep runs on)")
  chip = GPUS[name]
  per_host = min(n_devices, environment.get("IHSWEEP_GPUS_PER_HOST"))
  if n_devices % per_host:
    raise TargetError(
      f"--devices={n_devices} is not allowed with --target={name}: a multiple of the "
      f"{per_host} GPUs per host (IHSWEEP_GPUS_PER_HOST), or at most {per_host} (one host)"
    )
  capacity = gpu_capacity(name)
  why = use_gpu_compiler()
  if why is None:
    from jax.experimental import topologies

    # Compile-only programs cannot be loaded back from the persistent cache (as for TPUs).
    jax.config.update("jax_enable_compilation_cache", False)
    try:
      with _quiet_stderr():  # the plugin's "Could not find cuda drivers" notes (C++ logging)
        topo = topologies.get_topology_desc(
          platform="cuda",
          target_config=gpu_target_config(name),
          topology=f"1x{n_devices // per_host}x{per_host}",
        )
      return Target(name, chip, list(topo.devices), capacity, per_host, GPU_COMPILER)
    except Exception as e:  # noqa: BLE001 — the plugin's own words, then the fallback
      why = f"the CUDA plugin made no devices ({str(e)[:200]})"
  local = jax.devices("cpu")
  if n_devices > len(local):
    raise TargetError(
      f"--devices={n_devices} with --target={name}: {why}, and this machine has "
      f"{len(local)} CPU device(s) to estimate on; set XLA_FLAGS="
      f"--xla_force_host_platform_device_count={n_devices} before the command"
    )
  return Target(name, chip, local[:n_devices], capacity, per_host, f"{CPU_ESTIMATE}: {why})")


def planned_source(cfg):
  """The data source a group's programs are compiled with for a target: the config's own,
  except that natural text (whose corpus need not be on this machine) is a host-fed stand-in
  of the corpus dtype (``[E, U, B, C + 1]`` per call, as at study scale)."""
  from ihsweep.data import make_source
  from ihsweep.data.source import Source

  mcfg, tr = cfg.model, cfg.train
  if cfg.data.source != "natural":
    return make_source(cfg.data, mcfg.vocab_size, tr.batch_size, tr.context_size)
  import numpy as np

  dtype = np.uint16 if mcfg.vocab_size <= 1 << 16 else np.uint32

  @dataclasses.dataclass
  class PlannedText(Source):
    vocab_size: int
    batch_size: int
    context_size: int
    on_device = False
    has_held_out_windows = True

    def sample(self, key, data_params, arrays):
      raise NotImplementedError("a planned corpus is host-fed")

    def host_batches(self, keys, first_step, n_steps):
      return np.zeros((len(keys), n_steps, self.batch_size, self.context_size + 1), dtype)

  return PlannedText(mcfg.vocab_size, tr.batch_size, tr.context_size)


def update_cost(choice, cfg, mesh_shape: tuple, platform: str = "cpu") -> tuple[float, float]:
  """FLOPs and bytes accessed per device for one update of the group, from the compiled train
  program's ``cost_analysis``. XLA counts a loop's body once, so its numbers are one microbatch
  of one vmap chunk with one vocabulary tile of the loss: they are scaled by k × chunks, and the
  other tiles' FLOPs (8 · t · D per token: forward, recomputed forward, two gradients) are added,
  and with cuDNN's attention the FLOPs of its custom calls (``fused_attention_flops``). Bytes of
  the other tiles are not (a lower bound where the loss is tiled). ``platform``: that of the
  devices compiled for (the tile rule, ``losses.logits_budget``)."""
  from ihsweep.compute import losses

  s = choice.setting
  n_ens, n_data = mesh_shape
  local = int(cfg.ensemble.size) // n_ens
  k, chunks = s.gradient_accumulation_steps, local // s.vmap_chunk
  b, c = int(cfg.train.batch_size), int(cfg.train.context_size)
  v, d = int(cfg.model.vocab_size), int(cfg.model.d_model)
  tokens = b // k * c  # per microbatch per model
  tile = losses.auto_vocab_tile(v, tokens, losses.logits_budget(platform))
  n_tiles = -(-v // tile)
  missing = 8.0 * (n_tiles - 1) * tile * d * (tokens / n_data) * s.vmap_chunk if tile < v else 0.0
  scale = k * chunks
  if cfg.train.get("attention", "explicit") == "cudnn":
    layers, c = int(cfg.model.n_layers), int(cfg.train.context_size)
    missing += fused_attention_flops(layers, d, c, tokens / n_data) * s.vmap_chunk
  return (choice.train.flops + missing) * scale, choice.train.bytes_accessed * scale


ROOFLINE_TERMS = {
  "flops_s": "FLOPs / peak",
  "bytes_s": "bytes accessed / HBM bandwidth",
  "state_bytes_s": "2 x train state / HBM bandwidth",
  "launch_s": "kernels x launch latency",
}


def update_time_terms(train, flops: float, n_bytes: float, target) -> dict:
  """The terms of one update's time on a device of ``target`` whose maximum is the plan's
  roofline (seconds), two lower bounds and an estimate: ``flops_s`` = FLOPs / peak; the memory
  term, ``bytes_s`` = bytes
  accessed / HBM bandwidth where the compiled program counted them, else ``state_bytes_s`` =
  twice the donated train state (``train.alias_bytes``: AdamW reads and writes every parameter
  and moment once per update at least) / HBM bandwidth — the lowered program's bytes count
  every unfused op and would over-state it; and for XLA:GPU programs ``launch_s`` = kernels per
  update (``planning.kernels``) × ``kernels.LAUNCH_S`` (an estimate: XLA's CUDA-graph command
  buffers can launch for less). ``train``: the train program's
  ``memory.ProgramMemory``."""

  terms = {"flops_s": flops / target.peak_flops}
  if train.cost_from != "lowered HLO":
    terms["bytes_s"] = n_bytes / target.hbm_bytes_per_s
  else:
    terms["state_bytes_s"] = 2.0 * train.alias_bytes / target.hbm_bytes_per_s
  if train.kernels_per_update:
    terms["launch_s"] = train.kernels_per_update * kernels.LAUNCH_S
  return terms


def fused_attention_flops(n_layers: int, d_model: int, context: int, tokens: float) -> float:
  """Training FLOPs of one model's attention scores and weighted values (QKᵀ, AV) over
  ``tokens`` tokens in sequences of C = ``context``, which cuDNN's flash attention computes
  inside a custom call that XLA's cost analysis counts as none: PaLM's 12 · n_layers · d_model ·
  C per token (Chowdhery et al. 2022,
  appendix B; forward + backward over the full C × C matrix), halved, because cuDNN skips the
  tiles the causal mask removes; its backward's recomputed scores are not counted (a lower
  bound, as the roofline is)."""
  return 0.5 * 12.0 * n_layers * d_model * context * tokens


def candidate_layouts(target: Target) -> list[int]:
  """Devices per worker, smallest first: those ``ihsweep plan`` tries on N devices of H per
  host (``list_schedule.candidate_layouts``: divisors of N up to H), then teams of 2, … hosts."""

  host, n = target.devices_per_host, len(target.devices)
  teams = [p * host for p in numbers.divisors(n // host) if p > 1]
  return list_schedule.candidate_layouts(n, host) + teams


def _layout_sizes(jobs, target: Target, d: int) -> dict | None:
  """Each group's devices on workers of ``d`` (``list_schedule.usable_device_count``), or None when
  ``d`` spans hosts and a group cannot use all of them (``phases.fills``)."""

  if d > target.devices_per_host and not all(phases.fills(j, d) for j in jobs):
    return None
  return {j.id: list_schedule.usable_device_count(j.n_models, j.batch_size, d) for j in jobs}


def plan_for_target(
  cfg,
  target: Target,
  law=None,
  log=lambda line: None,
  *,
  compare_attention: bool = False,
  run_flags: list[str] | None = None,
) -> dict:
  """Every group compiled for ``target`` (module docstring) at the smallest devices per worker
  D at which every group fits (memory chosen per group, ``runner.resolve_memory``): each
  group's memory, FLOPs and roofline time there, and the list schedule of the groups on the
  target's devices (``list_schedule.simulate``, plan order, each on its worker's
  ``usable_device_count``). Progress goes to ``log``: a line as each group's compile starts and
  ends, with its pass, "group i of n" and the seconds since the plan began.

  ``compare_attention``: each group whose train step's attention is not the explicit ``[B·H, C,
  C]`` pattern is compiled once more with that pattern at the setting chosen, to report what
  its kernel saves. Off by default: it changes no decision of the plan (the setting, D and the
  layout are chosen with the kernel ``train.resolve_attention`` gives on the target, the rule
  ``ihsweep run`` applies there) and doubles its compiles. ``run_flags``: the ``ihsweep run``
  flags of the planned sweep (``placement.run_flags``) for the launch lines.

  Returns a JSON-able dict: ``target``, ``devices_per_worker``, ``groups`` (per group: ``id``,
  ``batch_size``, ``context_size``, ``n_models``, ``devices``, ``mesh`` [ensemble, data],
  ``gradient_accumulation_steps``, ``vmap_chunk``, ``remat``, ``attention`` {``compiled`` (the
  train step's kernel, ``train.resolve_attention``); where it is the explicit pattern
  ``saved_bytes`` 0; else, with ``compare_attention``, ``explicit_bytes`` and ``saved_bytes``
  per device against the explicit pattern at the same setting}, ``memory``
  {``per_device_bytes``, ``argument_bytes``, ``temp_bytes``, ``capacity_bytes``, ``fits``},
  ``flops_per_update``, ``analytic_flops_per_update`` (PaLM's 6N + 12·L·d·C per token),
  ``bytes_per_update``, ``roofline_update_s``, ``all_reduce_s`` (per update, over its data
  axis on the chip's network; 0 without one), ``update_s`` (their sum), ``updates``,
  ``roofline_s``, ``seconds`` at D), ``refused`` (layouts tried before D and why),
  ``layouts`` (D and every wider layout: groups on more devices, times scaled by the device
  ratio; each with ``data_axis_groups``, the groups whose gradient is all-reduced there,
  ``comm_share``, the all-reduces' share of the groups' device-time, and ``not_launchable``,
  why the launchers cannot start it, or None), the best of them
  (``devices_per_worker``, ``n_workers``, ``schedule``, ``makespan_s``, ``utilisation``; the
  shortest makespan among the launchable layouts, and where the chip's network has no
  published figure among those without all-reduces, ``unpriced`` saying so), ``launch``
  ({``lines``, ``note``}: ``placement.launch_lines`` for the best layout; None without
  ``run_flags``) and ``fits``.
  """
  import time

  from ihsweep.compute import schedule
  from ihsweep.planning import kernels, placement, timing
  from ihsweep.training import memory

  t0 = time.perf_counter()
  fixed = int(cfg.mesh.num_devices)
  if fixed and fixed not in candidate_layouts(target):
    raise TargetError(
      f"config.mesh.num_devices = {fixed} is not allowed with --target={target.name} on "
      f"{len(target.devices)} device(s): 0 (the plan chooses the devices per worker) or one of "
      f"{', '.join(map(str, candidate_layouts(target)))}"
    )
  _, jobs = placement.make_jobs(cfg, law, check_data=False)
  for j in jobs:  # too large on every device of the target at any setting: refused uncompiled
    widest = list_schedule.usable_device_count(j.n_models, j.batch_size, len(target.devices))
    memory.check_possible(
      j.cfg, target.devices[:widest], f"group {j.id}", target.capacity_bytes, j.n_params
    )
  compile_group = _GroupCompiler(target, log, t0)
  refused = []
  layout = _first_fitting_layout(jobs, target, compile_group, refused, fixed)
  if layout is None:
    return {"target": target.to_json(), "fits": False, "refused": refused, "groups": []}
  d, sizes = layout
  fused = [j for j in jobs if compile_group(j, sizes[j.id])[0].train.attention != "explicit"]
  if compare_attention and fused:
    compile_group.passes += 1
    for i, j in enumerate(fused):
      where = (
        f"pass {compile_group.passes} (--compare_attention: the explicit pattern), group "
        f"{i + 1} of {len(fused)}"
      )
      compile_group.explicit_bytes(j, sizes[j.id], where)
  comm_model = timing.FlopsModel(target.peak_flops, target.network, target.devices_per_host)
  groups, entries = [], []
  for j in jobs:
    m = sizes[j.id]
    row = _group_row(j, m, compile_group, target, comm_model)
    groups.append(row)
    entries.append((j, m, row["roofline_s"]))
  layouts = _wider_layouts(jobs, target, d, entries, comm_model, fixed)
  best, unpriced = best_layout(layouts, target)
  launch = None
  if run_flags is not None:
    lines, note = placement.launch_lines(
      run_flags,
      best["n_workers"],
      best["devices_per_worker"],
      target.devices_per_host,
      target.chip.platform,
    )
    launch = {"lines": lines, "note": note}
  return {
    "target": target.to_json(),
    "devices_per_worker": best["devices_per_worker"],
    "n_workers": best["n_workers"],
    "compiled_devices_per_worker": d,
    "refused": refused,
    "groups": groups,
    "layouts": [{k: v for k, v in lay.items() if k != "schedule"} for lay in layouts],
    "schedule": best["schedule"],
    "makespan_s": best["makespan_s"],
    "utilisation": best["utilisation"],
    "unpriced": unpriced,
    "launch": launch,
    "fits": all(g["memory"]["fits"] for g in groups),
    "checkpoints": schedule.checkpoint_totals([g["checkpoints"] for g in groups]),
    "headroom": memory.HEADROOM,
    "roofline": "per update and device the largest of two lower bounds, FLOPs / peak and the "
    "bytes accessed / HBM bandwidth (where the compiled program counts them, else twice the "
    "train state), and for GPUs an estimate, kernels per update x "
    f"{kernels.LAUNCH_S * 1e6:.0f} us per launch (update_time_terms), + the gradient "
    "all-reduce over a data axis on the chip's network ("
    + (target.network.describe() if target.network else "no published figure: not priced")
    + "); evaluation, checkpoints and start-up not counted",
  }


def best_layout(layouts: list[dict], target: Target) -> tuple[dict, str | None]:
  """``(the plan's layout, None or why its choice is unpriced)``: of ``_wider_layouts``' layouts
  the launchable ones (``not_launchable`` None), the shortest makespan first, then the fewest
  devices per worker. Where the chip's network has no published figure the all-reduces are
  not priced, so only layouts without any (``data_axis_groups`` 0: every group's models whole
  on their devices) compete; where none is, the choice is the same and ``unpriced`` says it
  ignored their all-reduces."""
  pool = [lay for lay in layouts if lay.get("not_launchable") is None] or layouts
  unpriced = None
  if target.network is None:
    nil = [lay for lay in pool if lay["data_axis_groups"] == 0]
    unpriced = (
      f"{target.chip.name}: no published interconnect figure, so gradient all-reduces are not "
      f"priced; "
      + (
        "the plan's layout is the best of those without any"
        if nil
        else "every layout all-reduces some group's gradient: the choice ignores that time"
      )
    )
    pool = nil or pool
  best = min(pool, key=lambda lay: (round(lay["makespan_s"], 6), lay["devices_per_worker"]))
  return best, unpriced


class _GroupCompiler:
  """``(compiled config, memory.Choice, why it does not fit or None)`` of a job on its first m
  devices of the target (``runner.resolve_memory``, bf16 compute where the dtype is 'auto'),
  compiled once per (job, m), with a progress line to ``log`` as each compile starts and ends
  (its pass, "group i of n" and the seconds since the plan began)."""

  def __init__(self, target: Target, log, t0: float):
    self.target, self.log, self.memo = target, log, {}
    self.facts = target.compiled_facts()
    self.t0, self.passes = t0, 0  # the plan's start (time.perf_counter); passes begun

  def _progress(self, where: str, text: str) -> float:
    """Logs ``[seconds since the plan began] where: text``; returns time.perf_counter()."""
    import time

    now = time.perf_counter()
    self.log(f"[{now - self.t0:6.0f} s] {where}: {text}")
    return now

  def _reused(self, hits_before: int) -> str:
    n = self.facts.hits - hits_before
    where = self.facts.directory
    return f"; {n} program(s) read back from {where}, compiled by an earlier plan" if n else ""

  def __call__(self, job, m: int, where: str = "") -> tuple:
    import time

    from ihsweep.training import memory, runner

    target, memo = self.target, self.memo
    if (job.id, m) not in memo:
      hits = self.facts.hits
      start = self._progress(
        where,
        f"group {job.id} (E = {job.n_models}, B = {job.batch_size}, C = {job.context_size}): "
        f"compiling for {target.name} on {m} device(s) ...",
      )
      cfg = copy.deepcopy(job.cfg)
      if cfg.model.dtype == "auto":  # as on the target: bf16 compute (ModelConfig.dtype)
        with cfg.unlocked():
          cfg.model.dtype = "bfloat16"
      try:
        out, choice = runner.resolve_memory(
          cfg,
          target.devices[:m],
          f"group {job.id}",
          target.capacity_bytes,
          planned_source(job.cfg),
          target.chip.platform,
          count_kernels=_kernels_per_update if target.devices[0].platform == "gpu" else None,
          facts=self.facts,
        )
        memo[(job.id, m)] = (out, choice, None)
      except memory.DoesNotFit as e:
        memo[(job.id, m)] = (cfg, e.choice, str(e))
      c = memo[(job.id, m)][1]
      self._progress(
        where,
        f"group {job.id} done in {time.perf_counter() - start:.0f} s: {c.setting.describe()}, "
        f"{memory.gib(c.per_device_bytes)} per device ({len(c.tried)} setting(s) "
        f"{'tried' if self.facts.hits > hits else 'compiled'}{self._reused(hits)})",
      )
    return memo[(job.id, m)]

  def explicit_bytes(self, job, m: int, where: str = "") -> int:
    """Bytes per device of the job's programs on m devices at the setting chosen there, with
    the explicit attention pattern instead of the chosen kernel (compiled once more)."""
    import time

    from ihsweep.training import memory, runner

    if ("explicit", job.id, m) not in self.memo:
      out, choice, _ = self(job, m)
      s = choice.setting
      cfg = copy.deepcopy(out)
      with cfg.unlocked():
        cfg.train.attention = "explicit"
        cfg.train.gradient_accumulation_steps = s.gradient_accumulation_steps
        cfg.train.remat = s.remat
        cfg.ensemble.vmap_chunk = s.vmap_chunk
      hits = self.facts.hits
      start = self._progress(
        where,
        f"group {job.id}: compiling with the explicit attention pattern (what "
        f"{out.train.attention} saves) ...",
      )
      try:
        _, found = runner.resolve_memory(
          cfg,
          self.target.devices[:m],
          f"group {job.id}",
          self.target.capacity_bytes,
          planned_source(job.cfg),
          self.target.chip.platform,
          facts=self.facts,
        )
      except memory.DoesNotFit as e:
        found = e.choice
      self.memo[("explicit", job.id, m)] = found.per_device_bytes
      self._progress(
        where,
        f"group {job.id} done in {time.perf_counter() - start:.0f} s: "
        f"{memory.gib(found.per_device_bytes)} per device{self._reused(hits)}",
      )
    return self.memo[("explicit", job.id, m)]


def _first_fitting_layout(jobs, target: Target, compile_group, refused: list, fixed: int = 0):
  """``(D, {group id: devices})``: the first of ``candidate_layouts`` (only ``fixed``, the
  config's mesh.num_devices, if set) at which every group fits, or None; the layouts refused
  before it are appended to ``refused`` with why."""
  for d in [fixed] if fixed else candidate_layouts(target):
    sizes = _layout_sizes(jobs, target, d)
    if sizes is None:
      refused.append(
        {
          "devices_per_worker": d,
          "why": "a group cannot use every device of a worker spanning hosts",
        }
      )
      continue
    bad = None
    compile_group.passes += 1
    for i, j in enumerate(jobs):
      where = (
        f"pass {compile_group.passes} (memory on workers of {d} device(s)), group {i + 1} of "
        f"{len(jobs)}"
      )
      _, _, why = compile_group(j, sizes[j.id], where)
      if why:
        bad = why
        break
    if bad is None:
      return d, sizes
    refused.append({"devices_per_worker": d, "why": bad})
  return None


def _group_row(j, m: int, compile_group, target: Target, comm_model) -> dict:
  """One group of ``plan_for_target``'s ``groups``: compiled on m devices, its memory, FLOPs,
  roofline and all-reduce time per update, and its updates' time."""
  from ihsweep.base import sharding
  from ihsweep.compute import schedule

  out, choice, _ = compile_group(j, m)
  mesh = sharding.mesh_shape(j.n_models, j.batch_size, m)
  flops, n_bytes = update_cost(choice, out, mesh, target.devices[0].platform)
  terms = update_time_terms(choice.train, flops, n_bytes, target)
  roofline = max(terms.values())
  all_reduce = comm_model.all_reduce_s(j, m)
  per_update = roofline + all_reduce
  s = choice.setting
  attention = {"compiled": out.train.get("attention", "explicit")}
  if attention["compiled"] == "explicit":
    attention["saved_bytes"] = 0
  elif ("explicit", j.id, m) in compile_group.memo:  # compiled by --compare_attention
    attention["explicit_bytes"] = compile_group.explicit_bytes(j, m)
    attention["saved_bytes"] = attention["explicit_bytes"] - choice.per_device_bytes
  return {
    "id": j.id,
    "batch_size": j.batch_size,
    "context_size": j.context_size,
    "n_models": j.n_models,
    "n_params": j.n_params,
    "devices": m,
    "mesh": list(mesh),
    "gradient_accumulation_steps": s.gradient_accumulation_steps,
    "vmap_chunk": s.vmap_chunk,
    "remat": s.remat,
    "attention": attention,
    "memory_from": target.estimate,
    "cost_from": choice.train.cost_from,
    "memory": {
      "per_device_bytes": choice.per_device_bytes,
      "argument_bytes": choice.train.argument_bytes,
      "temp_bytes": choice.train.temp_bytes,
      "capacity_bytes": target.capacity_bytes,
      "fits": choice.fits,
    },
    "compiled_settings": len(choice.tried),
    "compile_s": sum(t for _, _, t in choice.tried),
    "tried": choice.to_json()["tried"],
    "flops_per_update": flops,
    "analytic_flops_per_update": j.flops_per_update / m,
    "bytes_per_update": n_bytes,
    "kernels_per_update": choice.train.kernels_per_update,
    "roofline_terms": terms,
    "roofline_from": "max(" + ", ".join(ROOFLINE_TERMS[t] for t in terms) + ")",
    "roofline_update_s": roofline,
    "all_reduce_s": all_reduce,
    "update_s": per_update,
    "updates": j.updates,
    "roofline_s": roofline * j.updates,
    "seconds": per_update * j.updates,
    "checkpoints": schedule.checkpoint_bytes(j.cfg, j.n_params, j.updates, per_update * j.updates),
  }


def _wider_layouts(jobs, target: Target, d: int, entries, comm_model, fixed: int = 0) -> list[dict]:
  """D and every wider layout (D alone when ``fixed``, the config's mesh.num_devices), each
  list-scheduled (``list_schedule.simulate``), with the groups whose mesh has a data axis there
  (``data_axis_groups``), the all-reduces' share of the groups' device-time (``comm_share``)
  and, on a TPU, workers narrower than a host ``not_launchable``
  (launch/tpu_pod.sh runs one process per host, a worker over all its devices)."""
  from ihsweep.base import sharding

  # Wider workers: each group on m' = usable_device_count(E, B, D') ≥ m devices, its compute time
  # scaled from its compiled one as m / m' (its batch split further), plus its all-reduces on
  # m' devices, and its memory per device no larger than at m (compiled there). The layout with
  # the shortest makespan is the plan's.
  n = len(target.devices)
  layouts = []
  for wide in [w for w in candidate_layouts(target) if w >= d and (not fixed or w == d)]:
    m_wide = _layout_sizes(jobs, target, wide)
    if m_wide is None:
      continue
    comm = {j.id: j.updates * comm_model.all_reduce_s(j, m_wide[j.id]) for j, _, _ in entries}
    rows = [(j.id, m_wide[j.id], sec * m / m_wide[j.id] + comm[j.id]) for j, m, sec in entries]
    held = sum(mw * t for _, mw, t in rows)
    sched = list_schedule.simulate(rows, n, wide)
    host = target.devices_per_host
    layouts.append(
      {
        "devices_per_worker": wide,
        "n_workers": n // wide,
        "makespan_s": sched.makespan_s,
        "utilisation": sched.utilisation,
        "data_axis_groups": sum(
          sharding.mesh_shape(j.n_models, j.batch_size, m_wide[j.id])[1] > 1 for j in jobs
        ),
        "comm_share": sum(m_wide[i] * c for i, c in comm.items()) / held if held else 0.0,
        "not_launchable": (
          f"a TPU host runs one process, a worker over its {host} devices"
          if target.chip.platform == "tpu" and wide % host
          else None
        ),
        "schedule": [dataclasses.asdict(slot) for slot in sched.slots],
      }
    )
  return layouts


def _signed_gib(n_bytes: int) -> str:
  from ihsweep.training.memory import gib

  return ("-" if n_bytes < 0 else "") + gib(abs(n_bytes))


def _bound(group: dict) -> str:
  """Which lower bound sets a group's roofline: flops, memory or launch."""
  terms = group.get("roofline_terms") or {"flops_s": 1.0}
  top = max(terms, key=terms.get)
  return {"flops_s": "flops", "launch_s": "launch"}.get(top, "memory")


def format_plan(p: dict) -> str:
  """The text ``ihsweep plan --target`` prints."""
  from ihsweep.compute.schedule import describe_checkpoint_totals
  from ihsweep.planning.prediction import duration
  from ihsweep.training.memory import gib

  t = p["target"]
  lines = [
    f"target {t['name']}: {t['devices']} {t['chip']} device(s), {t['devices_per_host']} per host, "
    f"{gib(t['capacity_bytes'])} each (memory from the {t['memory_from']}); peak "
    f"{t['peak_flops_per_device'] / 1e12:.0f} TFLOP/s bf16 and "
    f"{t['hbm_bytes_per_s_per_device'] / 1e9:.0f} GB/s per device",
  ]
  for r in p["refused"]:
    lines.append(f"  {r['devices_per_worker']} device(s) per worker refused: {r['why']}")
  if not p["groups"]:
    lines.append("no layout fits every group")
    return "\n".join(lines)
  lines.append(
    f"compiled on workers of {p['compiled_devices_per_worker']} device(s), the fewest at which "
    f"every group fits; per group (memory per device with {p['headroom']:.0%} headroom):"
  )
  lines.append(
    "  group     B     C  E  dev  mesh   k  chunk remat  attention   memory/device       "
    "fits  TFLOP/upd  roofline/upd bound  all-reduce/upd      time"
  )
  for g in p["groups"]:
    mem = g["memory"]
    lines.append(
      f"  {g['id']:<6} {g['batch_size']:>4} {g['context_size']:>5} {g['n_models']:>2} "
      f"{g['devices']:>4}  {g['mesh'][0]}x{g['mesh'][1]:<3} {g['gradient_accumulation_steps']:>3} "
      f"{g['vmap_chunk']:>5} {g['remat']:<6} {g['attention']['compiled']:<9}  "
      f"{gib(mem['per_device_bytes']):>9} / "
      f"{gib(mem['capacity_bytes']):<9} {'yes' if mem['fits'] else 'NO':<4} "
      f"{g['flops_per_update'] / 1e12:>9.3f}  {g['roofline_update_s'] * 1e3:>9.2f} ms "
      f"{_bound(g):<6} "
      f"{g['all_reduce_s'] * 1e3:>11.2f} ms  {duration(g['seconds']):>8}"
    )
  fused = [g for g in p["groups"] if g["attention"]["compiled"] != "explicit"]
  if fused and not all("explicit_bytes" in g["attention"] for g in fused):
    lines.append(
      f"attention: {len(fused)} group(s) compiled with {fused[0]['attention']['compiled']} "
      f"(--compare_attention compiles each once more with the explicit pattern, to show what "
      f"it saves)"
    )
  elif fused:
    saved = [g["attention"]["saved_bytes"] for g in fused]
    widest = max(fused, key=lambda g: (g["context_size"], g["attention"]["saved_bytes"]))
    before, after = widest["attention"]["explicit_bytes"], widest["memory"]["per_device_bytes"]
    lines.append(
      f"attention: {len(fused)} group(s) compiled with {fused[0]['attention']['compiled']}; "
      f"bytes per device saved against the explicit pattern at the same setting: "
      f"{_signed_gib(min(saved))} to {_signed_gib(max(saved))} (group {widest['id']}, C = "
      f"{widest['context_size']}: {gib(before)} -> {gib(after)})"
    )
  lines.append(
    "layouts (wider workers: compute scaled by devices, all-reduces on the wider mesh, memory "
    "no larger):"
  )
  for lay in p["layouts"]:
    mark = "  <- best" if lay["devices_per_worker"] == p["devices_per_worker"] else ""
    if lay.get("not_launchable"):
      mark += f"  (not launchable: {lay['not_launchable']})"
    comm = lay.get("comm_share") or 0.0
    lines.append(
      f"  {lay['n_workers']:>4} worker(s) × {lay['devices_per_worker']:>3} device(s): roofline "
      f"makespan {duration(lay['makespan_s'])}, utilisation {lay['utilisation']:.0%}"
      + (f", all-reduces {comm:.0%} of the groups' device-time" if comm else "")
      + mark
    )
  if p.get("unpriced"):
    lines.append(f"network: {p['unpriced']}")
  lines.append(
    f"roofline makespan {duration(p['makespan_s'])}, utilisation {p['utilisation']:.0%} on "
    f"{p['n_workers']} worker(s) × {p['devices_per_worker']} device(s) ({p['roofline']})"
  )
  analytic = sum(g["analytic_flops_per_update"] * g["devices"] * g["updates"] for g in p["groups"])
  device_s = sum(g["roofline_s"] * g["devices"] for g in p["groups"])
  f_max = analytic / device_s if device_s else 0.0
  lines.append(
    f"`ihsweep plan --flops_per_s=F` prices PaLM's analytic FLOPs alone at F per device: "
    f"{analytic / t['peak_flops_per_device'] / 3600:.2f} device-hours at this peak, divided by "
    f"the fraction of it you give; this roofline's {device_s / 3600:.2f} device-hours add what "
    f"the compiled programs say (their FLOPs, state bytes and kernel launches): an F above "
    f"{f_max:.3g} FLOP/s ({f_max / t['peak_flops_per_device']:.0%} of peak) would promise less "
    f"time than it (a floor where FLOPs or memory set it; launches are an estimate)"
  )
  lines.append(describe_checkpoint_totals(p["checkpoints"]) + " (roofline times)")
  lines.append("every group fits" if p["fits"] else "NOT every group fits")
  launch = p.get("launch") or {"lines": [], "note": ""}
  if launch["lines"]:
    lines.append(
      f"to run it ({p['n_workers']} worker(s) × {p['devices_per_worker']} device(s); "
      f"{launch['note']}):"
    )
    lines += [f"  {line}" for line in launch["lines"]]
  elif launch["note"]:
    lines.append(f"not launchable as planned: {launch['note']}")
  return "\n".join(lines)


def _kernels_per_update(hlo_text: str) -> int:
  """The kernels an XLA:GPU program launches per update (``kernels.per_update``)."""
  return kernels.per_update(hlo_text)["kernels"]
