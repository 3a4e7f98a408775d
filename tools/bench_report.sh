#!/usr/bin/env bash
# One command for the TP benchmark report: builds and runs //bench:tp_bench (every TP layer row),
# //bench:tp_model_report (the scaling model, validated in the same run, and the H100 tables)
# and the PyTorch peer (bench/peers/tp_mlp_torch.sh), then writes bench/REPORT.md,
# bench/report.json and bench/tp_scaling.png (gnuplot; tools/setup.sh installs gnuplot-nox).
#
#   bash tools/bench_report.sh            # ~5-10 min on a loaded 2-core machine
#   STEPS=5 D=1024 bash tools/bench_report.sh
#
# The GPU section: from one GPU run's outputs in DIR (tp_bench_cuda.json and tp_model_gpu.md, as
# .gpu/run.sh of tools/gpu_bundle.sh writes them under $OUT), writes DIR/REPORT_GPU.md (or OUT.md)
# with tools/bench_report_gpu.py; no build. On the GPU machine it first records the machine in
# DIR/machine.txt (nvidia-smi; TOKENS, D, STEPS and COMMIT from the environment) unless present.
# Copy the result to bench/REPORT_GPU.md, next to the CPU report.
#
#   bash tools/bench_report.sh --gpu DIR [OUT.md]
set -euo pipefail
caller="$PWD"
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--gpu" ]; then
  dir="${2:?usage: bash tools/bench_report.sh --gpu DIR [OUT.md]}"
  out="${3:-$dir/REPORT_GPU.md}"
  case "$dir" in /*) ;; *) dir="$caller/$dir" ;; esac  # relative to where it was called
  case "$out" in /*) ;; *) out="$caller/$out" ;; esac
  [ -d "$dir" ] || { echo "bench_report: --gpu $dir: no such directory" >&2; exit 2; }
  if [ ! -f "$dir/machine.txt" ]; then
    smi() { nvidia-smi --query-gpu="$1" --format=csv,noheader 2>/dev/null | head -1 || true; }
    {
      echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
      echo "commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
      echo "host=$(hostname)"
      echo "gpu=$(smi name)"
      echo "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
      echo "driver=$(smi driver_version)"
      echo "cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
      echo "cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
      echo "cores=$(nproc)"
      echo "tokens=${TOKENS:-?}"
      echo "d=${D:-?}"
      echo "steps=${STEPS:-?}"
    } > "$dir/machine.txt"
  fi
  "${PYTHON:-python3}" tools/bench_report_gpu.py --dir="$dir" --out_md="$out"
  echo "bench_report: wrote $out" >&2
  exit 0
fi
steps="${STEPS:-3}"
d="${D:-512}"
tokens="${TOKENS:-512}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
  echo "cores=$(nproc)"
  echo "memory=$(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "kernel=$(uname -r)"
  echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "tokens=$tokens"
  echo "d=$d"
  echo "steps=$steps"
} > "$tmp/machine.txt"
# After machine.txt: nproc honours OMP_NUM_THREADS.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

bazel build -c opt --config=opt //bench:tp_bench //bench:tp_model_report //bench:overhead_bench

echo "bench_report: tp_bench (tokens $tokens, d $d, $steps steps per row)" >&2
bazel-bin/bench/tp_bench --tokens="$tokens" --d="$d" --steps="$steps" \
  --benchmark_format=json --benchmark_out="$tmp/tp_bench.json" > "$tmp/tp_bench.txt"
echo "bench_report: tp_model_report" >&2
bazel-bin/bench/tp_model_report --tokens="$tokens" --d="$d" --steps="$steps" \
  --json="$tmp/tp_model.json" > "$tmp/tp_model.md"
echo "bench_report: PyTorch peer" >&2
bash bench/peers/tp_mlp_torch.sh "$tmp/peer.json" > "$tmp/peer.md"
echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$tmp/machine.txt"

/usr/bin/python3 tools/bench_report.py --dir="$tmp" --out_md=bench/REPORT.md \
  --out_json=bench/report.json --plot_data="$tmp/plot.dat" > "$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "bench_report: wrote bench/REPORT.md, bench/report.json, bench/tp_scaling.png" >&2
