// Multi-process NCCL check, one process per GPU, started by collectives/launch (see
// nccl_multiprocess_test): rendezvous from the environment, then every op against a host
// reference. Exit code 0 = all good, 1 = a wrong result or an error; without CUDA it prints why
// and exits 2, and on a bad flag 2 with the reason.
//
//   launch --nproc_per_node=2 -- nccl_check --count=4096 --timeout_s=60
//   nccl_check --help
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/nccl_communicator.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

ABSL_FLAG(int64_t, count, 1000003,
          "elements of the f32 all_reduce (1 to 2^28; odd sizes exercise NCCL's tails)");
ABSL_FLAG(double, timeout_s, 300,
          "seconds an NCCL call (and the rendezvous) may take before the communicator aborts");
ABSL_FLAG(int, device, -1, "CUDA device of this rank; -1: LOCAL_RANK modulo the visible GPUs");

namespace shardmap::collectives {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "nccl_check: %s\n", what.c_str());
  return 1;
}

#if SHARDMAP_HAS_CUDA
template <typename T>
std::vector<T> RoundTrip(const std::vector<T>& in, size_t out_count,
                         const std::function<absl::Status(const T*, T*)>& op, absl::Status* s) {
  T *d_in = nullptr, *d_out = nullptr;
  cudaMalloc(&d_in, std::max<size_t>(1, in.size()) * sizeof(T));
  cudaMalloc(&d_out, std::max<size_t>(1, out_count) * sizeof(T));
  cudaMemcpy(d_in, in.data(), in.size() * sizeof(T), cudaMemcpyHostToDevice);
  // A pageable host->device cudaMemcpy may return before its DMA lands, and the collectives
  // run on the communicator's non-blocking stream, which does not wait for the legacy stream.
  cudaDeviceSynchronize();
  *s = op(d_in, d_out);
  std::vector<T> out(out_count);
  cudaMemcpy(out.data(), d_out, out_count * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(d_in);
  cudaFree(d_out);
  return out;
}
#endif

int Main(size_t count, const NcclOptions& options) {
#if !SHARDMAP_HAS_CUDA
  (void)count;
  (void)options;
  std::fprintf(stderr, "nccl_check: built without CUDA\n");
  return 2;
#else
  auto comm = CreateNcclCommunicatorFromEnv(options);
  if (!comm.ok()) return Fail(comm.status().ToString());
  Communicator& c = **comm;
  const int n = c.size(), r = c.rank();
  absl::Status s;
  // all_reduce f32: element i on rank q is q + i (exact in f32): sum = n(n-1)/2 + n*i.
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + (i % 1000));
  auto y = RoundTrip<float>(x, count, [&](const float* a, float* b) {
    return c.AllReduce(a, b, count, DataType::kF32, ReduceOp::kSum);
  }, &s);
  if (!s.ok()) return Fail(s.ToString());
  for (size_t i = 0; i < count; ++i) {
    if (y[i] != n * (n - 1) / 2.0f + n * static_cast<float>(i % 1000)) {
      return Fail(absl::StrCat("all_reduce wrong at ", i));
    }
  }
  // all_gather + all_to_all of ranks' ids.
  std::vector<int32_t> mine(3, r);
  auto g = RoundTrip<int32_t>(mine, 3 * n, [&](const int32_t* a, int32_t* b) {
    return c.AllGather(a, b, 3, DataType::kI32);
  }, &s);
  if (!s.ok()) return Fail(s.ToString());
  for (int q = 0; q < n; ++q) {
    for (int j = 0; j < 3; ++j) {
      if (g[q * 3 + j] != q) return Fail("all_gather wrong");
    }
  }
  std::vector<int32_t> to(n);
  for (int q = 0; q < n; ++q) to[q] = r * 100 + q;
  auto a = RoundTrip<int32_t>(to, n, [&](const int32_t* in, int32_t* out) {
    return c.AllToAll(in, out, 1, DataType::kI32);
  }, &s);
  if (!s.ok()) return Fail(s.ToString());
  for (int q = 0; q < n; ++q) {
    if (a[q] != q * 100 + r) return Fail("all_to_all wrong");
  }
  // ppermute: shift by one, rank 0 receives nothing (zeros).
  std::vector<std::pair<int, int>> pairs;
  for (int q = 0; q + 1 < n; ++q) pairs.push_back({q, q + 1});
  auto p = RoundTrip<int32_t>(mine, 3, [&](const int32_t* in, int32_t* out) {
    return c.Ppermute(in, out, 3, DataType::kI32, pairs);
  }, &s);
  if (!s.ok()) return Fail(s.ToString());
  if (p[0] != (r == 0 ? 0 : r - 1)) return Fail("ppermute wrong");
  // Split by parity and reduce inside.
  auto sub = c.Split(r % 2, r);
  if (!sub.ok()) return Fail(sub.status().ToString());
  std::vector<int32_t> one = {1};
  auto cnt = RoundTrip<int32_t>(one, 1, [&](const int32_t* in, int32_t* out) {
    return (*sub)->AllReduce(in, out, 1, DataType::kI32, ReduceOp::kSum);
  }, &s);
  if (!s.ok()) return Fail(s.ToString());
  if (cnt[0] != (n + 1 - r % 2) / 2) return Fail("split all_reduce wrong");
  if (absl::Status b = c.Barrier(); !b.ok()) return Fail(b.ToString());
  std::printf("nccl_check ok: rank %d of %d\n", r, n);
  return 0;
#endif
}

}  // namespace
}  // namespace shardmap::collectives

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Checks NCCL collectives across the processes of a job (rendezvous from the torchrun/Slurm "
      "environment) against host references.\n  launch --nproc_per_node=N -- nccl_check "
      "[--count=1000003] [--timeout_s=300] [--device=-1]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  auto usage_error = [](const std::string& what) {
    std::fprintf(stderr, "nccl_check: %s (see --help)\n", what.c_str());
    return 2;
  };
  if (rest.size() > 1) return usage_error(absl::StrCat("unexpected argument '", rest[1], "'"));
  const int64_t count = absl::GetFlag(FLAGS_count);
  if (count < 1 || count > (int64_t{1} << 28)) {
    return usage_error(absl::StrCat("--count=", count, ": must be between 1 and 2^28"));
  }
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s > 0) || timeout_s > 86400) {
    return usage_error(absl::StrCat("--timeout_s=", timeout_s, ": must be in (0, 86400]"));
  }
  shardmap::collectives::NcclOptions options;
  options.timeout = absl::Seconds(timeout_s);
  options.device = absl::GetFlag(FLAGS_device);
  if (options.device < -1) {
    return usage_error(absl::StrCat("--device=", options.device, ": use -1 or a device index"));
  }
  return shardmap::collectives::Main(static_cast<size_t>(count), options);
}
