#!/usr/bin/env bash
# train_gpt end to end: a tiny run on a 2-D mesh (loss lines, summary, a trace that parses as
# JSON with one track per rank, a checkpoint that resumes on another mesh with the same loss as
# the uninterrupted run), and bad input rejected before the first step with a clear message.
set -euo pipefail
bin="models/train/train_gpt"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
common=(--text="$tmp/text.txt" --layers=1 --d_model=16 --heads=4 --seq=8 --batch=4 --lr=1e-2
        --dtype=f64)

fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -o '^step [0-9]* loss [^ ]*' || true; }
same_losses() {  # same_losses "$a" "$b": the same steps' losses, equal to 1e-9 relative
  python3 - "$1" "$2" <<'PY'
import sys
a = [float(l.split()[3]) for l in sys.argv[1].splitlines() if l.strip()]
b = [float(l.split()[3]) for l in sys.argv[2].splitlines() if l.strip()]
ok = a and len(a) == len(b) and all(abs(x - y) <= 1e-9 * abs(x) for x, y in zip(a, b))
sys.exit(0 if ok else 1)
PY
}

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

# Expert parallelism: MoE MLPs with the experts over ep=2 give the single-device MoE losses; the
# dispatch shows as all_to_all bytes and each step prints its dropped assignments. A checkpoint
# saved on ep2 resumes on one device with the uninterrupted run's loss.
moe=(--experts=4 --topk=2 --capacity=1.0 --aux_loss_coef=0.01)
ep_out=$("$bin" "${common[@]}" "${moe[@]}" --mesh=ep=2 --steps=2 --save="$tmp/moe.safetensors")
grep -q "all_to_all" <<<"$ep_out" || fail "no all_to_all bytes under ep"
grep -q "^step 1 loss .*MoE dropped [0-9]* of 64 assignments" <<<"$ep_out" || fail "no MoE drops line"
moe_full=$("$bin" "${common[@]}" "${moe[@]}" --steps=3)
one=$(grep '^step 1 loss' <<<"$moe_full" | awk '{print $4}')
ep=$(grep '^step 1 loss' <<<"$ep_out" | awk '{print $4}')
python3 -c "import sys; a,b=float('$one'),float('$ep'); sys.exit(abs(a-b) > 1e-9*abs(a))" \
  || fail "ep2 MoE: $ep vs $one"
full=$(grep '^step 2 loss' <<<"$moe_full" | awk '{print $4}')
resumed=$("$bin" "${common[@]}" "${moe[@]}" --mesh= --resume="$tmp/moe.safetensors" --steps=3 \
          | grep '^step 2 loss' | awk '{print $4}')
python3 -c "import sys; a,b=float('$full'),float('$resumed'); sys.exit(abs(a-b) > 1e-9*abs(a))" \
  || fail "MoE resume ep2 -> 1 device: $full vs $resumed"
# MoE in bf16 (routing on bf16 router logits) tracks the f32 run within 2^-9 relative.
bf_ep=$("$bin" "${common[@]}" "${moe[@]}" --dtype=bf16 --mesh=ep=2 --steps=2 | grep '^step 1 loss' | awk '{print $4}')
f32_ep=$("$bin" "${common[@]}" "${moe[@]}" --dtype=f32 --mesh=ep=2 --steps=2 | grep '^step 1 loss' | awk '{print $4}')
python3 -c "import sys; a,b=float('$f32_ep'),float('$bf_ep'); sys.exit(abs(a-b) > abs(a)/512 or a == b)" \
  || fail "bf16 MoE ep2: $bf_ep vs f32 $f32_ep"
# Pipeline: pp2 x dp2 with 1F1B and pp2 with GPipe give the single-device losses (f64).
pp_out=$("$bin" "${common[@]}" --layers=2 --mesh=pp=2,dp=2 --microbatches=2 --schedule=1f1b \
         --steps=2)
echo "$pp_out"
grep -q "^pipeline: pp=2, 2 microbatches of 2 sequences, 1f1b" <<<"$pp_out" || fail "no pipeline line"
grep -q "bubble measured" <<<"$pp_out" || fail "no bubble in the summary"
one2=$("$bin" "${common[@]}" --layers=2 --steps=2 | grep '^step 1 loss' | awk '{print $4}')
for run in "$pp_out" "$("$bin" "${common[@]}" --layers=2 --mesh=pp=2 --microbatches=4 \
                        --schedule=gpipe --steps=2)"; do
  pp=$(grep '^step 1 loss' <<<"$run" | awk '{print $4}')
  python3 -c "import sys; a,b=float('$one2'),float('$pp'); sys.exit(abs(a-b) > 1e-9*abs(a))" \
    || fail "pp: $pp vs $one2"
done
# Interleaved 1F1B: pp2 x 2 chunks of one layer each gives the single-device losses (f64).
il_out=$("$bin" "${common[@]}" --layers=4 --mesh=pp=2 --microbatches=2 \
         --schedule=interleaved_1f1b --virtual_stages=2 --steps=2)
echo "$il_out"
grep -q "^pipeline: pp=2, 2 microbatches of 2 sequences, interleaved_1f1b, 2 model chunks" \
  <<<"$il_out" || fail "no interleaved pipeline line"
grep -q "bubble measured .* (ideal: (p-1)/(v m+p-1)" <<<"$il_out" || fail "no interleaved bubble"
one4=$("$bin" "${common[@]}" --layers=4 --steps=2)
same_losses "$(losses <<<"$il_out")" "$(losses <<<"$one4")" \
  || fail "interleaved pp2 x v2 losses differ from one device"
# bf16 through the pipeline (bf16 activations cross the stage boundary): within 2^-11 relative of
# the 1-device bf16 run, as models/train/gpt_mixed_precision_test.cc bounds the other meshes.
bf_one=$("$bin" "${common[@]}" --layers=2 --dtype=bf16 --steps=2 | grep '^step 1 loss' | awk '{print $4}')
bf_pp=$("$bin" "${common[@]}" --layers=2 --dtype=bf16 --mesh=pp=2,dp=2 --microbatches=2 --steps=2 \
        | grep '^step 1 loss' | awk '{print $4}')
python3 -c "import sys; a,b=float('$bf_one'),float('$bf_pp'); sys.exit(abs(a-b) > abs(a)/2048)" \
  || fail "bf16 pp2 x dp2: $bf_pp vs $bf_one"
# bf16 mixed precision on fsdp2 x tp2 + sp: f32 master weights (the per-rank bytes printed), and
# losses within 2^-9 relative of the f32 run (models/train/gpt_mixed_precision_test.cc says why).
bf=$("$bin" "${common[@]}" --dtype=bf16 --mesh=dp_shard=2,tp=2 --sp --steps=3)
echo "$bf"
grep -q "bf16 compute, f32 master weights" <<<"$bf" || fail "bf16: no precision line"
grep -q "per rank: parameters .* gradients .* optimizer state .* activations" <<<"$bf" \
  || fail "bf16: no per-rank bytes"
f32=$("$bin" "${common[@]}" --dtype=f32 --steps=3 | grep '^step 2 loss' | awk '{print $4}')
b16=$(grep '^step 2 loss' <<<"$bf" | awk '{print $4}')
python3 -c "import sys; a,b=float('$f32'),float('$b16'); sys.exit(abs(a-b) > abs(a)/512 or a == b)" \
  || fail "bf16 fsdp2 x tp2+sp: $b16 vs f32 $f32"

expect_error() {  # expect_error "message" flags...: exit 2 (an error, not a crash), no step run
  local msg="$1"; shift
  local rc=0
  err=$("$bin" "$@" 2>&1) || rc=$?
  [ "$rc" = 0 ] && fail "accepted: $*"
  [ "$rc" = 2 ] || fail "exit $rc (a crash?) for: $*: $err"
  grep -q -- "$msg" <<<"$err" || fail "expected '$msg', got: $err"
  grep -q "^step" <<<"$err" && fail "trained before rejecting: $*"
  return 0
}
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

# --recompute: full and selective train to the losses of none exactly (dp2 x tp2 + sp: the SP
# collectives of each block are issued again in the backward); the summary names the mode and
# its peak of saved activations, which falls. A bad value, and selective with the fused
# attention kernel (nothing to recompute), are refused.
rc_args=("${common[@]}" --layers=2 --seq=16 --mesh=dp=2,tp=2 --sp --steps=2)
rc_none=$("$bin" "${rc_args[@]}")
rc_full=$("$bin" "${rc_args[@]}" --recompute=full)
rc_sel=$("$bin" "${rc_args[@]}" --recompute=selective)
[ -n "$(losses <<<"$rc_none")" ] || fail "--recompute: no losses"
[ "$(losses <<<"$rc_full")" = "$(losses <<<"$rc_none")" ] || fail "--recompute=full losses differ"
[ "$(losses <<<"$rc_sel")" = "$(losses <<<"$rc_none")" ] || fail "--recompute=selective losses differ"
python3 - "$rc_none" "$rc_sel" "$rc_full" <<'PY' || fail "--recompute: peak saved activations"
import re, sys
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
peaks = []
for out, mode in zip(sys.argv[1:], ["none", "selective", "full"]):
    m = re.search(r"^activations: recompute=(\w+), peak saved per rank ([\d.]+) (\w+)", out, re.M)
    assert m and m.group(1) == mode, (mode, out)
    peaks.append(float(m.group(2)) * units[m.group(3)])
assert peaks[0] > peaks[1] > peaks[2], peaks
PY
expect_error "recompute=some: expected none" "${common[@]}" --recompute=some
expect_error "recompute=: expected none (keep" "${common[@]}" --recompute=
SHARDMAP_ATTENTION=fused expect_error "selective with the fused attention kernel" \
  "${common[@]}" --recompute=selective
expect_error "--devices cpu:3 but the mesh" "${common[@]}" --mesh=dp=2 --devices=cpu:3
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
# ---- A trainer, not a demo (issue 29) ----
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
