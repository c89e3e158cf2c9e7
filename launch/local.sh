#!/usr/bin/env bash
# One process: `ihsweep run` on this machine's devices (every GPU, or one fake CPU device per
# core): one worker, taking the sweep's groups one after another. Usage:
#   launch/local.sh [--dry-run] --config=configs/demo.py --workdir=runs/demo [more run flags]
# More workers on the same sweep: launch/local_multiprocess.sh N --independent (N at once), or
# this same command again in another shell (it joins the running sweep as another worker).
# Environment: IHSWEEP = the command to run (default: ihsweep; e.g. ".venv/bin/ihsweep").
set -euo pipefail
dry=0
args=()
for a in "$@"; do
  if [[ "$a" == --dry-run ]]; then dry=1; else args+=("$a"); fi
done
read -ra ihsweep <<< "${IHSWEEP:-ihsweep}"
cmd=("${ihsweep[@]}" run "${args[@]}")
if (( dry )); then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
