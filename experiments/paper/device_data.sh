#!/usr/bin/env bash
# DATA for experiments/paper/long_on_device.sh, made on the CPU machine from ../shared/data and this checkout's
# .venv: what a lent GPU lacks, as small as it packs (a call carries the checkout and DATA, 64 MiB at most;
# the committed checkout is ~49 MB, so DATA must stay under ~15 MB).
#
#     bash experiments/paper/device_data.sh DATA TASKS [corpus]     # e.g. .devdata MRPC,RTE corpus
#
# TASKS: GLUE folder names; `corpus` adds the pre-training corpus (11.3 MB), needed only before the release
# exists. DATA should be a folder that .git/info/exclude names (`carry` it in the call).
set -eu
out=${1:?usage: bash experiments/paper/device_data.sh DATA TASKS [corpus]}
tasks=${2:?TASKS, e.g. MRPC,RTE}
shared=../shared/data
site=.venv/lib/python3.11/site-packages
mkdir -p "$out"
if [[ ${3:-} == corpus ]]; then
    zcat "$shared/corpus/english_mixed.txt.gz" | xz -9 -T2 > "$out/english_mixed.txt.xz"
fi
tar cJf "$out/glue.tar.xz" -C "$shared" $(for t in ${tasks//,/ }; do echo "glue/$t"; done)
# The GPU machine's Python is 3.12: the pure-Python packages are copied from this .venv, the two compiled ones
# come as its wheels. tensorflow-datasets without the other datasets' data files and dummy data (the GLUE
# reader needs its core, text/glue.py and url_checksums/).
tmp=$(mktemp -d)
for p in promise simple_parsing tensorflow_metadata termcolor toml immutabledict docstring_parser \
         importlib_resources tensorboardX tensorflow_datasets; do
    cp -r "$site/$p" "$site"/"$(echo $p | tr A-Z a-z)"-*.dist-info "$tmp/"
done
find "$tmp" -name __pycache__ -prune -exec rm -rf {} +
find "$tmp/tensorflow_datasets" -type d -name dummy_data -prune -exec rm -rf {} +
find "$tmp/tensorflow_datasets" -name '*_test.py' -delete
rm -rf "$tmp"/tensorflow_datasets/{image_classification,datasets,object_detection}/*/
find "$tmp/tensorflow_datasets" -type f ! -name '*.py' -size +20k -not -path '*/url_checksums/*' \
    -not -path '*/core/*' -delete
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$tmp/wheels" array_record==0.8.6 dm-tree==0.1.10
for w in "$tmp"/wheels/*.whl; do unzip -q -o "$w" -d "$tmp"; done
rm -rf "$tmp/wheels"
tar cJf "$out/site.tar.xz" -C "$tmp" .
rm -rf "$tmp"
du -b "$out"/*
