// Layout kernel launchers (layout.cu, cast.cu) for the CUDA side of tensor/ops/shape_ops.h:
// permutes, strided row copies (slice, slice-assign, concat) and dtype casts. Plain host
// functions on raw device pointers; each returns a cudaError_t as int. Layout kernels move bits
// (any dtype of the given element size); casts convert values exactly like the CPU Cast.
//
//   // Permute f32[2,3,4] by {1,2,0}:
//   PermuteDims d;
//   CollapsePermute(std::vector<int64_t>{2, 3, 4}.data(), perm, 3, &d);   // true
//   LaunchPermute(in, out, 24, /*elem_bytes=*/4, d, stream);
//   // Slice dim 1 [2, 7) of f32[4,10]: 4 rows of 5*4 bytes, source pitch 40, dest pitch 20.
//   LaunchCopyRows(out, 20, in + 2 * 4, 40, /*rows=*/4, /*row_bytes=*/20, stream);
#ifndef SHARDMAP_TENSOR_CUDA_ELEMENTWISE_LAYOUT_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_ELEMENTWISE_LAYOUT_KERNELS_H_

#include <cstdint>
#include <initializer_list>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

constexpr int kMaxPermuteRank = 8;

// A permutation after collapsing: size-1 dims dropped, input dims that stay adjacent and in
// order in the output merged. For output dim k (outermost first): its size and the input stride
// (in elements) it walks.
struct PermuteDims {
  int rank = 0;
  int64_t out_sizes[kMaxPermuteRank] = {};
  int64_t in_strides[kMaxPermuteRank] = {};
};

// Collapses permuting `in_shape` (rank dims) by `perm` (out dim k = in dim perm[k], a valid
// permutation). Returns false when more than kMaxPermuteRank dims remain. Header-only host code.
//
//   [2,3,4] perm {0,2,1}  -> out_sizes {2,4,3}, in_strides {12,1,4}
//   [2,3,4] perm {2,0,1}  -> out_sizes {4,6},   in_strides {1,4}     (dims 0,1 merged)
//   [5,1,7] perm {2,1,0}  -> out_sizes {7,5},   in_strides {1,7}
inline bool CollapsePermute(const int64_t* in_shape, const int* perm, int rank, PermuteDims* d) {
  if (rank > 64) return false;
  int64_t stride[64];
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    stride[i] = s;
    s *= in_shape[i];
  }
  d->rank = 0;
  int prev_in = -2;  // the input dim of the last kept output dim
  for (int k = 0; k < rank; ++k) {
    const int in = perm[k];
    if (in_shape[in] == 1) continue;
    const int r = d->rank;
    // Merge when this input dim directly follows the previous kept one in the input, with only
    // size-1 dims between them (they do not move any pointer).
    bool adjacent = prev_in >= 0 && in > prev_in;
    for (int j = prev_in + 1; adjacent && j < in; ++j) adjacent = in_shape[j] == 1;
    if (adjacent && r > 0) {
      d->out_sizes[r - 1] *= in_shape[in];
      d->in_strides[r - 1] = stride[in];
    } else {
      if (r == kMaxPermuteRank) return false;
      d->out_sizes[r] = in_shape[in];
      d->in_strides[r] = stride[in];
      d->rank = r + 1;
    }
    prev_in = in;
  }
  return true;
}

// When the input's innermost dim stays innermost (e.g. [b,s,h,d] -> [b,h,s,d]), whole output
// rows are contiguous input rows: rewrites *d, *elem_bytes and *n to move them in the widest
// unit (8 or 16 bytes, or 4) that the row size and the pointers' alignment (`addr_bits`: the
// pointers OR-ed) allow. Every other input stride is a multiple of the row, so it is the same
// permutation of wider elements. Returns whether it widened. Header-only host code.
//
//   bf16 [2,3,4,64] perm {0,2,1,3}: rows of 128 bytes -> elem_bytes 16, out_sizes {2,4,3,8}
inline bool WidenPermute(PermuteDims* d, int* elem_bytes, int64_t* n, uint64_t addr_bits) {
  const int last = d->rank - 1;
  if (last < 0 || d->in_strides[last] != 1) return false;
  const int64_t row_bytes = d->out_sizes[last] * *elem_bytes;
  for (int unit : {16, 8, 4}) {
    if (unit <= *elem_bytes) return false;
    if (row_bytes % unit == 0 && addr_bits % unit == 0) {
      const int64_t f = unit / *elem_bytes;
      d->out_sizes[last] /= f;
      for (int k = 0; k < last; ++k) d->in_strides[k] /= f;
      *n /= f;
      *elem_bytes = unit;
      return true;
    }
  }
  return false;
}

// Whether d is a (batched) transpose of the last two dims: in [B, R, C] -> out [B, C, R] (B = 1
// for a plain 2-D transpose). Header-only host code.
inline bool AsBatchedTranspose(const PermuteDims& d, int64_t* B, int64_t* R, int64_t* C) {
  if (d.rank == 2 && d.in_strides[0] == 1 && d.in_strides[1] == d.out_sizes[0]) {
    *B = 1, *R = d.out_sizes[1], *C = d.out_sizes[0];
    return true;
  }
  if (d.rank == 3 && d.in_strides[1] == 1 && d.in_strides[2] == d.out_sizes[1] &&
      d.in_strides[0] == d.out_sizes[1] * d.out_sizes[2]) {
    *B = d.out_sizes[0], *R = d.out_sizes[2], *C = d.out_sizes[1];
    return true;
  }
  return false;
}

// out (contiguous, n elements of elem_bytes = 2, 4 or 8) = the permutation described by d of
// in. Collapsed forms [r,c] -> [c,r] and [b,r,c] -> [b,c,r] use a tiled shared-memory
// transpose; rank <= 1 is a straight copy; the rest a strided gather with coalesced writes.
int LaunchPermute(const void* in, void* out, int64_t n, int elem_bytes, const PermuteDims& d,
                  void* stream);

// For r < rows: copies row_bytes bytes from src + r * src_pitch to dst + r * dst_pitch (all in
// bytes; the rows must not overlap). Moves 16, 8, 4, 2 or 1 bytes at a time, the widest that
// every pointer and size allows.
int LaunchCopyRows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                   int64_t rows, int64_t row_bytes, void* stream);

// out[i] = in[i] converted from `from` to `to` (n elements), exactly as the CPU Cast: floats to
// bf16/f16 round to nearest even once (f64 through a round-to-odd f32), float -> int truncates
// (NaN and out-of-range give the integer minimum, as x86's cvttsd2si the CPU build uses), other
// pairs go through double.
int LaunchCast(const void* in, DType from, void* out, DType to, int64_t n, void* stream);

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_ELEMENTWISE_LAYOUT_KERNELS_H_
