#!/usr/bin/env bash
# Builds and tests the example workspace that depends on shardmap (examples/external_user/) the
# way a user would: its own WORKSPACE (local_repository + shardmap_deps()), its own output base.
# Runs `bazel test //...` there with the CUDA toolkit as found, then with CUDA_PATH=/nonexistent.
# Exits non-zero on any failure.
#
#   bash tools/test_example.sh            # both passes
#   bash tools/test_example.sh --no-cuda  # only the pass without the toolkit
set -uo pipefail
cd "$(dirname "$0")/../examples/external_user" || exit 1

status=0
run() {  # run LABEL [ENV...]: one bazel test //... in the example workspace
  local label="$1"; shift
  echo "== example workspace (examples/external_user): bazel test //... ${label}"
  env "$@" bazel test //... 2>&1 | grep -vE '^\[|^INFO: (From|Analyzed)|linux-sandbox'
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "example workspace: FAILED (${label})"; status=1; }
}

if [ "${1:-}" != "--no-cuda" ] && [ -d "${CUDA_PATH:-/usr/local/cuda}" ]; then
  run "(CUDA toolkit: ${CUDA_PATH:-/usr/local/cuda})"
fi
run "(CUDA_PATH=/nonexistent)" CUDA_PATH=/nonexistent
# The example's Bazel server holds memory; the suite does not need it any more.
bazel shutdown >/dev/null 2>&1 || true
[ "$status" -eq 0 ] && echo "example workspace: passed"
exit "$status"
