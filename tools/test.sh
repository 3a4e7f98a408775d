#!/usr/bin/env bash
# The test suite: set-up, then every test, then the build again with the CUDA toolkit hidden (the
# project must build and pass without CUDA too). Exits non-zero on any failure or build error.
#
#   bash tools/test.sh                 # everything
#   bash tools/test.sh //tensor/...    # a subset (skips the no-CUDA pass)
#
# Counts are test cases, read from Bazel's test XML by tools/test_summary.py: after each pass it
# lists the skipped cases with their reason (e.g. "no GPU: ..."), the targets that executed no
# test case and the failures, then "PASS: N passed, N failed, N skipped". The last line is the
# total over the passes: "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

targets=("${@:-//...}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# run_pass LABEL [ENV=VALUE ...]: bazel test with the env settings, then its case counts.
run_pass() {
  local label=$1
  shift
  local log="$tmp/pass.log"
  echo "== bazel test ${targets[*]} ($label)"
  env "$@" bazel test "${targets[@]}" 2>&1 | tee "$log" \
    | grep -vE '^\[|^INFO: (From|Analyzed)|linux-sandbox' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  grep -qE 'FAILED|NO STATUS|TIMEOUT|FAILED TO BUILD|^ERROR:' "$log" && status=1
  python3 tools/test_summary.py --log "$log" --label "$label" --counts "$tmp/counts" || status=1
}

if [ -d /usr/local/cuda ]; then run_pass "with CUDA"; else run_pass "no CUDA toolkit"; fi
if [ $# -eq 0 ] && [ -d /usr/local/cuda ]; then
  run_pass "no CUDA" CUDA_PATH=/nonexistent
fi

# The example workspace that depends on shardmap, as a user's would (full runs only). It has its
# own output base, so it compiles shardmap again: without the toolkit by default (about 13 min
# cold on 2 cores; with nvcc it takes about 27 min more, too much for every CI run), with it too
# when SHARDMAP_EXAMPLE_CUDA=1.
if [ $# -eq 0 ]; then
  if [ "${SHARDMAP_EXAMPLE_CUDA:-0}" = 1 ]; then
    bash tools/test_example.sh || status=1
  else
    bash tools/test_example.sh --no-cuda || status=1
  fi
fi

read -r passed failed skipped < <(awk '{p += $1; f += $2; s += $3} END {print p+0, f+0, s+0}' \
                                  "$tmp/counts" 2>/dev/null || echo "0 0 0")
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "the build or a test run failed (see above)"
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$status"
