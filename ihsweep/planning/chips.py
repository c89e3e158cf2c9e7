"""The accelerators ``ihsweep plan --target`` knows, as data: each chip's published peak
(dense bf16 FLOP/s), memory bandwidth and interconnect (an entry of ``NETWORKS``), the TPU
slice shapes each generation is sold in, and the GPU target descriptions (``gpu_targets/``).

Peak numbers (dense bf16 FLOP/s, HBM bandwidth) are the vendors' published specifications:
Google Cloud TPU docs (v4: 275 TFLOP/s, 1,228 GB/s per chip; v5e: 197, 819; v5p: 459, 2,765;
v6e: 918, 1,640 — per chip, shared by the devices libtpu lists for a chip: a v4 chip's two
TensorCores each get half, a v5p chip is one megacore device), NVIDIA data sheets
(H100 SXM 989 TFLOP/s, 3.35 TB/s; H200 989, 4.8 TB/s; A100 80 GB 312, 2.04 TB/s; L40S 362,
0.864 TB/s). The interconnect each gradient all-reduce is priced on: ``Chip.network``, an entry
of ``NETWORKS`` (NVLink, PCIe or ICI, and across hosts, each with its source).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

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
  network: str = ""  # its NETWORKS entry ('': no published figure, not priced)


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


def tpu_slice(chip: str, n_chips: int) -> str | None:
  """The smallest-listed slice shape of TPU generation ``chip`` with ``n_chips`` chips (those
  ``tpu_topology_problem`` accepts without the 3D rule's large shapes), or None."""
  shapes = _3D_SMALL if chip in _3D_MAX_CHIPS else _2D_SLICES
  for shape in shapes:
    if math.prod(int(d) for d in shape.split("x")) == n_chips:
      return shape
  return None


def names() -> str:
  return (
    "a TPU topology (" + ", ".join(f"{c}:AxB[xC]" for c in TPU_CHIPS) + ", e.g. v5e:8x8) or a GPU "
    "(" + ", ".join(GPUS) + ") with --devices=N"
  )


@dataclasses.dataclass(frozen=True)
class Network:
  """The interconnect a plan prices a data axis's gradient all-reduce on, per device and each
  way: ``intra_host_bytes_per_s`` among one host's devices, ``inter_host_bytes_per_s`` when the
  data axis spans hosts; ``latency_s`` per ring step; ``phase_switch_s``: what each phase after
  the first costs before its training starts (every process waits at a barrier, forms its new
  team and compiles its first group's programs, which no earlier training hides: an assumed
  figure, not a measured one). ``source``: where the bandwidths come from."""

  name: str
  intra_host_bytes_per_s: float
  inter_host_bytes_per_s: float
  source: str
  latency_s: float = 10e-6
  phase_switch_s: float = 60.0

  def all_reduce_s(self, n_bytes: float, n: int, across_hosts: bool) -> float:
    """Seconds of a ring all-reduce of ``n_bytes`` (per device) over ``n`` devices: each
    sends and receives 2 (n − 1) / n of them over its slowest link, in 2 (n − 1) steps
    (Patarasuk & Yuan 2009, the bandwidth-optimal ring; NCCL's ring is this algorithm)."""
    if n <= 1:
      return 0.0
    bw = self.inter_host_bytes_per_s if across_hosts else self.intra_host_bytes_per_s
    return 2 * (n - 1) / n * n_bytes / bw + 2 * (n - 1) * self.latency_s

  def describe(self) -> str:
    return (
      f"{self.name}: {self.intra_host_bytes_per_s / 1e9:.4g} GB/s per device each way within "
      f"a host, {self.inter_host_bytes_per_s / 1e9:.4g} GB/s across hosts ({self.source}); "
      f"{self.latency_s * 1e6:g} µs per ring step; {self.phase_switch_s:g} s per phase switch "
      f"(assumed)"
    )


# Published interconnect bandwidths, per device and each way: half the bidirectional figure
# (NVLink, PCIe, the Cloud TPU pages' "bidirectional ICI bandwidth per chip"); a TPU chip's
# figure is shared by its TensorCores where libtpu lists them as devices (toolchain.Target).
NETWORKS = {
  "none": None,
  "h100": Network(
    "h100",
    450e9,
    50e9,
    "NVIDIA H100 SXM: NVLink 4, 900 GB/s bidirectional per GPU; across hosts one 400 Gb/s "
    "InfiniBand NDR port per GPU",
  ),
  "h200": Network(
    "h200",
    450e9,
    50e9,
    "NVIDIA H200 SXM datasheet: NVLink 4, 900 GB/s bidirectional per GPU (the H100's); across "
    "hosts one 400 Gb/s InfiniBand NDR port per GPU, as in DGX H200",
  ),
  "a100": Network(
    "a100",
    300e9,
    25e9,
    "NVIDIA A100 SXM datasheet: NVLink 3, 600 GB/s bidirectional per GPU; across hosts one "
    "200 Gb/s InfiniBand HDR port per GPU, as in DGX A100",
  ),
  "l40s": Network(
    "l40s",
    32e9,
    32e9,
    "NVIDIA L40S datasheet: no NVLink, PCIe Gen4 x16, 64 GB/s bidirectional per GPU; across "
    "hosts no published per-GPU network: its PCIe link bounds it (a lower bound on the time)",
  ),
  "v4": Network(
    "v4",
    1.1e15 / 4096,
    1.1e15 / 4096,
    "Cloud TPU v4 docs: all-reduce bandwidth 1.1 PB/s per 4,096-chip Pod, 268.6 GB/s per chip "
    "(the same share gives v5e's and v6e's per-chip figures), across the hosts of a slice too",
  ),
  "v5e": Network(
    "v5e",
    200e9,
    200e9,
    "Cloud TPU v5e: ICI 400 GB/s bidirectional per chip, across the hosts of a slice too",
  ),
  "v5p": Network(
    "v5p",
    600e9,
    600e9,
    "Cloud TPU v5p: ICI 1,200 GB/s bidirectional per chip, across the hosts of a slice too",
  ),
  "v6e": Network(
    "v6e",
    400e9,
    400e9,
    "Cloud TPU v6e (Trillium) docs: ICI 800 GB/s bidirectional per chip, across the hosts of "
    "a slice too",
  ),
}
