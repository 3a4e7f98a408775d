#!/usr/bin/env bash
# Builds and tests the example workspace that depends on shardmap (examples/external_user/) the
# way a user would: its own WORKSPACE (local_repository + shardmap_deps()), its own output base.
# Runs `bazel test //...` there with the CUDA toolkit as found, then with CUDA_PATH=/nonexistent,
# then `bazel query @shardmap//...` (which must not walk into a built clone's bazel-* links).
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

# `bazel query @shardmap//...` must not walk into the clone's own bazel-* links (shardmap's
# .bazelignore lists them; the execroot link is named after the clone's folder).
clone_link="bazel-$(basename "$(cd ../.. && pwd)")"
if [ ! -e "../../${clone_link}" ] || grep -qx "${clone_link}" ../../.bazelignore; then
  echo "== example workspace: bazel query @shardmap//..."
  query_err=$(mktemp)
  if ! CUDA_PATH=/nonexistent bazel query @shardmap//... >/dev/null 2>"${query_err}"; then
    grep -E '^ERROR' "${query_err}" | head -5
    echo "example workspace: bazel query @shardmap//... FAILED"
    status=1
  fi
  rm -f "${query_err}"
else
  echo "example workspace: bazel query @shardmap//... not checked: ${clone_link} (this clone's" \
       "folder is not named shardmap) is not in .bazelignore"
fi
# The example's Bazel server holds memory; the suite does not need it any more.
bazel shutdown >/dev/null 2>&1 || true
[ "$status" -eq 0 ] && echo "example workspace: passed"
exit "$status"
