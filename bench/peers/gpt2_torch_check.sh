#!/usr/bin/env bash
# A GPT-2 safetensors file written by PyTorch loads into train_gpt with PyTorch's losses
# (gpt2_torch_check.py). Installs Debian's python3-torch when missing (a peer, never a build
# dependency) and runs it with /usr/bin/python3.
#
#   bash bench/peers/gpt2_torch_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q --no-install-recommends python3-torch
fi
bazel build -c opt //models/train:train_gpt
/usr/bin/python3 bench/peers/gpt2_torch_check.py --train_gpt bazel-bin/models/train/train_gpt "$@"
