#!/usr/bin/env bash
# train_gpt --backend=gloo: one process per rank through collectives/launch prints the same
# losses as the in-process run (bitwise: both reduce in rank order with the same kernel), on tp2,
# on fsdp over 3 processes and on tp2+sp in bf16; a checkpoint saved by the gloo run (parameters all_gathered,
# written by rank 0) resumes in-process with the uninterrupted run's loss; bad setups fail clearly.
set -euo pipefail
bin="models/train/train_gpt"
launch="collectives/launch"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/text.txt"
common=(--text="$tmp/text.txt" --layers=1 --d_model=16 --heads=4 --seq=8 --batch=6 --lr=1e-2
        --dtype=f64 --steps=3)

fail() { echo "FAIL: $*"; exit 1; }
losses() { grep -o 'step [0-9]* loss [^ ]*' || true; }

# processes, then train_gpt flags (the last case: bf16 mixed precision, bf16 tp collectives).
for case in "2 --mesh=tp=2" "3 --mesh=dp_shard=3" "2 --mesh=tp=2 --sp --dtype=bf16"; do
  read -r -a flags <<<"$case"
  n="${flags[0]}"; flags=("${flags[@]:1}")
  mesh="${flags[*]}"
  gloo=$("$launch" --nproc_per_node="$n" -- "$bin" "${common[@]}" --backend=gloo "${flags[@]}" \
         --save="$tmp/gloo_$n.safetensors")
  echo "$gloo"
  grep -q "on $n processes (gloo)" <<<"$gloo" || fail "$mesh: no gloo header"
  inproc=$("$bin" "${common[@]}" "${flags[@]}")
  [ "$(losses <<<"$gloo")" = "$(losses <<<"$inproc")" ] && [ -n "$(losses <<<"$gloo")" ] \
    || fail "$mesh: gloo losses differ from in-process: $(losses <<<"$gloo") vs $(losses <<<"$inproc")"
  # Only rank 0 prints the steps.
  [ "$(grep -c '^\[rank 0\] step' <<<"$gloo")" = 3 ] || fail "$mesh: rank 0 step lines"
  grep -q '^\[rank [1-9]\] step' <<<"$gloo" && fail "$mesh: a rank other than 0 printed steps"
done

# The gloo fsdp3 save resumes on one in-process device with the uninterrupted 4-step loss.
full=$("$bin" "${common[@]}" --steps=4 | grep '^step 3 loss' | awk '{print $4}')
resumed=$("$bin" "${common[@]}" --mesh= --resume="$tmp/gloo_3.safetensors" --steps=4 \
          | grep '^step 3 loss' | awk '{print $4}')
[ -n "$full" ] && [ "$full" = "$resumed" ] || fail "resume of the gloo save: $resumed vs $full"

# The trainer's run features under --backend=gloo on a multi-axis mesh (dp_shard=2 x tp=2 over 4
# processes): the same losses, validation loss, periodic checkpoints and sample as in-process.
feat=(--grad_accum=2 --val_fraction=0.1 --eval_every=2 --lr_schedule=cosine --warmup_steps=1
      --sample=6 --prompt="the " --mesh=dp_shard=2,tp=2 --sp --batch=4 --steps=4)
mkdir -p "$tmp/grot" "$tmp/irot"
gfeat=$("$launch" --nproc_per_node=4 -- "$bin" "${common[@]}" "${feat[@]}" --backend=gloo \
        --save="$tmp/grot/run.safetensors" --save_every=2 --keep_last=1 --run_id=feat)
ifeat=$("$bin" "${common[@]}" "${feat[@]}" --save="$tmp/irot/run.safetensors" --save_every=2 \
        --keep_last=1 --run_id=feat)
[ "$(losses <<<"$gfeat")" = "$(losses <<<"$ifeat")" ] && [ -n "$(losses <<<"$ifeat")" ] \
  || fail "features under gloo: $(losses <<<"$gfeat") vs $(losses <<<"$ifeat")"
[ "$(grep -o 'val loss [^ ]*' <<<"$gfeat")" = "$(grep -o 'val loss [^ ]*' <<<"$ifeat")" ] \
  || fail "val loss under gloo"
[ "$(grep -o 'sample.*' <<<"$gfeat")" = "$(grep -o 'sample.*' <<<"$ifeat")" ] \
  || fail "sample under gloo: $(grep -o 'sample.*' <<<"$gfeat")"
[ "$(ls "$tmp/grot" | sort | tr '\n' ' ')" = "run.safetensors run.step4.safetensors " ] \
  || fail "gloo rotation: $(ls "$tmp/grot")"
cmp "$tmp/grot/run.step4.safetensors" "$tmp/irot/run.step4.safetensors" \
  || fail "the gloo checkpoint differs from the in-process one"

# Pipeline parallelism over processes: pp2 x dp2 (1F1B, 2 microbatches) over 4 gloo processes
# gives the in-process losses and saves the same checkpoint (the stages' parameters gathered;
# one --run_id, so that the metadata is the same too).
mkdir -p "$tmp/gpp" "$tmp/ipp"
pp_flags=(--mesh=pp=2,dp=2 --microbatches=2 --layers=2 --batch=4 --steps=3 --run_id=pp)
gpp=$("$launch" --nproc_per_node=4 -- "$bin" "${common[@]}" "${pp_flags[@]}" --backend=gloo \
      --save="$tmp/gpp/pp.safetensors")
ipp=$("$bin" "${common[@]}" "${pp_flags[@]}" --save="$tmp/ipp/pp.safetensors")
[ "$(losses <<<"$gpp")" = "$(losses <<<"$ipp")" ] && [ -n "$(losses <<<"$ipp")" ] \
  || fail "pp over gloo: $(losses <<<"$gpp") vs $(losses <<<"$ipp")"
cmp "$tmp/gpp/pp.safetensors" "$tmp/ipp/pp.safetensors" || fail "pp gloo checkpoint differs"

expect_error() {  # expect_error "message" command...
  local msg="$1"; shift
  if err=$("$@" 2>&1); then fail "accepted: $*"; fi
  grep -q -- "$msg" <<<"$err" || fail "expected '$msg', got: $err"
  grep -q "step 0" <<<"$err" && fail "trained before rejecting: $*"
  return 0
}
expect_error "the world has 2 processes but the mesh has 4 ranks" \
  "$launch" --nproc_per_node=2 -- "$bin" "${common[@]}" --backend=gloo --mesh=tp=4
expect_error "--backend=gloo: .*collectives/launch --nproc_per_node=2" \
  env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$bin" "${common[@]}" --backend=gloo --mesh=tp=2
# Ranks started with different settings name the flag (issue 29: was "lost rank 0").
expect_error "started with different settings: --steps (rank 1 differs from rank 0" \
  "$launch" --nproc_per_node=2 -- bash -c 'exec "$0" "$@" --steps=$((3 + RANK))' "$bin" \
  "${common[@]}" --backend=gloo --mesh=tp=2
# Different data (same path, other bytes) is named too.
printf 'another text entirely, with other bytes. %.0s' $(seq 1 40) > "$tmp/other.txt"
expect_error "different settings: --data" \
  "$launch" --nproc_per_node=2 -- bash -c \
  'a=$1 b=$2; shift 2; exec "$0" "$@" --text=$([ "$RANK" = 0 ] && echo "$a" || echo "$b")' "$bin" \
  "$tmp/text.txt" "$tmp/other.txt" --layers=1 --d_model=16 --heads=4 --seq=8 --batch=6 \
  --backend=gloo --mesh=tp=2
expect_error "--backend mpi: no such backend; the registered backends are inprocess, gloo, nccl" "$bin" "${common[@]}" --backend=mpi
expect_error "--backend=nccl runs each process on a GPU: add --device=cuda" \
  "$bin" "${common[@]}" --backend=nccl
expect_error "--backend=gloo runs on CPU memory" \
  "$launch" --nproc_per_node=2 -- "$bin" "${common[@]}" --backend=gloo --mesh=tp=2 --device=cuda
# --trace with a process per rank: every process writes its own track and rank 0 merges them,
# so the one trace file shows both ranks (and no part file is left).
"$launch" --nproc_per_node=2 -- "$bin" "${common[@]}" --backend=gloo --mesh=tp=2 --steps=2 \
  --trace="$tmp/gloo_trace.json" > /dev/null 2>&1 || fail "gloo --trace run failed"
python3 - "$tmp/gloo_trace.json" <<'PY' || fail "gloo --trace: not one track per rank"
import json, sys
t = json.load(open(sys.argv[1]))
names = {e['tid'] for e in t if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
phases = {e['tid'] for e in t if e.get('cat') == 'phase'}
c = 1 << 20  # each rank's collectives track
assert names == {0, 1, c, c + 1} and phases == {0, 1}, (names, phases)
PY
[ ! -e "$tmp/gloo_trace.json.rank1" ] || fail "gloo --trace left its part file"
# --collective_timeout: a peer stopped mid-run fails the job within the timeout, naming the
# wait, instead of holding it for the 5-minute default. Rank 1 is stopped once both ranks are in
# the run (rank 0 printed the header, after the ranks agreed on their settings), not after a
# fixed sleep: on a loaded machine rank 1 may not have joined by then.
export STOP_WHEN="$tmp/stopped_peer_rank0.out"
rm -f "$STOP_WHEN" "$STOP_WHEN.at"
if err=$("$launch" --nproc_per_node=2 -- bash -c \
  'if [ "$RANK" = 1 ]; then "$0" "$@" >/dev/null 2>&1 & p=$!
     for i in $(seq 1 3000); do grep -q "global batch" "$STOP_WHEN" 2>/dev/null && break; sleep 0.1; done
     date +%s > "$STOP_WHEN.at"; kill -STOP $p; wait $p; exit; fi
   stdbuf -oL "$0" "$@" 2>&1 | tee "$STOP_WHEN"; exit "${PIPESTATUS[0]}"' "$bin" "${common[@]}" \
  --backend=gloo --mesh=tp=2 --steps=1000000 --log_every=100000 --collective_timeout=3 2>&1); then
  fail "a run with a stopped peer exited 0"
fi
grep -q "global batch" "$STOP_WHEN" || fail "stopped peer: rank 0 never started: $err"
start=$(cat "$STOP_WHEN.at")
# Rank 1 stops wherever it is: in a collective rank 0 then waits on ("timed out ... waiting for
# rank 1"), or in the Split() that opens the started calls' lane: before its rendezvous (which
# names rank 1) or while Gloo connects the group's pairs (named by the group's ranks).
grep -Eq "timed out after 3s waiting for rank 1|rank 1 of 2 did not reach the rendezvous of Split\(\) #[0-9]+ within 3s|connecting the group of color 0 failed: .*\(the group's world ranks 0, 1, within 3s: a member stopped" \
  <<<"$err" || fail "stopped peer: got $err"
[ $(( $(date +%s) - start )) -lt 60 ] || fail "a stopped peer took over 60 s to detect"
# A peer that never connects: the rendezvous gives up after the timeout too, naming the rank.
expect_error "rank 1 of 2 did not join within 2s; start every rank" \
  "$launch" --nproc_per_node=2 -- bash -c 'if [ "$RANK" = 1 ]; then exec sleep 100; fi; exec "$0" "$@"' \
  "$bin" "${common[@]}" --backend=gloo --mesh=tp=2 --collective_timeout=2
# A launched process left on the in-process backend refuses instead of training alone (the other
# rank, on gloo, would wait for it).
expect_error "--backend=inprocess runs every rank as a thread of this process, but a launcher" \
  "$launch" --nproc_per_node=2 -- bash -c \
  'b=gloo; [ "$RANK" = 1 ] && b=inprocess; exec "$0" "$@" --backend=$b' "$bin" "${common[@]}" \
  --mesh=tp=2 --collective_timeout=20
expect_error "--collective_timeout 0 must be a finite number of seconds > 0" \
  "$bin" "${common[@]}" --collective_timeout=0
echo PASS
