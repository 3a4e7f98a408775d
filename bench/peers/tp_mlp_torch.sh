#!/usr/bin/env bash
# The TP MLP (tokens 512, hidden 512, ffn 2048, f32, fwd+bwd) of //bench:tp_bench next to the
# same MLP Megatron-style in PyTorch + Gloo (tp_mlp_torch.py) at TP 1, 2, 4, and PyTorch eager's
# per-op time next to //bench:overhead_bench's. Installs Debian's python3-torch when missing (a
# peer, never a build dependency) and runs it with /usr/bin/python3, one thread per rank.
#
#   bash bench/peers/tp_mlp_torch.sh [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends python3-torch
fi
bazel build -c opt --config=opt //bench:tp_bench //bench:overhead_bench >/dev/null 2>&1 ||
  bazel build -c opt --config=opt //bench:tp_bench //bench:overhead_bench
tmp="$(mktemp -d)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
bazel-bin/bench/overhead_bench --benchmark_filter='^(add|matmul)/mode:(checked|taped_checked)/' \
  --benchmark_min_time=0.2 --benchmark_format=json --benchmark_out="$tmp/oh.json" >/dev/null
/usr/bin/python3 bench/peers/tp_mlp_torch.py --tp_bench=bazel-bin/bench/tp_bench \
  --ours_overhead="$tmp/oh.json" ${1:+--json="$1"}
rm -rf "$tmp"
