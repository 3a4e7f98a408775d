#!/usr/bin/env bash
# tools/bench_report.sh --gpu on the FORMAT SAMPLE in tools/testdata/gpu_report_sample (synthetic
# numbers in the formats a GPU run writes): the report's header, tables and model section, and
# the errors for missing or malformed inputs.
set -uo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-shardmap}" 2>/dev/null || true
export PYTHON=/usr/bin/python3
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
check() {  # check FILE TEXT: FILE contains TEXT
  grep -qF -- "$2" "$1" || { echo "FAIL: $1 lacks: $2"; fail=1; }
}

dir="$tmp/run"
mkdir -p "$dir"
cp tools/testdata/gpu_report_sample/machine.txt tools/testdata/gpu_report_sample/tp_bench_cuda.json "$dir/"
bench/tp_model_gpu_report --profile=tools/testdata/gpu_report_sample/tp_gpu_profile.txt \
  --tokens=256 --d=512 > "$dir/tp_model_gpu.md" || { echo "FAIL: tp_model_gpu_report"; fail=1; }
bash tools/bench_report.sh --gpu "$dir" "$tmp/REPORT_GPU.md" || { echo "FAIL: bench_report.sh --gpu"; fail=1; }
r="$tmp/REPORT_GPU.md"
# Header: machine, card, driver, date, commit from machine.txt.
check "$r" "| gpu | SAMPLE-GPU 80GB |"
check "$r" "| driver | 000.00 |"
check "$r" "| date | 2000-01-01T00:00:00Z |"
check "$r" "| commit | 0000000-sample |"
# A layer table with its unsharded baseline and rows (ms, fenced, vs 1 GPU, TFLOP/s).
check "$r" "### mlp, fwd_bwd, bf16, cuda_shared (unsharded on one stream: 0.064 ms)"
check "$r" "| 2 | no | 0.144 | 0.187 | 2.23 | 22.4 | 0.021 | 512 |"
check "$r" "| 8 | yes | 0.507 | 0.658 | 7.86 | 6.4 | 0.048 | 512 |"
check "$r" "| attention/tp:8/tokens:256/d:512/sp/fwd_bwd/cuda_shared/bf16 | SAMPLE error message of a failed row |"
check "$r" "| collective/all_reduce/cuda_shared/dtype:bf16/t:4/bytes:262144 | 11.0 | 35.6 |"
# The model: GEMM efficiency (400 TFLOP/s + 8 us per GEMM in the sample), validation (the sample's
# layers are 1.15 x the model: err -13%), multi-node tables with their link sources.
check "$r" "| column fc [T,d]x[d,4d/t] | 256x512x2048 | 57.5 (1.00) | 256x512x1024 | 31.0 (0.54) |"
check "$r" "| mlp/tp:4/tokens:256/d:512/sp/fwd_bwd/cuda_shared/bf16 | 0.281 | 0.365 | 0.244 | 0.200 | 0.044 | -13% |"
check "$r" "Summary over 8 predicted rows: |err| median 13%, max 13%, within 20%: 8."
check "$r" "not predicted: tp_model_gpu: async_tp_mlp/tp:2"
check "$r" "#### block fwd+bwd, bf16, with sequence parallelism"
check "$r" "| 1 | 8 | 0.190 | 0.146 | 0.044 | 0.000 | 1.35e+06 | 0.190 | 0.146 | 0.044 | 1.35e+06 |"
check "$r" "| 64 | 512 | 0.241 |"
check "$r" "(t > heads)"
check "$r" "stated: NVLink 4, 900 GB/s bidirectional"
check "$r" "InfiniBand NDR, 400 Gb/s"

# Errors: exit 2 with the reason.
out=$(bash tools/bench_report.sh --gpu "$tmp/nowhere" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "no such directory" <<<"$out" || { echo "FAIL: missing dir -> $rc: $out"; fail=1; }
bad="$tmp/bad"; mkdir -p "$bad"; cp "$dir/machine.txt" "$bad/"; echo '{"benchmarks": ' > "$bad/tp_bench_cuda.json"
out=$(bash tools/bench_report.sh --gpu "$bad" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "tp_bench_cuda.json" <<<"$out" || { echo "FAIL: bad json -> $rc: $out"; fail=1; }
# A JSON file cut off after a complete row (a run stopped by its time limit) is read up to it.
cut="$tmp/cut"; mkdir -p "$cut"; cp "$dir/machine.txt" "$dir/tp_model_gpu.md" "$cut/"
/usr/bin/python3 - "$dir/tp_bench_cuda.json" "$cut/tp_bench_cuda_bf16.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["benchmarks"][:3]
text = '{"context": {}, "benchmarks": [\n' + ",\n".join(json.dumps(r) for r in rows) + ",\n"
open(sys.argv[2], "w").write(text)
PY
bash tools/bench_report.sh --gpu "$cut" > /dev/null 2>&1 || { echo "FAIL: cut-short json"; fail=1; }
check "$cut/REPORT_GPU.md" "**Cut short:** tp_bench_cuda_bf16.json stopped at its time limit"
check "$cut/REPORT_GPU.md" "| 2 | no | 0.144 | 0.187 | 2.23 |"
printf 'gemm bf16 1 2 3\n' > "$tmp/bad_profile.txt"
out=$(bench/tp_model_gpu_report --profile="$tmp/bad_profile.txt" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "line 1" <<<"$out" || { echo "FAIL: bad profile -> $rc: $out"; fail=1; }
out=$(bench/tp_model_gpu_report 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--profile=FILE is required" <<<"$out" || { echo "FAIL: no profile -> $rc: $out"; fail=1; }

[ $fail -eq 0 ] && echo "bench_report_gpu_test: all passed"
exit $fail
