#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here (this machine has Bazel and the CUDA toolkit but no GPU)
# and packs them into .gpu/ (git-ignored) for a machine that has a GPU but no Bazel:
#   .gpu/bundle.tar.xz   bin/<package>/<binary> (our code linked statically, stripped) and lib/
#                        (the non-CUDA shared libraries they need: Abseil, OpenBLAS, ...)
#   .gpu/run.sh          unpacks to /tmp/gpu_bundle and runs tools/gpu_run.sh: first what must pass
#                        (the GPU tests, the determinism check, the NCCL overlap check: comm stream
#                        vs compute stream, host waits per step), then train_gpt on GPT-2 shapes
#                        against PyTorch, the GPT-2 step benchmark, the ops table, attention against
#                        PyTorch SDPA and the TP layers, inside a time budget (BUDGET_S: 420 s, 300 s
#                        with --quick), writing two files under $OUT (default /tmp/gpu_out): the
#                        report, summary.md, and every log in logs.tar.xz
# It then prints the bundle's size, the source tree's (what travels with it) and their sum, and
# fails if the sum is over what one device run carries (CARRY_LIMIT_MB, 64 MiB).
#
#   bash tools/gpu_bundle.sh            # then, on the GPU machine, from the repository root:
#   bash .gpu/run.sh                    # everything, under 8 minutes on one H100/H200
#   bash .gpu/run.sh --quick            # the must-pass checks first (tests, determinism, NCCL
#                                       # overlap), then the train_gpt row: about 5 minutes
set -euo pipefail
cd "$(dirname "$0")/.."

# Every cc_test under tensor/cuda and every cc_test whose name says gpu or cuda (the GPU variants
# of shardmap_cc_test included); shell tests stay here (they need Bazel's runfiles).
# Llama 3's GPU pieces come in this way: RMSNorm and SiLU (SwiGLU's gate) forward and backward in
# tensor/cuda/nn:nn_cuda_test and tensor/cuda/elementwise:elementwise_cuda_test, the grouped-query
# fused attention in tensor/cuda/attention:attention_cuda_test, and KV-cache generation on GPU
# ranks in models/llama:llama_generate_gpu_test.
tests=$(bazel query --noshow_progress \
  'kind("cc_test", tests(//tensor/cuda/...) + attr(name, "gpu|cuda", tests(//...)))' \
  2>/dev/null || true)
tests="$tests
//collectives:in_process_gpu_test
//collectives:nccl_communicator_test
//collectives:nccl_multiprocess_test
//collectives/conformance:nccl_conformance_test"
tests="$tests //bench:tp_layers_test"  # TP layers on virtual ranks of GPU 0 (tp-gpu)
extra="//collectives:launch //collectives:nccl_check //collectives:nccl_failure_check //tests:gpu_nccl_mlp_check //bench:cuda_bench"
extra="$extra //bench:tp_bench //bench:tp_model_gpu_report"  # TP layers on the GPU (tools/tp_gpu_run.sh)
extra="$extra //bench:gpt_bench //bench:attention_bench //models/train:train_gpt"  # GPT on the GPU
extra="$extra //tests:gpu_nccl_overlap_check"  # NCCL overlap and host waits (gpu_run.sh section 4)

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

# Tests that Bazel runs with SHARDMAP_TEST_PLACEMENT=gpu (shardmap_cc_test's GPU variants): the
# runner sets it for them (bin/gpu_placement_tests.txt, one package/name a line).
bazel query --noshow_progress \
  'attr(env, "SHARDMAP_TEST_PLACEMENT", kind("cc_test", tests(//...)))' 2>/dev/null \
  | sed 's|^//||; s|:|/|' > .gpu/bin/gpu_placement_tests.txt || true

tar -C .gpu -cf - bin lib | xz -T2 -9 > .gpu/bundle.tar.xz  # -9: a 64 MiB window finds the kernels every binary links
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty)" > .gpu/commit.txt
rm -rf .gpu/bin .gpu/lib

cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs the bundled GPU tests and benchmarks (see tools/gpu_bundle.sh and tools/gpu_run.sh). Exit
# status: 0 iff every test that ran passed.
gpu_dir="$(cd "$(dirname "$0")" && pwd)"
rm -rf /tmp/gpu_bundle && mkdir -p /tmp/gpu_bundle
tar -C /tmp/gpu_bundle -xJf "$gpu_dir/bundle.tar.xz"
export LD_LIBRARY_PATH="/tmp/gpu_bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# CUDA's libraries may sit elsewhere there (NCCL, cuBLASLt, cuDNN in Python wheels): add them.
for d in $(find /usr /opt -name 'libnccl.so.2' -o -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' \
             -o -name 'libcudnn.so.9' 2>/dev/null | xargs -r -n1 dirname | sort -u); do
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
nvidia-smi -L || true
exec bash "$gpu_dir/../tools/gpu_run.sh" /tmp/gpu_bundle/bin "$out" \
  "$(cat "$gpu_dir/commit.txt" 2>/dev/null)" "${1:-}"
RUN
chmod +x .gpu/run.sh

# What one device run carries (the device tool: 64 MiB in all): the tree that travels (tracked
# and untracked-but-not-ignored files, shared/ if present) plus the bundle (.gpu, named in carry).
limit_mb="${CARRY_LIMIT_MB:-64}"
bundle_bytes=$(du -sb .gpu | cut -f1)
tree_bytes=$( { git ls-files -z --cached --others --exclude-standard
                if [ -d shared ]; then find shared -type f -print0; fi; } \
              | xargs -0 -r stat -L -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}') || true
total=$((bundle_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_bundle: bundle .gpu $(mib "$bundle_bytes") (bundle.tar.xz $(mib "$(stat -c %s .gpu/bundle.tar.xz)")), tree $(mib "$tree_bytes"), together $(mib "$total") of the ${limit_mb} MiB one device run carries"
if [ "$total" -gt $((limit_mb * 1048576)) ]; then
  echo "gpu_bundle: too large to carry: drop binaries from the bundle or shrink the tree" >&2
  exit 1
fi
