#!/usr/bin/env bash
# N processes on 127.0.0.1 (M fake CPU devices each, default 1), prefixed logs, signals forwarded,
# non-zero status if any process fails. Usage:
#   launch/local.sh N [M] -- gpt1-jax pretrain --config tiny --workdir runs/mh
# All the work is done by launch/local.py (standard library only); PYTHON picks the interpreter.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 N [M] -- COMMAND ..." >&2
  exit 2
fi
n=$1; shift
m=1
if [[ $1 != "--" ]]; then m=$1; shift; fi
if [[ $1 != "--" ]]; then  # else a command without the -- read its name as M: "invalid int value: 'gpt1-jax'"
  echo "$0: put -- before the command: $0 N [M] -- COMMAND ..." >&2
  exit 2
fi
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/local.py" -n "$n" -d "$m" "$@"
