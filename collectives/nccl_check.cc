// Multi-process NCCL check, one process per GPU, started by collectives/launch (see
// nccl_multiprocess_test): rendezvous from the environment, then every op against a host
// reference (all_reduce sum/max/min/avg, reduce_scatter and its V variant, all_gather and V,
// all_to_all and V, broadcast, ppermute, bf16, split). Exit code 0 = all good, 1 = a wrong
// result or an error; without CUDA it prints why and exits 2, and on a bad flag 2 with the reason.
//
//   launch --nproc_per_node=2 -- nccl_check --count=4096 --timeout_s=60
//   nccl_check --help
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/internal/half.h"
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
  // Garbage in the output, so an element an op fails to write (ppermute's zeros) cannot pass.
  cudaMemset(d_out, 0xA5, std::max<size_t>(1, out_count) * sizeof(T));
  // A pageable host->device cudaMemcpy may return before its DMA lands, and the collectives
  // run on the communicator's non-blocking stream, which does not wait for the legacy stream.
  cudaDeviceSynchronize();
  *s = op(d_in, d_out);
  // The collectives are stream-ordered on the communicator's stream (they return once
  // enqueued): the read waits for the device first (the caller's host wait).
  cudaDeviceSynchronize();
  std::vector<T> out(out_count);
  cudaMemcpy(out.data(), d_out, out_count * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(d_in);
  cudaFree(d_out);
  return out;
}
#endif

#if SHARDMAP_HAS_CUDA
// Signed small integers, exact in every float dtype and under any reduction order.
float Val(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((rank * 7 + i * 3) % 11) - 5);
}

// Runs op on device copies of `in` and compares with `want` (|got - want| <= tol).
std::string Expect(const char* what, const std::vector<float>& in, const std::vector<float>& want,
                   double tol, const std::function<absl::Status(const float*, float*)>& op) {
  absl::Status s;
  std::vector<float> got = RoundTrip<float>(in, want.size(), op, &s);
  if (!s.ok()) return absl::StrCat(what, ": ", s.ToString());
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      return absl::StrCat(what, " wrong at ", i, ": got ", got[i], ", want ", want[i]);
    }
  }
  return "";
}

// reduce_scatter (even and V), broadcast, all_gather V, all_to_all V, max/min/avg, and bf16:
// every result against a host reference. Returns "" or what went wrong.
std::string CheckMoreOps(Communicator& c) {
  const int n = c.size(), r = c.rank();
  std::string e;
  // all_reduce max / min / avg (f32) of signed values.
  const size_t m = 4099;
  std::vector<float> x(m), mx(m), mn(m), avg(m);
  for (size_t i = 0; i < m; ++i) {
    x[i] = Val(r, i);
    mx[i] = mn[i] = Val(0, i);
    double sum = 0;
    for (int q = 0; q < n; ++q) {
      mx[i] = std::max(mx[i], Val(q, i));
      mn[i] = std::min(mn[i], Val(q, i));
      sum += Val(q, i);
    }
    avg[i] = static_cast<float>(sum / n);
  }
  for (auto [op, want, name, tol] :
       {std::tuple{ReduceOp::kMax, &mx, "all_reduce max", 0.0},
        std::tuple{ReduceOp::kMin, &mn, "all_reduce min", 0.0},
        std::tuple{ReduceOp::kAvg, &avg, "all_reduce avg", 1e-6}}) {
    e = Expect(name, x, *want, tol, [&, op = op](const float* a, float* b) {
      return c.AllReduce(a, b, m, DataType::kF32, op);
    });
    if (!e.empty()) return e;
  }
  // reduce_scatter sum (f32): send n chunks of rc; rank r gets the sum of chunk r.
  const size_t rc = 1001;
  std::vector<float> send(n * rc), rs(rc);
  for (size_t j = 0; j < send.size(); ++j) send[j] = Val(r, j);
  for (size_t i = 0; i < rc; ++i) {
    rs[i] = 0;
    for (int q = 0; q < n; ++q) rs[i] += Val(q, r * rc + i);
  }
  e = Expect("reduce_scatter", send, rs, 0, [&](const float* a, float* b) {
    return c.ReduceScatter(a, b, rc, DataType::kF32, ReduceOp::kSum);
  });
  if (!e.empty()) return e;
  // Uneven: rank q's share is q + 1 elements (+ 500 to cross NCCL's chunking).
  std::vector<size_t> counts(n);
  size_t total = 0;
  std::vector<size_t> offset(n);
  for (int q = 0; q < n; ++q) {
    counts[q] = q + 501;
    offset[q] = total;
    total += counts[q];
  }
  std::vector<float> all(total), rsv(counts[r]);
  for (size_t j = 0; j < total; ++j) all[j] = Val(r, j);
  for (size_t i = 0; i < counts[r]; ++i) {
    rsv[i] = 0;
    for (int q = 0; q < n; ++q) rsv[i] += Val(q, offset[r] + i);
  }
  e = Expect("reduce_scatter_v", all, rsv, 0, [&](const float* a, float* b) {
    return c.ReduceScatterV(a, b, counts, DataType::kF32, ReduceOp::kSum);
  });
  if (!e.empty()) return e;
  std::vector<float> mine(counts[r]), agv(total);
  for (size_t i = 0; i < counts[r]; ++i) mine[i] = Val(r, 1000 + i);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < counts[q]; ++i) agv[offset[q] + i] = Val(q, 1000 + i);
  }
  e = Expect("all_gather_v", mine, agv, 0, [&](const float* a, float* b) {
    return c.AllGatherV(a, b, counts, DataType::kF32);
  });
  if (!e.empty()) return e;
  // all_to_all V: rank r sends (r + j) % 3 + 1 elements valued 1000 r + 10 j + k to rank j.
  std::vector<size_t> sc(n), rcv(n);
  std::vector<float> a2a_in, a2a_want;
  for (int j = 0; j < n; ++j) {
    sc[j] = (r + j) % 3 + 1;
    rcv[j] = (j + r) % 3 + 1;
    for (size_t k = 0; k < sc[j]; ++k) a2a_in.push_back(1000.0f * r + 10.0f * j + k);
    for (size_t k = 0; k < rcv[j]; ++k) a2a_want.push_back(1000.0f * j + 10.0f * r + k);
  }
  e = Expect("all_to_all_v", a2a_in, a2a_want, 0, [&](const float* a, float* b) {
    return c.AllToAllV(a, sc, b, rcv, DataType::kF32);
  });
  if (!e.empty()) return e;
  // broadcast from the last rank, in place; the others start with garbage.
  const int root = n - 1;
  std::vector<float> buf(777), bwant(777);
  for (size_t i = 0; i < buf.size(); ++i) {
    bwant[i] = Val(root, i);
    buf[i] = r == root ? bwant[i] : -12345.0f;
  }
  e = Expect("broadcast", buf, bwant, 0, [&](const float* a, float* b) {
    if (cudaMemcpy(b, a, buf.size() * sizeof(float), cudaMemcpyDeviceToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      return absl::InternalError("device copy failed");
    }
    return c.Broadcast(b, buf.size(), DataType::kF32, root);
  });
  if (!e.empty()) return e;
  // bf16 all_reduce sum and reduce_scatter max: small integers are exact in bf16.
  std::vector<uint16_t> h(n * rc), hsum(n * rc), hmax(rc);
  for (size_t j = 0; j < h.size(); ++j) {
    h[j] = internal::F32ToBF16(Val(r, j));
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += Val(q, j);
    hsum[j] = internal::F32ToBF16(sum);
  }
  for (size_t i = 0; i < rc; ++i) {
    float best = Val(0, r * rc + i);
    for (int q = 1; q < n; ++q) best = std::max(best, Val(q, r * rc + i));
    hmax[i] = internal::F32ToBF16(best);
  }
  absl::Status s;
  if (RoundTrip<uint16_t>(h, h.size(), [&](const uint16_t* a, uint16_t* b) {
        return c.AllReduce(a, b, h.size(), DataType::kBF16, ReduceOp::kSum);
      }, &s) != hsum || !s.ok()) {
    return absl::StrCat("bf16 all_reduce sum wrong ", s.ToString());
  }
  if (RoundTrip<uint16_t>(h, rc, [&](const uint16_t* a, uint16_t* b) {
        return c.ReduceScatter(a, b, rc, DataType::kBF16, ReduceOp::kMax);
      }, &s) != hmax || !s.ok()) {
    return absl::StrCat("bf16 reduce_scatter max wrong ", s.ToString());
  }
  return "";
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
  if (const std::string e = CheckMoreOps(c); !e.empty()) return Fail(e);
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
  auto usage_error = [](const std::string& what) {
    std::fprintf(stderr, "nccl_check: %s (see --help)\n", what.c_str());
    return 2;
  };
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          argc, argv,
          {.usage = "Checks NCCL collectives across the processes of a job (rendezvous from the "
                    "torchrun/Slurm environment) against host references.\n  launch "
                    "--nproc_per_node=N -- nccl_check [--count=1000003] [--timeout_s=300] "
                    "[--device=-1]",
           .positional_hint = ""});
      !s.ok()) {
    return usage_error(std::string(s.message()));
  }
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
