// Layout kernels: tiled transpose, strided-gather permute, strided row copies.
#include "tensor/cuda/elementwise/layout_kernels.h"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::kernels {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32x8 block moves a 32x32 tile

// out[b, c, r] = in[b, r, c] for B batches of an R x C matrix. One 32x32 tile per block
// iteration: coalesced reads of input rows into shared memory, coalesced writes of output rows.
template <typename E>
__global__ void TransposeKernel(const E* __restrict__ in, E* __restrict__ out, int64_t B,
                                int64_t R, int64_t C) {
  __shared__ E tile[kTile][kTile + 1];  // +1: no bank conflicts on the column reads
  const int64_t tr = (R + kTile - 1) / kTile, tc = (C + kTile - 1) / kTile;
  const int64_t per_batch = tr * tc, tiles = B * per_batch;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b = t / per_batch, rem = t - b * per_batch;
    const int64_t r0 = (rem / tc) * kTile, c0 = (rem % tc) * kTile;
    const E* src = in + b * R * C;
    E* dst = out + b * R * C;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < R && c < C) tile[k][threadIdx.x] = src[r * C + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t c = c0 + k, r = r0 + threadIdx.x;
      if (c < C && r < R) dst[c * R + r] = tile[threadIdx.x][k];
    }
    __syncthreads();
  }
}

// Output dims innermost first.
template <typename I>
struct GatherDims {
  int rank;
  I sizes[kMaxPermuteRank];
  I strides[kMaxPermuteRank];
};

template <typename E, typename I>
__global__ void PermuteKernel(const E* __restrict__ in, E* __restrict__ out, int64_t n,
                              GatherDims<I> d) {
  SM_GRID_STRIDE_LOOP(i, n) {
    I rem = static_cast<I>(i), off = 0;
#pragma unroll
    for (int k = 0; k < kMaxPermuteRank; ++k) {
      if (k == d.rank) break;
      const I q = rem / d.sizes[k];
      off += (rem - q * d.sizes[k]) * d.strides[k];
      rem = q;
    }
    out[i] = in[off];
  }
}

template <typename I>
GatherDims<I> Reverse(const PermuteDims& p) {
  GatherDims<I> d{};
  d.rank = p.rank;
  for (int k = 0; k < p.rank; ++k) {
    d.sizes[k] = static_cast<I>(p.out_sizes[p.rank - 1 - k]);
    d.strides[k] = static_cast<I>(p.in_strides[p.rank - 1 - k]);
  }
  return d;
}

template <typename U, typename I>
__global__ void CopyRowsKernel(U* __restrict__ dst, I dst_pitch, const U* __restrict__ src,
                               I src_pitch, int64_t n, I width) {
  SM_GRID_STRIDE_LOOP(i, n) {
    const I r = static_cast<I>(i) / width, c = static_cast<I>(i) - r * width;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
}

template <typename U>
void CopyRowsAs(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t rows,
                int64_t row_bytes, cudaStream_t s) {
  const int64_t w = row_bytes / sizeof(U), n = rows * w;
  const int64_t dp = dst_pitch / sizeof(U), sp = src_pitch / sizeof(U);
  const int64_t span = (rows - 1) * (dp > sp ? dp : sp) + w;  // largest index touched, + 1
  if (n <= static_cast<int64_t>(UINT32_MAX) && span <= static_cast<int64_t>(UINT32_MAX)) {
    CopyRowsKernel<U, uint32_t><<<Blocks(n), kThreads, 0, s>>>(
        static_cast<U*>(dst), static_cast<uint32_t>(dp), static_cast<const U*>(src),
        static_cast<uint32_t>(sp), n, static_cast<uint32_t>(w));
  } else {
    CopyRowsKernel<U, int64_t><<<Blocks(n), kThreads, 0, s>>>(
        static_cast<U*>(dst), dp, static_cast<const U*>(src), sp, n, w);
  }
}

template <typename E>
void PermuteAs(const void* in_v, void* out_v, int64_t n, const PermuteDims& d, cudaStream_t s) {
  const E* in = static_cast<const E*>(in_v);
  E* out = static_cast<E*>(out_v);
  if constexpr (sizeof(E) <= 8) {  // wider units only come from row moves, never transposes
    int64_t B = 0, R = 0, C = 0;
    if (AsBatchedTranspose(d, &B, &R, &C)) {
      const int64_t tiles = B * ((R + kTile - 1) / kTile) * ((C + kTile - 1) / kTile);
      const unsigned grid = static_cast<unsigned>(tiles < 65535LL * 32 ? tiles : 65535LL * 32);
      TransposeKernel<E><<<grid, dim3(kTile, kTileRows), 0, s>>>(in, out, B, R, C);
      return;
    }
  }
  if (n <= static_cast<int64_t>(UINT32_MAX)) {
    PermuteKernel<E, uint32_t><<<Blocks(n), kThreads, 0, s>>>(in, out, n, Reverse<uint32_t>(d));
  } else {
    PermuteKernel<E, int64_t><<<Blocks(n), kThreads, 0, s>>>(in, out, n, Reverse<int64_t>(d));
  }
}

}  // namespace

int LaunchCopyRows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                   int64_t rows, int64_t row_bytes, void* stream) {
  if (rows <= 0 || row_bytes <= 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  const uint64_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                        static_cast<uint64_t>(dst_pitch) | static_cast<uint64_t>(src_pitch) |
                        static_cast<uint64_t>(row_bytes);
  if (bits % 16 == 0) {
    CopyRowsAs<uint4>(dst, dst_pitch, src, src_pitch, rows, row_bytes, s);
  } else if (bits % 8 == 0) {
    CopyRowsAs<uint2>(dst, dst_pitch, src, src_pitch, rows, row_bytes, s);
  } else if (bits % 4 == 0) {
    CopyRowsAs<uint32_t>(dst, dst_pitch, src, src_pitch, rows, row_bytes, s);
  } else if (bits % 2 == 0) {
    CopyRowsAs<uint16_t>(dst, dst_pitch, src, src_pitch, rows, row_bytes, s);
  } else {
    CopyRowsAs<uint8_t>(dst, dst_pitch, src, src_pitch, rows, row_bytes, s);
  }
  return cudaGetLastError();
}

int LaunchPermute(const void* in, void* out, int64_t n, int elem_bytes, const PermuteDims& d,
                  void* stream) {
  if (n == 0) return cudaSuccess;
  if (d.rank > kMaxPermuteRank) return cudaErrorInvalidValue;
  if (d.rank <= 1) {  // nothing moves: one contiguous copy
    return LaunchCopyRows(out, 0, in, 0, 1, n * elem_bytes, stream);
  }
  const cudaStream_t s = AsStream(stream);
  PermuteDims w = d;  // whole rows in wider units where possible
  WidenPermute(&w, &elem_bytes, &n,
               reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out));
  switch (elem_bytes) {
    case 2: PermuteAs<uint16_t>(in, out, n, w, s); break;
    case 4: PermuteAs<uint32_t>(in, out, n, w, s); break;
    case 8: PermuteAs<uint64_t>(in, out, n, w, s); break;
    case 16: PermuteAs<uint4>(in, out, n, w, s); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::kernels
