#!/usr/bin/env bash
# N processes of `ihsweep run` on this machine joined by a localhost coordinator
# (jax.distributed.initialize): the code path of a pod, on one machine. Every process trains each
# group together on one global mesh (ihsweep/sweep.py explains the rule).
# Usage:
#   launch/local_multiprocess.sh N [--dry-run] --config=FILE --workdir=DIR [more run flags]
# Environment it sets per process: IHSWEEP_COORDINATOR=localhost:PORT, IHSWEEP_NUM_PROCESSES=N,
# IHSWEEP_PROCESS_ID=k. On CPU each process gets IHSWEEP_CPU_DEVICES fake devices (default:
# cores / N, at least 1) through XLA_FLAGS, unless XLA_FLAGS already sets a count.
# Environment it reads: IHSWEEP (command, default ihsweep), IHSWEEP_PORT (default: a free port),
# IHSWEEP_CPU_DEVICES.
# Output: process 0 on this terminal and in DIR/logs/process_0.log, process k in
# DIR/logs/process_k.log (appended, one header line per launch). SIGTERM/SIGINT are passed to every process (each checkpoints and
# exits); the exit status is the first non-zero one, and when a process fails the others are
# stopped (SIGTERM, then SIGKILL after IHSWEEP_GRACE_S seconds).
set -euo pipefail
if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 N [--dry-run] --config=FILE --workdir=DIR [ihsweep run flags]" >&2
  exit 2
fi
n=$1; shift
dry=0
args=()
workdir=""
prev=""
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    --workdir=*) workdir=${a#--workdir=}; args+=("$a") ;;
    *) args+=("$a"); if [[ "$prev" == --workdir ]]; then workdir=$a; fi ;;
  esac
  prev=$a
done
read -ra ihsweep <<< "${IHSWEEP:-ihsweep}"
port=${IHSWEEP_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}
cores=$(nproc 2>/dev/null || echo 1)
per=${IHSWEEP_CPU_DEVICES:-$(( cores / n > 0 ? cores / n : 1 ))}
xla=${XLA_FLAGS:-}
if [[ "$xla" != *xla_force_host_platform_device_count* ]]; then
  xla="${xla:+$xla }--xla_force_host_platform_device_count=$per"
fi
env_for() {
  echo "IHSWEEP_COORDINATOR=localhost:$port IHSWEEP_NUM_PROCESSES=$n IHSWEEP_PROCESS_ID=$1 XLA_FLAGS=$xla"
}
if (( dry )); then
  for ((k = 0; k < n; k++)); do
    printf '%s ' "$(env_for $k)"; printf '%q ' "${ihsweep[@]}" run "${args[@]}"; echo
  done
  exit 0
fi
logdir=${workdir:+$workdir/logs}
logdir=${logdir:-.}
mkdir -p "$logdir"
pids=()
for ((k = 0; k < n; k++)); do
  (
    export IHSWEEP_COORDINATOR="localhost:$port" IHSWEEP_NUM_PROCESSES="$n" IHSWEEP_PROCESS_ID="$k"
    export XLA_FLAGS="$xla"
    echo "=== $(date '+%F %T') process $k of $n: ${ihsweep[*]} run ${args[*]}" >> "$logdir/process_$k.log"
    if (( k == 0 )); then
      # tee ignores SIGTERM/SIGINT so that it keeps copying while process 0 checkpoints.
      exec "${ihsweep[@]}" run "${args[@]}" > >(trap '' TERM INT; exec tee -a "$logdir/process_0.log") 2>&1
    else
      exec "${ihsweep[@]}" run "${args[@]}" >> "$logdir/process_$k.log" 2>&1
    fi
  ) &
  pids+=($!)
done
forward() { kill -"$1" "${pids[@]}" 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
# Every process takes part in each group's collectives, so when one exits with an error the
# others cannot go on: they get SIGTERM, then SIGKILL after IHSWEEP_GRACE_S (default 30) s.
status=0
deadline=""
remaining=("${pids[@]}")
while (( ${#remaining[@]} )); do
  next=()
  for pid in "${remaining[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then next+=("$pid"); continue; fi
    set +e; wait "$pid"; rc=$?; set -e
    if (( rc != 0 && status == 0 )); then
      status=$rc
      forward TERM
      deadline=$(( SECONDS + ${IHSWEEP_GRACE_S:-30} ))
    fi
  done
  remaining=("${next[@]}")
  if [[ -n "$deadline" ]] && (( SECONDS >= deadline && ${#remaining[@]} )); then
    kill -KILL "${remaining[@]}" 2>/dev/null || true
  fi
  if (( ${#remaining[@]} )); then sleep 1 || true; fi  # a signal to the group also hits sleep
done
exit $status
