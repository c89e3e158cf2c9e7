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
# DIR/logs/process_k.log (appended, one header line per launch). SIGTERM/SIGINT are passed to
# every process (each checkpoints and exits).
# Exit status: the first failure's, as the shell reports it (128 + the signal's number for a
# process killed by a signal: 137 after SIGKILL), with one line naming the process. The others
# are then stopped: SIGTERM, SIGKILL after IHSWEEP_GRACE_S (default 30) seconds; a process found
# stopped (SIGSTOP; it cannot act on SIGTERM) is killed at once. A process that stops answering
# without exiting is noticed by the others within IHSWEEP_HEARTBEAT_S (ihsweep/sharding.py).
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
asked=""  # the signal this launcher passed on: the processes' statuses then report it
forward() { asked=$1; kill -"$1" "${pids[@]}" 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
is_stopped() {  # state T (SIGSTOP) or t (a debugger): such a process cannot act on SIGTERM
  local stat state
  if read -r stat 2>/dev/null < "/proc/$1/stat"; then state=${stat##*) }; state=${state%% *}
  else state=$(ps -o state= -p "$1" 2>/dev/null || true); fi
  [[ "$state" == [Tt]* ]]
}
how() {  # an exit status in words
  local sig=$(( $1 - 128 ))
  if (( sig > 0 )); then echo "ended with status $1 (128 + $sig: SIG$(kill -l "$sig" 2>/dev/null))"
  else echo "exited with status $1"; fi
}
exec 3>&2
# Every process takes part in each group's collectives, so when one fails the others cannot go
# on. Children are polled (bash's `wait -n` reports jobs that ended together in launch order, not
# exit order; bash's own job messages go to /dev/null: they print this script's source).
status=0
deadline=""
codes=()
remaining=("${!pids[@]}")
{
while (( ${#remaining[@]} )); do
  next=()
  failed=""
  for k in "${remaining[@]}"; do
    if kill -0 "${pids[k]}" 2>/dev/null; then next+=("$k"); continue; fi
    set +e; wait "${pids[k]}"; rc=$?; set -e
    # Of two found ended at once, one killed by a signal is the likelier cause: a process whose
    # peer is gone exits with an error status (1).
    if (( rc != 0 )) && [[ -z "$failed" || ( rc -gt 128 && ${codes[failed]} -le 128 ) ]]; then
      failed=$k
    fi
    codes[k]=$rc
  done
  remaining=("${next[@]}")
  if [[ -n "$failed" ]] && (( status == 0 )); then
    status=${codes[failed]}
    stopped=()
    for k in "${remaining[@]}"; do
      if is_stopped "${pids[k]}"; then stopped+=("$k"); kill -KILL "${pids[k]}" 2>/dev/null || true
      else kill -TERM "${pids[k]}" 2>/dev/null || true; fi
    done
    msg="process $failed of $n $(how "$status") (log: $logdir/process_$failed.log)"
    (( ${#stopped[@]} )) && msg+="; stopped (SIGSTOP?) and not answering: process ${stopped[*]}, killed"
    (( ${#remaining[@]} > ${#stopped[@]} )) && msg+="; stopping the others"
    [[ -z "$asked" ]] && echo "local_multiprocess.sh: $msg" >&3
    deadline=$(( SECONDS + ${IHSWEEP_GRACE_S:-30} ))
  fi
  if [[ -n "$deadline" ]] && (( SECONDS >= deadline && ${#remaining[@]} )); then
    for k in "${remaining[@]}"; do kill -KILL "${pids[k]}" 2>/dev/null || true; done
  fi
  if (( ${#remaining[@]} )); then sleep 0.2 || true; fi  # a signal to the group also hits sleep
done
} 2>/dev/null
exit $status
