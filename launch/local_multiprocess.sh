#!/usr/bin/env bash
# N processes of `ihsweep run` on this machine, on one run directory, in one of two modes.
# Usage:
#   launch/local_multiprocess.sh N [--independent] [--dry-run] --config=FILE --workdir=DIR \
#       [more run flags]
#
# Joined (default): the N processes form one jax.distributed job through a localhost
# coordinator: the code path of a pod, on one machine. Each process is a worker training
# process-local groups on its own devices, or, in phases, workers spanning several processes
# (--config.sweep.processes_per_worker=k; ihsweep/workers/sweep.py explains it). Environment it sets per process:
# IHSWEEP_COORDINATOR=localhost:PORT, IHSWEEP_NUM_PROCESSES=N, IHSWEEP_PROCESS_ID=k.
# Independent (--independent): N separate `ihsweep run` processes with the same flags, no
# coordinator (IHSWEEP_COORDINATOR, IHSWEEP_NUM_PROCESSES, IHSWEEP_PROCESS_ID and
# IHSWEEP_DISTRIBUTED are removed from their environment): each is a worker that claims the next
# pending group in DIR (most expensive first), trains it on its own devices, then takes the
# next; `ihsweep status --workdir=DIR` shows who holds what. Starting more workers later (this
# script again, or a plain `ihsweep run` with the same flags) adds workers to the same sweep.
#
# Devices. On CPU each process gets IHSWEEP_CPU_DEVICES fake devices (default: cores / N, at
# least 1) through XLA_FLAGS, unless XLA_FLAGS already sets a count. IHSWEEP_GPUS=0,1,... (GPU
# ids or UUIDs, G of them) hands them out: with N < G, N dividing G, process k gets G/N of them
# (CUDA_VISIBLE_DEVICES=its consecutive share: 8 GPUs, 4 workers: 0,1 / 2,3 / 4,5 / 6,7, as
# `ihsweep plan` lays out workers of 2 GPUs); with N >= G round-robin, the (k mod G)-th. With
# IHSWEEP_GPUS a process's fake CPU devices are as many as its GPUs (XLA_FLAGS' count replaced,
# IHSWEEP_CPU_DEVICES unused), so that the plan's line run where JAX has only the CPU starts
# the processes and workers it describes (there 8 devices each would make 4 workers of 2 in
# every process of `IHSWEEP_GPUS=0,...,7 ... 4 --independent ... devices_per_worker=2`).
# Independent workers may share a GPU (tiny models; N > G): the workers of a shared GPU get
# XLA_PYTHON_CLIENT_PREALLOCATE=false and XLA_PYTHON_CLIENT_MEM_FRACTION=0.9/K (K = workers on
# that GPU; a value you set yourself is kept). Joined processes cannot share a GPU (NCCL
# refuses two ranks of one job on one device): N > G is refused there.
# Environment it reads: IHSWEEP (command, default: ihsweep on PATH, else this checkout's
# .venv/bin/ihsweep), IHSWEEP_PORT (joined; default: a
# free port), IHSWEEP_CPU_DEVICES, IHSWEEP_GPUS, IHSWEEP_GRACE_S, IHSWEEP_LOG_PREFIX (log
# names; default process_ joined, worker_ independent; launch/slurm_array.sbatch sets one per
# array task).
#
# Output: process 0 on this terminal and in DIR/logs/process_0.log, process k in
# DIR/logs/process_k.log (independent: DIR/logs/worker_k.log), appended, one header line per
# launch. SIGTERM/SIGINT are passed to every process (each checkpoints its group and exits).
# --dry-run prints each process's environment and command, one line each, and starts nothing;
# on stderr, each process's devices and the workers it runs over them (auto, or slices of
# --config.sweep.devices_per_worker=D); it first checks that the command and the --config file
# exist (one line on stderr; status 1, nothing printed, where the run would fail).
#
# Exit status, joined: the first failure's, as the shell reports it (128 + the signal's number
# for a process killed by a signal: 137 after SIGKILL), with one line naming the process. The
# others are then stopped: SIGTERM, SIGKILL after IHSWEEP_GRACE_S (default 30) seconds; a process
# found stopped (SIGSTOP; it cannot act on SIGTERM) is killed at once. A process that stops
# answering without exiting is noticed by the others within IHSWEEP_HEARTBEAT_S
# (ihsweep/base/sharding.py).
# Exit status, independent: the workers do not depend on each other, so one that fails (or is
# killed) does not stop the others: a line names it when it ends ("the others go on"), the
# others finish their groups and take over the groups it held (at once for a dead process on
# this machine; a hung one after IHSWEEP_CLAIM_STALE_S without a heartbeat), and the script
# waits for all of them. It then exits with the first failure's status (as above; 0 if every
# worker exited 0) and, after a failure, one last line says so: rerunning the same command
# resumes whatever is left. A worker found stopped (SIGSTOP) once every other worker has ended is
# killed and counts as failed (status 137). After a SIGTERM/SIGINT to this script, the workers'
# own statuses (143 for a checkpointed stop) are its exit status and no failure line is printed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/launch/ihsweep_command.sh"
usage="usage: $0 N [--independent] [--dry-run] --config=FILE --workdir=DIR [ihsweep run flags]"
if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "$usage" >&2
  exit 2
fi
n=$1; shift
dry=0
independent=0
args=()
workdir=""
prev=""
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    --independent) independent=1 ;;
    --workdir=*) workdir=${a#--workdir=}; args+=("$a") ;;
    *) args+=("$a"); if [[ "$prev" == --workdir ]]; then workdir=$a; fi ;;
  esac
  prev=$a
done
find_ihsweep "$root"
# This script's own variables, checked before anything starts (one line, exit 2).
whole() {  # $1: name, $2: value, $3: least allowed
  if [[ -n "$2" && ( ! "$2" =~ ^[0-9]+$ || "$2" -lt "$3" ) ]]; then
    echo "$0: $1=$2 is not allowed: a whole number >= $3" >&2
    exit 2
  fi
}
whole IHSWEEP_CPU_DEVICES "${IHSWEEP_CPU_DEVICES:-}" 1
whole IHSWEEP_GRACE_S "${IHSWEEP_GRACE_S:-}" 0
whole IHSWEEP_PORT "${IHSWEEP_PORT:-}" 1
if [[ -n "${IHSWEEP_PORT:-}" ]] && (( IHSWEEP_PORT > 65535 )); then
  echo "$0: IHSWEEP_PORT=$IHSWEEP_PORT is not allowed: a port from 1 to 65535" >&2
  exit 2
fi
if (( independent )); then
  label=worker; prefix=${IHSWEEP_LOG_PREFIX:-worker_}
else
  label=process; prefix=${IHSWEEP_LOG_PREFIX:-process_}
  port=${IHSWEEP_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}
fi
cores=$(nproc 2>/dev/null || echo 1)
per=${IHSWEEP_CPU_DEVICES:-$(( cores / n > 0 ? cores / n : 1 ))}
xla=${XLA_FLAGS:-}
if [[ "$xla" != *xla_force_host_platform_device_count* ]]; then
  xla="${xla:+$xla }--xla_force_host_platform_device_count=$per"
fi
gpus=()
if [[ -n "${IHSWEEP_GPUS:-}" ]]; then
  IFS=, read -ra gpus <<< "$IHSWEEP_GPUS"
  for g in "${gpus[@]}"; do
    if [[ ! "$g" =~ ^[A-Za-z0-9-]+$ ]]; then
      echo "$0: IHSWEEP_GPUS=$IHSWEEP_GPUS is not allowed: comma-separated GPU ids or UUIDs" >&2
      exit 2
    fi
  done
  # CUDA reads an id as a number (00 is GPU 0): ids compared without their leading zeros
  distinct=()
  for g in "${gpus[@]}"; do
    if [[ "$g" =~ ^[0-9]+$ ]]; then g="${g#"${g%%[!0]*}"}"; g=${g:-0}; fi
    distinct+=("$g")
  done
  if [[ $(printf '%s\n' "${distinct[@]}" | sort | uniq -d) ]]; then
    echo "$0: IHSWEEP_GPUS=$IHSWEEP_GPUS is not allowed: distinct GPU ids or UUIDs (a GPU listed twice)" >&2
    exit 2
  fi
  if (( n < ${#gpus[@]} && ${#gpus[@]} % n )); then
    echo "$0: $n processes on ${#gpus[@]} GPUs (IHSWEEP_GPUS=$IHSWEEP_GPUS) is not allowed: a number of processes that divides the GPUs (each gets as many) or at least as many processes as GPUs" >&2
    exit 2
  fi
  if (( ! independent && n > ${#gpus[@]} )); then
    echo "$0: $n joined processes on ${#gpus[@]} GPUs (IHSWEEP_GPUS=$IHSWEEP_GPUS): the processes of one jax.distributed job cannot share a GPU; use --independent, or at most ${#gpus[@]} processes" >&2
    exit 2
  fi
fi
# Variables inherited from the caller that would make an independent worker join a job.
drop=()
if (( independent )); then
  for v in IHSWEEP_COORDINATOR IHSWEEP_NUM_PROCESSES IHSWEEP_PROCESS_ID IHSWEEP_DISTRIBUTED; do
    if [[ -n "${!v+set}" ]]; then drop+=("$v"); fi
  done
fi
# XLA_FLAGS with $1 fake CPU devices: the caller's flags, their device count replaced.
xla_with() {
  local words w out=()
  read -ra words <<< "${XLA_FLAGS:-}"
  for w in "${words[@]}"; do
    if [[ "$w" != --xla_force_host_platform_device_count=* ]]; then out+=("$w"); fi
  done
  out+=("--xla_force_host_platform_device_count=$1")
  echo "${out[*]}"
}
env_for() {  # process $1's environment as VAR=value words, into the array `envs`
  local k=$1
  envs=()
  if (( ! independent )); then
    envs+=("IHSWEEP_COORDINATOR=localhost:$port" "IHSWEEP_NUM_PROCESSES=$n" "IHSWEEP_PROCESS_ID=$k")
  fi
  if (( ${#gpus[@]} && n < ${#gpus[@]} )); then  # G/N GPUs each, consecutive
    local share=$(( ${#gpus[@]} / n ))
    local mine=("${gpus[@]:k * share:share}")
    envs+=("XLA_FLAGS=$(xla_with "$share")")  # on CPU, as many devices as its GPUs
    envs+=("CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${mine[*]}")")
  elif (( ${#gpus[@]} )); then
    local g=$(( k % ${#gpus[@]} ))
    local sharing=$(( n / ${#gpus[@]} + (g < n % ${#gpus[@]} ? 1 : 0) ))
    envs+=("XLA_FLAGS=$(xla_with 1)")
    envs+=("CUDA_VISIBLE_DEVICES=${gpus[g]}")
    if (( sharing > 1 )); then
      envs+=("XLA_PYTHON_CLIENT_PREALLOCATE=false")
      envs+=("XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-$(awk -v k="$sharing" 'BEGIN { printf "%.3f", 0.9 / k }')}")
    fi
  else
    envs+=("XLA_FLAGS=$xla")
  fi
}
# The workers a process of devices $1 (comma-separated) runs side by side, as a dry run tells
# them on stderr: slices of --config.sweep.devices_per_worker=D, or auto (ihsweep run chooses
# from the groups' costs and names them in its log's first line).
workers_of() {
  local d=0 a devs slices=() i
  for a in "${args[@]}"; do if [[ "$a" == --config.sweep.devices_per_worker=* ]]; then d=${a#*=}; fi; done
  IFS=, read -ra devs <<< "$1"
  if [[ ! "$d" =~ ^[0-9]+$ ]] || (( d == 0 )); then
    echo "auto (sweep.devices_per_worker = 0: ihsweep run chooses workers over slices of its ${#devs[@]} device(s) from the groups' costs; its log's first line names them)"
  elif (( ${#devs[@]} % d )); then
    echo "refused: sweep.devices_per_worker=$d does not divide its ${#devs[@]} device(s)"
  else
    for ((i = 0; i < ${#devs[@]}; i += d)); do slices+=("[$(IFS=,; echo "${devs[*]:i:d}")]"); done
    echo "$(( ${#devs[@]} / d )) worker(s) of $d: ${slices[*]}"
  fi
}
if (( dry )); then
  check_run "$0" "${args[@]}" || exit 1
  for ((k = 0; k < n; k++)); do
    env_for $k
    if (( ${#drop[@]} )); then printf 'env '; printf -- '-u %s ' "${drop[@]}"; fi
    printf '%q ' "${envs[@]}" "${ihsweep[@]}" run "${args[@]}"; echo
    mine=""
    for e in "${envs[@]}"; do if [[ "$e" == CUDA_VISIBLE_DEVICES=* ]]; then mine=${e#*=}; fi; done
    if [[ -z "$mine" ]]; then mine=$(seq -s, -f 'cpu:%g' 0 $(( per - 1 ))); fi
    echo "# $label $k: devices $mine; workers: $(workers_of "$mine")" >&2
  done
  exit 0
fi
require_ihsweep "$0"
logdir=${workdir:+$workdir/logs}
logdir=${logdir:-.}
mkdir -p "$logdir"
if (( independent )); then
  echo "local_multiprocess.sh: $n independent workers on ${workdir:-?}: worker 0 here, worker k in $logdir/${prefix}k.log; \`ihsweep status --workdir=${workdir:-DIR}\` shows who holds which group" >&2
fi
pids=()
for ((k = 0; k < n; k++)); do
  (
    env_for $k
    if (( ${#drop[@]} )); then unset "${drop[@]}"; fi
    export "${envs[@]}"
    mode=""; (( independent )) && mode=" (independent)"
    echo "=== $(date '+%F %T') $label $k of $n$mode: ${ihsweep[*]} run ${args[*]}" >> "$logdir/$prefix$k.log"
    if (( k == 0 )); then
      # tee ignores SIGTERM/SIGINT so that it keeps copying while process 0 checkpoints.
      exec "${ihsweep[@]}" run "${args[@]}" > >(trap '' TERM INT; exec tee -a "$logdir/${prefix}0.log") 2>&1
    else
      exec "${ihsweep[@]}" run "${args[@]}" >> "$logdir/$prefix$k.log" 2>&1
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
# Joined: every process takes part in the job's collectives, so when one fails the others
# cannot go on. Independent: they can, and they take over the failed one's groups. Children are
# polled (bash's `wait -n` reports jobs that ended together in launch order, not exit order;
# bash's own job messages go to /dev/null: they print this script's source).
status=0
failed_first=""
deadline=""
codes=()
killed=()  # independent: workers found stopped after the others ended, killed by this script
remaining=("${!pids[@]}")
{
while (( ${#remaining[@]} )); do
  next=()
  failed=""
  ended_bad=()
  for k in "${remaining[@]}"; do
    if kill -0 "${pids[k]}" 2>/dev/null; then next+=("$k"); continue; fi
    set +e; wait "${pids[k]}"; rc=$?; set -e
    # Of two found ended at once, one killed by a signal is the likelier cause: a process whose
    # peer is gone exits with an error status (1).
    if (( rc != 0 )) && [[ -z "$failed" || ( rc -gt 128 && ${codes[failed]} -le 128 ) ]]; then
      failed=$k
    fi
    codes[k]=$rc
    if (( rc != 0 )) && [[ " ${killed[*]} " != *" $k "* ]]; then ended_bad+=("$k"); fi
  done
  remaining=("${next[@]}")
  if (( independent )) && [[ -z "$asked" ]]; then
    for k in "${ended_bad[@]}"; do
      msg="worker $k of $n $(how "${codes[k]}") (log: $logdir/$prefix$k.log)"
      (( ${#remaining[@]} )) && msg+="; the others go on"
      echo "local_multiprocess.sh: $msg" >&3
    done
  fi
  if [[ -n "$failed" ]] && (( status == 0 )); then
    status=${codes[failed]}
    failed_first=$failed
    if (( ! independent )); then
      stopped=()
      for k in "${remaining[@]}"; do
        if is_stopped "${pids[k]}"; then stopped+=("$k"); kill -KILL "${pids[k]}" 2>/dev/null || true
        else kill -TERM "${pids[k]}" 2>/dev/null || true; fi
      done
      msg="process $failed of $n $(how "$status") (log: $logdir/$prefix$failed.log)"
      (( ${#stopped[@]} )) && msg+="; stopped (SIGSTOP?) and not answering: process ${stopped[*]}, killed"
      (( ${#remaining[@]} > ${#stopped[@]} )) && msg+="; stopping the others"
      [[ -z "$asked" ]] && echo "local_multiprocess.sh: $msg" >&3
      deadline=$(( SECONDS + ${IHSWEEP_GRACE_S:-30} ))
    fi
  fi
  if (( independent && ${#remaining[@]} && ${#remaining[@]} < n )); then
    # Every worker still there is stopped while the others have ended: nobody will resume it.
    all_stopped=1
    for k in "${remaining[@]}"; do is_stopped "${pids[k]}" || { all_stopped=0; break; }; done
    if (( all_stopped )); then
      for k in "${remaining[@]}"; do kill -KILL "${pids[k]}" 2>/dev/null || true; killed+=("$k"); done
      [[ -z "$asked" ]] && echo "local_multiprocess.sh: stopped (SIGSTOP?) and not answering after the others ended: worker ${remaining[*]} of $n, killed" >&3
    fi
  fi
  if [[ -n "$deadline" ]] && (( SECONDS >= deadline && ${#remaining[@]} )); then
    for k in "${remaining[@]}"; do kill -KILL "${pids[k]}" 2>/dev/null || true; done
  fi
  if (( ${#remaining[@]} )); then sleep 0.2 || true; fi  # a signal to the group also hits sleep
done
} 2>/dev/null
if (( independent && status != 0 )) && [[ -z "$asked" ]]; then
  ok=0
  for k in "${!codes[@]}"; do (( codes[k] == 0 )) && ok=$(( ok + 1 )); done
  echo "local_multiprocess.sh: exit status $status (worker $failed_first of $n); $ok of $n workers exited with status 0; rerun the same command to finish any group left unfinished (\`ihsweep status --workdir=${workdir:-DIR}\`)" >&3
fi
exit $status
