#!/usr/bin/env bash
# Llama 3 step: //bench:llama_bench next to the same model in PyTorch eager (llama_torch.py),
# one thread each. Installs Debian's python3-torch when missing (a peer, never a build
# dependency) and runs it with /usr/bin/python3.
#
#   bash bench/peers/llama_torch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q --no-install-recommends python3-torch
fi
echo "== shardmap (//bench:llama_bench) =="
OPENBLAS_NUM_THREADS=1 bazel run -c opt --config=opt //bench:llama_bench
echo "== PyTorch eager (bench/peers/llama_torch.py) =="
OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/llama_torch.py
