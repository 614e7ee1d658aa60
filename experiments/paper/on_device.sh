#!/usr/bin/env bash
# Table 5's runs on a lent accelerator, for the minutes it is lent (experiments/paper/README.md, "On a lent GPU"):
# the committed 4-epoch pipeline's table5 and more_seeds stages for some tasks, bounded in time, then the records it made copied to
# OUT. The stage stops at a checkpoint when its time is up (SIGTERM), keeping every run that finished. Matmuls run
# at full float32 (JAX_DEFAULT_MATMUL_PRECISION=highest): a GPU's default would be TF32, and the records made on
# the CPU are float32.
#
#     bash experiments/paper/on_device.sh OUT SECONDS GLUE_DIR [TASKS]    # TASKS: default sst2
#
# OUT gets device.txt, stdout.log, stderr.log and records.tgz (the new records, paths below the records folder).
# Back on the CPU machine, they go beside the others (tar xzkf OUT/records.tgz -C experiments/paper/results_4ep/runs)
# and the usual command (experiments/paper/README.md) finds them done before and writes the tables.
set -u
out=${1:?usage: bash experiments/paper/on_device.sh OUT SECONDS GLUE_DIR [TASKS]}
seconds=${2:?SECONDS}
glue=${3:?GLUE_DIR}
tasks=${4:-sst2}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest
records=experiments/paper/results_4ep/runs
before=$(mktemp)
find "$records" -type f -name '*.json' | sort > "$before"
"$py" -c "import jax; d = jax.devices()[0]; print('jax', jax.__version__, d.platform, d.device_kind)" | tee "$out/device.txt"
timeout -s TERM -k 30 "$seconds" "$py" -m experiments.paper.run --pretrain-config experiments/paper/pretrain_4ep.yaml \
    --budget full_sets --data-dir "$glue" --out runs/paper-4ep --stages table5,more_seeds --tasks "$tasks" \
    > "$out/stdout.log" 2> "$out/stderr.raw"
echo "exit $?"
tr '\r' '\n' < "$out/stderr.raw" | grep -a -v '%|' > "$out/stderr.log" && rm "$out/stderr.raw"  # without the bars
new=$(find "$records" -type f -name '*.json' | sort | comm -13 "$before" - | sed "s|^$records/||")
echo "new records: $(echo -n "$new" | grep -c .)"
[[ -z $new ]] || tar czf "$out/records.tgz" -C "$records" $new
tail -n 30 "$out/stderr.log"
