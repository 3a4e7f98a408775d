#!/usr/bin/env bash
# What a run may do to its --save prefix (issue 48's fault probe): nothing is deleted before the
# run has been checked and started, no file outside the prefix is written through a planted
# symlink, the temporaries of killed saves are cleaned up, and a FIFO named like a checkpoint
# never hangs a run. Every refusal is exit 2 within seconds (each command runs under a timeout).
set -euo pipefail
bin="models/train/train_gpt"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
small=(--text="$tmp/text.txt" --layers=1 --d_model=16 --heads=4 --seq=8 --dtype=f64 --batch=4
       --lr=1e-2)

fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 120 "$bin" "$@"; }  # a hang is a failure (exit 124), not a stuck test
expect_error() {  # expect_error "message" flags...: exit 2, the message, no step run
  local msg="$1"; shift
  local rc=0
  err=$(run "$@" 2>&1) || rc=$?
  [ "$rc" = 2 ] || fail "exit $rc for: $*: $err"
  grep -q -- "$msg" <<<"$err" || fail "expected '$msg', got: $err"
  grep -q "^step" <<<"$err" && fail "trained before rejecting: $*"
  return 0
}
listing() { ls -A "$1" | tr '\n' ' '; }

# 1. --overwrite removes nothing until the run has been checked and started: a mistyped
# --resume (a missing file: a fresh run id, so the run's own checkpoints look like another
# run's) or a bad --lr exits 2 with the prefix as it was.
mkdir -p "$tmp/p"
run "${small[@]}" --steps=4 --save="$tmp/p/run.safetensors" --save_every=2 --keep_last=0 >/dev/null
before=$(listing "$tmp/p")
[ "$before" = "run.safetensors run.step2.safetensors run.step4.safetensors " ] \
  || fail "setup: $before"
expect_error "$tmp/p/missing.safetensors" "${small[@]}" --steps=6 --overwrite \
  --resume="$tmp/p/missing.safetensors" --save="$tmp/p/run.safetensors" --save_every=2
[ "$(listing "$tmp/p")" = "$before" ] \
  || fail "a bad --resume with --overwrite deleted: $(listing "$tmp/p")"
expect_error "lr" "${small[@]}" --steps=6 --overwrite --lr=nan --save="$tmp/p/run.safetensors" \
  --save_every=2
[ "$(listing "$tmp/p")" = "$before" ] \
  || fail "--lr=nan with --overwrite deleted: $(listing "$tmp/p")"
# A run that starts removes them after its first checkpoint, and says so.
new=$(run "${small[@]}" --steps=2 --overwrite --save="$tmp/p/run.safetensors" --save_every=2)
grep -q "^checkpoint: $tmp/p/run.step2.safetensors$" <<<"$new" || fail "no first checkpoint: $new"
grep -q "^--overwrite: removed 1 checkpoint of other runs: $tmp/p/run.step4.safetensors$" \
  <<<"$new" || fail "--overwrite did not say what it removed: $new"
python3 - "$(grep -n '' <<<"$new" | grep -m1 ':checkpoint: ' | cut -d: -f1)" \
  "$(grep -n '' <<<"$new" | grep -m1 ':--overwrite: ' | cut -d: -f1)" <<'PY' \
  || fail "removed before the run's first checkpoint: $new"
import sys
sys.exit(0 if int(sys.argv[1]) < int(sys.argv[2]) else 1)
PY

# 2. Symlinks planted at every name a save used to open with O_TRUNC (the write probe, the
# step's temporary and its doubled one, predicted from the pid: exec keeps the subshell's) and
# at the final name: the file outside the prefix is untouched.
mkdir -p "$tmp/s"
printf 'precious' > "$tmp/victim.txt"
(
  pid=$BASHPID
  for name in ".write_probe.$pid" "run.step2.safetensors.tmp.$pid" \
              "run.step2.safetensors.tmp.$pid.tmp.$pid" "run.safetensors.tmp.$pid" \
              "run.step2.safetensors"; do
    ln -s "$tmp/victim.txt" "$tmp/s/$name"
  done
  exec "$bin" "${small[@]}" --steps=2 --save="$tmp/s/run.safetensors" --save_every=2 \
    >"$tmp/s.out" 2>&1  # the binary itself, so that its pid is the one predicted
) || fail "run beside planted symlinks: $(cat "$tmp/s.out")"
[ "$(cat "$tmp/victim.txt")" = "precious" ] || fail "a save wrote through a planted symlink"
[ -f "$tmp/s/run.step2.safetensors" ] && [ ! -L "$tmp/s/run.step2.safetensors" ] \
  || fail "the checkpoint is not a regular file"

# 3. The temporaries that killed saves leave (today's <final>.tmp.<pid>.<random>, the final
# --save file's, and the older doubled .tmp.<pid>.tmp.<pid>) are removed by the next run.
sh -c 'exit 0' & dead=$!
wait "$dead"
mkdir -p "$tmp/k"
for name in "run.step4.safetensors.tmp.$dead.tmp.$dead" "run.step6.safetensors.tmp.$dead.Ab3xYz" \
            "run.safetensors.tmp.$dead.Zz9Yy8"; do
  printf 'partial' > "$tmp/k/$name"
done
out=$(run "${small[@]}" --steps=2 --save="$tmp/k/run.safetensors" --save_every=2)
grep -q "^removed 3 temporary files of killed saves: " <<<"$out" || fail "stale temporaries: $out"
[ "$(listing "$tmp/k")" = "run.safetensors run.step2.safetensors " ] \
  || fail "left behind: $(listing "$tmp/k")"

# A real kill -9 while saving: a run saving every step (40 MB each) is killed as soon as a
# temporary is seen beside an earlier checkpoint. Every <prefix>.step<N>.safetensors left is complete, at most one temporary
# is left, and the next run removes it and resumes from the newest checkpoint.
mkdir -p "$tmp/k9"
big=(--text="$tmp/text.txt" --layers=2 --d_model=256 --heads=4 --seq=8 --dtype=f64 --batch=4
     --lr=1e-3 --save="$tmp/k9/run.safetensors" --save_every=1 --keep_last=2)
"$bin" "${big[@]}" --steps=100000 >/dev/null 2>&1 & victim=$!
seen=0
for _ in $(seq 1 6000); do
  files=$(ls "$tmp/k9")
  if grep -q '\.tmp\.' <<<"$files" && grep -q '^run\.step[0-9]*\.safetensors$' <<<"$files"; then
    seen=1
    break
  fi
  sleep 0.01
done
kill -9 "$victim"; wait "$victim" 2>/dev/null || true
[ "$seen" = 1 ] || fail "no second save in progress seen in 60 s: $(listing "$tmp/k9")"
[ "$(ls "$tmp/k9" | grep -c '\.tmp\.')" -le 1 ] || fail "more than one temporary: $(listing "$tmp/k9")"
python3 - "$tmp/k9" <<'PY' || fail "a partial checkpoint after kill -9: $(listing "$tmp/k9")"
import glob, json, os, struct, sys
for p in glob.glob(sys.argv[1] + '/run.step*.safetensors'):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    end = max(v['data_offsets'][1] for k, v in h.items() if k != '__metadata__')
    assert len(b) == 8 + n + end, (p, len(b), 8 + n + end)
PY
newest=$(ls "$tmp/k9" | sed -n 's/^run\.step\([0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1)
again=$(run "${big[@]}" --resume=auto --steps=$((newest + 1)) 2>&1) || fail "after kill -9: $again"
grep -q "^resumed from $tmp/k9/run.step$newest.safetensors at step $newest$" <<<"$again" \
  || fail "after kill -9: $again"
if ls "$tmp/k9" | grep -q '\.tmp\.'; then
  fail "the killed save's temporary is left: $(listing "$tmp/k9")"
fi

# 8. A FIFO named like a checkpoint (nobody writes it: an open that waits never returns).
mkdir -p "$tmp/f"
run "${small[@]}" --steps=2 --save="$tmp/f/run.safetensors" --save_every=2 >/dev/null
mkfifo "$tmp/f/run.step9.safetensors"
expect_error "'$tmp/f/run.step9.safetensors' is not a regular file" \
  "${small[@]}" --steps=2 --resume="$tmp/f/run.step9.safetensors"
auto=$(run "${small[@]}" --steps=4 --resume=auto --save="$tmp/f/run.safetensors" --save_every=2 \
       2>&1) || fail "--resume=auto beside a FIFO: $auto"
grep -q "passed over $tmp/f/run.step9.safetensors: .*is a FIFO" <<<"$auto" || fail "FIFO: $auto"
grep -q "^resumed from $tmp/f/run.step2.safetensors at step 2$" <<<"$auto" || fail "FIFO: $auto"
rm -f "$tmp/f/run.step2.safetensors" "$tmp/f/run.step4.safetensors"
fresh=$(run "${small[@]}" --steps=2 --save="$tmp/f/run.safetensors" --save_every=2 2>&1) \
  || fail "a fresh --save_every run beside a FIFO: $fresh"
grep -q "^checkpoint: $tmp/f/run.step2.safetensors$" <<<"$fresh" || fail "FIFO: $fresh"
# 4. A batch whose step cannot fit is refused before allocating, with the figure: given on the
# command line (against this machine's memory or --max_memory) or adopted from a checkpoint.
expect_error "--batch 100000000 (seq 8, vocab 256, 1 layers of d_model 16, f64) needs at least \
.* GiB per process .* more than this machine's memory" \
  "${small[@]}" --steps=1 --batch=100000000
expect_error "--batch 1000000 .* needs at least 31.5 GiB per process .* than --max_memory (8 GiB)" \
  "${small[@]}" --steps=1 --batch=1000000 --max_memory=8GiB
python3 - "$tmp/p/run.step2.safetensors" "$tmp/bigbatch.safetensors" \
  "$tmp/manykeys.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
header = json.loads(data[8:8 + n])
def write(path, h):
    text = json.dumps(h).encode()
    text += b' ' * ((8 - len(text) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(text)) + text + data[8 + n:])
header['__metadata__']['run.flag.batch'] = '100000000'
write(sys.argv[2], header)
# 5. Millions of tiny metadata entries within the 100 MiB header limit.
header['__metadata__'].update({str(i): '' for i in range(1200000)})
write(sys.argv[3], header)
PY
expect_error "--batch 100000000 .* more than this machine's memory" \
  --resume="$tmp/bigbatch.safetensors"
start=$(date +%s)
expect_error "safetensors header members in '$tmp/manykeys.safetensors': .* exceeds the limit" \
  "${small[@]}" --resume="$tmp/manykeys.safetensors"
[ $(( $(date +%s) - start )) -lt 60 ] || fail "a header of many entries took over 60 s"
# 6. An encoder.json of more entries than any vocabulary is refused before it is parsed whole.
mkdir -p "$tmp/tok"
python3 -c "
import sys
sys.stdout.write('{' + ','.join('\"t%d\":%d' % (i, i) for i in range(2200000)) + '}')
" > "$tmp/tok/encoder.json"
printf '#version: 0.2\n' > "$tmp/tok/vocab.bpe"
start=$(date +%s)
expect_error "BPE vocabulary entries in '$tmp/tok/encoder.json': 2200000 exceeds the limit" \
  "${small[@]}" --steps=1 --tokenizer="$tmp/tok" --vocab=50304
[ $(( $(date +%s) - start )) -lt 60 ] || fail "a huge encoder.json took over 60 s"
# 7. Other paths a run reads: a FIFO as the --plan profile, as the training text, and at the
# CPU peak cache's place (the run measures the peak instead; before, it blocked forever).
mkfifo "$tmp/pipe"
expect_error "hardware profile '$tmp/pipe' is a FIFO (named pipe), not a regular file" \
  "${small[@]}" --steps=1 --plan --plan_profile="$tmp/pipe"
expect_error "is not a regular file" "${small[@]}" --steps=1 --text="$tmp/pipe"
mkdir -p "$tmp/cache/shardmap"
mkfifo "$tmp/cache/shardmap/cpu_peak_flops.txt"
peak=$(XDG_CACHE_HOME="$tmp/cache" run "${small[@]}" --steps=1 2>&1) \
  || fail "a FIFO at the CPU peak cache: $peak"
grep -q "^MFU: " <<<"$peak" || fail "a FIFO at the CPU peak cache: $peak"
echo PASS
