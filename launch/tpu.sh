#!/usr/bin/env bash
# gpt1-jax on a Cloud TPU VM pod slice: create the VM, copy + install the code, run on every worker,
# stop, delete. Every step is one gcloud command; DRY_RUN=1 prints them instead of running them.
#
#   launch/tpu.sh create                 # gcloud compute tpus tpu-vm create ...
#   launch/tpu.sh copy                   # this checkout -> ~/gpt1-jax on every worker (no .git/.venv)
#   launch/tpu.sh install                # Python 3.11 venv + the pinned requirements and .[tpu] on every worker
#   launch/tpu.sh run --config gpt1 ...  # gpt1-jax pretrain --workdir $WORKDIR ... on every worker, detached
#   launch/tpu.sh logs                   # follow each worker's ~/gpt1-jax.log (Ctrl-C stops following, not the run)
#   launch/tpu.sh stop                   # SIGTERM: checkpoint at a common step, exit 0
#   launch/tpu.sh delete
#
# Edit (or export) these. WORKDIR must be one filesystem all workers share (Filestore/NFS, or a bucket
# mounted with gcsfuse at the same path on every worker); --data must be readable on every worker.
# JAX detects the pod itself (TPU metadata): no coordinator flags are needed.
set -euo pipefail

: "${TPU_NAME:=gpt1-jax}"
: "${ZONE:=us-central2-b}"
: "${PROJECT:=}"                                  # empty: gcloud's configured project
: "${ACCELERATOR_TYPE:=v4-16}"                    # v4-16 = 8 chips on 2 hosts
: "${RUNTIME_VERSION:=tpu-ubuntu2204-base}"       # v5e: v2-alpha-tpuv5-lite, v5p: v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e
: "${REMOTE_DIR:=gpt1-jax}"                       # on each worker, relative to the home directory
: "${WORKDIR:=/mnt/shared/runs/gpt1}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# As the remote shell will read them (a space or a quote in a path split it there); `~/` stays outside, to expand.
remote_dir="$(printf '%q' "$REMOTE_DIR")"
workdir="$(printf '%q' "$WORKDIR")"
zone=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && zone+=(--project="$PROJECT")

quote() {  # like Python's shlex.quote: as is when safe, else in single quotes
  if [[ "$1" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\"\'\"\'}"; fi
}

run() {  # print (DRY_RUN=1) or run one command
  if [[ -z "${DRY_RUN:-}" ]]; then "$@"; return; fi
  local out="" a
  for a in "$@"; do out+="$(quote "$a") "; done
  echo "${out% }"
}

on_all_workers() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${zone[@]}" --worker=all --command "$1"
}

verb="${1:-}"
shift || true
case "$verb" in
  create)
    run gcloud compute tpus tpu-vm create "$TPU_NAME" "${zone[@]}" \
      --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" ;;
  copy)
    tarball="${TMPDIR:-/tmp}/gpt1-jax-src.tgz"
    run tar -czf "$tarball" -C "$REPO" --exclude=.git --exclude=.venv --exclude=runs .
    run gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:gpt1-jax-src.tgz" "${zone[@]}" --worker=all
    on_all_workers "mkdir -p ~/$remote_dir && tar -xzf ~/gpt1-jax-src.tgz -C ~/$remote_dir" ;;
  install)
    # jax 0.10 needs Python >= 3.11; the Ubuntu 22.04 images ship 3.10 (their python3.11 comes from apt). The pins
    # are requirements.txt's, with the TPU runtime of the same jax ([tpu] extra).
    on_all_workers "cd ~/$remote_dir && (command -v python3.11 || (sudo apt-get update -q && sudo apt-get install -y -q python3.11 python3.11-venv)) && python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements.txt -e \".[tpu]\"" ;;
  run)
    args=""
    for a in "$@"; do args+=" $(printf '%q' "$a")"; done
    # Detached from the ssh session (setsid, nohup, output to a log): a dropped connection or a laptop asleep
    # ended the run on every worker (SIGHUP, then SIGPIPE on its output) without a checkpoint.
    on_all_workers "cd ~/$remote_dir && (nohup setsid .venv/bin/gpt1-jax pretrain --workdir $workdir$args > ~/gpt1-jax.log 2>&1 < /dev/null & echo \$! > ~/gpt1-jax.pid) && echo started: launch/tpu.sh logs follows it" ;;
  logs)
    on_all_workers 'tail -n +1 -F ~/gpt1-jax.log' ;;
  stop)
    on_all_workers 'kill -TERM $(cat ~/gpt1-jax.pid)' ;;
  delete)
    run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${zone[@]}" --quiet ;;
  *)
    awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}" >&2
    exit 2 ;;
esac
