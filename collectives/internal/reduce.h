// CPU reduction kernel shared by the in-process backend (and the host-staged GPU fallback).
//
//   const void* srcs[3] = {a, b, c};
//   ReduceBuffers(dst, srcs, 3, count, DataType::kBF16, ReduceOp::kSum);
//   // dst[i] = bf16(f32(a[i]) + f32(b[i]) + f32(c[i])), summed in source order, rounded once
//
// Deterministic: every element is reduced in source order 0..n-1. bf16/f16 accumulate in f32 and
// round once (RNE); integer sum/prod wrap (two's complement); avg is sum / n (integers truncate).
// dst may alias any one source exactly (in-place), never partially overlap one.
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_REDUCE_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_REDUCE_H_

#include <cstddef>

#include "collectives/communicator.h"

namespace shardmap::collectives::internal {

void ReduceBuffers(void* dst, const void* const* srcs, int n, size_t count, DataType dtype,
                   ReduceOp op);

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_REDUCE_H_
