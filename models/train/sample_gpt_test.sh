#!/usr/bin/env bash
# sample_gpt: samples and the validation loss of a train_gpt checkpoint without training. The
# evaluation equals the val loss train_gpt printed for that checkpoint; a seed gives the same
# samples on every mesh; top_k=1 is greedy; the prompt is echoed; the run's tokenizer decodes;
# bad settings are refused with exit 2.
set -euo pipefail
train="models/train/train_gpt"
bin="models/train/sample_gpt"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
fail() { echo "FAIL: $*"; exit 1; }
same() {  # same A B: equal to 1e-9 relative
  python3 -c "import sys; a,b=float('$1'),float('$2'); sys.exit(abs(a-b) > 1e-9*abs(a))"
}
expect_error() {  # expect_error "message" flags...: exit 2 with the message
  local msg="$1"; shift
  local rc=0
  err=$("$bin" "$@" 2>&1) || rc=$?
  [ "$rc" = 2 ] || fail "exit $rc for: $*: $err"
  grep -q -- "$msg" <<<"$err" || fail "expected '$msg', got: $err"
  return 0
}

# A run with a held-out split, grad_accum and evaluation at its end (f64).
run=$("$train" --text="$tmp/text.txt" --layers=2 --d_model=16 --heads=4 --seq=8 --dtype=f64 \
      --batch=4 --grad_accum=2 --lr=1e-2 --steps=4 --val_fraction=0.2 --eval_every=4 \
      --eval_steps=3 --mesh=dp=2 --save="$tmp/ck.safetensors")
printed=$(grep '^val loss' <<<"$run" | awk '{print $3}')
[ -n "$printed" ] || fail "no val loss from train_gpt: $run"
# Eval-only on several meshes (the run's batch, grad_accum and split come from the checkpoint).
for mesh in "" "--mesh=tp=2 --sp" "--mesh=dp_shard=2" "--mesh=pp=2 --microbatches=2"; do
  out=$("$bin" --checkpoint="$tmp/ck.safetensors" --num_samples=0 --eval_steps=3 $mesh)
  got=$(grep '^val loss' <<<"$out" | awk '{print $3}')
  same "$printed" "$got" || fail "eval on '$mesh': $got vs train_gpt's $printed"
  grep -q "^val loss .* (3 batches of 4 x 8 tokens from the last 0.2 of $tmp/text.txt)" <<<"$out" \
    || fail "eval line: $out"
done
# Another file: its whole content.
head -c 600 "$tmp/text.txt" > "$tmp/val.txt"
other=$("$bin" --checkpoint="$tmp/ck.safetensors" --num_samples=0 --eval_steps=1 \
        --val_data="$tmp/val.txt")
grep -q "^val loss [0-9.]* (1 batches of 4 x 8 tokens from $tmp/val.txt)" <<<"$other" \
  || fail "--val_data: $other"

wrap=$("$bin" --checkpoint="$tmp/ck.safetensors" --num_samples=0 --eval_steps=1000)
grep -q "^note: --eval_steps 1000 x batch 4 x seq 8 reads 32001 tokens but .* the batches wrap around" \
  <<<"$wrap" || fail "eval wrap note: $wrap"

# Samples: the prompt echoed, then the continuation; one seed gives the same text on every mesh.
sample() { "$bin" --checkpoint="$tmp/ck.safetensors" --prompt="the q" --tokens=16 "$@" | grep -v '^checkpoint '; }
one=$(sample --num_samples=2 --temperature=0.9 --seed=5)
echo "$one"
grep -q "^--- sample 1 of 2 (seed 5, temperature 0.9, top-k 0, 16 tokens)$" <<<"$one" || fail "header: $one"
grep -q "^--- sample 2 of 2 (seed 6, " <<<"$one" || fail "second sample's seed: $one"
[ "$(grep -c '^the q' <<<"$one")" = 2 ] || fail "prompt not echoed: $one"
for mesh in "--mesh=dp=2,tp=2 --sp" "--mesh=cp=2" "--mesh=dp_shard=3"; do
  [ "$(sample --num_samples=2 --temperature=0.9 --seed=5 $mesh)" = "$one" ] \
    || fail "samples on $mesh differ: $(sample --num_samples=2 --temperature=0.9 --seed=5 $mesh)"
done
# Another seed, other text (the test can fail); top_k=1 is greedy whatever the temperature.
[ "$(sample --temperature=0.9 --seed=9 | tail -1)" != "$(sample --temperature=0.9 --seed=5 | tail -1)" ] \
  || fail "seeds 5 and 9 gave the same sample"
[ "$(sample --temperature=0 | tail -1)" = "$(sample --temperature=1.5 --top_k=1 --seed=3 | tail -1)" ] \
  || fail "top_k=1 is not greedy"
# The sample train_gpt printed after training (greedy) is sample_gpt's greedy continuation.
tg=$("$train" --resume="$tmp/ck.safetensors" --steps=5 --save="$tmp/ck5.safetensors" --sample=16 \
     --prompt="the q" | grep '^sample (16 tokens, greedy): ' | sed 's/^sample (16 tokens, greedy): //')
[ "the q$tg" = "$("$bin" --checkpoint="$tmp/ck5.safetensors" --prompt="the q" --tokens=16 \
                  --temperature=0 | tail -1)" ] || fail "train_gpt's sample differs: $tg"

# The run's tokenizer decodes (GPT-2's BPE, the known-answer subset of models/data/testdata).
mkdir -p "$tmp/tok"
cp models/data/testdata/gpt2_subset_encoder.json "$tmp/tok/encoder.json"
cp models/data/testdata/gpt2_subset_vocab.bpe "$tmp/tok/vocab.bpe"
"$train" --text=models/data/testdata/texts/english.txt --tokenizer="$tmp/tok" --vocab=50304 \
  --layers=1 --d_model=16 --heads=4 --seq=8 --batch=4 --steps=1 --save="$tmp/bpe.safetensors" >/dev/null
bpe=$("$bin" --checkpoint="$tmp/bpe.safetensors" --prompt="The" --tokens=4 --temperature=0)
grep -q "^The" <<<"$(tail -1 <<<"$bpe")" || fail "BPE sample: $bpe"
expect_error "needs encoder.json and vocab.bpe" --checkpoint="$tmp/bpe.safetensors" --tokenizer="$tmp"
# And Llama 3's tokenizer.model (the known-answer subset of models/data/testdata/llama3, which
# holds the tokens of " dog": the prompt round-trips).
"$train" --text=models/data/testdata/llama3/mixed.txt --vocab=128256 \
  --tokenizer=models/data/testdata/llama3/llama3_subset.tiktoken \
  --layers=1 --d_model=16 --heads=4 --seq=8 --batch=4 --steps=1 --save="$tmp/l3.safetensors" >/dev/null
l3=$("$bin" --checkpoint="$tmp/l3.safetensors" --prompt="The lazy dog" --tokens=2 --temperature=0)
grep -q "^The lazy dog" <<<"$(tail -1 <<<"$l3")" || fail "Llama 3 sample: $l3"

# The KV cache (prompt + tokens - 1 within seq = 8): the same greedy and seeded text as the
# recomputed window; past seq --kv_cache=on refuses with the fix, and auto says why on stderr.
for extra in "--temperature=0" "--temperature=0.9 --seed=4" "--temperature=0.9 --seed=4 --mesh=tp=2 --sp"; do
  on=$("$bin" --checkpoint="$tmp/ck.safetensors" --prompt="the q" --tokens=4 $extra --kv_cache=on | tail -1)
  off=$("$bin" --checkpoint="$tmp/ck.safetensors" --prompt="the q" --tokens=4 $extra --kv_cache=off | tail -1)
  [ "$on" = "$off" ] || fail "kv cache ($extra): '$on' vs '$off'"
done
expect_error "generate at most 4 tokens" --checkpoint="$tmp/ck.safetensors" --prompt="the q" --tokens=5 --kv_cache=on
expect_error "--kv_cache 'maybe' is not one of auto, on, off" --checkpoint="$tmp/ck.safetensors" --kv_cache=maybe
"$bin" --checkpoint="$tmp/ck.safetensors" --prompt="the q" --tokens=5 2>&1 >/dev/null \
  | grep -q "^note: sampling without a KV cache: .*feed 9" || fail "no note on the recomputed window"

# Bad settings: exit 2, naming the flag.
expect_error "--temperature -1 must be finite and >= 0" --checkpoint="$tmp/ck.safetensors" --temperature=-1
expect_error "--temperature nan must be finite" --checkpoint="$tmp/ck.safetensors" --temperature=nan
expect_error "--top_k 300 must be in \[0, vocab = 256\]" --checkpoint="$tmp/ck.safetensors" --top_k=300
expect_error "--top_k -1 must be" --checkpoint="$tmp/ck.safetensors" --top_k=-1
expect_error "--num_samples -1 must be >= 0" --checkpoint="$tmp/ck.safetensors" --num_samples=-1
expect_error "--checkpoint is missing" --prompt=x
expect_error "checkpoint '$tmp/none.safetensors'" --checkpoint="$tmp/none.safetensors"
expect_error "--prompt is empty" --checkpoint="$tmp/ck.safetensors" --prompt=
expect_error "pipeline stages (pp > 1) is not supported" --checkpoint="$tmp/ck.safetensors" --mesh=pp=2
expect_error "--eval_steps -1 must be >= 0" --checkpoint="$tmp/ck.safetensors" --num_samples=0 --eval_steps=-1
# --device=cuda: the same greedy text on a GPU; without one a clear error.
if cuda=$("$bin" --checkpoint="$tmp/ck.safetensors" --prompt="the q" --tokens=16 --temperature=0 \
          --device=cuda --mesh=tp=2 2>&1); then
  [ "$(tail -1 <<<"$cuda")" = "$(sample --temperature=0 | tail -1)" ] || fail "cuda sample: $cuda"
else
  expect_error "--device=cuda: no usable GPU" --checkpoint="$tmp/ck.safetensors" --device=cuda
fi
echo PASS
