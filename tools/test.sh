#!/usr/bin/env bash
# The test suite: set-up, then every test, then the build again with the CUDA toolkit hidden (the
# project must build and pass without CUDA too). Exits non-zero on any failure.
#
#   bash tools/test.sh                 # everything
#   bash tools/test.sh //tensor/...    # a subset (skips the no-CUDA pass)
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

targets=("${@:-//...}")
log=$(mktemp)
status=0

echo "== bazel test ${targets[*]}"
bazel test "${targets[@]}" 2>&1 | tee "$log" | grep -vE '^\[|^INFO: (From|Analyzed)|linux-sandbox' || true
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
grep -qE 'FAILED|NO STATUS|TIMEOUT|FAILED TO BUILD|ERROR:' "$log" && status=1

if [ $# -eq 0 ] && [ -d /usr/local/cuda ]; then
  echo "== no-CUDA pass: CUDA_PATH=/nonexistent (the toolkit hidden)"
  CUDA_PATH=/nonexistent bazel test //... 2>&1 | tee -a "$log.nocuda" \
    | grep -vE '^\[|^INFO: (From|Analyzed)|linux-sandbox' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  cat "$log.nocuda" >> "$log"
fi

# The example workspace that depends on shardmap, as a user's would (full runs only).
if [ $# -eq 0 ]; then
  bash tools/test_example.sh || status=1
fi

passed=$(grep -cE '^//.* PASSED' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log" || true)
skipped=$(grep -cE '^//.* SKIPPED' "$log" || true)
rm -f "$log" "$log.nocuda"
echo "bazel: ${passed} passed, ${failed} failed, ${skipped} skipped"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then echo "bazel: the build or a test run failed (see above)"; fi
exit "$status"
