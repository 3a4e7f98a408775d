#!/usr/bin/env bash
# The main demo: set-up, then a small GPT-2 trained on real text on 4 simulated CPU devices with a
# 2-D mesh (data parallel x tensor parallel, plus sequence parallelism). It prints the per-device
# SPMD types inside one transformer block and one line per step; the loss falls.
#
# The text is the GNU GPL v3 as Debian's base-files package ships it on every install
# (/usr/share/common-licenses/GPL-3, 35 KB); its bytes are the tokens (vocab 256).
#
#   bash tools/demo.sh            # about a minute on 2 cores
#   bash tools/demo.sh --steps=200 --trace=/tmp/gpt_trace.json   # extra flags go to train_gpt
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
text=/usr/share/common-licenses/GPL-3
if [ ! -r "$text" ]; then
  echo "demo: $text (Debian's base-files) is missing; pass --text=ANY_TEXT_FILE" >&2
fi
bazel run -c opt //models/train:train_gpt -- \
  --mesh=dp=2,tp=2 --sp --text="$text" \
  --layers=2 --d_model=64 --heads=4 --seq=64 --batch=8 \
  --steps=60 --lr=3e-3 --print_types "$@"
