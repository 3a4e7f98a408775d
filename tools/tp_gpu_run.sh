#!/usr/bin/env bash
# The TP step of the GPU bundle (.gpu/run.sh of tools/gpu_bundle.sh), ~2-3 minutes: tp_bench on
# the GPU (virtual ranks sharing GPU 0, bf16 then f32; with several GPUs also one rank per GPU),
# the GPU-fed TP model, and the GPU section of the report. Writes under OUT:
#   tp_bench_cuda_<dtype>.{json,txt}   the layer, GEMM and collective rows
#   tp_gpu_profile_<dtype>.txt         the profile the model reads (bench/tp_model_gpu.h)
#   tp_model_gpu.md                    tp_model_gpu_report's tables
#   machine.txt, REPORT_GPU.md         tools/bench_report.sh --gpu (copy to bench/REPORT_GPU.md)
#
#   bash tools/tp_gpu_run.sh BIN_DIR OUT [COMMIT]    # BIN_DIR holds bench/tp_bench etc.
# TOKENS (4096), D (2048), STEPS (5) and LIMIT_S (seconds per tp_bench run, 75) from the
# environment. Exit status 0 iff the report was written.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:?usage: tp_gpu_run.sh BIN_DIR OUT [COMMIT]}"
out="${2:?usage: tp_gpu_run.sh BIN_DIR OUT [COMMIT]}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export COMMIT="${3:-${COMMIT:-unknown}}"
export TOKENS="${TOKENS:-4096}" D="${D:-2048}" STEPS="${STEPS:-5}"
limit="${LIMIT_S:-75}"
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
common=(--device=cuda --tokens="$TOKENS" --d="$D" --steps="$STEPS" --warmup=2
        --benchmark_format=json)

run() {  # run NAME ARGS...: one tp_bench run under the time limit
  local name="$1"; shift
  echo "tp_gpu_run: tp_bench $name (limit ${limit}s)" >&2
  timeout "$limit" "$bin/bench/tp_bench" "${common[@]}" "$@" \
    --benchmark_out="$out/tp_bench_cuda_$name.json" \
    --profile_out="$out/tp_gpu_profile_$name.txt" > "$out/tp_bench_cuda_$name.txt" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "tp_gpu_run: tp_bench $name stopped at ${limit}s (rows so far kept)" >&2
  if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then
    echo "tp_gpu_run: tp_bench $name failed ($rc):" >&2
    tail -5 "$out/tp_bench_cuda_$name.txt" >&2
  else
    tail -3 "$out/tp_bench_cuda_$name.txt"
  fi
}
run bf16 --dtype=bf16
run f32 --dtype=f32
if [ "${gpus:-0}" -ge 2 ]; then
  run per_gpu_bf16 --dtype=bf16 --placement=per_gpu
fi

cat "$out"/tp_gpu_profile_*.txt > "$out/tp_gpu_profile.txt" 2>/dev/null
"$bin/bench/tp_model_gpu_report" --profile="$out/tp_gpu_profile.txt" --tokens="$TOKENS" --d="$D" \
  > "$out/tp_model_gpu.md" 2> "$out/tp_model_gpu.err" || { echo "tp_gpu_run: tp_model_gpu_report failed:" >&2; cat "$out/tp_model_gpu.err" >&2; }
bash "$repo/tools/bench_report.sh" --gpu "$out" "$out/REPORT_GPU.md"
