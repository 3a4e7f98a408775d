#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here (this machine has Bazel and the CUDA toolkit but no GPU)
# and gathers them into .gpu/ (git-ignored) for a machine that has a GPU but no Bazel:
#   .gpu/bin/<package>/<binary>   statically linked against our code, stripped
#   .gpu/lib/                     the non-CUDA shared libraries they need (Abseil, OpenBLAS, ...)
#   .gpu/run.sh                   runs every test, then //bench:cuda_bench; logs to $OUT if set
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
extra="//collectives:launch //collectives:nccl_check //bench:cuda_bench"

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
for b in .gpu/bin/*/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E 'libcuda|libcudart|libcublas|libnccl|linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl|librt|libgcc_s|libstdc\+\+' \
  | xargs -r -I{} cp -L {} .gpu/lib/

cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs the bundled GPU tests and benchmarks (see tools/gpu_bundle.sh). Exit status: 0 iff every
# test passed.
cd "$(dirname "$0")/bin"
export LD_LIBRARY_PATH="$PWD/../lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
nvidia-smi -L || true
fail=0
for t in $(ls */*_test 2>/dev/null); do
  if "./$t" > "$out/$(basename "$t").log" 2>&1; then r=PASS; else r=FAIL; fail=1; fi
  echo "$r $t $(grep -c '^\[  SKIPPED \]' "$out/$(basename "$t").log") skipped"
  [ $r = FAIL ] && grep -E 'Failure|FAILED|error' "$out/$(basename "$t").log" | head -20
done
if [ -x bench/cuda_bench ]; then
  ./bench/cuda_bench --benchmark_min_time=0.2 2>&1 | tee "$out/cuda_bench.txt" | tail -40
fi
exit $fail
RUN
chmod +x .gpu/run.sh
du -sh .gpu
