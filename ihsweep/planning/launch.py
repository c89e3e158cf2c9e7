"""How to start a planned layout: the launchers' command lines (launch/*), filled in with the
planned run's flags (``placement.run_flags``). ``prediction`` prints them under a
``--flops_per_s`` plan, ``targets`` under a ``--target`` one; no JAX."""

from __future__ import annotations

import shlex


def launch_lines(
  flags: list[str],
  n_workers: int,
  devices_per_worker: int,
  devices_per_host: int,
  platform: str = "gpu",
) -> tuple[list[str], str]:
  """``(lines, note)``: shell lines (run from the repository root) that start one phase of
  ``n_workers`` workers of D = ``devices_per_worker`` devices on hosts of H =
  ``devices_per_host``, each worker ``ihsweep run FLAGS`` (``flags``: ``placement.run_flags``),
  and a note on what the lines leave to the user; no lines (the note says why) where the
  launchers cannot start that layout.

  GPUs, D <= H: independent workers of D GPUs, a SLURM job array (launch/slurm_array.sbatch,
  one task per worker) or, on one machine, launch/local_multiprocess.sh --independent with its
  GPUs handed out D each (IHSWEEP_GPUS). GPUs, D a multiple of H: one jax.distributed job
  (launch/slurm.sbatch, one process per host) whose workers span D / H hosts
  (``sweep.processes_per_worker``). TPUs: launch/tpu_pod.sh runs one process per host of the
  slice: D below H, H / D workers of D side by side in each (``sweep.devices_per_worker``);
  else D / H hosts a worker."""
  d, h, w = devices_per_worker, devices_per_host, n_workers
  words = " ".join(shlex.quote(f) for f in flags)
  teams = f" --config.sweep.processes_per_worker={d // h}" if d > h else ""
  if platform == "tpu":
    if d < h:
      return [
        f'launch/tpu_pod.sh "${{TPU_NAME:?}}" "${{ZONE:?}}" {words}'
        f" --config.sweep.processes_per_worker=1 --config.sweep.devices_per_worker={d}"
      ], (
        f"TPU_NAME, ZONE: the slice; --workdir on a filesystem every host mounts; each of its "
        f"{w * d // h} host(s) runs one process of {h // d} workers of {d} chip(s) side by side"
      )
    return [
      f'launch/tpu_pod.sh "${{TPU_NAME:?}}" "${{ZONE:?}}" {words}'
      f" --config.sweep.processes_per_worker={d // h}"
    ], (
      f"TPU_NAME, ZONE: the slice (gcloud compute tpus tpu-vm create); --workdir on a "
      f"filesystem every host mounts (plan --workdir=DIR sets it); each of its {w * d // h} "
      f"host(s) runs one process, {d // h} host(s) a worker"
    )
  if d > h:
    hosts = w * d // h
    return [
      f"sbatch --nodes={hosts} --ntasks-per-node=1 --gpus-per-task={h} launch/slurm.sbatch "
      f"{words}{teams}"
    ], f"one jax.distributed job of {hosts} processes of {h} GPUs, {d // h} per worker"
  per_machine = min(w, h // d)
  gpus = ",".join(str(k) for k in range(per_machine * d))
  words += f" --config.sweep.devices_per_worker={d}"  # each process one worker of its D GPUs
  lines = [
    f"sbatch --array=0-{w - 1} --gres=gpu:{d} launch/slurm_array.sbatch {words}",
    f"IHSWEEP_GPUS={gpus} launch/local_multiprocess.sh {per_machine} --independent {words}",
  ]
  machines = -(-w // per_machine)
  where = "one machine" if machines == 1 else f"each of {machines} machines"
  return lines, (
    f"{w} independent worker(s) of {d} GPU(s): the SLURM job array (one task per worker), "
    f"or on {where} {per_machine} local worker(s); the run directory on a filesystem every "
    f"worker sees (plan --workdir=DIR sets it)"
  )


def default_launch_lines(
  flags: list[str], n_processes: int, devices_per_process: int, platform: str = "gpu"
) -> tuple[list[str], str]:
  """``(lines, note)``: the shell line (run from the repository root) that starts the sweep as
  its phases are planned, with ``ihsweep run``'s default layout (``sweep.devices_per_worker`` =
  0: each process runs the workers side by side that the same model chooses): one process on
  one machine (launch/local.sh), one jax.distributed job of P processes of d GPUs
  (launch/slurm.sbatch, one process per node), or launch/tpu_pod.sh on a TPU slice."""
  words = " ".join(shlex.quote(f) for f in flags)
  p, d = n_processes, devices_per_process
  if platform == "tpu":
    return [f'launch/tpu_pod.sh "${{TPU_NAME:?}}" "${{ZONE:?}}" {words}'], (
      f"one process on each of the slice's {p} host(s), joined by jax.distributed; TPU_NAME, "
      f"ZONE: the slice; --workdir on a filesystem every host mounts"
    )
  if p == 1:
    return [f"launch/local.sh {words}"], f"one process over the host's {d} device(s)"
  return [
    f"sbatch --nodes={p} --ntasks-per-node=1 --gpus-per-task={d} launch/slurm.sbatch {words}"
  ], (
    f"one jax.distributed job of {p} processes of {d} GPUs, one per node; the run directory "
    f"on a filesystem every node sees"
  )
