#!/usr/bin/env bash
# Runs a command-line tool once per case and checks its exit code and output (for sh_test):
#
#   cli_test.sh BINARY CASES
#
# CASES has one case per line, "CODE | TEXT | ARGS" (ARGS split on spaces; # starts a comment):
#   2 | --batch=7 is not a multiple of dp=2 | --batch=7
# A case passes when BINARY ARGS exits with CODE and prints TEXT (stdout or stderr).
set -uo pipefail
binary="$1"
cases="$2"
fail=0
n=0
while IFS= read -r line; do
  line="${line%%#*}"
  [ -z "${line// }" ] && continue
  IFS='|' read -r code text args <<<"$line"
  code="${code// }"; text="$(echo "$text" | sed 's/^ *//; s/ *$//')"
  read -r -a argv <<<"$args"
  out=$("$binary" "${argv[@]}" 2>&1); rc=$?
  n=$((n + 1))
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $(basename "$binary") ${argv[*]} -> exit $rc (want $code and '$text'):"
    echo "$out" | tail -5
    fail=1
  fi
done <"$cases"
echo "$n cases, $([ $fail -eq 0 ] && echo all passed || echo some failed)"
[ "$n" -gt 0 ] || { echo "no cases in $cases"; exit 1; }
exit $fail
