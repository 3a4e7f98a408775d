#!/usr/bin/env bash
# Checkpoints that know their run (issue 37): a resume takes the run's settings from the file,
# notes every setting the command line changes and refuses those that cannot change mid-run;
# run ids keep two runs under one --save prefix apart (--overwrite removes the other's).
set -euo pipefail
bin="models/train/train_gpt"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
shape=(--layers=1 --d_model=16 --heads=4 --seq=8 --dtype=f64)

fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -o '^step [0-9]* loss [^ ]*' || true; }
same_losses() {  # the same steps' losses, equal to 1e-9 relative
  python3 - "$1" "$2" <<'PY'
import sys
a = [float(l.split()[3]) for l in sys.argv[1].splitlines() if l.strip()]
b = [float(l.split()[3]) for l in sys.argv[2].splitlines() if l.strip()]
ok = a and len(a) == len(b) and all(abs(x - y) <= 1e-9 * abs(x) for x, y in zip(a, b))
sys.exit(0 if ok else 1)
PY
}
expect_error() {  # expect_error "message" flags...: exit 2, the message, no step run
  local msg="$1"; shift
  local rc=0
  err=$("$bin" "$@" 2>&1) || rc=$?
  [ "$rc" = 2 ] || fail "exit $rc for: $*: $err"
  grep -q -- "$msg" <<<"$err" || fail "expected '$msg', got: $err"
  grep -q "^step" <<<"$err" && fail "trained before rejecting: $*"
  return 0
}

# The issue's case: a run with --batch=4 (not the default 8) and other non-default settings,
# resumed with no flag but the file: batch, lr, schedule, mesh, data and steps come from the
# checkpoint, and the losses are the uninterrupted run's.
mkdir -p "$tmp/a"
run=(--text="$tmp/text.txt" "${shape[@]}" --batch=4 --lr=1e-2 --lr_schedule=cosine
     --warmup_steps=1 --min_lr=1e-3 --grad_accum=2 --mesh=dp=2 --steps=6)
full=$("$bin" "${run[@]}" --save="$tmp/a/run.safetensors" --save_every=3 --keep_last=0)
rest=$("$bin" --resume="$tmp/a/run.step3.safetensors")
echo "$rest"
grep -q "global batch 4 x 8 tokens" <<<"$rest" || fail "batch not taken from the checkpoint: $rest"
grep -q "^from the checkpoint's run: .*--batch=4 .*--lr=0.01 .*--lr_schedule=cosine .*--mesh=dp=2" \
  <<<"$rest" || fail "adopted settings not listed: $rest"
same_losses "$(losses <<<"$full" | tail -3)" "$(losses <<<"$rest")" \
  || fail "resume with the run's settings: $(losses <<<"$rest") vs $(losses <<<"$full" | tail -3)"
# A flag given at its default value is given: --batch=8 changes the run's 4 (a note), and is used.
b8=$("$bin" --resume="$tmp/a/run.step3.safetensors" --batch=8)
grep -q "^note: --batch=8 changes the run's batch '4' ($tmp/a/run.step3.safetensors)$" <<<"$b8" \
  || fail "no note for --batch=8: $b8"
grep -q "global batch 8 x 8 tokens" <<<"$b8" || fail "--batch=8 not used: $b8"
# Shape flags at their default values are checked too (--layers=2 is the default; the file has 1).
expect_error "--layers=2 but the checkpoint '$tmp/a/run.step3.safetensors' has layers 1" \
  --resume="$tmp/a/run.step3.safetensors" --layers=2
# What cannot change mid-run: the random order's seed, the held-out split, the data's content.
expect_error "--seed=2 but the run in '$tmp/a/run.step3.safetensors' has seed '1' (its batches are drawn in random order" \
  --resume="$tmp/a/run.step3.safetensors" --seed=2
expect_error "--val_fraction=0.1 but the run in .* has val_fraction '0'" \
  --resume="$tmp/a/run.step3.safetensors" --val_fraction=0.1
printf 'another text entirely, not the one the run was trained on. %.0s' $(seq 1 30) > "$tmp/other.txt"
expect_error "the training data '$tmp/other.txt' (.* bytes, hash [0-9a-f]*) is not the run's: .* start a new run from these weights with --init=" \
  --resume="$tmp/a/run.step3.safetensors" --text="$tmp/other.txt"
cp "$tmp/text.txt" "$tmp/moved.txt"
moved=$("$bin" --resume="$tmp/a/run.step3.safetensors" --text="$tmp/moved.txt")
grep -q "^note: the training data '$tmp/moved.txt' has the content of the run's '$tmp/text.txt'$" \
  <<<"$moved" || fail "moved data: $moved"
same_losses "$(losses <<<"$moved")" "$(losses <<<"$rest")" || fail "moved data losses"
# --init starts a new run: nothing is adopted or refused but the shape.
init=$("$bin" --init="$tmp/a/run.step3.safetensors" --text="$tmp/other.txt" --steps=1)
grep -q "global batch 8 x 8 tokens" <<<"$init" || fail "--init adopted the run's batch: $init"

# Run ids. An older run under the prefix b/run: steps 5 and 10.
mkdir -p "$tmp/b"
small=(--text="$tmp/text.txt" "${shape[@]}" --batch=4 --lr=1e-2)
"$bin" "${small[@]}" --steps=10 --save="$tmp/b/run.safetensors" --save_every=5 --keep_last=0 >/dev/null
# A fresh run under the same prefix is refused (it would prune its own files beside the older
# run's, and --resume=auto would then continue the older run: the issue's case)...
expect_error "--save '$tmp/b/run.safetensors' holds checkpoints of another run ($tmp/b/run.step5.safetensors, $tmp/b/run.step10.safetensors) and this run (id [0-9a-f]*) would save beside them" \
  "${small[@]}" --steps=4 --save="$tmp/b/run.safetensors" --save_every=2 --keep_last=1
# ... unless --overwrite, which names and removes them.
new=$("$bin" "${small[@]}" --steps=4 --save="$tmp/b/run.safetensors" --save_every=2 --keep_last=1 \
      --overwrite)
grep -q "^--overwrite: removed 2 checkpoints of other runs: $tmp/b/run.step5.safetensors, $tmp/b/run.step10.safetensors$" \
  <<<"$new" || fail "--overwrite: $new"
[ "$(ls "$tmp/b" | tr '\n' ' ')" = "run.safetensors run.step4.safetensors " ] \
  || fail "after --overwrite: $(ls "$tmp/b")"
auto=$("$bin" --resume=auto --save="$tmp/b/run.safetensors" --steps=6 --save_every=2)
grep -q "^resumed from $tmp/b/run.step4.safetensors at step 4$" <<<"$auto" || fail "auto: $auto"
# The run id is kept across the resume: the resumed run's checkpoint has the fresh run's id.
python3 - "$tmp/b/run.step4.safetensors" "$tmp/b/run.step6.safetensors" <<'PY' || fail "run id"
import json, struct, sys
def meta(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    return json.loads(b[8:8 + n])['__metadata__']
a, b = meta(sys.argv[1]), meta(sys.argv[2])
assert len(a['run.id']) == 16 and a['run.id'] == b['run.id'], (a['run.id'], b['run.id'])
assert a['run.flag.batch'] == '4' and a['run.data.bytes'] == '1800', a
PY
expect_error "--run_id=other but '$tmp/b/run.step4.safetensors' is a checkpoint of run '[0-9a-f]*': a resume continues that run" \
  --resume="$tmp/b/run.step4.safetensors" --run_id=other
# Two runs' checkpoints under one prefix (copied in): --resume=auto names both and refuses.
cp "$tmp/a/run.step3.safetensors" "$tmp/b/run.step3.safetensors"
expect_error "--resume=auto: '$tmp/b/run.safetensors' holds the checkpoints of 2 runs: run [0-9a-f]* (steps [0-9, ]*); run [0-9a-f]* (steps [0-9, ]*); continue one with --resume=FILE" \
  --resume=auto --save="$tmp/b/run.safetensors"

# MFU: the step line and the summary; the percentage is FLOPs/token x tokens/s / peak.
mfu=$("$bin" "${small[@]}" --steps=2 --peak_flops=1e12)
grep -q "^step 1 loss .* tokens/s | MFU [0-9.]*% | .* | RSS [0-9.]* [KMG]iB$" <<<"$mfu" || fail "MFU step line: $mfu"
python3 - "$mfu" <<'PY' || fail "MFU summary: $mfu"
import re, sys
out = sys.argv[1]
tps = float(re.search(r'^summary: .*, ([0-9.]+) tokens/s;', out, re.M).group(1))
m = re.search(r'^MFU: ([0-9.]+)% of 1e\+12 FLOP/s \(--peak_flops\); ([0-9]+) model FLOPs per token .*; peak RSS ', out, re.M)
pct, fpt = float(m.group(1)), float(m.group(2))
# d 16, 1 layer, vocab 256, seq 8: N = 12*16^2 + 13*16 + 256*16 + 2*16 = 7408; 6N + 12*1*16*8
assert fpt == 6 * 7408 + 12 * 16 * 8, fpt
assert abs(pct - 100 * fpt * tps / 1e12) <= 0.01 * pct + 0.01, (pct, fpt, tps)
PY
# The CPU peak: the hardware's (cores x clock x FMA width, each named), nothing measured or
# cached, and the MFU at most 100%.
first=$(XDG_CACHE_HOME="$tmp/cache" "$bin" "${small[@]}" --steps=1)
grep -q "^MFU: [0-9.]*% of .* FLOP/s (this CPU's f64 peak, hardware: [0-9]* cores (.*) x [0-9.]* GHz (.*) x 2 FMA units x [0-9]* f64 lanes (.*) x 2)" \
  <<<"$first" || fail "CPU peak: $first"
pct=$(sed -n 's/^MFU: \([0-9.]*\)% of .*/\1/p' <<<"$first")
python3 -c "import sys; assert 0 < float(sys.argv[1]) <= 100, sys.argv[1]" "$pct" || fail "MFU $pct%"
[[ ! -e "$tmp/cache/shardmap/cpu_peak_flops.txt" ]] || fail "a hardware peak needs no cache file"
echo PASS
