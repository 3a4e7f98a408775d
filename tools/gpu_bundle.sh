#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here (this machine has Bazel and the CUDA toolkit but no GPU)
# and packs them into .gpu/ (git-ignored, about 13 MB) for a machine that has a GPU but no Bazel:
#   .gpu/bundle.tar.xz   bin/<package>/<binary> (our code linked statically, stripped) and lib/
#                        (the non-CUDA shared libraries they need: Abseil, OpenBLAS, ...)
#   .gpu/run.sh          unpacks to /tmp/gpu_bundle, runs every test, then //bench:cuda_bench;
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
extra="//collectives:launch //collectives:nccl_check //tests:gpu_nccl_mlp_check //bench:cuda_bench"
extra="$extra //models:train_gpt //bench:gpt_bench"  # the GPT trainer and its benchmark (--device=cuda)

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

tar -C .gpu -cf - bin lib | xz -T2 -6 > .gpu/bundle.tar.xz
rm -rf .gpu/bin .gpu/lib

cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs the bundled GPU tests and benchmarks (see tools/gpu_bundle.sh). Exit status: 0 iff every
# test passed.
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
  ./bench/cuda_bench --benchmark_min_time=0.2 2>&1 | tee "$out/cuda_bench.txt" | tail -40
fi
exit $fail
RUN
chmod +x .gpu/run.sh
du -sh .gpu
