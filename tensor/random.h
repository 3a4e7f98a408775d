// Counter-based random tensors (Philox-4x32-10 keyed by the seed, counter = flat index; normals
// by Box-Muller from one counter's four words): element i of a tensor is a pure function of
// (seed, i), so a shard can be generated alone and equals the same slice of the whole tensor. The
// same seed gives the same global weights on 1 or 64 ranks (sharding-invariant initialisation).
//
//   Tensor w = RandomNormal({1024, 4096}, /*seed=*/7);
//   // Rank r of 4 builds its column shard directly:
//   Tensor shard = RandomNormalSlice({1024, 4096}, {0, 1024 * r}, {1024, 1024}, 7);
//   // shard equals Slice(w, 1, 1024 * r, 1024).
//   // Generated directly on GPU 0 by a Philox kernel (no host copy), the same values:
//   Tensor wd = RandomNormal({1024, 4096}, 7, 0.0, 1.0, DType::kF32, Device::Cuda(0));
//
// On a GPU, uniform values and ints are bitwise equal to the CPU's; normals use the device's
// log and cos and may differ from the CPU's in the last bit or two of the f64 value.
// On Device::Meta() the same checks run and a data-less tensor of the shape comes back (nothing
// is drawn: initialisation is free in shape-only runs).
#ifndef SHARDMAP_TENSOR_RANDOM_H_
#define SHARDMAP_TENSOR_RANDOM_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace shardmap {

Tensor RandomNormal(absl::Span<const int64_t> shape, uint64_t seed, double mean = 0.0,
                    double stddev = 1.0, DType dtype = DType::kF32,
                    Device device = Device::Cpu());
// Uniform values lie in [low, high) in f64; rounding to a narrower dtype can reach `high`.
Tensor RandomUniform(absl::Span<const int64_t> shape, uint64_t seed, double low = 0.0,
                     double high = 1.0, DType dtype = DType::kF32,
                     Device device = Device::Cpu());

// The block of the global tensor starting at `offsets` with shape `local_shape`.
Tensor RandomNormalSlice(absl::Span<const int64_t> global_shape,
                         absl::Span<const int64_t> offsets,
                         absl::Span<const int64_t> local_shape, uint64_t seed, double mean = 0.0,
                         double stddev = 1.0, DType dtype = DType::kF32,
                         Device device = Device::Cpu());
Tensor RandomUniformSlice(absl::Span<const int64_t> global_shape,
                          absl::Span<const int64_t> offsets,
                          absl::Span<const int64_t> local_shape, uint64_t seed, double low = 0.0,
                          double high = 1.0, DType dtype = DType::kF32,
                     Device device = Device::Cpu());

// Uniform integers in [0, n) (i64), for token ids and targets.
Tensor RandomInts(absl::Span<const int64_t> shape, int64_t n, uint64_t seed,
                  Device device = Device::Cpu());
// The block of RandomInts(global_shape, n, seed) at `offsets` (e.g. one data-parallel rank's
// batch rows).
Tensor RandomIntsSlice(absl::Span<const int64_t> global_shape, absl::Span<const int64_t> offsets,
                       absl::Span<const int64_t> local_shape, int64_t n, uint64_t seed,
                       Device device = Device::Cpu());

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_RANDOM_H_
