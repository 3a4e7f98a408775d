#!/usr/bin/env bash
# The whole GPU check, in one command on the GPU machine (.gpu/run.sh of tools/gpu_bundle.sh calls
# it after unpacking): sections in priority order, the must-pass checks first, each under a time
# limit, skipped once the budget is spent, so the run ends inside BUDGET_S (default 420 s; 300 s
# with --quick) and writes one report, OUT/summary.md, and every log packed in OUT/logs.tar.xz
# (two files: the device tool brings back at most 8). Must pass (the exit status), in this order:
#   1. tests       every bundled GPU test (each at most 120 s, 90 s quick; no new test starts once
#                  only the later must-pass sections' reserve is left); the skipped cases with
#                  their reasons go to "Could not run"
#   2. determinism train_gpt --deterministic twice (2 layers of GPT-2 width): the loss lines must
#                  be bitwise equal
#   3. overlap     tests/gpu_nccl_overlap_check through collectives/launch on the NCCL backend
#                  (every GPU up to 4; one GPU: two ranks sharing it where NCCL allows, else one
#                  rank): the comm stream's spans against the compute stream's, the host waits
#                  per step against the expected count (the loss read alone: NCCL's blocking
#                  collectives are stream-ordered, index checks deferred to the loss read), step
#                  time with --overlap on vs off (at most 60 s)
# Reported (--quick: 4 only, PyTorch eager only):
#   4. train_gpt   train_gpt --device=cuda on GPT-2 124M shapes (bf16, batch 16, seq 1024, random
#                  tokens) next to bench/peers/gpt_torch_cuda.py (eager; torch.compile unless
#                  quick, at most 180 s): tokens/s, MFU, peak memory
#   5. determinism train_gpt twice without --deterministic (GEMM autotuning on): equal or not,
#                  and the speed against the deterministic runs
#   6. gpt         gpt_bench --device=cuda --model=gpt2 --dtype=bf16 and its PyTorch table
#   7. ops         cuda_bench and its PyTorch peer: cuda_ops_table.md
#   8. attention   attention_bench's CUDA rows, and its kernel rows against PyTorch SDPA (flash)
#                  (bench/peers/attention_torch_cuda.py), flagged below 0.7x
#   9. tp          tools/tp_gpu_run.sh: tp_bench on the GPU, the GPU TP model, REPORT_GPU.md
#
#   bash tools/gpu_run.sh BIN_DIR OUT [COMMIT] [--quick]     # BIN_DIR: the unpacked bundle's bin/
# Exit status: 0 iff every test that ran passed, the deterministic runs agreed and the overlap
# check passed (a must-pass section skipped for time is listed under "Could not run").
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:?usage: gpu_run.sh BIN_DIR OUT [COMMIT] [--quick]}"
out="${2:?usage: gpu_run.sh BIN_DIR OUT [COMMIT] [--quick]}"
commit="${3:-unknown}"
quick=0
[ "${4:-}" = "--quick" ] && quick=1
mkdir -p "$out" && out="$(cd "$out" && pwd)"
logs=/tmp/gpu_run_logs  # packed into $out/logs.tar.xz after each section
rm -rf "$logs" && mkdir -p "$logs"
cd "$bin" || exit 2
budget="${BUDGET_S:-$([ $quick = 1 ] && echo 300 || echo 420)}"
reserve=110  # what the must-pass sections after the tests need (determinism 45, overlap 65)
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
cap() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }  # the smaller of $1 and what is left
summary="$out/summary.md"
notrun="$logs/not_run.md"  # the "Could not run" list, appended to the summary at the end
: > "$notrun"
pack() { tar -C "$logs" -cJf "$out/logs.tar.xz" . 2>/dev/null || true; }
{
  echo "# GPU run at ${commit}, $(date -u '+%Y-%m-%d %H:%M UTC')$([ $quick = 1 ] && echo ' (--quick)')"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo "nvidia-smi: not found"
  python3 -c "import torch; print('PyTorch', torch.__version__, 'CUDA', torch.version.cuda)" \
    2>/dev/null || echo "PyTorch: not importable"
  echo '```'
} > "$summary"
# section NAME MIN_SECONDS: true when at least MIN_SECONDS of the budget are left (else notes the
# skip).
section() {
  if [ "$(left)" -lt "$2" ]; then
    echo "- section $1: skipped, $(left) s of the budget left (needs $2)" | tee -a "$notrun"
    return 1
  fi
  echo "== $1 ($(left) s left)"
}
# must NAME MIN_SECONDS: a must-pass section; skipped (no time, or its binary missing) it fails
# the run.
must() {
  section "$@" && return 0
  echo "- section $1 must pass: counted as failed" >> "$notrun"
  fail=1
  return 1
}
need() {  # need BINARY: true when the bundle has it (else notes it and fails the run)
  [ -x "$1" ] && return 0
  echo "- $1: not in the bundle (a must-pass section could not run)" >> "$notrun"
  fail=1
  return 1
}
has_torch=0
python3 -c "import torch" 2>/dev/null && has_torch=1
[ $has_torch = 1 ] || echo "- PyTorch is not importable here: no PyTorch rows" >> "$notrun"
fail=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "- 2-GPU cases (${gpus:-0} GPU here): collectives/nccl_check, nccl_failure_check and" \
       "tests/gpu_nccl_mlp_check are not run; the tests' 2-GPU cases skip (listed below)" >> "$notrun"
fi
# 1. Tests.
if must tests 60; then
  passed=0 failed=0 skipped_cases=0
  echo -e "\n## Tests\n" >> "$summary"
  per_test=$([ $quick = 1 ] && echo 90 || echo 120)
  for t in $(find . -type f \( -name '*_test' -o -name '*_test_gpu' \) | sed 's|^\./||' | sort); do
    [ "$(left)" -lt $((30 + reserve)) ] && { echo "- test $t: not run (budget)" >> "$notrun"; continue; }
    log="$logs/$(echo "$t" | tr '/' '_').log"
    gpu_env=()  # shardmap_cc_test's GPU variants run with SHARDMAP_TEST_PLACEMENT=gpu, as in Bazel
    grep -qx "$t" gpu_placement_tests.txt 2>/dev/null && gpu_env=(SHARDMAP_TEST_PLACEMENT=gpu)
    limit=$(cap "$per_test"); room=$(( $(left) - reserve )); [ "$room" -lt "$limit" ] && limit=$room
    if env "${gpu_env[@]}" timeout "$limit" "./$t" > "$log" 2>&1; then
      r=PASS; passed=$((passed + 1))
    else r=FAIL; fail=1; failed=$((failed + 1)); fi
    s=$(grep -c '^\[  SKIPPED \] .*(' "$log")
    skipped_cases=$((skipped_cases + s))
    echo "$r $t ($s cases skipped)"
    echo "- $r $t ($s cases skipped)" >> "$summary"
    if [ $r = FAIL ]; then
      grep -E 'Failure|FAILED|error|Timeout|timed out' "$log" | head -12 | sed 's/^/    /' >> "$summary"
    fi
    grep -h -E '^(f32|bf16_|peak device memory|[0-9]+ of [0-9]+ parameters bitwise)' "$log" \
      | head -20 | sed 's/^/    /' >> "$summary"
  done
  echo "- **$passed test binaries passed, $failed failed; $skipped_cases cases skipped**" >> "$summary"
  python3 "$repo/tools/gpu_report.py" skipped "$logs"/*_test*.log >> "$notrun" 2>/dev/null
  pack
fi

# Random GPT-2 tokens (uint16, vocabulary 50304) for train_gpt.
tokens=/tmp/gpu_run_tokens.bin
python3 -c "
import array, random
random.seed(1)
array.array('H', (random.randrange(50304) for _ in range(400000))).tofile(open('$tokens', 'wb'))"
gpt2=(--layers=12 --d_model=768 --heads=12 --vocab=50304 --seq=1024 --batch=16 --dtype=bf16
      --data="$tokens" --log_every=1)

# 2. Determinism: the same command twice, losses bitwise.
if must determinism 40 && need models/train/train_gpt; then
  small=(--layers=2 --d_model=768 --heads=12 --vocab=50304 --seq=1024 --batch=8 --dtype=bf16
         --data="$tokens" --log_every=1 --steps=4)
  for run in a b; do
    timeout "$(cap 60)" ./models/train/train_gpt --device=cuda "${small[@]}" --deterministic \
      > "$logs/deterministic_$run.log" 2>&1 || echo "deterministic run $run: exit $?"
  done
  { echo -e "\n## Determinism (train_gpt twice, 2 layers of GPT-2 width, 4 steps)\n"
    echo -n "- --deterministic: "
    python3 "$repo/tools/gpu_report.py" determinism "$logs/deterministic_a.log" \
      "$logs/deterministic_b.log" || fail=1
  } >> "$summary"
  pack
fi

# 3. NCCL overlap: the started collectives' stream beside the compute stream, host waits per step.
if must overlap 45 && need tests/gpu_nccl_overlap_check && need collectives/launch; then
  # One GPU: two processes share it (virtual ranks) where NCCL allows it (NCCL before 2.30
  # refuses), else one rank: the streams part and the host waits, no transfer between ranks.
  n=$(( ${gpus:-0} >= 2 ? (gpus < 4 ? gpus : 4) : 2 ))
  results=("$logs/overlap_$n.json")
  timeout "$(cap 60)" ./collectives/launch --nproc_per_node="$n" -- tests/gpu_nccl_overlap_check \
    --json="$logs/overlap_$n.json" > "$logs/overlap_$n.log" 2>&1 ||
    echo "overlap check, $n ranks: exit $? (see overlap_$n.log)"
  tail -4 "$logs/overlap_$n.log"
  if [ "${gpus:-0}" -lt 2 ] && [ ! -s "$logs/overlap_$n.json" ] && [ "$(left)" -gt 30 ]; then
    echo "- overlap check with 2 ranks on one GPU: $(grep -m1 -i -E 'duplicate|error|failed' \
      "$logs/overlap_$n.log" | cut -c1-300); ran with 1 rank instead" >> "$notrun"
    results+=("$logs/overlap_1.json")
    timeout "$(cap 45)" ./collectives/launch --nproc_per_node=1 -- tests/gpu_nccl_overlap_check \
      --json="$logs/overlap_1.json" > "$logs/overlap_1.log" 2>&1 ||
      echo "overlap check, 1 rank: exit $? (see overlap_1.log)"
    tail -4 "$logs/overlap_1.log"
  fi
  { echo -e "\n## NCCL overlap (tests/gpu_nccl_overlap_check: --overlap on vs off, host waits)\n"
    python3 "$repo/tools/gpu_report.py" overlap "${results[@]}" || fail=1
  } >> "$summary"
  pack
fi

# 4. train_gpt on GPT-2 124M shapes against PyTorch.
if section train_gpt 50 && [ -x models/train/train_gpt ]; then
  steps=$([ $quick = 1 ] && echo 8 || echo 12)
  timeout "$(cap 120)" ./models/train/train_gpt --device=cuda "${gpt2[@]}" --steps="$steps" \
    > "$logs/train_gpt.log" 2>&1 || echo "train_gpt: exit $? (see train_gpt.log)"
  tail -3 "$logs/train_gpt.log"
  : > "$logs/gpt_torch_cuda.jsonl"
  if [ $has_torch = 1 ] && [ "$(left)" -gt 40 ]; then
    modes=$([ $quick = 1 ] && echo eager || echo eager,compile)
    [ $quick = 1 ] && echo "- PyTorch torch.compile row: not run with --quick" >> "$notrun"
    timeout "$(cap 180)" python3 "$repo/bench/peers/gpt_torch_cuda.py" --modes="$modes" \
      --steps=10 --warmup=3 --json="$logs/gpt_torch_cuda.jsonl" > "$logs/gpt_torch_cuda.txt" 2>&1 ||
      echo "gpt_torch_cuda.py: exit $? (see gpt_torch_cuda.txt)"
  fi
  { echo -e "\n## train_gpt --device=cuda, GPT-2 124M shapes (bf16, batch 16, seq 1024)\n"
    python3 "$repo/tools/gpu_report.py" train-row "$logs/train_gpt.log" "$logs/gpt_torch_cuda.jsonl"
    grep -E '^(GPU:|summary:)' "$logs/train_gpt.log" | sed 's/^/    /'
  } >> "$summary" 2>&1
  pack
fi

# 5. Determinism without --deterministic (GEMM autotuning by timing): reported, not required.
if [ $quick = 0 ] && section determinism_default 50 && [ -x models/train/train_gpt ]; then
  small=(--layers=2 --d_model=768 --heads=12 --vocab=50304 --seq=1024 --batch=8 --dtype=bf16
         --data="$tokens" --log_every=1 --steps=4)
  for run in a b; do
    timeout "$(cap 60)" ./models/train/train_gpt --device=cuda "${small[@]}" \
      > "$logs/default_$run.log" 2>&1 || echo "default run $run: exit $?"
  done
  # The default runs' speed against the deterministic ones is the cost of --deterministic.
  { echo -e "\n## Determinism without --deterministic (the same 2-layer runs)\n"
    echo -n "- default (GEMM autotuning by timing, may differ): "
    python3 "$repo/tools/gpu_report.py" determinism "$logs/default_a.log" "$logs/default_b.log"
  } >> "$summary"
  pack
fi

if [ $quick = 0 ]; then
  # 6. gpt_bench (the GPT-2 step as a benchmark, 1 rank and tp2 virtual ranks) against PyTorch.
  if section gpt 60 && [ -x bench/gpt_bench ]; then
    timeout "$(cap 150)" ./bench/gpt_bench --device=cuda --model=gpt2 --dtype=bf16 \
      --benchmark_out="$logs/gpt_bench.json" --benchmark_out_format=json \
      > "$logs/gpt_bench.txt" 2>&1 || echo "gpt_bench: exit $? (see gpt_bench.txt)"
    [ -s "$logs/gpt_bench.json" ] || echo '{"benchmarks": []}' > "$logs/gpt_bench.json"
    { echo -e "\n## gpt_bench GPT-2 124M, bf16\n"
      python3 "$repo/bench/peers/gpt_gpu_table.py" "$logs/gpt_bench.json" "$logs/gpt_torch_cuda.jsonl"
    } >> "$summary" 2>&1
    pack
  fi

  # 7. Ops and GEMMs against PyTorch.
  if section ops 90 && [ -x bench/cuda_bench ]; then
    timeout "$(cap 150)" ./bench/cuda_bench --benchmark_min_time=0.1 \
      --benchmark_out="$logs/cuda_bench.json" --benchmark_out_format=json \
      > "$logs/cuda_bench.txt" 2>&1 || echo "cuda_bench: exit $?"
    if [ $has_torch = 1 ] && [ "$(left)" -gt 30 ]; then
      timeout "$(cap 120)" bash "$repo/bench/peers/cuda_ops_table.sh" \
        ./bench/cuda_bench "$logs" "$logs/cuda_bench.json" > /dev/null 2>&1 ||
        echo "cuda_ops_table: exit $?"
    fi
    { echo -e "\n## Ops and GEMMs\n"
      if [ -s "$logs/cuda_ops_table.md" ]; then cat "$logs/cuda_ops_table.md"
      else tail -40 "$logs/cuda_bench.txt"; fi
    } >> "$summary"
    pack
  fi

  # 8. Attention: the layer's CUDA rows, and the kernels against PyTorch SDPA (flash).
  if section attention 40 && [ -x bench/attention_bench ]; then
    timeout "$(cap 90)" ./bench/attention_bench --benchmark_filter=Cuda --benchmark_min_time=0.1 \
      --benchmark_out="$logs/attention_bench.json" --benchmark_out_format=json \
      > "$logs/attention_bench.txt" 2>&1 || echo "attention_bench: exit $?"
    : > "$logs/attention_torch_cuda.jsonl"
    if [ $has_torch = 1 ] && [ "$(left)" -gt 20 ]; then
      timeout "$(cap 60)" python3 "$repo/bench/peers/attention_torch_cuda.py" \
        --json="$logs/attention_torch_cuda.jsonl" > "$logs/attention_torch_cuda.txt" 2>&1 ||
        echo "attention_torch_cuda.py: exit $?"
    fi
    { echo -e "\n## Attention kernels (forward + backward) against PyTorch SDPA\n"
      python3 "$repo/tools/gpu_report.py" attention "$logs/attention_bench.json" \
        "$logs/attention_torch_cuda.jsonl"
      echo -e "\nThe layer (fused vs materialised):\n"; echo '```'
      grep -E '^(BM|---|Benchmark)' "$logs/attention_bench.txt" | head -30
      echo '```'; } >> "$summary"
    pack
  fi

  # 9. TP layers.
  if section tp 100 && [ -x bench/tp_bench ]; then
    LIMIT_S=$(( ($(left) - 20) / 2 < 75 ? ($(left) - 20) / 2 : 75 )) \
      timeout "$(left)" bash "$repo/tools/tp_gpu_run.sh" "$PWD" "$logs" "$commit" ||
      echo "tp_gpu_run: exit $?"
    { echo -e "\n## TP layers\n"
      [ -s "$logs/REPORT_GPU.md" ] && echo "See REPORT_GPU.md in logs.tar.xz (copy it to bench/REPORT_GPU.md)."
    } >> "$summary"
  fi
else
  echo "- sections determinism_default, gpt_bench, ops, attention, tp: not run with --quick" >> "$notrun"
fi

{ echo -e "\n## Could not run\n"
  if [ -s "$notrun" ]; then cat "$notrun"; else echo "- nothing: every section and case ran"; fi
  echo -e "\n(run took $((SECONDS - start)) s of a ${budget} s budget; logs in logs.tar.xz)"
} >> "$summary"
pack
cat "$summary"
exit $fail
