#!/usr/bin/env bash
# train_gpt end to end: a tiny run on a 2-D mesh (loss lines, summary, a trace that parses as
# JSON with one track per rank, a checkpoint that resumes on another mesh with the same loss as
# the uninterrupted run), and bad input rejected before the first step with a clear message.
. models/train/train_gpt_test_lib.sh


out=$("$bin" "${common[@]}" --mesh=dp=2,tp=2 --sp --steps=3 --trace="$tmp/trace.json" \
      --save="$tmp/ck.safetensors" --print_types)
echo "$out"
grep -q "^step 0 loss " <<<"$out" || fail "no step line"
grep -q "^step 2 loss " <<<"$out" || fail "no third step"
grep -q "reduce_scatter" <<<"$out" || fail "no reduce_scatter bytes under SP"
grep -q "^summary: 3 steps" <<<"$out" || fail "no summary"
grep -q "{dp:S0,tp:S1}" <<<"$out" || fail "no SPMD types printed"
python3 -c "
import json,sys
t=json.load(open('$tmp/trace.json'))  # streamed: the JSON array format
tracks={e['tid'] for e in t if e.get('ph')=='X'}
c=1<<20  # each rank's collectives track (kCollectiveTrackBase + rank)
assert {e['tid'] for e in t if e.get('ph')=='M'}=={0,1,2,3,c,c+1,c+2,c+3}  # named tracks per rank
assert tracks=={0,1,2,3,c,c+1,c+2,c+3}, tracks
assert any(e.get('cat','').startswith('in flight') and e['tid']>=c for e in t)
assert any(e['name']=='backward' for e in t)
assert any('bytes' in e.get('args',{}) for e in t)
" || fail "trace"

# Four uninterrupted steps vs three + resume to the total of four on another mesh: the same
# step-3 loss (--steps is the total count).
full=$("$bin" "${common[@]}" --steps=4 | grep '^step 3 loss' | awk '{print $4}')
resumed=$("$bin" "${common[@]}" --mesh=tp=2 --resume="$tmp/ck.safetensors" --steps=4 \
          | grep '^step 3 loss' | awk '{print $4}')
python3 -c "import sys; a,b=float('$full'),float('$resumed'); sys.exit(abs(a-b) > 1e-9*abs(a))" \
  || fail "resume: $full vs $resumed"

# Context parallelism: cp2 x tp2 gives the single-device losses; the ring shows as ppermute bytes.
cp_out=$("$bin" "${common[@]}" --mesh=cp=2,tp=2 --steps=2)
grep -q "ppermute" <<<"$cp_out" || fail "no ppermute bytes under cp"
grep -q "activations .* (largest" <<<"$cp_out" || fail "no activation bytes in the summary"
one=$("$bin" "${common[@]}" --steps=2 | grep '^step 1 loss' | awk '{print $4}')
cp=$(grep '^step 1 loss' <<<"$cp_out" | awk '{print $4}')
python3 -c "import sys; a,b=float('$one'),float('$cp'); sys.exit(abs(a-b) > 1e-9*abs(a))" \
  || fail "cp2 x tp2: $cp vs $one"


expect_error "heads 4 are not divisible by tp=3" "${common[@]}" --mesh=tp=3
expect_error "unknown axis 'xp'" "${common[@]}" --mesh=xp=2
expect_error "1 layers cannot fill pp=2" "${common[@]}" --mesh=pp=2 --microbatches=2
expect_error "not divisible by microbatches 3" "${common[@]}" --layers=2 --mesh=pp=2 --microbatches=3
expect_error "unknown pipeline schedule 'zb'" "${common[@]}" --layers=2 --mesh=pp=2 --schedule=zb
expect_error "--virtual_stages 0 must be >= 1" "${common[@]}" --layers=4 --mesh=pp=2 \
  --microbatches=2 --schedule=interleaved_1f1b --virtual_stages=0
expect_error "--virtual_stages 2 with --schedule=1f1b" "${common[@]}" --layers=4 --mesh=pp=2 \
  --microbatches=2 --virtual_stages=2
expect_error "interleaved_1f1b needs --virtual_stages >= 2" "${common[@]}" --layers=4 \
  --mesh=pp=2 --microbatches=2 --schedule=interleaved_1f1b
expect_error "1 microbatches is not a multiple of 2" "${common[@]}" --layers=4 --mesh=pp=2 \
  --schedule=interleaved_1f1b --virtual_stages=2
expect_error "6 layers do not split evenly into pp=2 x --virtual_stages=2" "${common[@]}" \
  --layers=6 --mesh=pp=2 --microbatches=2 --schedule=interleaved_1f1b --virtual_stages=2
expect_error "--stage_layers gives 2 sizes but interleaving needs one per virtual stage" \
  "${common[@]}" --layers=4 --mesh=pp=2 --microbatches=2 --schedule=interleaved_1f1b \
  --virtual_stages=2 --stage_layers=2,2
expect_error "pipeline (pp) with context parallelism" "${common[@]}" --layers=2 --mesh=pp=2,cp=2
expect_error "seq 8 is not divisible by 2\*cp = 6" "${common[@]}" --mesh=cp=3
expect_error "batch 4 is not divisible by the 3" "${common[@]}" --mesh=dp=3
expect_error "vocab 250 is not divisible by tp=4" "${common[@]}" --vocab=250 --mesh=tp=4 --heads=4
expect_error "--dtype f16: use f32, f64 or bf16" "${common[@]}" --dtype=f16
expect_error "--overlap='maybe': give on" "${common[@]}" --overlap=maybe
expect_error "--bucket_mb=0: the gradient bucket size must be a positive" "${common[@]}" --bucket_mb=0
expect_error "--bucket_mb=-3: the gradient bucket size" "${common[@]}" --bucket_mb=-3
expect_error "--bucket_mb=nan: the gradient bucket size" "${common[@]}" --bucket_mb=nan
expect_error "--fsdp_prefetch=0: the prefetch depth must be at least 1" "${common[@]}" --mesh=dp_shard=2 --fsdp_prefetch=0
expect_error "missing.txt': no such file" --text="$tmp/missing.txt"
printf 'abc' > "$tmp/abc.txt"
expect_error "one sample needs seq+1 = 9" --text="$tmp/abc.txt" --seq=8 --layers=1 --d_model=16 --heads=4

# --init takes the shape from a file that has it (--save wrote ck with gpt.* metadata), as
# --resume does; shape flags that disagree are refused. A file without the metadata (a GPT-2
# file from elsewhere: here ck with its metadata stripped) keeps the flags' shape, and tensors
# that do not match it are named.
expect_error "--layers=3 but the checkpoint '$tmp/ck.safetensors' has layers 1; --init takes" \
  "${common[@]}" --layers=3 --init="$tmp/ck.safetensors"
from_init=$("$bin" --text="$tmp/text.txt" --batch=4 --steps=1 --init="$tmp/ck.safetensors")
grep -q "^GPT-2: 1 layers, d_model 16, 4 heads, vocab 256, seq 8" <<<"$from_init" \
  || fail "--init did not take the file's shape: $from_init"
python3 - "$tmp/ck.safetensors" "$tmp/plain.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
header = json.loads(data[8:8 + n])
header['__metadata__'] = {k: v for k, v in header['__metadata__'].items() if not k.startswith('gpt.')}
h = json.dumps(header).encode()
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(h)) + h + data[8 + n:])
PY
expect_error "no tensor 'h.1.ln_1.weight'" "${common[@]}" --layers=2 --init="$tmp/plain.safetensors"
expect_error "needs \[256,32\]" "${common[@]}" --d_model=32 --init="$tmp/plain.safetensors"
printf '\x2c\x01%.0s' $(seq 1 10) > "$tmp/ids.bin"
expect_error "token 0 is id 300, outside the vocabulary" --data="$tmp/ids.bin" --seq=4 --layers=1 --d_model=16 --heads=4
expect_error "has an ep axis but the model has no experts" "${common[@]}" --mesh=ep=2
expect_error "3 experts are not divisible by the 2" "${common[@]}" --experts=3 --mesh=ep=2
expect_error "topk = 5 with 4 experts" "${common[@]}" --experts=4 --topk=5
expect_error "expert axis 'tp' is not a batch axis" "${common[@]}" --experts=4 --mesh=dp=2,tp=2 --expert_axes=tp
expect_error "capacity factor 0" "${common[@]}" --experts=4 --capacity=0
# Issue 29: crashes and silent garbage are clear errors before the first step.
expect_error "steps (--steps) 0 must be >= 1" "${common[@]}" --steps=0
expect_error "steps (--steps) -1 must be >= 1" "${common[@]}" --steps=-1
expect_error "learning rate (--lr) nan" "${common[@]}" --lr=nan
expect_error "learning rate (--lr) inf" "${common[@]}" --lr=inf
expect_error "learning rate (--lr) -1 must be finite and >= 0" "${common[@]}" --lr=-1
expect_error "betas (--beta1, --beta2) = (nan" "${common[@]}" --beta1=nan
expect_error "weight decay (--weight_decay) nan" "${common[@]}" --weight_decay=nan
expect_error "--text '/tmp': is a directory" --text=/tmp
expect_error "--data '/tmp': is a directory" --data=/tmp
expect_error "checkpoint '/tmp' is a directory" "${common[@]}" --init=/tmp
expect_error "both --init .* and --resume .* are given" "${common[@]}" \
  --init="$tmp/ck.safetensors" --resume="$tmp/ck.safetensors"
expect_error "directory '$tmp/no/such' does not exist" "${common[@]}" --save="$tmp/no/such/x.st"
expect_error "is at step 3 but the run's total is 2 steps" "${common[@]}" \
  --resume="$tmp/ck.safetensors" --steps=2
# --device: a GPU placement without a GPU is a clear error (on a GPU machine the run must train).
if gpu_out=$("$bin" "${common[@]}" --steps=1 --device=cuda --mesh=dp=2 2>&1); then
  grep -q "virtual ranks sharing cuda:0" <<<"$gpu_out" || fail "--device=cuda header: $gpu_out"
  grep -q "peak GPU memory" <<<"$gpu_out" || fail "--device=cuda: no peak memory: $gpu_out"
else
  expect_error "--device=cuda: no usable GPU (.*); use --device=cpu" "${common[@]}" --device=cuda
fi
expect_error "--device tpu: use cpu or cuda" "${common[@]}" --device=tpu
expect_error "--gpu_ranks needs --device=cuda" "${common[@]}" --gpu_ranks=shared
# NaN weights in an --init file: the run stops at step 0 naming it (not "loss nan", exit 0).
python3 - "$tmp/ck.safetensors" "$tmp/nan.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
s, e = h['wte.weight']['data_offsets']
body = bytearray(b[8 + n:])
body[s:e] = struct.pack('<d', float('nan')) * ((e - s) // 8)
open(sys.argv[2], 'wb').write(b[:8 + n] + bytes(body))
PY
expect_error "step 0: the loss is nan" "${common[@]}" --init="$tmp/nan.safetensors"
# A learning rate that diverges stops the run at the first non-finite step.
diverged=$("$bin" "${common[@]}" --lr=1e30 --clip=0 --steps=30 2>&1) && fail "diverged run exit 0"
grep -q "the loss is .* (not finite)\|gradient norm .* (not finite)" <<<"$diverged" \
  || fail "no non-finite stop: $diverged"
echo PASS
