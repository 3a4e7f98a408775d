#!/usr/bin/env bash
# train_gpt on every parallelism but dp/tp/cp (those are train_gpt_test.sh): expert parallelism,
# pipelines (1F1B, GPipe, interleaved), bf16 and mixed precision, and recomputation, each
# against the single-device losses.
. models/train/train_gpt_test_lib.sh

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
echo PASS
