#!/usr/bin/env bash
# Cloud TPU pod slice: `ihsweep run` on every host (worker VM) at once (gcloud … ssh
# --worker=all); jax.distributed.initialize() finds the other hosts itself
# (IHSWEEP_DISTRIBUTED=1): the hosts of a slice must join one job to use its chips.
# Groups are process-local by default (config sweep.placement = 'worker'): each host's process
# is a worker over its own chips that claims the next pending group in the run directory (most
# expensive first), trains it, then takes the next; a v4-32 slice (4 hosts × 4 chips) trains 4
# groups side by side. `--config.sweep.placement=global` restores the earlier rule: every host
# trains every group together on one mesh over all chips of the slice, one group after another
# (each group must then be able to use every chip: at most E · B of them). ihsweep/sweep.py
# explains both.
# Usage:
#   launch/tpu_pod.sh TPU_NAME ZONE [--dry-run] --config=configs/exp1_natural.py \
#       --workdir=/mnt/shared/exp1 --config.data.tfds_data_dir=$TFDS [more run flags]
# Environment: IHSWEEP_REPO (the checkout on every host, default ~/ihsweep, with a .venv made by
# `make install` then `.venv/bin/pip install -e '.[tpu]'`), GCLOUD_PROJECT (optional --project).
# Flags are passed as --flag=value (one word each); --dry-run may come anywhere and prints the
# gcloud command. The run directory must be on a filesystem every host mounts and that supports
# flock (e.g. Filestore/NFSv4; the workers' claims lock a file in it); each group's checkpoints
# are written by the host that trains it. Several slices (or a slice and other machines) can
# work on one sweep: run this for each with the same --workdir.
set -euo pipefail
dry=0
args=()
positional=()
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    --*) args+=("$a") ;;
    *) positional+=("$a") ;;
  esac
done
if [[ ${#positional[@]} -ne 2 ]]; then
  echo "usage: $0 TPU_NAME ZONE [--dry-run] --config=FILE --workdir=DIR [ihsweep run flags]" >&2
  exit 2
fi
tpu=${positional[0]} zone=${positional[1]}
repo=${IHSWEEP_REPO:-'~/ihsweep'}
remote="cd $repo && IHSWEEP_DISTRIBUTED=1 .venv/bin/ihsweep run --noprogress $(printf '%q ' "${args[@]}")"
cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all ${GCLOUD_PROJECT:+--project="$GCLOUD_PROJECT"} --command="$remote")
if (( dry )); then
  printf '%s ' "${cmd[@]:0:${#cmd[@]}-1}"; printf -- '--command="%s"\n' "$remote"
  exit 0
fi
exec "${cmd[@]}"
