#!/usr/bin/env bash
# train_gpt as a trainer for long runs: progress lines, schedules, --grad_accum, evaluation,
# data order and the BPE tokenizer (checkpoints, resumes, --trace_steps and sampling:
# train_gpt_checkpoint_test.sh).
. models/train/train_gpt_test_lib.sh

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
# --tokenizer=FILE: Llama 3's tokenizer.model (the known-answer subset of
# models/data/testdata/llama3: as many tokens as llama3-tokenizer-js's ids); a file of another
# kind is refused, saying so.
l3=models/data/testdata/llama3
llama=$("$bin" --text=$l3/mixed.txt --tokenizer=$l3/llama3_subset.tiktoken --vocab=128256 \
        --layers=1 --d_model=16 --heads=4 --seq=8 --batch=4 --steps=1 --sample=3 --prompt="The")
grep -q " $(wc -w < $l3/mixed.ids) tokens of data" <<<"$llama" \
  || fail "--tokenizer=tokenizer.model: not the known-answer token count: $llama"
expect_error "--vocab 50304 is smaller than the tokenizer's 128256" --text=$l3/mixed.txt \
  --tokenizer=$l3/llama3_subset.tiktoken --vocab=50304
expect_error "is neither a tiktoken tokenizer.model .*: it looks like JSON" --text=$l3/mixed.txt \
  --tokenizer=models/data/testdata/gpt2_subset_encoder.json --vocab=128256
# Evaluation batches that outrun the held-out split are named, not silently wrapped.
wrap=$("$bin" "${common[@]}" --steps=1 --val_fraction=0.1 --eval_every=1 --eval_steps=100)
grep -q "note: --eval_steps 100 .* the evaluation batches wrap around" <<<"$wrap" \
  || fail "--eval_steps past the held-out split: $wrap"
expect_error "--save_every needs --save" "${common[@]}" --save_every=2

echo PASS
