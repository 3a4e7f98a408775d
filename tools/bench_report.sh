#!/usr/bin/env bash
# One command for the TP benchmark report: builds and runs //bench:tp_bench (every TP layer row),
# //bench:tp_model_report (the scaling model, validated in the same run, and the H100 tables)
# and the PyTorch peer (bench/peers/tp_mlp_torch.sh), then writes bench/REPORT.md,
# bench/report.json and bench/tp_scaling.png (gnuplot; tools/setup.sh installs gnuplot-nox).
#
#   bash tools/bench_report.sh            # ~5-10 min on a loaded 2-core machine
#   STEPS=5 D=1024 bash tools/bench_report.sh
set -euo pipefail
cd "$(dirname "$0")/.."
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
