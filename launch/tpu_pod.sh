#!/usr/bin/env bash
# Cloud TPU pod slice: `ihsweep run` on every host (worker VM) of the slice, started through
# `gcloud … ssh --worker=all` as a detached process (setsid nohup) that outlives the SSH session;
# jax.distributed.initialize() finds the other hosts itself (IHSWEEP_DISTRIBUTED=1): the hosts
# of a slice must join one job to use its chips.
# Groups are process-local by default: each host's process runs workers over slices of its own
# chips (the layout the plan finds fastest: sweep.devices_per_worker = 0, auto; the host's log
# names it), each claiming the next pending group in the run directory (most expensive first),
# training it, then taking the next; a v4-32 slice (4 hosts × 4 chips) with workers of 1 chip
# trains 16 groups side by side; large groups go, in later phases, to workers spanning several hosts
# (--config.sweep.processes_per_worker=k fixes k). ihsweep/workers/sweep.py explains it.
# Usage:
#   launch/tpu_pod.sh TPU_NAME ZONE [--sync] [--dry-run] --config=configs/exp1_natural.py \
#       --workdir=/mnt/shared/exp1 --config.data.tfds_data_dir=$TFDS [more run flags]
#   launch/tpu_pod.sh TPU_NAME ZONE --stop --workdir=/mnt/shared/exp1   (SIGTERM to each host's
#       process: it checkpoints its group and exits; rerunning the first command resumes)
# What runs on each host: cd $IHSWEEP_REPO, then `.venv/bin/ihsweep run --noprogress FLAGS` in
# its own session, stdout and stderr appended to WORKDIR/logs/host_<hostname>.log (its process id
# in WORKDIR/logs/host_<hostname>.pid); this command returns once every host has started.
# Follow with `ihsweep status --workdir=WORKDIR` and the logs.
# --sync first copies this checkout's committed tree (git archive HEAD: commit what should run)
# to IHSWEEP_REPO on every host and installs it there into .venv ('.[tpu]' with
# constraints.txt) if that has no ihsweep yet.
# Environment: IHSWEEP_REPO (the checkout on every host, default ~/ihsweep), GCLOUD_PROJECT
# (optional --project). Forwarded to every host's process: IHSWEEP_* (but IHSWEEP_REPO), JAX_*
# (e.g. JAX_COMPILATION_CACHE_DIR on the shared filesystem: one host's compile serves all),
# XLA_FLAGS, LIBTPU_INIT_ARGS, TFDS_DATA_DIR.
# Flags are passed as --flag=value (one word each); --dry-run may come anywhere and prints the
# commands, one per line, quoted for the shell, after checking what this machine's part needs:
# gcloud, and the --config file in this checkout (each host reads its own copy; --sync sends
# this one's committed tree); one line on stderr, status 1 where the run would fail. The run
# directory must be on a filesystem every host mounts and that supports flock (e.g.
# Filestore/NFSv4; the workers' claims lock a file in it); each group's checkpoints are written
# by the host that trains it. Several slices (or a slice and
# other machines) can work on one sweep: run this for each with the same --workdir.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/launch/ihsweep_command.sh"
dry=0 sync=0 stop=0
args=()
positional=()
workdir=
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    --sync) sync=1 ;;
    --stop) stop=1 ;;
    --workdir=*) workdir=${a#--workdir=}; args+=("$a") ;;
    --*) args+=("$a") ;;
    *) positional+=("$a") ;;
  esac
done
usage="usage: $0 TPU_NAME ZONE [--sync] [--dry-run] --config=FILE --workdir=DIR [ihsweep run flags]
       $0 TPU_NAME ZONE --stop [--dry-run] --workdir=DIR"
if [[ ${#positional[@]} -ne 2 || -z "$workdir" ]]; then
  echo "$usage" >&2
  exit 2
fi
if [[ "$workdir" != /* ]]; then  # every host must name the same directory, before any cd
  echo "$0: --workdir=$workdir is not allowed: an absolute path on a filesystem every host mounts" >&2
  exit 2
fi
if (( stop )) && (( sync || ${#args[@]} > 1 )); then
  echo "$0: --stop takes --workdir only (and --dry-run)" >&2; echo "$usage" >&2
  exit 2
fi
if (( dry )); then  # what this machine runs: gcloud; and the config the hosts will read
  problems=()
  gcloud=$(type -P gcloud) \
    || problems+=("gcloud is not on PATH (the Google Cloud CLI: it starts the hosts' processes)")
  if (( ! stop )); then
    p=$(config_problem "${args[@]}"); if [[ -n "$p" ]]; then problems+=("$p"); fi
  fi
  if (( ${#problems[@]} )); then
    p=$(printf '%s; ' "${problems[@]}")
    echo "$0: the run would fail: ${p%; }" >&2
    exit 1
  fi
  if (( stop )); then echo "# checked: gcloud found ($gcloud)" >&2
  else
    config_problem "${args[@]}" > /dev/null
    echo "# checked: gcloud found ($gcloud); $config_file found here (the hosts run their" \
      "checkout's .venv/bin/ihsweep on theirs, not checked from here)" >&2
  fi
fi
tpu=${positional[0]} zone=${positional[1]}
repo=${IHSWEEP_REPO:-'~/ihsweep'}
# The checkout's path as the hosts' shell reads it: quoted (a space in it is one word), with a
# leading ~/ left for that shell to expand to each host's home.
if [[ "$repo" == "~/"* ]]; then repo="~/$(printf '%q' "${repo#\~/}")"; else repo=$(printf '%q' "$repo"); fi
ssh=(gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all ${GCLOUD_PROJECT:+--project="$GCLOUD_PROJECT"})
logs=$(printf '%q' "$workdir/logs")
host='$(hostname)'
show() {  # one line, as the shell reads it: '…' around a word that needs quotes and has no '
  local a out=()
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=,@%+~-]*$ ]]; then out+=("$a")
    elif [[ "$a" != *\'* && "$a" =~ ^(--[a-z-]+=)(.*)$ ]]; then out+=("${BASH_REMATCH[1]}'${BASH_REMATCH[2]}'")
    elif [[ "$a" != *\'* ]]; then out+=("'$a'")
    else out+=("$(printf '%q' "$a")"); fi
  done
  echo "${out[*]}"
}
go() { if (( dry )); then show "$@"; else "$@"; fi; }

if (( stop )); then
  remote="f=$logs/host_$host.pid; if [ ! -f \"\$f\" ]; then echo \"$host: no \$f: nothing started here\"; elif kill -TERM -- -\$(cat \"\$f\") 2>/dev/null; then echo \"$host: SIGTERM to \$(cat \"\$f\")\"; else echo \"$host: process \$(cat \"\$f\") (\$f) is not running\"; fi"
  go "${ssh[@]}" --command="$remote"
  exit 0
fi

if (( sync )); then
  tarball=${TMPDIR:-/tmp}/ihsweep-checkout.tar.gz
  install="cd $repo && tar -xzf ~/ihsweep-checkout.tar.gz && rm ~/ihsweep-checkout.tar.gz && { test -x .venv/bin/ihsweep || { python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e \".[tpu]\"; }; }"
  if (( dry )); then echo "git archive --format=tar.gz -o $tarball HEAD"
  else git archive --format=tar.gz -o "$tarball" HEAD; fi
  go gcloud compute tpus tpu-vm scp "$tarball" "$tpu":~/ihsweep-checkout.tar.gz --zone="$zone" --worker=all ${GCLOUD_PROJECT:+--project="$GCLOUD_PROJECT"}
  go "${ssh[@]}" --command="mkdir -p $repo && $install"
fi

envs=()
for name in $(compgen -e | LC_ALL=C sort); do
  case "$name" in
    IHSWEEP_REPO) ;;
    IHSWEEP_*|JAX_*|XLA_FLAGS|LIBTPU_INIT_ARGS|TFDS_DATA_DIR) envs+=("$name=${!name}") ;;
  esac
done
# setsid: its own session, so the SSH session's end (SIGHUP) does not reach it; the process id
# is the session's, so --stop signals the whole session.
run="$( ((${#envs[@]})) && printf '%q ' "${envs[@]}")IHSWEEP_DISTRIBUTED=1 .venv/bin/ihsweep run --noprogress $(printf '%q ' "${args[@]}")"
run=${run% }
# A host whose pid file names a live process is already running this sweep: it starts nothing.
remote="cd $repo && mkdir -p $logs && if [ -f $logs/host_$host.pid ] && kill -0 -- -\$(cat $logs/host_$host.pid) 2>/dev/null; then echo \"$host: already running (process \$(cat $logs/host_$host.pid)); --stop first\"; exit 1; fi && echo \"=== \$(date +%F_%T) $host: ihsweep run\" >> $logs/host_$host.log && { setsid nohup env $run >> $logs/host_$host.log 2>&1 < /dev/null & echo \$! > $logs/host_$host.pid; echo \"$host: started, log $logs/host_$host.log\"; }"
go "${ssh[@]}" --command="$remote"
if (( dry )); then
  d=0  # on stderr: the workers each host's process runs side by side
  for a in "${args[@]}"; do if [[ "$a" == --config.sweep.devices_per_worker=* ]]; then d=${a#*=}; fi; done
  if [[ "$d" == 0 ]]; then
    echo "# each host's workers: auto (sweep.devices_per_worker = 0: ihsweep run chooses slices of its chips from the groups' costs; its log's first line names them)" >&2
  else
    echo "# each host's workers: $d consecutive chip(s) each, in its phases of process-local workers" >&2
  fi
fi
