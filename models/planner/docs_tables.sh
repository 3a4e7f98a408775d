#!/usr/bin/env bash
# Regenerates the planner tables of docs/planner.md: GPT-2 XL, a 7B and a 70B GPT on 8, 64 and
# 512 H100s, the 7B and 70B at long sequences (what CP buys), and GPT-2 XL with 32 heads (its 25
# heads leave TP no divisor).
#   models/planner/docs_tables.sh OUT_DIR [PLAN_GPT_BINARY]
# Pipelines are enumerated with 1F1B and microbatches = 2 x pp (--schedules,
# --microbatch_factors) to keep the 512-GPU runs to minutes on a small machine.
set -uo pipefail
out="${1:?usage: docs_tables.sh OUT_DIR [plan_gpt]}"
bin="${2:-bazel-bin/models/planner/plan_gpt}"
mkdir -p "$out"
common=(--profile=h100_node --schedules=1f1b --microbatch_factors=2 --top=0 --refused=false)
# The global batch grows with the cluster: 7B and 70B at seq 4096 take 32, 128 and 512
# sequences (0.13M, 0.5M, 2M tokens) on 8, 64, 512 GPUs; GPT-2 XL at seq 1024 64, 256, 1024.
# At 512 GPUs pp <= 8 and cp <= 2 (--max_pp, --max_cp) keep each run to minutes (a shape-only
# step on 512 ranks takes ~1 s here); the long-sequence runs allow cp up to 8.
only="${ONLY:-}"   # e.g. ONLY="7b_512 70b_512": just those runs
run() {  # run NAME ARGS...
  local name="$1"; shift
  if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then return; fi
  echo "\$ plan_gpt $* ${common[*]}" > "$out/$name.txt"
  "$bin" "$@" "${common[@]}" >> "$out/$name.txt" 2>&1 || true
  tr '\r' '\n' < "$out/$name.txt" | grep -v 'profiled .* meshes' > "$out/$name.tmp"
  mv "$out/$name.tmp" "$out/$name.txt"
}
for gb in "8 64" "64 256" "512 1024"; do
  set -- $gb
  limits=()
  [ "$1" = 512 ] && limits=(--max_pp=8 --max_cp=2)
  run "gpt2xl_$1" --model=gpt2-xl --gpus=$1 --batch=$2 "${limits[@]}"
  run "7b_$1" --model=7b --gpus=$1 --batch=$(($2 / 2)) "${limits[@]}"
  run "70b_$1" --model=70b --gpus=$1 --batch=$(($2 / 2)) "${limits[@]}"
done
run gpt2xl32h_8 --model=gpt2-xl --heads=32 --gpus=8 --batch=64
run 7b_seq32k_64 --model=7b --gpus=64 --batch=32 --seq=32768
run 70b_seq32k_512 --model=70b --gpus=512 --batch=128 --seq=32768 --max_pp=8 --max_cp=8
