// Reduction kernel launchers (tensor/cuda/reduce/reduce_kernels.cu). Plain C++: raw device
// pointers, int64 sizes, a cudaStream_t as void*; each returns a cudaError_t as int.
//
//   // x: f32[4, 1000, 8] on the device; out: f32[4, 8] = sum over the middle axis.
//   LaunchReducePass(x, DType::kF32, out, DType::kF32, ReduceKind::kSum,
//                    /*outer=*/4, /*n=*/1000, /*inner=*/8, /*seg_len=*/1000, /*scale=*/1.0, s);
//
// The tensor-level driver (reduce_ops.cc) turns any set of reduced dims into passes over
// [outer, n, inner] views, and splits long axes into segments (one pass writes partial results
// per segment, the next pass folds those) so each thread folds a short sequence and the partial
// results meet in a tree: f32 sums stay accurate without f64 accumulation.
#ifndef SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_KERNELS_H_

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

enum class ReduceKind : int { kSum = 0, kMax = 1, kMin = 2 };

// ---- Host-side planning (header-only, so host tests can check it without a GPU) ----

// Which kernel folds a pass over [outer, n, inner] cut into segments of seg_len:
//   kColumn:   a thread per output (o, s, i) folds its segment down the column (inner > 1, or
//              rows of at most kThreadRowMax: a warp then reads 32 neighbouring short rows)
//   kRowWarp:  inner == 1, a warp per segment of up to kWarpRowMax
//   kRowBlock: inner == 1, a block per longer segment
enum class ReducePath { kColumn, kRowWarp, kRowBlock };
constexpr int64_t kThreadRowMax = 16;
constexpr int64_t kWarpRowMax = 2048;

inline ReducePath ChooseReducePath(int64_t inner, int64_t seg_len) {
  if (inner != 1 || seg_len <= kThreadRowMax) return ReducePath::kColumn;
  return seg_len <= kWarpRowMax ? ReducePath::kRowWarp : ReducePath::kRowBlock;
}

// The same choice for ArgMax (always one pass: seg_len = n).
inline ReducePath ChooseArgMaxPath(int64_t inner, int64_t n) { return ChooseReducePath(inner, n); }

// Segment length for one pass over [outer, n, inner] (n >= 1); n itself means "finish in this
// pass". Rows (inner == 1) are folded by a warp or block each: long rows are split when there are
// too few rows to fill the GPU or when one block would fold more than 32K elements. Columns
// (inner > 1) are folded by a thread each, sequentially, so they are cut into runs of 64. Every
// split has seg_len >= 2, so each pass shrinks n and the passes end.
inline int64_t ReduceSegmentLength(int64_t outer, int64_t n, int64_t inner) {
  if (inner == 1) {
    if (n <= 4096) return n;
    const int64_t a = (1024 + outer - 1) / outer, b = (n + 32767) / 32768;
    const int64_t want = a > b ? a : b;
    if (want <= 1) return n;
    const int64_t seg = (n + want - 1) / want;
    return seg > 2048 ? seg : 2048;
  }
  return n <= 128 ? n : 64;
}

// One pass over x viewed as [outer, n, inner] (row-major, contiguous, n >= 1). The n axis is cut
// into nseg = ceil(n / seg_len) segments; out, viewed as [outer, nseg, inner], gets
//   out[o, s, i] = fold over k in [s*seg_len, min(n, (s+1)*seg_len)) of x[o, k, i]
// times `scale` for kSum. Max/Min propagate NaN (any NaN in the fold gives NaN), like the CPU.
// Folds run in f32 for f32/bf16/f16 inputs and in f64 for f64. Dtype pairs (in, out): equal
// floating dtypes, (bf16|f16, f32) or (f32, bf16|f16); others give cudaErrorInvalidValue.
int LaunchReducePass(const void* x, DType in_dtype, void* out, DType out_dtype, ReduceKind kind,
                     int64_t outer, int64_t n, int64_t inner, int64_t seg_len, double scale,
                     void* stream);

// out[o, i] = index k in [0, n) of the max of x[o, k, i] (floating dtype, n >= 1): the first
// index on ties, the first NaN if there is one (like NumPy and the CPU op).
int LaunchArgMax(const void* x, DType dtype, int64_t* out, int64_t outer, int64_t n,
                 int64_t inner, void* stream);

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_KERNELS_H_
