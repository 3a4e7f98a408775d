#!/usr/bin/env bash
# mlp_demo's flags: --help, a small odd run (dp=3 x tp=2, tp=1), and each bad flag rejected with
# exit code 2 and a message naming it.
set -uo pipefail
demo="$1"
fail=0

expect() {  # expect CODE TEXT ARGS...: exit code CODE and TEXT in the output
  local code="$1" text="$2"; shift 2
  local out rc
  out=$("$demo" "$@" 2>&1); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: mlp_demo $* -> exit $rc (want $code and '$text'):"; echo "$out" | tail -5
    fail=1
  fi
}

expect 1 "Trains a dp x tp Megatron MLP" --help   # Abseil exits 1 after --help
expect 0 "PASS" --mesh=dp=3,tp=2 --batch=6 --d_model=5 --d_hidden=6 --steps=3 --precision=none
expect 0 "PASS" --mesh=dp=1,tp=1 --batch=3 --d_model=4 --d_hidden=5 --steps=2 --precision=f32
expect 2 "--mesh=dp=2,pp=2: axis 'pp'" --mesh=dp=2,pp=2
expect 2 "name both axes" --mesh=dp=2
expect 2 "'tp=0' is not axis=size" --mesh=dp=2,tp=0
expect 2 "'tp=x' is not axis=size" --mesh=dp=2,tp=x
expect 2 "at most 64" --mesh=dp=65536,tp=65536
expect 2 "--batch=7 is not a multiple of dp=2" --batch=7
expect 2 "--d_hidden=30 is not a multiple of tp=4" --d_hidden=30
expect 2 "--d_model=0: must be between" --d_model=0
expect 2 "--steps=1" --steps=1
expect 2 "--lr=nan" --lr=nan
expect 2 "--precision=fp8" --precision=fp8
expect 2 "unexpected argument 'extra'" extra
expect 1 "Unknown command line flag" --no_such_flag
exit $fail
