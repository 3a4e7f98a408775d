#!/usr/bin/env bash
# Regenerates the planner tables of docs/planner.md: GPT-2 XL, a 7B and a 70B GPT on 8, 64 and
# 512 H100s, the 7B and 70B at long sequences (what CP buys), and GPT-2 XL with 32 heads (its 25
# heads leave TP no divisor).
#   models/planner/docs_tables.sh OUT_DIR [PLAN_GPT_BINARY]
# Pipelines are enumerated with 1F1B and microbatches = 2 x pp (--schedules,
# --microbatch_factors) to keep the 512-GPU runs to minutes on a small machine.
set -uo pipefail
out="${1:?usage: docs_tables.sh OUT_DIR [plan_gpt]}"
bin="${2:-bazel-bin/models/plan_gpt}"
mkdir -p "$out"
common=(--profile=h100_node --schedules=1f1b --microbatch_factors=2 --top=12 --refused=false)
run() {  # run NAME ARGS...
  local name="$1"; shift
  echo "\$ plan_gpt $* ${common[*]}" > "$out/$name.txt"
  "$bin" "$@" "${common[@]}" >> "$out/$name.txt" 2>&1 || true
  grep -v 'profiled .* meshes' "$out/$name.txt" > "$out/$name.tmp" && mv "$out/$name.tmp" "$out/$name.txt"
}
# The global batch grows with the cluster: 7B and 70B at seq 4096 take 32, 128 and 512
# sequences (0.13M, 0.5M, 2M tokens) on 8, 64, 512 GPUs; GPT-2 XL at seq 1024 64, 256, 1024.
for gb in "8 64" "64 256" "512 1024"; do
  set -- $gb
  run "gpt2xl_$1" --model=gpt2-xl --gpus=$1 --batch=$2
  run "7b_$1" --model=7b --gpus=$1 --batch=$(($2 / 2))
  run "70b_$1" --model=70b --gpus=$1 --batch=$(($2 / 2))
done
run gpt2xl32h_8 --model=gpt2-xl --heads=32 --gpus=8 --batch=64
run 7b_seq32k_64 --model=7b --gpus=64 --batch=32 --seq=32768
run 70b_seq32k_512 --model=70b --gpus=512 --batch=128 --seq=32768
