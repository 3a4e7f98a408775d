#!/usr/bin/env bash
# The whole GPU check, in one command on the GPU machine (.gpu/run.sh of tools/gpu_bundle.sh calls
# it after unpacking): sections in priority order, each under a time limit, skipped once the
# budget is spent, so the run ends inside BUDGET_S (default 450 s) with every section's output
# under OUT and one summary, OUT/summary.md:
#   1. tests     every bundled GPU test (each at most 120 s): the kernels against the CPU ops,
#                the GPT on one GPU against the CPU and across meshes, NCCL
#   2. gpt       gpt_bench --device=cuda --model=gpt2 --dtype=bf16 (1 rank and tp2 as virtual
#                ranks) next to bench/peers/gpt_torch_cuda.py (eager, torch.compile):
#                gpt_gpu_table.md
#   3. ops       cuda_bench and its PyTorch peer: cuda_ops_table.md
#   4. attention attention_bench's CUDA rows (tensor cores vs SIMT kernels, fused vs materialised)
#   5. tp        tools/tp_gpu_run.sh: tp_bench on the GPU, the GPU TP model, REPORT_GPU.md
#
#   bash tools/gpu_run.sh BIN_DIR OUT [COMMIT]     # BIN_DIR: the unpacked bundle's bin/
# Exit status: 0 iff every test that ran passed.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:?usage: gpu_run.sh BIN_DIR OUT [COMMIT]}"
out="${2:?usage: gpu_run.sh BIN_DIR OUT [COMMIT]}"
commit="${3:-unknown}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
cd "$bin" || exit 2
budget="${BUDGET_S:-450}"
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
summary="$out/summary.md"
{
  echo "# GPU run at ${commit}, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  python3 -c "import torch; print('PyTorch', torch.__version__, 'CUDA', torch.version.cuda)" 2>&1 || true
  echo '```'
} > "$summary"
# section NAME MIN_SECONDS: true when at least MIN_SECONDS of the budget are left (else notes the
# skip in the summary).
section() {
  if [ "$(left)" -lt "$2" ]; then
    echo "- $1: skipped, $(left) s of the budget left (needs $2)" | tee -a "$summary"
    return 1
  fi
  echo "== $1 ($(left) s left)"
}
has_torch=0
python3 -c "import torch" 2>/dev/null && has_torch=1

# 1. Tests.
fail=0 passed=0 failed=0 skipped_cases=0
if section tests 60; then
  echo -e "\n## Tests\n" >> "$summary"
  for t in $(find . -type f \( -name '*_test' -o -name '*_test_gpu' \) | sed 's|^\./||' | sort); do
    [ "$(left)" -lt 30 ] && { echo "- $t: not run (budget)" >> "$summary"; continue; }
    log="$out/$(basename "$t").log"
    gpu_env=()  # shardmap_cc_test's GPU variants run with SHARDMAP_TEST_PLACEMENT=gpu, as in Bazel
    grep -qx "$t" gpu_placement_tests.txt 2>/dev/null && gpu_env=(SHARDMAP_TEST_PLACEMENT=gpu)
    if env "${gpu_env[@]}" timeout 120 "./$t" > "$log" 2>&1; then
      r=PASS; passed=$((passed + 1))
    else r=FAIL; fail=1; failed=$((failed + 1)); fi
    s=$(grep -c '^\[  SKIPPED \] .*(' "$log")
    skipped_cases=$((skipped_cases + s))
    echo "$r $t ($s cases skipped)"
    if [ $r = FAIL ]; then
      echo "- FAIL $t" >> "$summary"
      grep -E 'Failure|FAILED|error|Timeout|timed out' "$log" | head -12 | sed 's/^/    /' >> "$summary"
    fi
  done
  echo "- $passed test binaries passed, $failed failed; $skipped_cases cases skipped" >> "$summary"
fi

# 2. GPT-2 124M against PyTorch.
if section gpt 60 && [ -x bench/gpt_bench ]; then
  timeout $(( $(left) < 150 ? $(left) : 150 )) ./bench/gpt_bench --device=cuda --model=gpt2 \
    --dtype=bf16 --benchmark_out="$out/gpt_bench.json" --benchmark_out_format=json \
    > "$out/gpt_bench.txt" 2>&1 || echo "gpt_bench: exit $? (see gpt_bench.txt)"
  tail -5 "$out/gpt_bench.txt"
  if [ $has_torch = 1 ] && [ "$(left)" -gt 40 ]; then
    timeout $(( $(left) < 180 ? $(left) : 180 )) python3 "$repo/bench/peers/gpt_torch_cuda.py" \
      --json="$out/gpt_torch_cuda.jsonl" > "$out/gpt_torch_cuda.txt" 2>&1 ||
      echo "gpt_torch_cuda.py: exit $? (see gpt_torch_cuda.txt)"
    cat "$out/gpt_torch_cuda.txt" | tail -3
  fi
  touch "$out/gpt_torch_cuda.jsonl"
  [ -s "$out/gpt_bench.json" ] || echo '{"benchmarks": []}' > "$out/gpt_bench.json"
  { echo -e "\n## GPT-2 124M, bf16\n"
    python3 "$repo/bench/peers/gpt_gpu_table.py" "$out/gpt_bench.json" "$out/gpt_torch_cuda.jsonl"
  } >> "$summary" 2>&1
fi

# 3. Ops and GEMMs against PyTorch.
if section ops 90 && [ -x bench/cuda_bench ]; then
  timeout $(( $(left) < 150 ? $(left) : 150 )) ./bench/cuda_bench --benchmark_min_time=0.1 \
    --benchmark_out="$out/cuda_bench.json" --benchmark_out_format=json \
    > "$out/cuda_bench.txt" 2>&1 || echo "cuda_bench: exit $?"
  if [ $has_torch = 1 ] && [ "$(left)" -gt 30 ]; then
    timeout $(( $(left) < 120 ? $(left) : 120 )) bash "$repo/bench/peers/cuda_ops_table.sh" \
      ./bench/cuda_bench "$out" "$out/cuda_bench.json" > /dev/null 2>&1 ||
      echo "cuda_ops_table: exit $?"
  fi
  { echo -e "\n## Ops and GEMMs\n"
    if [ -s "$out/cuda_ops_table.md" ]; then cat "$out/cuda_ops_table.md"
    else tail -40 "$out/cuda_bench.txt"; fi
  } >> "$summary"
fi

# 4. Attention.
if section attention 40 && [ -x bench/attention_bench ]; then
  timeout 60 ./bench/attention_bench --benchmark_filter=Cuda --benchmark_min_time=0.1 \
    > "$out/attention_bench.txt" 2>&1 || echo "attention_bench: exit $?"
  { echo -e "\n## Attention (fused vs materialised)\n"; echo '```'
    grep -E '^(BM|attention|Attention|---|Benchmark)' "$out/attention_bench.txt" | head -30
    echo '```'; } >> "$summary"
fi

# 5. TP layers.
if section tp 100 && [ -x bench/tp_bench ]; then
  LIMIT_S=$(( ($(left) - 20) / 2 < 75 ? ($(left) - 20) / 2 : 75 )) \
    timeout "$(left)" bash "$repo/tools/tp_gpu_run.sh" "$PWD" "$out" "$commit" ||
    echo "tp_gpu_run: exit $?"
  { echo -e "\n## TP layers\n"
    [ -s "$out/REPORT_GPU.md" ] && echo "See REPORT_GPU.md (copy it to bench/REPORT_GPU.md)."
  } >> "$summary"
fi

echo -e "\n(run took $((SECONDS - start)) s of a ${budget} s budget)" >> "$summary"
cat "$summary"
exit $fail
