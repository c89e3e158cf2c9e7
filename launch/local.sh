#!/usr/bin/env bash
# One process: `ihsweep run` on this machine's devices (every GPU, or one fake CPU device per
# core), running the workers side by side that the plan finds fastest for the groups
# (sweep.devices_per_worker = 0, auto; e.g. 4 workers of 2 GPUs for exp1 on 8 H100s; the log's
# first line names them; --config.sweep.devices_per_worker=D fixes D; --dry-run prints the
# command and, on stderr, the workers). Usage:
#   launch/local.sh [--dry-run] --config=configs/demo.py --workdir=runs/demo [more run flags]
# More workers on the same sweep: launch/local_multiprocess.sh N --independent (N at once), or
# this same command again in another shell (it joins the running sweep as another worker).
# Environment: IHSWEEP = the command to run (default: ihsweep on PATH, else this checkout's
# .venv/bin/ihsweep). --dry-run also checks that it and the --config file exist (one line on
# stderr; status 1 where the run would fail).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/launch/ihsweep_command.sh"
dry=0
args=()
for a in "$@"; do
  if [[ "$a" == --dry-run ]]; then dry=1; else args+=("$a"); fi
done
find_ihsweep "$root"
cmd=("${ihsweep[@]}" run "${args[@]}")
if (( dry )); then
  check_run "$0" "${args[@]}" || exit 1
  printf '%q ' "${cmd[@]}"; echo
  d=0  # its workers, on stderr: slices of --config.sweep.devices_per_worker=D, or auto
  for a in "${args[@]}"; do if [[ "$a" == --config.sweep.devices_per_worker=* ]]; then d=${a#*=}; fi; done
  where="this machine's devices${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}"
  if [[ "$d" == 0 ]]; then
    echo "# workers: auto over $where (sweep.devices_per_worker = 0: ihsweep run chooses them from the groups' costs; its log's first line names them)" >&2
  else
    echo "# workers: $d consecutive devices each, over $where" >&2
  fi
  exit 0
fi
require_ihsweep "$0"
exec "${cmd[@]}"
