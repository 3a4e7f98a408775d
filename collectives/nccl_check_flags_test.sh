#!/usr/bin/env bash
# nccl_check's flags: --help, and each bad flag rejected (exit 2, naming it) before any rendezvous.
set -uo pipefail
check="$1"
fail=0

expect() {  # expect CODE TEXT ARGS...
  local code="$1" text="$2"; shift 2
  local out rc
  out=$("$check" "$@" 2>&1); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: nccl_check $* -> exit $rc (want $code and '$text'):"; echo "$out" | tail -5
    fail=1
  fi
}

expect 1 "Checks NCCL collectives" --help   # Abseil exits 1 after --help
expect 2 "--count=0: must be between" --count=0
expect 2 "--timeout_s=nan" --timeout_s=nan
expect 2 "--timeout_s=1e+300" --timeout_s=1e300
expect 2 "--device=-5" --device=-5
expect 2 "unexpected argument 'x'" x
exit $fail
