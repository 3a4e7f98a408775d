#include "tensor/cuda/kernels/kernel_util.cuh"
#include "tensor/cuda/reduce/random_kernels.h"
#include "tensor/internal/philox.h"

namespace shardmap::cuda::kernels {
namespace {

using ::shardmap::internal::Philox;  // tensor/internal/philox.h: the CPU's generator, compiled for the device

// 53 random bits as a double in [0, 1) (exact: the conversion and the power-of-two scale).
__device__ __forceinline__ double Unit(uint32_t hi, uint32_t lo) {
  const uint64_t x = (static_cast<uint64_t>(hi) << 32) | lo;
  return __dmul_rn(static_cast<double>(x >> 11), 0x1p-53);
}

// a + b * u as one explicit fma, like tensor/random.cc (std::fma): the same rounding on both
// sides whatever the compilers contract. Other products use _rn so nvcc contracts nothing.
__device__ __forceinline__ double UniformAt(uint64_t g, uint64_t seed, double a, double b) {
  const ::shardmap::internal::Block w = Philox(g, static_cast<uint32_t>(RandomKind::kUniform), seed);
  return __fma_rn(b, Unit(w.v[0], w.v[1]), a);
}

__device__ __forceinline__ double NormalAt(uint64_t g, uint64_t seed, double a, double b) {
  const ::shardmap::internal::Block w = Philox(g, static_cast<uint32_t>(RandomKind::kNormal), seed);
  const double u1 = __dsub_rn(1.0, Unit(w.v[0], w.v[1]));  // (0, 1]: log is finite
  const double u2 = Unit(w.v[2], w.v[3]);
  constexpr double kTwoPi = 2.0 * 3.14159265358979323846;
  const double z = __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(kTwoPi, u2)));
  return __fma_rn(b, z, a);
}

__device__ __forceinline__ int64_t IntAt(uint64_t g, uint64_t seed, uint64_t n) {
  const ::shardmap::internal::Block w = Philox(g, static_cast<uint32_t>(RandomKind::kInts), seed);
  const uint64_t x = (static_cast<uint64_t>(w.v[0]) << 32) | w.v[1];
  return static_cast<int64_t>(__umul64hi(x, n));
}

// f64 -> f32 with round-to-odd, so the later f32 -> bf16/f16 rounding is one correct rounding of
// the f64 value (as DoubleToFloatRoundToOdd in tensor/ops/shape_ops.cc).
__device__ __forceinline__ float RoundToOdd(double d) {
  const float f = __double2float_rz(d);
  if (d != d || static_cast<double>(f) == d) return __double2float_rn(d);
  return __uint_as_float(__float_as_uint(f) | 1u);
}

template <typename T> __device__ __forceinline__ T Store(double v);
template <> __device__ __forceinline__ float Store<float>(double v) { return __double2float_rn(v); }
template <> __device__ __forceinline__ double Store<double>(double v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(RoundToOdd(v));
}
template <> __device__ __forceinline__ __half Store<__half>(double v) {
  return __float2half_rn(RoundToOdd(v));
}

__device__ __forceinline__ uint64_t GlobalIndex(const RandomGeometry& geo, int64_t l) {
  int64_t g = geo.base;
  for (int k = geo.rank - 1; k >= 0 && l > 0; --k) {
    const int64_t q = l / geo.local[k];
    g += (l - q * geo.local[k]) * geo.global_stride[k];
    l = q;
  }
  return static_cast<uint64_t>(g);
}

template <typename T, RandomKind K>
__global__ void RandomKernel(T* __restrict__ out, RandomGeometry geo, uint64_t seed, double a,
                             double b) {
  SM_GRID_STRIDE_LOOP(l, geo.numel) {
    const uint64_t g = GlobalIndex(geo, l);
    if constexpr (K == RandomKind::kUniform) {
      out[l] = Store<T>(UniformAt(g, seed, a, b));
    } else {
      out[l] = Store<T>(NormalAt(g, seed, a, b));
    }
  }
}

__global__ void RandomIntsKernel(int64_t* __restrict__ out, RandomGeometry geo, uint64_t seed,
                                 uint64_t n) {
  SM_GRID_STRIDE_LOOP(l, geo.numel) { out[l] = IntAt(GlobalIndex(geo, l), seed, n); }
}

}  // namespace

int LaunchRandom(void* out, DType dtype, RandomKind kind, const RandomGeometry& geometry,
                 uint64_t seed, double a, double b, int64_t n, void* stream) {
  if (geometry.numel == 0) return cudaSuccess;
  if (geometry.rank < 0 || geometry.rank > kRandomMaxRank) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  const unsigned blocks = Blocks(geometry.numel);
  if (kind == RandomKind::kInts) {
    if (dtype != DType::kI64 || n <= 0) return cudaErrorInvalidValue;
    RandomIntsKernel<<<blocks, kThreads, 0, s>>>(static_cast<int64_t*>(out), geometry, seed,
                                                 static_cast<uint64_t>(n));
    return cudaGetLastError();
  }
  SM_DISPATCH_FLOAT(dtype, T, {
    if (kind == RandomKind::kUniform) {
      RandomKernel<T, RandomKind::kUniform><<<blocks, kThreads, 0, s>>>(static_cast<T*>(out),
                                                                        geometry, seed, a, b);
    } else {
      RandomKernel<T, RandomKind::kNormal><<<blocks, kThreads, 0, s>>>(static_cast<T*>(out),
                                                                       geometry, seed, a, b);
    }
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::kernels
