#!/usr/bin/env bash
# train_gpt --plan (any --model): the plan for the run's own flags is printed before training (its mesh placed
# in the ranking), training then goes on; a bad --plan_profile stops the run with a clear error.
set -euo pipefail
bin="models/train/train_gpt"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
common=(--text="$tmp/text.txt" --layers=2 --d_model=16 --heads=4 --seq=8 --batch=8 --steps=2)
fail() { echo "FAIL: $*"; exit 1; }

out=$("$bin" "${common[@]}" --mesh=dp=2,tp=2 --sp --plan --plan_profile=h100_node)
echo "$out"
grep -q "^plan: " <<<"$out" || fail "no plan header"
grep -q "on 4 GPUs (4 per node), profile h100_node" <<<"$out" || fail "plan not for the run's 4 ranks"
grep -q "this run's mesh dp=2,tp=2 +sp ranks [0-9]* of [0-9]*" <<<"$out" || fail "run's mesh not placed"
grep -q "^step 1 loss " <<<"$out" || fail "training did not go on after the plan"

# A pipeline run's own schedule and microbatches.
out=$("$bin" "${common[@]}" --mesh=pp=2,dp=2 --microbatches=4 --schedule=gpipe --plan \
      --plan_profile=h100_node)
grep -q "this run's mesh pp=2,dp=2 gpipe/m4" <<<"$out" || fail "pipeline mesh not placed: $out"

# An interleaved run's chunks per stage.
out=$("$bin" "${common[@]}" --mesh=pp=2 --layers=4 --microbatches=2 --schedule=interleaved_1f1b \
      --virtual_stages=2 --plan --plan_profile=h100_node)
grep -q "this run's mesh pp=2 interleaved_1f1b/m2/v2" <<<"$out" \
  || fail "interleaved mesh not placed with its chunks: $out"

# Any registered model: a small Llama 3 (GQA: 2 kv heads of 4) is planned as itself.
out=$("$bin" --model=llama3 --text="$tmp/text.txt" --layers=2 --d_model=16 --heads=4 \
      --kv_heads=2 --ffn_dim=40 --vocab=256 --seq=8 --batch=8 --steps=1 --mesh=dp=2,tp=2 --sp \
      --plan --plan_profile=h100_node)
grep -q "this run's mesh dp=2,tp=2 +sp ranks [0-9]* of [0-9]*" <<<"$out" \
  || fail "llama3: run's mesh not placed: $out"
grep -q "^step 0 loss " <<<"$out" || fail "llama3: training did not go on after the plan"

# The measured CPU profile (the default on CPU ranks).
out=$("$bin" "${common[@]}" --mesh=dp=2 --plan --steps=1)
grep -q "profile cpu_measured" <<<"$out" || fail "the default profile is not measured: $out"

# Errors: an unknown profile stops the run before training.
set +e
err=$("$bin" "${common[@]}" --mesh=dp=2 --plan --plan_profile=nope 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] || fail "unknown profile: exit $rc"
grep -q "unknown hardware profile 'nope'" <<<"$err" || fail "unclear error: $err"
grep -q "^step 0" <<<"$err" && fail "trained despite the bad profile"
echo PASS
