#!/usr/bin/env bash
# Times //bench:tensor_bench's op rows and the same ops in PyTorch (Debian python3-torch,
# installed here if missing; never a build dependency), one thread each, and prints them side by
# side.
#
#   bash bench/peers/torch_ops.sh                 # builds tensor_bench (-c opt); ROUNDS=2 rounds
#   bash bench/peers/torch_ops.sh ours.json       # reuses a tensor_bench JSON output
#   FILTER=gelu_erf ROUNDS=5 bash bench/peers/torch_ops.sh   # rows matching a regex, 5 rounds
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends python3-torch
fi
# Alternating rounds (ours, PyTorch, ours, PyTorch, ...), per row the fastest of each side: the
# machine changes speed over minutes (other tenants), and alternating exposes both sides to it.
ours="${1:-}"
rounds="${ROUNDS:-2}"
filter="${FILTER:-}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if [ -n "$ours" ]; then
  /usr/bin/python3 bench/peers/torch_ops.py --ours="$ours" --filter="$filter"
  exit
fi
bazel build -c opt //bench:tensor_bench >/dev/null 2>&1 || bazel build -c opt //bench:tensor_bench
bench="$(bazel info -c opt bazel-bin)/bench/tensor_bench"
tmp="$(mktemp -d)"
ours_list="" torch_list=""
for r in $(seq 1 "$rounds"); do
  "$bench" --benchmark_filter="${filter:+$filter.*}/f32/" --benchmark_format=json \
    --benchmark_out="$tmp/ours_$r.json" >/dev/null
  /usr/bin/python3 bench/peers/torch_ops.py --torch_out="$tmp/torch_$r.json" --filter="$filter"
  ours_list="${ours_list:+$ours_list,}$tmp/ours_$r.json"
  torch_list="${torch_list:+$torch_list,}$tmp/torch_$r.json"
done
echo "$rounds alternating rounds, per row the fastest of each side"
/usr/bin/python3 bench/peers/torch_ops.py --ours="$ours_list" --torch="$torch_list" \
  --filter="$filter"
rm -rf "$tmp"
