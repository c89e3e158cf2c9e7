#!/usr/bin/env bash
# Cloud TPU pod slice: `ihsweep run` on every worker VM at once (gcloud … ssh --worker=all);
# jax.distributed.initialize() finds the other workers itself (IHSWEEP_DISTRIBUTED=1).
# Usage:
#   launch/tpu_pod.sh TPU_NAME ZONE [--dry-run] --config=configs/default.py \
#       --workdir=/mnt/shared/runs/exp1 [more run flags]
# Environment: IHSWEEP_REPO (the checkout on every worker, default ~/ihsweep, with a .venv made by
# `make install` then `.venv/bin/pip install -e '.[tpu]'`), GCLOUD_PROJECT (optional --project).
# Flags are passed as --flag=value (one word each); --dry-run may come anywhere. The run directory must be on a
# filesystem every worker mounts (e.g. Filestore/NFS or gcsfuse); checkpoints are written
# jointly by all workers.
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
