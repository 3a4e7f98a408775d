#!/usr/bin/env bash
# Times //bench:tensor_bench's op rows and the same ops in PyTorch (Debian python3-torch,
# installed here if missing; never a build dependency), one thread each, and prints them side by
# side.
#
#   bash bench/peers/torch_ops.sh                 # builds and runs tensor_bench (-c opt)
#   bash bench/peers/torch_ops.sh ours.json       # reuses a tensor_bench JSON output
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends python3-torch
fi
ours="${1:-}"
if [ -z "$ours" ]; then
  ours="$(mktemp --suffix=.json)"
  OPENBLAS_NUM_THREADS=1 bazel run -c opt //bench:tensor_bench -- \
    --benchmark_filter='/f32/' --benchmark_format=json --benchmark_out="$ours" >/dev/null
fi
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  /usr/bin/python3 bench/peers/torch_ops.py --ours="$ours"
