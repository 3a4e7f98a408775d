#!/usr/bin/env bash
# Shared by the train_gpt_*_test.sh scripts (sourced): the binary, a tiny text, the tiny model's
# flags and the checks. Each script is one Bazel test sized to run in a third of its timeout.
set -euo pipefail
bin="models/train/train_gpt"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
common=(--text="$tmp/text.txt" --layers=1 --d_model=16 --heads=4 --seq=8 --batch=4 --lr=1e-2
        --dtype=f64)

fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -o '^step [0-9]* loss [^ ]*' || true; }
same_losses() {  # same_losses "$a" "$b": the same steps' losses, equal to 1e-9 relative
  python3 - "$1" "$2" <<'PY'
import sys
a = [float(l.split()[3]) for l in sys.argv[1].splitlines() if l.strip()]
b = [float(l.split()[3]) for l in sys.argv[2].splitlines() if l.strip()]
ok = a and len(a) == len(b) and all(abs(x - y) <= 1e-9 * abs(x) for x, y in zip(a, b))
sys.exit(0 if ok else 1)
PY
}

expect_error() {  # expect_error "message" flags...: exit 2 (an error, not a crash), no step run
  local msg="$1"; shift
  local rc=0
  err=$("$bin" "$@" 2>&1) || rc=$?
  [ "$rc" = 0 ] && fail "accepted: $*"
  [ "$rc" = 2 ] || fail "exit $rc (a crash?) for: $*: $err"
  grep -q -- "$msg" <<<"$err" || fail "expected '$msg', got: $err"
  grep -q "^step" <<<"$err" && fail "trained before rejecting: $*"
  return 0
}
