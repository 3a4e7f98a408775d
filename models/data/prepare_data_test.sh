#!/usr/bin/env bash
# prepare_data end to end: writes train.bin / val.bin whose sizes add up to the known-answer
# token count, and refuses bad flags and files with exit 2 and a clear message.
set -uo pipefail
bin="models/data/prepare_data"
d="models/data/testdata"
vocab=(--vocab="$d/gpt2_subset_encoder.json" --merges="$d/gpt2_subset_vocab.bpe")
out="$TEST_TMPDIR/out"
mkdir -p "$out"
fail=0
"$bin" "${vocab[@]}" --input="$d/texts/english.txt" --out_dir="$out" --val_fraction=0.25 || fail=1
tokens=$(grep -c . "$d/english.ids")
train=$(($(stat -c %s "$out/train.bin") / 2))
val=$(($(stat -c %s "$out/val.bin") / 2))
want_train=$((tokens * 3 / 4))
if [ "$((train + val))" -ne "$tokens" ] || [ "$train" -ne "$want_train" ]; then
  echo "FAIL: train $train + val $val tokens; want $want_train + $((tokens - want_train))"
  fail=1
fi
# The first ids, read back little-endian.
first=$(od -An -tu2 -N6 --endian=little "$out/train.bin" | tr -s ' ' | sed 's/^ //')
want_first=$(head -3 "$d/english.ids" | tr '\n' ' ' | sed 's/ $//')
[ "$first" = "$want_first" ] || { echo "FAIL: first ids '$first', want '$want_first'"; fail=1; }

expect_error() {
  local want="$1"; shift
  local got rc
  got=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" <<<"$got"; then
    echo "FAIL: prepare_data $* -> exit $rc (want 2 and '$want'): $got"
    fail=1
  fi
}
expect_error "--vocab and --merges are required" --input=x --out_dir=y
expect_error "cannot read the BPE vocabulary '/nope.json'" --vocab=/nope.json --merges="$d/gpt2_subset_vocab.bpe" --input=x --out_dir="$out"
expect_error "the BPE merges '$d' is a directory" --vocab="$d/gpt2_subset_encoder.json" --merges="$d" --input=x --out_dir="$out"
expect_error "BPE merges '$d/gpt2_subset_encoder.json' line 1: expected two tokens" --vocab="$d/gpt2_subset_encoder.json" --merges="$d/gpt2_subset_encoder.json" --input=x --out_dir="$out"
expect_error "--input '/no/such.txt'" "${vocab[@]}" --input=/no/such.txt --out_dir="$out"
expect_error "--out_dir '/no/dir' is not an existing folder" "${vocab[@]}" --input="$d/texts/code.txt" --out_dir=/no/dir
expect_error "--val_fraction=1.5 must be in [0, 1)" "${vocab[@]}" --input="$d/texts/code.txt" --out_dir="$out" --val_fraction=1.5
expect_error "unexpected argument 'extra'" "${vocab[@]}" extra
# Files that are no tokenizer (issue 48): a device, a FIFO (no writer: reading would block
# forever) and an encoder.json with more entries than any vocabulary, refused before parsing.
# Each runs under a timeout: a hang is a failure.
mkfifo "$TEST_TMPDIR/pipe.bpe"
expect_error() {
  local want="$1"; shift
  local got rc
  got=$(timeout 60 "$bin" "$@" 2>&1); rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" <<<"$got"; then
    echo "FAIL: prepare_data $* -> exit $rc (want 2 and '$want'): $got"
    fail=1
  fi
}
expect_error "the BPE vocabulary '/dev/zero' is a character device, not a regular file" \
  --vocab=/dev/zero --merges="$d/gpt2_subset_vocab.bpe" --input="$d/texts/code.txt" --out_dir="$out"
expect_error "the BPE merges '$TEST_TMPDIR/pipe.bpe' is a FIFO (named pipe), not a regular file" \
  --vocab="$d/gpt2_subset_encoder.json" --merges="$TEST_TMPDIR/pipe.bpe" --input="$d/texts/code.txt" --out_dir="$out"
python3 -c "
import sys
sys.stdout.write('{' + ','.join('\"t%d\":%d' % (i, i) for i in range(2200000)) + '}')
" > "$TEST_TMPDIR/huge.json"
expect_error "BPE vocabulary entries in '$TEST_TMPDIR/huge.json': 2200000 exceeds the limit of 2097152" \
  --vocab="$TEST_TMPDIR/huge.json" --merges="$d/gpt2_subset_vocab.bpe" --input="$d/texts/code.txt" --out_dir="$out"
expect_error "--input '/dev/zero' is not a regular file" "${vocab[@]}" --input=/dev/zero --out_dir="$out"
[ "$fail" -eq 0 ] && echo "prepare_data: all cases passed"
exit "$fail"
