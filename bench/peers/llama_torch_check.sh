#!/usr/bin/env bash
# Regenerates models/llama/testdata/llama_torch_reference.safetensors with an independent
# PyTorch Llama (llama_torch_check.py, f64 loss and gradients), then runs the test that compares
# shardmap's Llama 3 to it (loss and gradients; 5 trained steps) to 1e-9 relative. Installs
# Debian's python3-torch when missing (a peer, never a build dependency).
#
#   bash bench/peers/llama_torch_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q --no-install-recommends python3-torch
fi
/usr/bin/python3 bench/peers/llama_torch_check.py "$@"
bazel test //models/llama:llama_model_test //models/llama:llama_train_test \
  --test_output=all --test_filter='LlamaTorchReferenceTest.*:LlamaTrainTest.*'
