#!/usr/bin/env bash
# train_gpt's periodic checkpoints: rotation, --resume without shape flags, --resume=auto past
# a cut-short file and a killed save's temporary, and models too large for the machine; then
# --trace_steps and sampling after training.
. models/train/train_gpt_test_lib.sh
"$bin" "${common[@]}" --steps=3 --save="$tmp/ck.safetensors" >/dev/null  # the huge-model case edits it

# Periodic atomic checkpoints keep the last 2; --resume of one needs no shape flags and gives the
# uninterrupted run's losses on another mesh; --resume=auto finds the newest.
mkdir -p "$tmp/rot"
full6=$("$bin" "${common[@]}" --steps=6 --mesh=dp=2 --save="$tmp/rot/run.safetensors" \
        --save_every=2 --keep_last=2)
[ "$(ls "$tmp/rot" | sort | tr '\n' ' ')" = "run.safetensors run.step4.safetensors run.step6.safetensors " ] \
  || fail "rotation kept: $(ls "$tmp/rot")"
rest=$("$bin" --text="$tmp/text.txt" --batch=4 --lr=1e-2 --mesh=tp=2 --steps=6 \
       --resume="$tmp/rot/run.step4.safetensors")
grep -q "1 layers, d_model 16, 4 heads, vocab 256, seq 8, .* f64" <<<"$rest" \
  || fail "the shape did not come from the checkpoint: $rest"
same_losses "$(losses <<<"$full6" | tail -2)" "$(losses <<<"$rest")" \
  || fail "resume without shape flags: $(losses <<<"$rest") vs $(losses <<<"$full6" | tail -2)"
mkdir -p "$tmp/auto"
cp "$tmp/rot/run.step4.safetensors" "$tmp/auto/run.step4.safetensors"
auto=$("$bin" --text="$tmp/text.txt" --batch=4 --lr=1e-2 --steps=6 --resume=auto \
       --save="$tmp/auto/run.safetensors")
same_losses "$(losses <<<"$auto")" "$(losses <<<"$rest")" || fail "--resume=auto: $auto"
grep -q "^resumed from $tmp/auto/run.step4.safetensors at step 4$" <<<"$auto" \
  || fail "--resume=auto does not say where it resumed: $auto"
# A newer file that is no complete checkpoint (a cut-short save) is passed over, naming it, and
# the temporary file of a killed save is removed by the next run under the prefix.
printf 'not a checkpoint' > "$tmp/auto/run.step9.safetensors"
sh -c 'exit 0' & dead=$!
wait "$dead"
printf 'partial' > "$tmp/auto/run.step5.safetensors.tmp.$dead"
again=$("$bin" --text="$tmp/text.txt" --batch=4 --lr=1e-2 --steps=6 --resume=auto \
        --save="$tmp/auto/run.safetensors")
grep -q "passed over $tmp/auto/run.step9.safetensors: " <<<"$again" || fail "corrupt newest: $again"
grep -q "^resumed from $tmp/auto/run.step4.safetensors at step 4$" <<<"$again" \
  || fail "corrupt newest: did not resume from step 4: $again"
grep -q "removed 1 temporary file of killed saves: $tmp/auto/run.step5.safetensors.tmp.$dead" \
  <<<"$again" || fail "stale temporary: $again"
[ ! -e "$tmp/auto/run.step5.safetensors.tmp.$dead" ] || fail "stale temporary left"
same_losses "$(losses <<<"$again")" "$(losses <<<"$rest")" || fail "resume past a corrupt file"
# --resume=auto under a prefix with no checkpoint yet: a fresh run, the same as without it.
mkdir -p "$tmp/fresh"
first=$("$bin" --text="$tmp/text.txt" --batch=4 --lr=1e-2 --steps=2 --resume=auto \
        --save="$tmp/fresh/run.safetensors")
grep -q "no checkpoint matches .*; starting a fresh run" <<<"$first" \
  || fail "--resume=auto with no checkpoint: $first"
plain=$("$bin" --text="$tmp/text.txt" --batch=4 --lr=1e-2 --steps=2)
same_losses "$(losses <<<"$first")" "$(losses <<<"$plain")" || fail "fresh --resume=auto: $first"
# A model that cannot fit this machine is refused before anything is allocated (exit 2, with the
# numbers), from the flags or from a checkpoint's metadata; nothing aborts.
expect_error "the model flags: 1000000000000 layers.* more than this machine's" "${common[@]}" \
  --layers=1000000000000
expect_error "vocab 9000000000000000000.* more than this machine's" "${common[@]}" \
  --vocab=9000000000000000000
expect_error "d_model 200000.* more than this machine's" "${common[@]}" --d_model=200000 --heads=4
python3 - "$tmp/ck.safetensors" "$tmp/huge.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
header = json.loads(data[8:8 + n])
header['__metadata__']['gpt.layers'] = '1000000000000'
h = json.dumps(header).encode()
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(h)) + h + data[8 + n:])
PY
expect_error "the checkpoint '$tmp/huge.safetensors': 1000000000000 layers" \
  --text="$tmp/text.txt" --resume="$tmp/huge.safetensors" --steps=9
expect_error "--d_model=32 but the checkpoint .* has d_model 16" --text="$tmp/text.txt" \
  --d_model=32 --resume="$tmp/rot/run.step4.safetensors" --steps=6
# --trace limited to chosen steps and streamed: one step's phases per rank.
"$bin" "${common[@]}" --steps=4 --mesh=dp=2 --trace="$tmp/t1.json" --trace_steps=2 >/dev/null
python3 -c "
import json
t=json.load(open('$tmp/t1.json'))
opt=[e for e in t if e.get('cat')=='phase' and e['name']=='optimizer']
assert len(opt)==2, len(opt)
" || fail "--trace_steps=2"
expect_error "nonexistent-dir" "${common[@]}" --trace=/nonexistent-dir/t.json

# --sample: greedy generation after training, the same text on dp2 x tp2 + sp as on 1 device;
# temperature / top-k sampling after a pipelined run.
s1=$("$bin" "${common[@]}" --steps=3 --sample=12 --prompt="the " | grep '^sample')
s4=$("$bin" "${common[@]}" --steps=3 --sample=12 --prompt="the " --mesh=dp=2,tp=2 --sp \
     | grep '^sample')
[ -n "$s1" ] && [ "$s1" = "$s4" ] || fail "--sample: '$s4' vs '$s1'"
grep -q "^sample (12 tokens, greedy): " <<<"$s1" || fail "sample line: $s1"
st=$("$bin" "${common[@]}" --steps=2 --sample=8 --temperature=0.8 --top_k=5 --mesh=pp=2 \
     --layers=2 --microbatches=2 | grep '^sample')
grep -q "temperature 0.8, top-k 5" <<<"$st" || fail "temperature sample under pp: $st"
expect_error "temperature" "${common[@]}" --sample=4 --temperature=-1
echo PASS
