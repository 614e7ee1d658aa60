#!/usr/bin/env bash
# The long release (issue 33) on a lent GPU, in one call: the 4-epoch recipe's model pre-trained for as many
# epochs (at most MAX_EPOCHS) as PRETRAIN_SECONDS of its measured step allow, released, then Table 5's runs
# (table5 and more_seeds stages, full_sets budget) for TASKS, one task after another, until SECONDS are spent.
# Once pretrain_long.yaml is committed (it was made so on 2026-11-30), the release is not made again: the call
# runs TASKS' fine-tuning only. experiments/paper/README.md, "The long release", says what it found.
#
#     bash experiments/paper/long_on_device.sh OUT SECONDS DATA [TASKS]     # TASKS: default rte,mrpc
#
# DATA holds english_mixed.txt.xz (the shared corpus, xz: the checkout travels whole, at most 64 MiB with what
# it carries; only to pre-train), glue.tar.xz (glue/<Task>/{train,dev}.tsv) and site.tar.xz (the Python
# packages the GPU machine lacks: tensorflow-datasets and its pure-Python needs, array_record, dm-tree,
# tensorboardX), as experiments/paper/device_data.sh makes them on the CPU machine. They are put where the CPU
# machine has them (../shared/data/...), so the records name the same paths.
# OUT gets log.txt, probe.json and, when they exist, release_long.tgz (when this call made it), results_long.tgz,
# pretrain_run.tgz: back on the CPU machine, `tar xzf OUT/X.tgz -C experiments/paper` for the first two.
# Matmuls at full float32 (JAX_DEFAULT_MATMUL_PRECISION=highest), as on the CPU, not the GPU's TF32 default.
set -u
out=${1:?usage: bash experiments/paper/long_on_device.sh OUT SECONDS DATA [TASKS]}
seconds=${2:?SECONDS}
data=$(realpath "${3:?DATA}")
tasks=${4:-rte,mrpc}
pretrain_seconds=${PRETRAIN_SECONDS:-200}
max_epochs=${MAX_EPOCHS:-20}
py=${PYTHON:-python3}
start=$(date +%s)
left() { echo $((seconds - ($(date +%s) - start))); }
mkdir -p "$out" && out=$(realpath "$out")
log=$out/log.txt
exec > >(tee -a "$log") 2>&1

shared=../shared/data
mkdir -p "$shared/corpus" /tmp/site
unxz() { "$py" -c "import gzip, lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, gzip.open(sys.argv[2], 'wb', compresslevel=1) as dst:
    shutil.copyfileobj(src, dst)" "$@"; }
[[ -f $shared/corpus/english_mixed.txt.gz || ! -f $data/english_mixed.txt.xz ]] ||
    unxz "$data/english_mixed.txt.xz" "$shared/corpus/english_mixed.txt.gz"
untar() { "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$@"; }  # no xz needed
[[ -d $shared/glue ]] || untar "$data/glue.tar.xz" "$shared"
[[ -f $data/site.tar.xz ]] && untar "$data/site.tar.xz" /tmp/site
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest
"$py" -c "import jax; d = jax.devices()[0]; print('jax', jax.__version__, d.platform, d.device_kind)"
echo "inputs ready at $(( $(date +%s) - start )) s"

recipe=experiments/paper/pretrain_long.yaml
corpus=$shared/corpus/english_mixed.txt.gz
if [[ -f $recipe ]]; then  # committed: the release is made, and the runs fine-tune it (DATA needs no corpus)
    echo "recipe: $recipe, as committed"
else
# The step's time, measured on this machine: the recipe's model, batch and data, 600 updates.
rm -rf /tmp/probe
"$py" -m gpt1_jax.cli pretrain --config experiments/paper/pretrain_4ep.yaml --workdir /tmp/probe --data "$corpus" \
    --steps "${PROBE_STEPS:-600}" --set eval_every=100000 --set checkpoint_every=100000 --set 'keep_steps=[]' \
    --set optim.warmup_steps=10 --no-progress > /dev/null || exit 1
"$py" - "$pretrain_seconds" "$max_epochs" "$out/probe.json" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open("/tmp/probe/metrics.jsonl")]
times = [r["step_s"] for r in rows if "step_s" in r][len(rows) // 10:]  # the first steps warm up
step_s = statistics.mean(times)
per_epoch = 2603  # updates of 16 x 256 tokens in one epoch of the corpus' training windows (pretrain_4ep.yaml)
budget, cap = float(sys.argv[1]), int(sys.argv[2])
epochs = min(cap, int(budget / (1.15 * step_s * per_epoch)))  # 15% for evaluations and checkpoints
probe = {"steps": len(rows), "mean_step_s": step_s, "median_step_s": statistics.median(times),
         "tokens_per_s": 16 * 256 / step_s, "epochs": epochs, "pretrain_seconds": budget}
json.dump(probe, open(sys.argv[3], "w"), indent=2)
print("probe:", probe)
EOF
epochs=$("$py" -c "import json; print(json.load(open('$out/probe.json'))['epochs'])")
if (( epochs < 6 )); then
    echo "only $epochs epochs fit in ${pretrain_seconds} s: not stronger than the 4-epoch release; nothing trained"
    exit 1
fi
steps=${FORCE_STEPS:-$(( epochs * 2603 / 100 * 100 ))}
sed -e "s/^steps: .*/steps: $steps/" -e 's/^checkpoint_every: .*/checkpoint_every: 2000/' \
    -e 's/^eval_every: .*/eval_every: 1000/' -e '/^keep_steps:/d' \
    -e '1,/^model:/{/^#/d}' experiments/paper/pretrain_4ep.yaml > "$recipe.body"
{ echo "# The long release (issue 33): pretrain_4ep.yaml's model, tokenizer, batch and optimizer for $epochs epochs"
  echo "# ($steps updates) instead of 4, on a lent GPU (experiments/paper/long_on_device.sh measured the step there"
  echo "# and chose the epochs). Checkpoints and evaluations sparser than 4ep's; no zero-shot checkpoints kept."
  cat "$recipe.body"; } > "$recipe" && rm "$recipe.body"
echo "recipe: $epochs epochs, $steps updates; $(left) s left"
fi

corpus_flag=()
[[ -f $corpus ]] && corpus_flag=(--corpus "$corpus")
first_task=1
for task in ${tasks//,/ }; do
    stages=table5,more_seeds
    (( first_task )) && stages=pretrain,release,$stages
    # A task's first run on the GPU spends minutes compiling its padded lengths (2026-11-30: still compiling
    # RTE's after 200 s): a task started with less time left makes no record.
    (( first_task || $(left) > ${TASK_SECONDS:-360} )) || break
    first_task=0
    echo "== $task ($stages), $(left) s left"
    timeout -s TERM -k 60 $(( $(left) - 70 )) "$py" -m experiments.paper.run --pretrain-config "$recipe" \
        --budget full_sets ${corpus_flag[@]+"${corpus_flag[@]}"} --data-dir "$shared/glue" --out runs/paper-long \
        --stages "$stages" --tasks "$task" 2> >(tr '\r' '\n' | grep -a -v '%|' >&2)
    echo "exit $?"
done

cd experiments/paper
# the release only when this call made it: a committed one is already in git, and its 8.6 MB would take a
# seventh of what OUT can bring back
[[ -n $(find release_long -type f -newermt "@$start" 2> /dev/null | head -1) ]] &&
    tar czf "$out/release_long.tgz" release_long
[[ -d results_long ]] &&
    tar czf "$out/results_long.tgz" --exclude results_long/pretraining results_long pretrain_long.yaml
cd - > /dev/null
tar czf "$out/pretrain_run.tgz" -C runs/paper-long pretrain/metrics.jsonl pretrain/config.yaml pretrain/run.json \
    pretrain/data_info.json 2> /dev/null
ls -la "$out"
echo "done at $(( $(date +%s) - start )) s"
