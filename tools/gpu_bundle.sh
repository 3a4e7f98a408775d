#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here (this machine has Bazel and the CUDA toolkit but no GPU)
# and packs them into .gpu/ (git-ignored, about 13 MB) for a machine that has a GPU but no Bazel:
#   .gpu/bundle.tar.xz   bin/<package>/<binary> (our code linked statically, stripped) and lib/
#                        (the non-CUDA shared libraries they need: Abseil, OpenBLAS, ...)
#   .gpu/run.sh          unpacks to /tmp/gpu_bundle, runs every test, then //bench:cuda_bench and
#                        its PyTorch peer (bench/peers/cuda_ops_table.sh: cuda_ops_table.md);
#                        logs to $OUT if set
#
#   bash tools/gpu_bundle.sh            # then, on the GPU machine, from the repository root:
#   bash .gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

tests=$(bazel query --noshow_progress \
  'tests(//tensor/cuda/...) + attr(name, "gpu|cuda", tests(//tests:all))' \
  2>/dev/null || true)
tests="$tests
//collectives:in_process_gpu_test
//collectives:nccl_communicator_test
//collectives:nccl_multiprocess_test"
tests="$tests //bench:tp_layers_test"  # TP layers on virtual ranks of GPU 0 (tp-gpu)
extra="//collectives:launch //collectives:nccl_check //tests:gpu_nccl_mlp_check //bench:cuda_bench"
extra="$extra //bench:tp_bench //bench:tp_model_gpu_report"  # TP layers on the GPU (tools/tp_gpu_run.sh)
extra="$extra //bench:attention_bench"  # fused attention: tensor cores vs SIMT vs materialised

# shellcheck disable=SC2086
bazel build -c opt --dynamic_mode=off $tests $extra

rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for t in $tests $extra; do
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  mkdir -p ".gpu/bin/$pkg"
  cp "bazel-bin/$pkg/$name" ".gpu/bin/$pkg/$name"
  chmod u+w ".gpu/bin/$pkg/$name"
  strip --strip-debug ".gpu/bin/$pkg/$name"
done
# Shared libraries from the system (not CUDA's: the GPU machine has its own driver and toolkit).
find .gpu/bin -type f | while read -r b; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E 'libcuda|libcudart|libcublas|libnccl|linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl|librt|libgcc_s|libstdc\+\+' \
  | xargs -r -I{} cp -L {} .gpu/lib/

# cuda_bench's PyTorch peer and the table joining both (run by run.sh after cuda_bench).
mkdir -p .gpu/bin/bench/peers
cp bench/peers/torch_cuda_ops.py bench/peers/cuda_ops_table.py bench/peers/cuda_ops_table.sh \
  .gpu/bin/bench/peers/

tar -C .gpu -cf - bin lib | xz -T2 -6 > .gpu/bundle.tar.xz
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty)" > .gpu/commit.txt
rm -rf .gpu/bin .gpu/lib

cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs the bundled GPU tests and benchmarks (see tools/gpu_bundle.sh). Exit status: 0 iff every
# test passed.
gpu_dir="$(cd "$(dirname "$0")" && pwd)"
rm -rf /tmp/gpu_bundle && mkdir -p /tmp/gpu_bundle
tar -C /tmp/gpu_bundle -xJf "$(dirname "$0")/bundle.tar.xz"
cd /tmp/gpu_bundle/bin
export LD_LIBRARY_PATH="$PWD/../lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# CUDA's libraries may sit elsewhere there (e.g. NCCL only in a Python wheel): add their folders.
for d in $(find /usr /opt -name 'libnccl.so.2' -o -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' \
             2>/dev/null | xargs -r -n1 dirname | sort -u); do
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
nvidia-smi -L || true
fail=0
for t in $(find . -type f -name '*_test' | sed 's|^\./||' | sort); do
  if "./$t" > "$out/$(basename "$t").log" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  echo "$r $t $(grep -c '^\[  SKIPPED \] .*(' "$out/$(basename "$t").log") skipped"
  [ $r = FAIL ] && grep -E 'Failure|FAILED|error' "$out/$(basename "$t").log" | head -20
done
if [ -x bench/cuda_bench ]; then
  ./bench/cuda_bench --benchmark_min_time=0.2 --benchmark_out="$out/cuda_bench.json" \
    --benchmark_out_format=json 2>&1 | tee "$out/cuda_bench.txt" | tail -40
  # Ours vs PyTorch (the machine's python3) per case: $out/cuda_ops_table.md.
  if python3 -c "import torch" 2>/dev/null; then
    bash bench/peers/cuda_ops_table.sh ./bench/cuda_bench "$out" "$out/cuda_bench.json"
  else
    echo "cuda_ops_table: python3 has no torch; PyTorch side skipped"
  fi
fi
# Fused attention at GPT-2 124M's shape: tensor-core vs SIMT kernels, fused vs materialised layer.
if [ -x bench/attention_bench ]; then
  ./bench/attention_bench --benchmark_filter=Cuda --benchmark_min_time=0.2 2>&1 \
    | tee "$out/attention_bench.txt" | tail -14
fi
# TP layers on the GPU, the GPU TP model and the report's GPU section (~2-3 min; $out/REPORT_GPU.md).
[ -x bench/tp_bench ] && bash "$gpu_dir/../tools/tp_gpu_run.sh" "$PWD" "$out" "$(cat "$gpu_dir/commit.txt" 2>/dev/null)"
exit $fail
RUN
chmod +x .gpu/run.sh
du -sh .gpu
