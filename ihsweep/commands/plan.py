"""``ihsweep plan``: a sweep's schedule, makespan and device utilisation on N devices without
training (``ihsweep.planning.placement.predict``), or with ``--target`` every group compiled for an
accelerator this machine need not have (``ihsweep.planning.targets``)."""

from __future__ import annotations

import copy
import json
import math
import sys

from ihsweep.base import numbers
from ihsweep.commands.common import add_axis_flags, bad_input, empty_law, fail, load_config
from ihsweep.commands.flags import FLAGS

NAME = "plan"
DESCRIPTION = "a sweep's schedule, makespan and device utilisation on N devices (no training)"
FLAG_NAMES = (
  "config",
  "grid",
  "zip",
  "devices",
  "devices_per_worker",
  "devices_per_host",
  "flops_per_s",
  "network",
  "law",
  "json",
  "target",
  "compare_attention",
  "workdir",
)
FLAGS_ONLY, COMPILES, TRAINS = True, True, False
DEFAULT_HOST = 8  # list_schedule.DEFAULT_DEVICES_PER_HOST (not imported: it imports jax)
USAGE = """usage: ihsweep plan --config=FILE[:VARIANT] --devices=N [--devices_per_worker=D]
                    [--flops_per_s=F [--devices_per_host=H] [--network=NAME]] [--law=FILE]
                    [--json] [--workdir=DIR]
                    [--grid=FIELD=V1,V2,...] [--zip=FIELD=V1,V2,...]
                    [--config.SECTION.FIELD=VALUE ...]
       ihsweep plan --config=FILE[:VARIANT] --target=NAME [--devices=N] [--compare_attention]
                    [--law=FILE] [--json] [--workdir=DIR] [...]"""
ABOUT = """\
Predicts, without training, how the config's sweep runs on N devices: each group's cost
(FLOPs) and time, the schedule, the makespan and the device utilisation (busy share of
device-time): in one or more phases, workers of one or several processes take the phase's
groups most expensive first, each group on as many of its worker's devices as it can use
(phases chosen as `ihsweep run` chooses them with sweep.processes_per_worker=0); beside
them, every one-phase layout of workers.

--target=NAME compiles every group's train and evaluation programs for an accelerator this
machine need not have — a TPU topology (v4:4x4x4, v5e:8x8, v5p:4x4x4, v6e:8x8: the TPU
compiler, libtpu, which `make install` puts in build/libtpu) or a GPU (h100-80gb, h200-141gb,
a100-80gb, l40s-48gb, with --devices=N: XLA's GPU compiler, deviceless, from JAX's CUDA plugin
in build/jax-cuda; without it the XLA CPU compiler's estimate, labelled so) — and reports per
group the mesh, gradient_accumulation_steps, vmap chunk, bytes per device against the
device's memory, FLOPs and a roofline time (compiled on the fewest devices per worker at
which every group fits), each gradient all-reduce priced on the chip's published
interconnect, then the layout with the shortest roofline makespan and the lines that launch
it (exit 1 if some group fits nowhere). Progress (each compile's pass, group i of n,
seconds) goes to stderr. A layout recommended with launch lines uses --workdir=DIR (default
runs/CONFIG_NAME; a TPU pod: /mnt/shared/CONFIG_NAME).

Before anything is timed or compiled, every group is checked as `ihsweep run` checks it on the
planned devices, not this machine's: on a worker of a process of the plan (the N devices as
hosts of --devices_per_host, of the target's, or measured of this machine's device count),
--devices_per_worker or the config's sweep.devices_per_worker devices (0: all of the process's),
its config validated and its memory bounded (with --flops_per_s the devices' memory is unknown
unless $IHSWEEP_DEVICE_MEMORY gives it); a group `run` would refuse is refused here."""


def flag_problem() -> str | None:
  """Why ``plan``'s numeric flags do not fit together (one line), or None."""
  from ihsweep.planning import chips

  n, d, h, f = (FLAGS.devices, FLAGS.devices_per_worker, FLAGS.devices_per_host, FLAGS.flops_per_s)
  if n is None:
    return "plan needs --config=FILE and --devices=N (the devices the sweep runs on)"
  if n < 1:
    return f"--devices={n} is not allowed: an integer >= 1 (the devices the sweep runs on)"
  if f is not None and not (math.isfinite(f) and f > 0):
    return (
      f"--flops_per_s={f:g} is not allowed: a finite number > 0 (sustained FLOP/s per "
      f"device, e.g. 4e14), or leave it out to measure on this machine"
    )
  if FLAGS.network is not None and f is None:
    return (
      f"--network={FLAGS.network} is not allowed without --flops_per_s: measured times are "
      f"one process's, with no communication between processes to price"
    )
  if FLAGS.network is not None and FLAGS.network not in chips.NETWORKS:
    return f"--network={FLAGS.network} is not allowed: one of {', '.join(chips.NETWORKS)}"
  if h is not None and f is None:
    return (
      f"--devices_per_host={h} is not allowed without --flops_per_s: measured times are "
      f"this machine's, whose devices are its host's"
    )
  if h is not None and h < 1:
    return f"--devices_per_host={h} is not allowed: an integer >= 1"
  if h is not None and n > h and n % h:
    return (
      f"--devices_per_host={h} is not allowed with --devices={n}: a divisor of it (every host "
      f"holds as many devices), or at least N (one host)"
    )
  return _worker_problem(n, d, h, f)


def _worker_problem(n: int, d: int | None, h: int | None, f: float | None) -> str | None:
  """Why --devices_per_worker=D does not fit --devices=N and the devices per host, or None."""
  if d is None:
    return None
  if d < 1 or n % d:
    return (
      f"--devices_per_worker={d} is not allowed: a divisor of --devices={n} "
      f"({numbers.some(numbers.divisors(n), d)}): the workers share the devices equally"
    )
  host = h or DEFAULT_HOST
  if f is not None and d > host and d % host:
    return (
      f"--devices_per_worker={d} is not allowed: at most --devices_per_host={host} "
      f"(a worker of one process), or a multiple of it (a worker spanning hosts, "
      f"inside one jax.distributed job)"
    )
  return None


def main(argv) -> int:
  from ihsweep.planning import list_schedule
  from ihsweep.planning import prediction as prediction_lib

  del argv
  import jax

  from ihsweep.base.law import Law, LawError
  from ihsweep.configuration.fields import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.planning import chips, placement

  if FLAGS.target is not None:
    from ihsweep.planning import toolchain

    if FLAGS.target in chips.GPUS:  # before anything starts JAX's backends
      toolchain.use_gpu_compiler()
  cfg, failed = load_config()
  if failed is not None:
    return failed
  if FLAGS.target is not None:
    return _plan_target(cfg)
  if FLAGS.compare_attention:
    return fail(
      "--compare_attention is not allowed without --target: it compiles the target's programs "
      "once more with the explicit attention pattern"
    )
  if cfg is None:
    return fail("plan needs --config=FILE and --devices=N (the devices the sweep runs on)")
  problem = flag_problem()
  if problem:
    return fail(problem)
  failed = empty_law("sweep's")
  if failed is not None:
    return failed
  if FLAGS.flops_per_s is None and FLAGS.devices_per_worker:
    local = len(jax.local_devices())
    if FLAGS.devices_per_worker > local:
      return fail(
        f"--devices_per_worker={FLAGS.devices_per_worker} is not allowed without "
        f"--flops_per_s: at most this machine's {local} device(s), on which times "
        f"are measured"
      )
  try:
    law = Law.from_json(FLAGS.law) if FLAGS.law else None
    problem = add_axis_flags(cfg)
    if problem:
      return fail(problem)
    problem = check_as_run(cfg)
    if problem:
      return fail(problem)
    prediction = placement.predict(
      cfg,
      FLAGS.devices,
      devices_per_worker=FLAGS.devices_per_worker,
      devices_per_host=FLAGS.devices_per_host,
      flops_per_s=FLAGS.flops_per_s,
      network=chips.NETWORKS[FLAGS.network or "h100"],
      law=law,
      log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    from ihsweep.planning import toolchain

    # A TPU network's plan is launched on a TPU pod (launch/tpu_pod.sh: a process per host).
    tpu = FLAGS.network in {chip.network for chip in chips.TPU_CHIPS.values()}
    prediction.run_flags, prediction.platform = _run_flags(tpu=tpu), "tpu" if tpu else "gpu"
  except (ConfigError, DataError) as e:
    return bad_input(e)
  except LawError as e:
    return fail(f"--law={FLAGS.law}: {e}" if FLAGS.law else str(e))
  except list_schedule.LayoutError as e:  # the config's mesh.num_devices does not fit N
    return fail(f"cannot plan: {e}")
  print(json.dumps(prediction.to_json()) if FLAGS.json else prediction_lib.format_text(prediction))
  return 0


def _plan_target(cfg) -> int:
  """``ihsweep plan --target=NAME``: every group compiled for the target
  (``ihsweep.planning.targets``)."""
  from ihsweep.base.law import Law, LawError
  from ihsweep.configuration.fields import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.planning import chips, plan_text, targets, toolchain

  if cfg is None:
    return fail(f"plan --target needs --config=FILE; --target: {chips.names()}")
  for name in ("devices_per_worker", "devices_per_host", "flops_per_s", "network"):
    if getattr(FLAGS, name) is not None:
      return fail(
        f"--{name} is not allowed with --target: the target sets devices per host and "
        f"times come from its compiled programs"
      )
  if FLAGS.devices is not None and FLAGS.devices < 1:
    return fail(
      f"--devices={FLAGS.devices} is not allowed: an integer >= 1 (the GPUs the sweep runs on)"
    )
  failed = empty_law("sweep's")
  if failed is not None:
    return failed
  try:
    law = Law.from_json(FLAGS.law) if FLAGS.law else None
    problem = add_axis_flags(cfg)
    if problem:
      return fail(problem)
    target = toolchain.make_target(FLAGS.target, FLAGS.devices)
    mesh = cfg.mesh.num_devices
    if not mesh or mesh in targets.candidate_layouts(target):  # else the target's own words
      host, n = target.devices_per_host, len(target.devices)
      _check_devices(cfg, target.devices[:host], n if n > host else 0, target.capacity_bytes)
    result = targets.plan_for_target(
      cfg,
      target,
      law,
      log=lambda line: print(line, file=sys.stderr, flush=True),
      compare_attention=FLAGS.compare_attention,
      run_flags=_run_flags(tpu=target.chip.platform == "tpu"),
    )
  except toolchain.TargetError as e:
    return fail(str(e))
  except (ConfigError, DataError) as e:
    return bad_input(e)
  except LawError as e:
    return fail(f"--law={FLAGS.law}: {e}" if FLAGS.law else str(e))
  print(json.dumps(result.to_json()) if FLAGS.json else plan_text.format_plan(result))
  return 0 if result.fits else 1


def check_as_run(cfg) -> str | None:
  """Refuses, before anything is timed, what ``ihsweep run`` would refuse on the devices this
  plan is for (``worker_fit.check_sweep``), whatever this machine has: the N = --devices as P
  processes of d (``placement.processes_of``: hosts of --devices_per_host, default 8, with
  --flops_per_s; measured, of this machine's device count), a process's devices this machine's
  first d where measured, else ``worker_fit.PlannedDevice`` stand-ins of unknown memory (known
  only from ``$IHSWEEP_DEVICE_MEMORY``); its workers of D = --devices_per_worker (what the plan's
  launch lines pass as sweep.devices_per_worker; above d, a worker of several processes: checked
  as auto), else the config's sweep.devices_per_worker (0: the widest). A group's memory counts
  all N devices where the plan is one jax.distributed job of several processes (P > 1 without a
  fixed D), as ``run`` does there.

  Returns:
    Why --devices_per_worker cannot be run with this config (one line), or None.

  Raises:
    ConfigError, DataError, memory.TooLarge: as ``ihsweep run`` before its run directory exists
      (the config's mesh.num_devices first against N, as ``placement.predict`` checks it).
  """
  import jax

  from ihsweep.configuration import fields
  from ihsweep.planning import list_schedule, placement
  from ihsweep.training import worker_fit

  n, d, flops = FLAGS.devices, FLAGS.devices_per_worker, FLAGS.flops_per_s
  hint = f" (0 = as many of the {n} devices as a group can use)"  # placement.predict's words
  fields.check(cfg, "mesh.num_devices", hi=n, hint=hint)
  local = jax.local_devices()
  if flops is not None:
    host = FLAGS.devices_per_host or list_schedule.DEFAULT_DEVICES_PER_HOST
  else:
    host = len(local)
  n_processes, per_process = placement.processes_of(n, host)
  if flops is None:
    devices = local[:per_process]
  else:
    devices = [worker_fit.PlannedDevice(i) for i in range(per_process)]
  team = d is not None and d > per_process
  job = n if n_processes > 1 and (team or not (d or cfg.mesh.num_devices)) else 0
  if d is not None:
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
      if "sweep" not in cfg:
        cfg.sweep = fields.default_sweep()
      cfg.sweep.devices_per_worker = 0 if team else d
  try:
    _check_devices(cfg, devices, job, None, data=flops is None)
  except fields.ConfigError as e:
    if d is None or team or e.field != "sweep.devices_per_worker":
      raise
    return f"--devices_per_worker={d} is not allowed with this config: {e.allowed}"
  return None


def _check_devices(cfg, devices, job_devices: int, capacity, data: bool = False) -> None:
  """``worker_fit.check_sweep`` of ``cfg``'s plan for a process of ``devices`` (``data``: the
  corpus checked, as the measured plan reads it; else not, as ``placement.make_jobs`` with
  ``check_data=False``). sweep.processes_per_worker is left to the plan, which checks it
  against its P processes (``placement.predict``), not this machine's.

  Raises:
    ConfigError, DataError, memory.TooLarge: as ``worker_fit.check_sweep``.
  """
  import contextlib

  from ihsweep.configuration import grid
  from ihsweep.planning import placement
  from ihsweep.training import worker_fit

  if cfg.get("sweep", {}).get("processes_per_worker", 0):
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
      cfg.sweep.processes_per_worker = 0
  with contextlib.nullcontext() if data else placement.data_unchecked():
    plan = grid.make_plan(cfg)
    worker_fit.check_sweep(cfg, plan, devices, capacity=capacity, job_devices=job_devices)


def _run_flags(tpu: bool) -> list[str]:
  """The ``ihsweep run`` flags of the sweep this plan planned (``placement.run_flags``): its
  config, overrides, axes and --workdir."""
  from ihsweep.commands.flags import ARGV, split_args
  from ihsweep.planning import placement

  return placement.run_flags(split_args(ARGV[1:])[0], FLAGS.workdir, tpu=tpu)
