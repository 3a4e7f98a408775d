#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "collectives/internal/device_reduce.h"

namespace shardmap::collectives::internal {
namespace {

// Mirrors collectives::DataType / ReduceOp (communicator.h), which nvcc does not include.
enum Dt { kF32, kF64, kBF16, kF16, kI32, kI64 };
enum Op { kSum, kProd, kMax, kMin, kAvg };

struct Srcs {
  const void* p[kMaxDeviceReduceSources];
};

struct Bf16T {
  using S = uint16_t;
  using A = float;
  __device__ static A Load(S v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
  __device__ static S Store(A v) {
    uint32_t x = __float_as_uint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<S>((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<S>(x >> 16);
  }
};
struct F16T {
  using S = uint16_t;
  using A = float;
  __device__ static A Load(S v) { return __half2float(__ushort_as_half(v)); }
  __device__ static S Store(A v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <typename T, typename U>
struct PlainT {
  using S = T;
  using A = U;  // unsigned for integers: sums and products wrap
  __device__ static A Load(S v) { return static_cast<A>(v); }
  __device__ static S Store(A v) { return static_cast<S>(v); }
};

template <typename Tr, int kOp, bool kInt>
__global__ void ReduceKernel(typename Tr::S* dst, Srcs srcs, int n, size_t count) {
  using S = typename Tr::S;
  using A = typename Tr::A;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    A acc = Tr::Load(static_cast<const S*>(srcs.p[0])[i]);
    for (int r = 1; r < n; ++r) {
      const A v = Tr::Load(static_cast<const S*>(srcs.p[r])[i]);
      if (kOp == kSum || kOp == kAvg) acc = acc + v;
      if (kOp == kProd) acc = acc * v;
      if (kInt) {
        if (kOp == kMax) acc = static_cast<S>(v) > static_cast<S>(acc) ? v : acc;
        if (kOp == kMin) acc = static_cast<S>(v) < static_cast<S>(acc) ? v : acc;
      } else {
        if (kOp == kMax) acc = v > acc ? v : acc;
        if (kOp == kMin) acc = v < acc ? v : acc;
      }
    }
    if (kOp == kAvg) {
      if (kInt) {
        dst[i] = static_cast<S>(static_cast<S>(acc) / n);
        continue;
      }
      acc = acc / static_cast<A>(n);
    }
    dst[i] = Tr::Store(acc);
  }
}

template <typename Tr, bool kInt>
cudaError_t LaunchOp(void* dst, const Srcs& s, int n, size_t count, int op, cudaStream_t stream) {
  const int threads = 256;
  const int blocks = static_cast<int>((count + threads - 1) / threads < 4096
                                          ? (count + threads - 1) / threads
                                          : 4096);
  auto* d = static_cast<typename Tr::S*>(dst);
  switch (op) {
    case kSum: ReduceKernel<Tr, kSum, kInt><<<blocks, threads, 0, stream>>>(d, s, n, count); break;
    case kProd: ReduceKernel<Tr, kProd, kInt><<<blocks, threads, 0, stream>>>(d, s, n, count); break;
    case kMax: ReduceKernel<Tr, kMax, kInt><<<blocks, threads, 0, stream>>>(d, s, n, count); break;
    case kMin: ReduceKernel<Tr, kMin, kInt><<<blocks, threads, 0, stream>>>(d, s, n, count); break;
    case kAvg: ReduceKernel<Tr, kAvg, kInt><<<blocks, threads, 0, stream>>>(d, s, n, count); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

int DeviceReduceLaunch(void* dst, const void* const* srcs, int n, size_t count, int dtype,
                       int op, void* stream) {
  if (count == 0) return cudaSuccess;
  if (n < 1 || n > kMaxDeviceReduceSources) return cudaErrorInvalidValue;
  Srcs s{};
  for (int r = 0; r < n; ++r) s.p[r] = srcs[r];
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kF32: return LaunchOp<PlainT<float, float>, false>(dst, s, n, count, op, st);
    case kF64: return LaunchOp<PlainT<double, double>, false>(dst, s, n, count, op, st);
    case kBF16: return LaunchOp<Bf16T, false>(dst, s, n, count, op, st);
    case kF16: return LaunchOp<F16T, false>(dst, s, n, count, op, st);
    case kI32: return LaunchOp<PlainT<int32_t, uint32_t>, true>(dst, s, n, count, op, st);
    case kI64: return LaunchOp<PlainT<int64_t, uint64_t>, true>(dst, s, n, count, op, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace shardmap::collectives::internal
