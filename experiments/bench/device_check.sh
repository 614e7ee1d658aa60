#!/usr/bin/env bash
# The accelerator check, one short script for a GPU machine lent for minutes (experiments/bench/README.md, its
# H100 section has the first run's numbers): what the chip and its jax are, its matmul rates, the plan `gpt1-jax plan` makes for the
# 117M step on it (compiled peak memory, roofline step time), then that step timed against HF's
# OpenAIGPT on the same GPU at the paper's batch, the `small` and fine-tuning shapes, the step without attention
# dropout on cuDNN's flash kernel and on the einsum core, the plan and the step of 1.3B at LARGE_BATCH (16),
# and greedy generation. Each part is bounded in time
# and writes its own OUT/NAME.jsonl (stderr: OUT/stderr.log), so one that fails or runs out of time
# leaves the others.
#
#     bash experiments/bench/device_check.sh OUT            # PYTHON=... to pick the interpreter
#     ONLY="train_117m train_small" bash experiments/bench/device_check.sh OUT   # rerun some parts
#     DTYPES=bfloat16 ...                                                          # compare_hf's dtypes only
#
# On an H100 the parts took 15, 8, 41, 168, 93, ~60, ~85 and 34 s (2026-11-27; no 1.3B parts yet): about 8 minutes with jax's
# start-ups, near one call's 10-minute limit; split it over two calls with ONLY where a machine is slower.
# On an H200 (2026-11-28, DTYPES=bfloat16) versions, matmul, plan, train_117m, plan_1p3b, train_1p3b and
# generate_b1 took 13, 8, 52, 93, 20, 24 and 41 s. The CPU mode beside a GPU run shares the memory bus:
# its ratios hold, its rates do not (experiments/bench/README.md, the AMX section).
#
# CPU_CORES=0,1 times the CPU instead, held to those cores (the GPU hidden, HF's threads = the cores): the lent
# machines' CPUs are the AMX kind (issue 34's targets), and two cores are what the project's CPU numbers use.
# The shapes are then compare_hf's own, with fewer timed steps, and the GPU-only parts (plan, attention) are left out:
#     CPU_CORES=0,1 bash experiments/bench/device_check.sh OUT
#     CPU_CORES=0,1 ONLY=cpu_profile_bf16 bash experiments/bench/device_check.sh OUT   # the bf16 step's CPU split
#     CPU_CORES=0,1 ONLY=products_117m bash experiments/bench/device_check.sh OUT     # its products, XLA's and torch's
set -u
out=${1:?usage: bash experiments/bench/device_check.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
batch=${BATCH:-64} large_batch=${LARGE_BATCH:-16}
steps=(--rounds 1 --steps 10 --warmup 3)
pin=() shape=(--batch "$batch") matmul_n=8192
if [[ -n ${CPU_CORES:-} ]]; then
    pin=(taskset -c "$CPU_CORES") shape=() matmul_n=2048 steps=(--rounds 1 --steps 3 --warmup 1)
    ONLY=${ONLY:-versions matmul train_small finetune_sst2 train_117m generate_b1}
    export CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu OMP_NUM_THREADS=$(taskset -c "$CPU_CORES" nproc)
    echo "$(grep -m1 -o -E 'model name.*' /proc/cpuinfo), $OMP_NUM_THREADS cores"
fi

step() {  # step NAME SECONDS COMMAND...: stdout to OUT/NAME.jsonl, stderr appended to OUT/stderr.log
    local name=$1 limit=$2; shift 2
    [[ -z ${ONLY:-} || " $ONLY " == *" $name "* ]] || return 0
    local t0=$SECONDS
    echo "== $name" >> "$out/stderr.log"
    timeout "$limit" "${pin[@]}" "$@" > "$out/$name.jsonl" 2>> "$out/stderr.log"
    echo "== $name: exit $? in $((SECONDS - t0)) s"
    tail -n 3 "$out/$name.jsonl"
}

[[ -n ${CPU_CORES:-} ]] || nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
step versions 45 "$py" -c "
import json, jax, flax, optax, orbax.checkpoint as ocp, tokenizers
from gpt1_jax.flops import cpu_flags
d = jax.devices()[0]
try:
    import torch, transformers; hf = {'torch': torch.__version__, 'transformers': transformers.__version__}
except ImportError:
    hf = {}
print(json.dumps({'jax': jax.__version__, 'flax': flax.__version__, 'optax': optax.__version__,
                  'orbax': ocp.__version__, 'tokenizers': tokenizers.__version__, **hf,
                  'platform': d.platform, 'device_kind': d.device_kind, 'devices': jax.device_count(),
                  'cpu_flags': ' '.join(cpu_flags())}))"
step matmul 60 "$py" -c "
import json; from gpt1_jax.flops import measured_matmul_peak as rate
n = $matmul_n
print(json.dumps({f'{d}_{n}^3_flops_per_s': rate(d, n, 5) for d in ('float32', 'bfloat16')}))"
step plan 120 "$py" -m gpt1_jax.cli plan --config gpt1 --batch-size "$batch" --seq-len 512 --set model.dtype=bfloat16
step train_117m 270 "$py" -m experiments.bench.compare_hf --targets train_117m "${shape[@]}" "${steps[@]}" ${DTYPES:+--dtypes "$DTYPES"}
step train_small 150 "$py" -m experiments.bench.compare_hf --targets train_small "${steps[@]}"
step finetune_sst2 120 "$py" -m experiments.bench.compare_hf --targets finetune_sst2 "${steps[@]}"
step attention 150 bash -c 'for a in auto xla; do "$0" -m gpt1_jax.cli bench --config gpt1 --batch-size "$1" --seq-len 512 \
    --dtype bfloat16 --steps 10 --warmup 3 --set model.attn_dropout=0 --set model.attention=$a; done' "$py" "$batch"
# The plan checked where memory is the question: 1.3B (bf16, scan) at a batch that fills a large part of the chip.
step plan_1p3b 120 "$py" -m gpt1_jax.cli plan --config gpt1-1.3b --batch-size "$large_batch" --seq-len 512
step train_1p3b 150 "$py" -m gpt1_jax.cli bench --config gpt1-1.3b --batch-size "$large_batch" --seq-len 512 --steps 5 --warmup 2
step generate_b1 90 "$py" -m experiments.bench.compare_hf --targets generate_b1 --rounds 1 --steps 3
# CPU mode, asked for by name (ONLY=cpu_profile_bf16): where the AMX kind's bf16 117M step spends its cycles, by
# library and XLA kernel (needs perf, and gdb to name the kernels; one error line where perf cannot sample).
# Asked for by name (ONLY=products_117m), either mode: the 117M step's products alone, XLA's against torch's (on the AMX
# kind torch's bf16 product is the faster one: the first measurement issue 34 asks of that kind).
[[ " ${ONLY:-} " == *" products_117m "* ]] && step products_117m 240 "$py" -m experiments.bench.compare_hf \
    --targets products_117m "${shape[@]}" --rounds 1 --steps 3 --warmup 1 ${DTYPES:+--dtypes "$DTYPES"}
if [[ -n ${CPU_CORES:-} ]]; then
    step cpu_profile_bf16 150 "$py" -m experiments.bench.cpu_profile --config gpt1 --batch 2 --seq 512 --dtype bfloat16 \
        --seconds 8
fi
