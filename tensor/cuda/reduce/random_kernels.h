// On-device counter-based random fill (tensor/cuda/reduce/random_kernels.cu): the same
// Philox-4x32-10 scheme as tensor/random.cc, so a tensor generated on a GPU equals the CPU one
// (bitwise for uniform values and ints; normals use the device's log/cos, within an ulp or two).
//
//   RandomGeometry g = ...;  // the block [offsets, offsets + local) of a global row-major shape
//   LaunchRandom(out, DType::kF32, RandomKind::kUniform, g, /*seed=*/7, /*a=*/low,
//                /*b=*/high - low, /*n=*/0, stream);
#ifndef SHARDMAP_TENSOR_CUDA_REDUCE_RANDOM_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_REDUCE_RANDOM_KERNELS_H_

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

// The Philox stream (counter word 2) of each kind, as in tensor/random.cc.
enum class RandomKind : uint32_t { kUniform = 0, kNormal = 1, kInts = 2 };

constexpr int kRandomMaxRank = 16;

// Element l (row-major in the block of shape `local`) has global flat index
//   base + sum_k idx_k(l) * global_stride[k].
struct RandomGeometry {
  int rank = 0;
  int64_t local[kRandomMaxRank] = {};
  int64_t global_stride[kRandomMaxRank] = {};
  int64_t base = 0;    // sum_k offsets[k] * global_stride[k]
  int64_t numel = 0;   // product of local
};

// out[l] = value(global index of l), computed in f64 (a + b * x as one fma) and rounded once to
// dtype:
//   kUniform: a + b * u          (u in [0, 1) from 53 bits; a = low, b = high - low)
//   kNormal:  a + b * z          (z by Box-Muller; a = mean, b = stddev)
//   kInts:    floor(x * n / 2^64) (x 64 random bits), out is i64, dtype must be kI64
// dtype: f32, f64, bf16 or f16 for uniform/normal.
int LaunchRandom(void* out, DType dtype, RandomKind kind, const RandomGeometry& geometry,
                 uint64_t seed, double a, double b, int64_t n, void* stream);

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_REDUCE_RANDOM_KERNELS_H_
