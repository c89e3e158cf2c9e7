"""The devices a plan compiles for without them (``ihsweep plan --target=NAME``: ``make_target``),
and the compilers that make them (libtpu, JAX's CUDA plugin and cuDNN, found in build/).

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

The chips' numbers: ``chips``; the compiled plan: ``targets``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import re

from ihsweep.base import environment
from ihsweep.base.errors import IhsweepError
from ihsweep.planning.chips import (
  GPUS,
  NETWORKS,
  TPU_CHIPS,
  Chip,
  gpu_capacity,
  gpu_target_config,
  names,
  tpu_topology_problem,
)

GPU_COMPILER = "XLA GPU compiler (deviceless: no autotuning)"
CPU_ESTIMATE = "XLA CPU compiler (estimate"


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
    """The chip's ``chips.Network`` per device (a chip's links shared by its cores), or None
    where the table has no published figure (communication not priced: ``best_layout``)."""
    net = NETWORKS.get(self.chip.network)
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


# TPU_ACCELERATOR_TYPE's name for a slice of N chips (v4 and v5p count TensorCores, 2 per chip).
_ACCELERATOR_TYPES = {
  "v4": "v4-{cores}",
  "v5e": "v5litepod-{chips}",
  "v5p": "v5p-{cores}",
  "v6e": "v6e-{chips}",
}


def _describe_this_host_to_libtpu(chip_name: str, shape: str) -> None:
  """Off a TPU VM, libtpu asks the GCE metadata server for this host's accelerator type and the
  slice's worker hostnames, and with no answer prints "could not determine TPU accelerator
  type" and an E0000 INVALID_ARGUMENT "unexpected worker hostname" before every TPU plan. The
  values a one-host VM of the target would have (only where unset and no TPU is attached, so a
  TPU VM's own are kept) answer it; the compile-only topology comes from --target, and libtpu's
  other messages (real errors) still show."""
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  chips = math.prod(int(x) for x in shape.split("x"))
  kind = _ACCELERATOR_TYPES.get(chip_name)
  if kind:
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", kind.format(chips=chips, cores=2 * chips))
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


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
    _describe_this_host_to_libtpu(chip_name, name.split(":", 1)[1])
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
