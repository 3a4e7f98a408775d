#!/usr/bin/env bash
# The main demo: set-up, then a 2-D (dp x tp) Megatron MLP trained for a few steps on 8 simulated
# devices, each step's loss shown next to the unsharded run's.
#
#   bash tools/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel run -c opt //models:mlp_demo
