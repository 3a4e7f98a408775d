#!/usr/bin/env bash
# train_gpt as a trainer for long runs: progress lines, schedules, --grad_accum, evaluation,
# periodic checkpoints with --resume / --resume=auto, models too large for the machine, data
# order, the BPE tokenizer, --trace_steps and sampling.
. models/train/train_gpt_test_lib.sh
"$bin" "${common[@]}" --steps=3 --save="$tmp/ck.safetensors" >/dev/null  # the huge-model case edits it

# Progress: step/total, ETA, tokens seen, lr, grad norm; --log_every prints every 2nd step plus
# the first and the last; a cosine schedule with warmup sets lr (step 0: 1e-2 * 1/3).
prog=$("$bin" "${common[@]}" --steps=6 --log_every=2 --lr_schedule=cosine --warmup_steps=2 --decay_steps=5 \
       --min_lr=1e-3)
[ "$(grep -c '^step' <<<"$prog")" = 4 ] || fail "--log_every=2 printed: $prog"
grep -q "^step 0 loss .* | 1/6, ETA .*, 32 tokens seen, lr 0.003333, grad norm " <<<"$prog" \
  || fail "progress fields: $prog"
grep -q "^step 2 loss .* | 3/6, .* 96 tokens seen, lr 0.01," <<<"$prog" || fail "warmup end"
grep -q "^step 5 loss .* | 6/6, .* lr 0.001" <<<"$prog" || fail "cosine floor: $prog"
expect_error "min_lr" "${common[@]}" --lr_schedule=cosine --min_lr=1
expect_error "step" "${common[@]}" --lr_schedule=step

# --grad_accum: the same losses as the whole batch at once (f64; also on dp2 x tp2 + sp).
whole=$("$bin" "${common[@]}" --steps=3 --mesh=dp=2,tp=2 --sp | losses)
accum=$("$bin" "${common[@]}" --steps=3 --mesh=dp=2,tp=2 --sp --grad_accum=2 | losses)
same_losses "$whole" "$accum" || fail "--grad_accum=2: $accum vs $whole"
expect_error "not divisible by grad_accum 3" "${common[@]}" --grad_accum=3

# Evaluation on a held-out split: val loss at steps 1, 3 (every 2) and the last; the same on
# fsdp2 x tp2 + sp; an error without validation data.
ev=$("$bin" "${common[@]}" --steps=5 --val_fraction=0.1 --eval_every=2 --eval_steps=2)
[ "$(grep -c '| val loss ' <<<"$ev")" = 3 ] || fail "eval lines: $ev"
ev_tp=$("$bin" "${common[@]}" --steps=5 --val_fraction=0.1 --eval_every=2 --eval_steps=2 \
        --mesh=dp_shard=2,tp=2 --sp)
v1=$(grep '^val loss' <<<"$ev" | awk '{print "step 0 loss", $3}')
v4=$(grep '^val loss' <<<"$ev_tp" | awk '{print "step 0 loss", $3}')
same_losses "$v1" "$v4" || fail "val loss on fsdp2 x tp2: $v4 vs $v1"
expect_error "--eval_every needs validation data" "${common[@]}" --eval_every=2

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
# --data_order: random (the default) reads other batches than sequential, the same ones on any
# mesh and across a resume (the resume and mesh cases above run in random order); a bad name
# is refused.
seq_run=$("$bin" "${common[@]}" --steps=2 --data_order=sequential)
rnd_run=$("$bin" "${common[@]}" --steps=2)
grep -q "tokens of data, random order (seed 1)" <<<"$rnd_run" || fail "random order header: $rnd_run"
grep -q "tokens of data, in order" <<<"$seq_run" || fail "sequential header: $seq_run"
[ "$(losses <<<"$seq_run" | tail -1)" != "$(losses <<<"$rnd_run" | tail -1)" ] \
  || fail "random and sequential orders gave the same losses"
rnd_dp=$("$bin" "${common[@]}" --steps=2 --mesh=dp=2)
same_losses "$(losses <<<"$rnd_run")" "$(losses <<<"$rnd_dp")" || fail "random order on dp=2: $rnd_dp"
expect_error "--data_order shuffled: use random" "${common[@]}" --data_order=shuffled
# --tokenizer: --text is GPT-2 BPE (the known-answer subset of models/data/testdata, exact for
# its texts: as many tokens as the npm encoder's ids), samples are decoded text.
mkdir -p "$tmp/tok"
cp models/data/testdata/gpt2_subset_encoder.json "$tmp/tok/encoder.json"
cp models/data/testdata/gpt2_subset_vocab.bpe "$tmp/tok/vocab.bpe"
bpe=$("$bin" --text=models/data/testdata/texts/english.txt --tokenizer="$tmp/tok" --vocab=50304 \
      --layers=1 --d_model=16 --heads=4 --seq=8 --batch=4 --steps=2 --sample=3 --prompt="The")
grep -q " $(wc -w < models/data/testdata/english.ids) tokens of data" <<<"$bpe" \
  || fail "--tokenizer: not the known-answer token count: $bpe"
grep -q "^sample (3 tokens, greedy): " <<<"$bpe" || fail "--tokenizer sample: $bpe"
expect_error "--vocab 256 is smaller than the tokenizer's" \
  --text=models/data/testdata/texts/english.txt --tokenizer="$tmp/tok"
expect_error "needs encoder.json and vocab.bpe" --text="$tmp/text.txt" --tokenizer="$tmp" \
  --vocab=50304
# Evaluation batches that outrun the held-out split are named, not silently wrapped.
wrap=$("$bin" "${common[@]}" --steps=1 --val_fraction=0.1 --eval_every=1 --eval_steps=100000)
grep -q "note: --eval_steps 100000 .* the evaluation batches wrap around" <<<"$wrap" \
  || fail "--eval_steps past the held-out split: $wrap"
expect_error "--d_model=32 but the checkpoint .* has d_model 16" --text="$tmp/text.txt" \
  --d_model=32 --resume="$tmp/rot/run.step4.safetensors" --steps=6
expect_error "--save_every needs --save" "${common[@]}" --save_every=2

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
