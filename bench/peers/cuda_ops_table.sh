#!/usr/bin/env bash
# One table of our GPU ops and GEMMs against PyTorch's on the same card: runs //bench:cuda_bench's
# gemm/ and ops/ cases (unless given their JSON) and bench/peers/torch_cuda_ops.py, then joins
# them (cuda_ops_table.py). Needs the GPU machine's python3 with PyTorch; ~2-3 minutes.
#
#   bash bench/peers/cuda_ops_table.sh CUDA_BENCH_BINARY OUT_DIR [cuda_bench.json]
#   -> OUT_DIR/cuda_ops_table.md (also printed), OUT_DIR/torch_cuda_ops.jsonl
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="$1"; out="$2"; ours="${3:-}"
mkdir -p "$out"
if [ -z "$ours" ]; then
  ours="$out/cuda_bench_ops.json"
  "$bench" --benchmark_filter='^(gemm|ops)/' --benchmark_min_time=0.2 \
    --benchmark_out="$ours" --benchmark_out_format=json > "$out/cuda_bench_ops.txt" 2>&1
fi
python3 "$here/torch_cuda_ops.py" > "$out/torch_cuda_ops.jsonl" 2> "$out/torch_cuda_ops.err" ||
  echo "torch_cuda_ops.py failed: $(tail -3 "$out/torch_cuda_ops.err")"
python3 "$here/cuda_ops_table.py" "$ours" "$out/torch_cuda_ops.jsonl" | tee "$out/cuda_ops_table.md"
