// In-process backend on GPU memory: several ranks (threads) sharing GPU 0, each on its own
// stream. Results are compared bitwise with the same collectives on host memory (themselves
// tested against serial references in in_process_test). Skips without a GPU.
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "collectives/internal/gpu_count.h"
#include "collectives/internal/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;

InProcessOptions OnGpu0() {
  InProcessOptions o;
  o.timeout = absl::Seconds(30);
  o.memory_space = [](int) { return MemorySpace{/*device=*/true, /*device_index=*/0, nullptr}; };
  return o;
}

TEST(InProcessGpuTest, DeviceMemoryWithoutAGpuFailsClearly) {
  if (internal::VisibleGpuCount() > 0) GTEST_SKIP() << "a GPU is visible";
  const absl::Time start = absl::Now();
  absl::Status s = RunInProcess(3, [](Communicator& c) { return c.Barrier(); }, OnGpu0());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(s.ok());
#if SHARDMAP_HAS_CUDA
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaSetDevice"));
#else
  EXPECT_THAT(std::string(s.message()), HasSubstr("this build has no CUDA"));
#endif
}

#if SHARDMAP_HAS_CUDA

// Per-rank inputs of dtype dt: small integers in [-3, 3], negatives and zeros included, so
// sums, products, min/max and averages are exact (and equal however the reduction is ordered).
std::vector<char> Input(int rank, DataType dt, size_t count) {
  std::vector<char> v(count * DataTypeSize(dt));
  for (size_t i = 0; i < count; ++i) {
    const int x = static_cast<int>((rank * 37 + i * 11) % 7) - 3;
    char* p = v.data() + i * DataTypeSize(dt);
    auto put = [p](auto value) { std::memcpy(p, &value, sizeof(value)); };
    switch (dt) {
      case DataType::kF32: put(static_cast<float>(x)); break;
      case DataType::kF64: put(static_cast<double>(x)); break;
      case DataType::kBF16: put(internal::F32ToBF16(static_cast<float>(x))); break;
      case DataType::kF16: put(internal::F32ToF16(static_cast<float>(x))); break;
      case DataType::kI32: put(static_cast<int32_t>(x)); break;
      case DataType::kI64: put(static_cast<int64_t>(x)); break;
    }
  }
  return v;
}

// Outputs start as this byte on host and device, so an element an op fails to write (e.g. the
// zeros ppermute owes a rank that receives nothing) cannot pass as a pre-zeroed 0.
constexpr unsigned char kGarbage = 0xA5;

// Runs `body` with the same per-rank inputs on host memory and on GPU memory; returns both
// ranks' outputs (bytes) for comparison.
struct Outputs {
  std::vector<std::vector<char>> host, device;
};

using Body = std::function<absl::Status(Communicator&, const char* in, char* out)>;

Outputs RunBoth(int n, DataType dt, size_t in_count, size_t out_bytes, const Body& body) {
  Outputs o;
  o.host.resize(n);
  o.device.resize(n);
  const size_t in_bytes = in_count * DataTypeSize(dt);
  absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
    std::vector<char> in = Input(c.rank(), dt, in_count);
    o.host[c.rank()].assign(out_bytes, static_cast<char>(kGarbage));
    return body(c, in.data(), o.host[c.rank()].data());
  });
  EXPECT_TRUE(s.ok()) << s;
  s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
    if (!c.memory_space().device || c.memory_space().stream == nullptr) {
      return absl::InternalError("expected device memory with a stream");
    }
    std::vector<char> in = Input(c.rank(), dt, in_count);
    char *d_in = nullptr, *d_out = nullptr;
    cudaMalloc(&d_in, in_bytes + 1);
    cudaMalloc(&d_out, out_bytes + 1);
    cudaMemcpy(d_in, in.data(), in_bytes, cudaMemcpyHostToDevice);
    cudaMemset(d_out, kGarbage, out_bytes);
    // Both may still be in flight on the legacy stream (cudaMemset is asynchronous, and a
    // pageable host->device cudaMemcpy may return before its DMA lands); the collective runs
    // on this rank's non-blocking stream, which does not wait for them.
    if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
      return absl::InternalError(cudaGetErrorString(e));
    }
    absl::Status st = body(c, d_in, d_out);
    o.device[c.rank()].assign(out_bytes, 0);
    cudaMemcpy(o.device[c.rank()].data(), d_out, out_bytes, cudaMemcpyDeviceToHost);
    cudaFree(d_in);
    cudaFree(d_out);
    return st;
  }, OnGpu0());
  EXPECT_TRUE(s.ok()) << s;
  return o;
}

TEST(InProcessGpuTest, MatchesHostBitwise) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible";
  for (int n : {1, 2, 3, 5}) {
    // 1031 elements: every rank reduces everything (below 32 KiB, out of place); 20011: the
    // reduce-scatter + all-gather phases, out of place and in place.
    for (const size_t count : {size_t{1031}, size_t{20011}}) {
      for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16, DataType::kI32,
                          DataType::kF64}) {
        const size_t esz = DataTypeSize(dt);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                            ReduceOp::kAvg}) {
          for (const bool in_place : {false, true}) {
            Outputs o = RunBoth(n, dt, count, count * esz, [&](Communicator& c, const char* in,
                                                                char* out) -> absl::Status {
              if (!in_place) return c.AllReduce(in, out, count, dt, op);
              if (!c.memory_space().device) {
                std::memcpy(out, in, count * esz);
              } else if (cudaMemcpy(out, in, count * esz, cudaMemcpyDeviceToDevice) !=
                             cudaSuccess ||
                         cudaDeviceSynchronize() != cudaSuccess) {
                return absl::InternalError("device copy failed");
              }
              return c.AllReduce(out, out, count, dt, op);
            });
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(o.device[r], o.host[r])
                  << "n=" << n << " count=" << count << " " << DataTypeName(dt) << " "
                  << ReduceOpName(op) << (in_place ? " in place" : "") << " rank " << r;
            }
          }
        }
      }
    }
    Outputs g = RunBoth(n, DataType::kF32, 10, 40 * n, [&](Communicator& c, const char* in,
                                                           char* out) {
      return c.AllGather(in, out, 10, DataType::kF32);
    });
    Outputs a = RunBoth(n, DataType::kF32, 2 * n, 8 * n, [&](Communicator& c, const char* in,
                                                             char* out) {
      return c.AllToAll(in, out, 2, DataType::kF32);
    });
    std::vector<std::pair<int, int>> pairs;
    for (int r = 0; r + 1 < n; ++r) pairs.push_back({r, r + 1});  // rank 0 gets zeros
    Outputs p = RunBoth(n, DataType::kF32, 6, 24, [&](Communicator& c, const char* in, char* out) {
      return c.Ppermute(in, out, 6, DataType::kF32, pairs);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(g.device[r], g.host[r]) << "all_gather n=" << n;
      EXPECT_EQ(a.device[r], a.host[r]) << "all_to_all n=" << n;
      EXPECT_EQ(p.device[r], p.host[r]) << "ppermute n=" << n;
    }
    // The rank that receives nothing holds zeros (written, not left from before), the others
    // their source's block.
    EXPECT_EQ(p.device[0], std::vector<char>(24, 0)) << "ppermute n=" << n;
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(p.device[r], Input(r - 1, DataType::kF32, 6)) << "ppermute n=" << n;
    }
  }
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace
}  // namespace shardmap::collectives
