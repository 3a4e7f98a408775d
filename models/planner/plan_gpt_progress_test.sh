#!/usr/bin/env bash
# plan_gpt's progress on stderr when stderr is a file (not a terminal): one whole line per
# report, no carriage returns; with --time_limit the best so far rides on it.
set -euo pipefail
plan_gpt="$1"
err="${TEST_TMPDIR:-/tmp}/progress.err"
"$plan_gpt" --layers=4 --d_model=32 --heads=4 --vocab=64 --seq=16 --batch=8 --gpus=8 \
  --gpus_per_node=8 >/dev/null 2>"$err"
if grep -q $'\r' "$err"; then
  echo "FAIL: carriage returns in a non-terminal's progress:"; cat -A "$err" | head; exit 1
fi
lines=$(grep -c '^plan_gpt: profiled [0-9]* of [0-9]* meshes' "$err" || true)
if [ "$lines" -lt 1 ]; then
  echo "FAIL: want one progress line per report, got $lines:"; cat "$err"; exit 1
fi
if [ -n "$(tail -c 1 "$err")" ]; then echo "FAIL: the last progress line has no newline"; exit 1; fi
grep -q 'best so far ' "$err" || { echo "FAIL: no best so far in:"; cat "$err"; exit 1; }
echo "progress: $lines lines, each ended"
