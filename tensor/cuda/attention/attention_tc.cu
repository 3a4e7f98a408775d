// Tensor-core fused causal attention (see tc_kernels.h, tc_tiling.h). Products through WMMA
// 16x16x16 bf16/f16 fragments with f32 accumulators; every accumulator goes through shared
// memory (store_matrix_sync) before threads read it, so no code depends on the fragments'
// register layout. Lane pairs own rows: lane l of warp w handles row 16 w + l / 2 and the
// columns c with c % 2 == l % 2 of the 64-wide score tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <atomic>
#include <type_traits>
#include <climits>
#include <cstdint>

#include "tensor/cuda/attention/kernels.h"
#include "tensor/cuda/attention/tc_kernels.h"
#include "tensor/cuda/attention/tc_tiling.h"
#include "tensor/cuda/attention/tiling.h"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::attention_kernels {
namespace {

namespace wmma = nvcuda::wmma;
using kernels::AsStream;
using kernels::FromAcc;
using kernels::ToAcc;

constexpr int kF = kTcFrag;
constexpr int kColFrags = kTcCols / kF;  // 4 fragments across a streamed tile
constexpr int kHalfCols = kTcCols / 2;   // score columns per lane

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, kF, kF, kF, T, wmma::row_major>;
template <typename T>
using FragBRow = wmma::fragment<wmma::matrix_b, kF, kF, kF, T, wmma::row_major>;
template <typename T>
using FragBCol = wmma::fragment<wmma::matrix_b, kF, kF, kF, T, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kF, kF, kF, float>;

__device__ __forceinline__ int64_t At(int64_t b, int64_t i, int64_t h, int64_t c, int64_t t,
                                      int64_t heads, int64_t d) {
  return ((b * t + i) * heads + h) * d + c;
}

// Whether any of the eight 16-bit floats of T in v is infinite or NaN (exponent bits all set).
template <typename T>
__device__ __forceinline__ bool AnyNonFinite(uint4 v) {
  constexpr uint32_t kExp = sizeof(T) == 2 && std::is_same_v<T, __half> ? 0x7C00u : 0x7F80u;
  bool bad = false;
  for (uint32_t w : {v.x, v.y, v.z, v.w}) {
    bad |= (w & kExp) == kExp || ((w >> 16) & kExp) == kExp;
  }
  return bad;
}

// Stages rows [first, first + kTcRows) of x [b, t, heads, kD] for (b, h) into xs
// [kTcRows][TcHalfLd(kD)], zeros past t, 8 elements (16 bytes) per load. The block calls it.
// Returns whether this thread staged an infinite or NaN element.
template <int kD, typename T>
__device__ __forceinline__ bool StageTile(const T* __restrict__ x, T* xs, int64_t b, int64_t h,
                                          int64_t first, int64_t t, int64_t heads) {
  constexpr int kVec = 8, kPerRow = kD / kVec, kLd = TcHalfLd(kD);
  bool bad = false;
  for (int e = threadIdx.x; e < kTcRows * kPerRow; e += kTcThreads) {
    const int r = e / kPerRow, c = (e - r * kPerRow) * kVec;
    const int64_t row = first + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row < t) val = *reinterpret_cast<const uint4*>(x + At(b, row, h, c, t, heads, kD));
    bad |= AnyNonFinite<T>(val);
    *reinterpret_cast<uint4*>(xs + r * kLd + c) = val;
  }
  return bad;
}

// Writes a warp's 16 f32 rows staged in `stage` [16][TcOutLd(kD)] (times `mul`) as T to rows
// [first, first + 16) of y [b, t, heads, kD], skipping rows >= t. Consecutive lanes write
// consecutive elements.
template <int kD, typename T>
__device__ __forceinline__ void WriteWarpRows(const float* stage, float mul, T* __restrict__ y,
                                              int64_t b, int64_t h, int64_t first, int64_t t,
                                              int64_t heads, int lane) {
  constexpr int kOLd = TcOutLd(kD);
  for (int e = lane; e < kF * kD; e += 32) {
    const int r = e / kD, c = e - r * kD;
    const int64_t row = first + r;
    if (row < t) y[At(b, row, h, c, t, heads, kD)] = FromAcc<T>(stage[r * kOLd + c] * mul);
  }
}

// Both backward kernels' first products, for the warp's 16 rows r of the staged tiles:
// x = a1[r] b1^T and y = a2[r] b2^T over the streamed tile's kTcCols rows of b1 / b2, stored as
// f32 [16][kTcScoreLd] at x_out / y_out (dK/dV: S^T = K Q^T, dP^T = V dO^T; dQ: S = Q K^T,
// dP = dO V^T).
template <int kD, typename T>
__device__ __forceinline__ void WarpProductPair(const T* a1, const T* b1, const T* a2,
                                                const T* b2, float* x_out, float* y_out,
                                                int warp) {
  constexpr int kLd = TcHalfLd(kD), kDFrags = kD / kF;
#pragma unroll
  for (int n = 0; n < kColFrags; ++n) {
    FragAcc xf, yf;
    wmma::fill_fragment(xf, 0.f);
    wmma::fill_fragment(yf, 0.f);
#pragma unroll
    for (int kk = 0; kk < kDFrags; ++kk) {
      FragA<T> a;
      FragBCol<T> bm;
      wmma::load_matrix_sync(a, a1 + warp * kF * kLd + kk * kF, kLd);
      wmma::load_matrix_sync(bm, b1 + n * kF * kLd + kk * kF, kLd);
      wmma::mma_sync(xf, a, bm, xf);
      wmma::load_matrix_sync(a, a2 + warp * kF * kLd + kk * kF, kLd);
      wmma::load_matrix_sync(bm, b2 + n * kF * kLd + kk * kF, kLd);
      wmma::mma_sync(yf, a, bm, yf);
    }
    wmma::store_matrix_sync(x_out + warp * kF * kTcScoreLd + n * kF, xf, kTcScoreLd,
                            wmma::mem_row_major);
    wmma::store_matrix_sync(y_out + warp * kF * kTcScoreLd + n * kF, yf, kTcScoreLd,
                            wmma::mem_row_major);
  }
}

// The forward's score product for the warp's 16 rows: S = Q K^T over the streamed tile's
// kTcCols keys, stored as f32 [16][kTcScoreLd] at ss (K row-major [key][dim] is K^T
// column-major).
template <int kD, typename T>
__device__ __forceinline__ void WarpScores(const FragA<T> (&qf)[kD / kF], const T* ks, float* ss,
                                           int warp) {
  constexpr int kLd = TcHalfLd(kD), kDFrags = kD / kF;
#pragma unroll
  for (int n = 0; n < kColFrags; ++n) {
    FragAcc sf;
    wmma::fill_fragment(sf, 0.f);
#pragma unroll
    for (int kk = 0; kk < kDFrags; ++kk) {
      FragBCol<T> kf;
      wmma::load_matrix_sync(kf, ks + n * kF * kLd + kk * kF, kLd);
      wmma::mma_sync(sf, qf[kk], kf, sf);
    }
    wmma::store_matrix_sync(ss + warp * kF * kTcScoreLd + n * kF, sf, kTcScoreLd,
                            wmma::mem_row_major);
  }
}

// The warp's 16 rows of a T [kTcRows][kTcProbLd] tile (P, or dS) as kColFrags A fragments.
template <typename T>
__device__ __forceinline__ void LoadWarpProbs(FragA<T> (&frags)[kColFrags], const T* tile,
                                              int warp) {
#pragma unroll
  for (int kk = 0; kk < kColFrags; ++kk) {
    wmma::load_matrix_sync(frags[kk], tile + warp * kF * kTcProbLd + kk * kF, kTcProbLd);
  }
}

// The forward's O += P V for the warp's 16 rows: P staged as T [16][kTcProbLd] at ps, the
// streamed V tile at vs, O as f32 [kTcRows][TcOutLd(kD)] at os.
template <int kD, typename T>
__device__ __forceinline__ void WarpAddProbsTimesValues(const T* ps, const T* vs, float* os,
                                                        int warp) {
  constexpr int kLd = TcHalfLd(kD), kOLd = TcOutLd(kD), kDFrags = kD / kF;
  FragA<T> pf[kColFrags];
  LoadWarpProbs(pf, ps, warp);
#pragma unroll
  for (int n = 0; n < kDFrags; ++n) {
    FragAcc of;
    float* tile = os + warp * kF * kOLd + n * kF;
    wmma::load_matrix_sync(of, tile, kOLd, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < kColFrags; ++kk) {
      FragBRow<T> vf;
      wmma::load_matrix_sync(vf, vs + kk * kF * kLd + n * kF, kLd);
      wmma::mma_sync(of, pf[kk], vf, of);
    }
    wmma::store_matrix_sync(tile, of, kOLd, wmma::mem_row_major);
  }
}

// Forward: one block per (query block of kTcRows, batch*head), the last query blocks (which see
// the most keys) first.
template <typename T, int kD>
__global__ void __launch_bounds__(kTcThreads)
    TcForwardKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    T* __restrict__ o, float* __restrict__ lse, AttentionDims dims,
                    int64_t row_blocks) {
  constexpr TcLayout kL = TcForwardLayout(kD);
  constexpr int kLd = TcHalfLd(kD), kOLd = TcOutLd(kD), kDFrags = kD / kF;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* qs = reinterpret_cast<T*>(tc_smem + kL.a);
  T* ks = reinterpret_cast<T*>(tc_smem + kL.b);
  T* vs = reinterpret_cast<T*>(tc_smem + kL.c);
  float* ss = reinterpret_cast<float*>(tc_smem + kL.s);
  T* ps = reinterpret_cast<T*>(tc_smem + kL.p);
  float* os = reinterpret_cast<float*>(tc_smem + kL.o);
  float* inv_s = reinterpret_cast<float*>(tc_smem + kL.stats);  // 1 / l per row
  float* poison_s = inv_s + kTcRows;                              // 0, or NaN per row

  const int64_t heads = dims.heads, tq = dims.tq, tk = dims.tk;
  const int64_t off = dims.q_offset, bh_count = dims.batch * heads;
  const int64_t blk = blockIdx.x;
  const int64_t qblock = row_blocks - 1 - blk / bh_count;
  const int64_t bh = blk % bh_count, b = bh / heads, h = bh % heads;
  const int64_t kvh = dims.kv_heads > 0 ? dims.kv_heads : heads, g = h / (heads / kvh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wrow = warp * kF + lane / 2, half = lane % 2;  // this lane's row in the block
  const int64_t q_first = qblock * kTcRows, i = q_first + wrow;
  const bool valid = i < tq;
  const int64_t gi = i + off;
  const float scale = static_cast<float>(dims.scale);

  StageTile<kD>(q, qs, b, h, q_first, tq, heads);
  for (int e = threadIdx.x; e < kTcRows * kOLd; e += kTcThreads) os[e] = 0.f;
  __syncthreads();
  FragA<T> qf[kDFrags];
#pragma unroll
  for (int kk = 0; kk < kDFrags; ++kk) {
    wmma::load_matrix_sync(qf[kk], qs + warp * kF * kLd + kk * kF, kLd);
  }

  float* srow = ss + wrow * kTcScoreLd;
  T* prow = ps + wrow * kTcProbLd;
  float* orow = os + wrow * kOLd;
  // m: running max of the row's visible scores, l: sum of exp(score - m) (identical in both lanes
  // of the pair); poison: 0, or NaN once one of this lane's visible scores is NaN or infinite.
  float m = -INFINITY, l = 0.f, poison = 0.f;
  const int64_t key_end = VisibleKeyEnd(q_first, kTcRows, tq, tk, off);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTcCols) {
    __syncthreads();  // every warp is done with the previous K/V tile
    StageTile<kD>(k, ks, b, g, j0, tk, kvh);
    // An infinite or NaN value in V: P = 0 at a masked key would still multiply it in the
    // tensor-core product (0 * inf = NaN), so such a tile is summed over visible keys only, as
    // the SIMT kernel does (rare: only for non-finite inputs).
    const bool v_nonfinite = __syncthreads_or(StageTile<kD>(v, vs, b, g, j0, tk, kvh)) != 0;
    WarpScores<kD>(qf, ks, ss, warp);
    __syncwarp();
    float sv[kHalfCols];
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kHalfCols; ++t) {
      const int c = 2 * t + half;
      const int64_t j = j0 + c;
      const float x = srow[c] * scale;
      const bool vis = valid && j < tk && j <= gi;
      if (vis) {
        poison += x * 0.f;
        tile_max = x > tile_max ? x : tile_max;
      }
      sv[t] = vis ? x : -INFINITY;
    }
    const float other_max = __shfl_xor_sync(0xffffffffu, tile_max, 1);
    tile_max = other_max > tile_max ? other_max : tile_max;
    const float m_new = tile_max > m ? tile_max : m;
    float alpha = 1.f, sum = 0.f;
    if (m_new == -INFINITY) {  // nothing visible to this row yet: P = 0, O stays 0
#pragma unroll
      for (int t = 0; t < kHalfCols; ++t) prow[2 * t + half] = FromAcc<T>(0.f);
    } else {
      alpha = expf(m - m_new);  // 0 while m is -inf
#pragma unroll
      for (int t = 0; t < kHalfCols; ++t) {
        const float p = sv[t] == -INFINITY ? 0.f : expf(sv[t] - m_new);
        sum += p;
        prow[2 * t + half] = FromAcc<T>(p);
      }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    if (alpha != 1.f) {
      for (int c = half; c < kD; c += 2) orow[c] *= alpha;
    }
    __syncwarp();
    if (v_nonfinite) {  // block-uniform
      for (int c = half; c < kD; c += 2) {
        float acc = orow[c];
        for (int kc = 0; kc < kTcCols; ++kc) {
          const int64_t j = j0 + kc;
          if (valid && j < tk && j <= gi) acc += ToAcc(prow[kc]) * ToAcc(vs[kc * kLd + c]);
        }
        orow[c] = acc;
      }
      __syncwarp();
      continue;
    }
    WarpAddProbsTimesValues<kD>(ps, vs, os, warp);
    __syncwarp();
  }
  poison += __shfl_xor_sync(0xffffffffu, poison, 1);
  if (half == 0) {
    inv_s[wrow] = l > 0.f ? 1.f / l : 0.f;
    poison_s[wrow] = poison;
    if (valid) lse[bh * tq + i] = (l > 0.f ? m + logf(l) : -INFINITY) + poison;
  }
  __syncwarp();
  const float* ow = os + warp * kF * kOLd;
  for (int e = lane; e < kF * kD; e += 32) {
    const int r = e / kD, c = e - r * kD;
    const int64_t row = q_first + warp * kF + r;
    if (row < tq) {
      o[At(b, row, h, c, tq, heads, kD)] =
          FromAcc<T>(ow[r * kOLd + c] * inv_s[warp * kF + r] + poison_s[warp * kF + r]);
    }
  }
}

// dK and dV: one block per (key block of kTcRows, batch*kv head); query tiles of kTcCols stream
// from the first query that sees the block, for each query head of the kv head's group in turn
// (grouped-query attention sums over them). dK, dV accumulate in fragments (no rescaling).
template <typename T, int kD>
__global__ void __launch_bounds__(kTcThreads)
    TcKeyGradKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ dout, const float* __restrict__ lse,
                    const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                    AttentionDims dims) {
  constexpr TcLayout kL = TcBackwardLayout(kD);
  constexpr int kLd = TcHalfLd(kD), kOLd = TcOutLd(kD), kDFrags = kD / kF;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* ks = reinterpret_cast<T*>(tc_smem + kL.a);
  T* vs = reinterpret_cast<T*>(tc_smem + kL.b);
  T* qs = reinterpret_cast<T*>(tc_smem + kL.c);
  T* dos = reinterpret_cast<T*>(tc_smem + kL.d);
  float* sts = reinterpret_cast<float*>(tc_smem + kL.s);
  float* dpts = reinterpret_cast<float*>(tc_smem + kL.dp);
  T* pts = reinterpret_cast<T*>(tc_smem + kL.p);
  T* dsts = reinterpret_cast<T*>(tc_smem + kL.ds);
  float* lse_s = reinterpret_cast<float*>(tc_smem + kL.stats);
  float* delta_s = lse_s + kTcCols;

  const int64_t heads = dims.heads, tq = dims.tq, tk = dims.tk;
  const int64_t kvh = dims.kv_heads > 0 ? dims.kv_heads : heads, rep = heads / kvh;
  const int64_t off = dims.q_offset, bg_count = dims.batch * kvh;
  const int64_t blk = blockIdx.x;
  const int64_t kblock = blk / bg_count;  // the first key blocks (seen by most queries) first
  const int64_t bg = blk % bg_count, b = bg / kvh, g = bg % kvh;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wrow = warp * kF + lane / 2, half = lane % 2;
  const int64_t k_first = kblock * kTcRows, j = k_first + wrow;
  const bool valid = j < tk;
  const float scale = static_cast<float>(dims.scale);

  StageTile<kD>(k, ks, b, g, k_first, tk, kvh);
  StageTile<kD>(v, vs, b, g, k_first, tk, kvh);
  FragAcc dkf[kDFrags], dvf[kDFrags];
#pragma unroll
  for (int n = 0; n < kDFrags; ++n) {
    wmma::fill_fragment(dkf[n], 0.f);
    wmma::fill_fragment(dvf[n], 0.f);
  }
  const float* strow = sts + wrow * kTcScoreLd;
  const float* dptrow = dpts + wrow * kTcScoreLd;
  T* ptrow = pts + wrow * kTcProbLd;
  T* dstrow = dsts + wrow * kTcProbLd;
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const int64_t bh = b * heads + h;
    for (int64_t i0 = FirstQuerySeeing(k_first, off); i0 < tq; i0 += kTcCols) {
      __syncthreads();  // the previous Q/dO tile's readers are done (and K/V staged, first time)
      StageTile<kD>(q, qs, b, h, i0, tq, heads);
      StageTile<kD>(dout, dos, b, h, i0, tq, heads);
      for (int e = threadIdx.x; e < kTcCols; e += kTcThreads) {
        const int64_t i = i0 + e;
        lse_s[e] = i < tq ? lse[bh * tq + i] : -INFINITY;
        delta_s[e] = i < tq ? delta[bh * tq + i] : 0.f;
      }
      __syncthreads();
      // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys.
      WarpProductPair<kD>(ks, qs, vs, dos, sts, dpts, warp);
      __syncwarp();
      // P^T = exp(S^T * scale - lse) and dS^T = P^T (dP^T - delta), zero where masked or padded.
  #pragma unroll
      for (int t = 0; t < kHalfCols; ++t) {
        const int c = 2 * t + half;
        const int64_t i = i0 + c;
        const float li = lse_s[c];
        const bool vis = valid && i < tq && j <= i + off && li != -INFINITY;
        const float p = vis ? expf(strow[c] * scale - li) : 0.f;
        const float ds = vis ? p * (dptrow[c] - delta_s[c]) : 0.f;
        ptrow[c] = FromAcc<T>(p);
        dstrow[c] = FromAcc<T>(ds);
      }
      __syncwarp();
      // dV += P^T dO, dK += dS^T Q (scaled at the end).
      FragA<T> pa[kColFrags], dsa[kColFrags];
  #pragma unroll
      for (int kk = 0; kk < kColFrags; ++kk) {
        wmma::load_matrix_sync(pa[kk], pts + warp * kF * kTcProbLd + kk * kF, kTcProbLd);
        wmma::load_matrix_sync(dsa[kk], dsts + warp * kF * kTcProbLd + kk * kF, kTcProbLd);
      }
  #pragma unroll
      for (int n = 0; n < kDFrags; ++n) {
  #pragma unroll
        for (int kk = 0; kk < kColFrags; ++kk) {
          FragBRow<T> bm;
          wmma::load_matrix_sync(bm, dos + kk * kF * kLd + n * kF, kLd);
          wmma::mma_sync(dvf[n], pa[kk], bm, dvf[n]);
          wmma::load_matrix_sync(bm, qs + kk * kF * kLd + n * kF, kLd);
          wmma::mma_sync(dkf[n], dsa[kk], bm, dkf[n]);
        }
      }
    }
  }  // query heads of the group
  __syncthreads();  // every warp is done with the score tiles: they become the output staging
  float* stage = sts + warp * (TcWarpOutStage(kD) / sizeof(float));
  const int64_t w_first = k_first + warp * kF;
#pragma unroll
  for (int n = 0; n < kDFrags; ++n) {
    wmma::store_matrix_sync(stage + n * kF, dvf[n], kOLd, wmma::mem_row_major);
  }
  __syncwarp();
  WriteWarpRows<kD>(stage, 1.f, dv, b, g, w_first, tk, kvh, lane);
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kDFrags; ++n) {
    wmma::store_matrix_sync(stage + n * kF, dkf[n], kOLd, wmma::mem_row_major);
  }
  __syncwarp();
  WriteWarpRows<kD>(stage, scale, dk, b, g, w_first, tk, kvh, lane);
}

// dQ: one block per (query block of kTcRows, batch*head), the last (longest) blocks first; key
// tiles of kTcCols stream through shared memory; dQ accumulates in fragments.
template <typename T, int kD>
__global__ void __launch_bounds__(kTcThreads)
    TcQueryGradKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                      const T* __restrict__ dout, const float* __restrict__ lse,
                      const float* __restrict__ delta, T* __restrict__ dq, AttentionDims dims,
                      int64_t row_blocks) {
  constexpr TcLayout kL = TcBackwardLayout(kD);
  constexpr int kLd = TcHalfLd(kD), kOLd = TcOutLd(kD), kDFrags = kD / kF;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* qs = reinterpret_cast<T*>(tc_smem + kL.a);
  T* dos = reinterpret_cast<T*>(tc_smem + kL.b);
  T* ks = reinterpret_cast<T*>(tc_smem + kL.c);
  T* vs = reinterpret_cast<T*>(tc_smem + kL.d);
  float* ss = reinterpret_cast<float*>(tc_smem + kL.s);
  float* dps = reinterpret_cast<float*>(tc_smem + kL.dp);
  T* dss = reinterpret_cast<T*>(tc_smem + kL.ds);
  float* lse_s = reinterpret_cast<float*>(tc_smem + kL.stats);
  float* delta_s = lse_s + kTcRows;

  const int64_t heads = dims.heads, tq = dims.tq, tk = dims.tk;
  const int64_t off = dims.q_offset, bh_count = dims.batch * heads;
  const int64_t blk = blockIdx.x;
  const int64_t qblock = row_blocks - 1 - blk / bh_count;
  const int64_t bh = blk % bh_count, b = bh / heads, h = bh % heads;
  const int64_t kvh = dims.kv_heads > 0 ? dims.kv_heads : heads, g = h / (heads / kvh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wrow = warp * kF + lane / 2, half = lane % 2;
  const int64_t q_first = qblock * kTcRows, i = q_first + wrow;
  const bool valid = i < tq;
  const int64_t gi = i + off;
  const float scale = static_cast<float>(dims.scale);

  StageTile<kD>(q, qs, b, h, q_first, tq, heads);
  StageTile<kD>(dout, dos, b, h, q_first, tq, heads);
  for (int e = threadIdx.x; e < kTcRows; e += kTcThreads) {
    const int64_t r = q_first + e;
    lse_s[e] = r < tq ? lse[bh * tq + r] : -INFINITY;
    delta_s[e] = r < tq ? delta[bh * tq + r] : 0.f;
  }
  FragAcc dqf[kDFrags];
#pragma unroll
  for (int n = 0; n < kDFrags; ++n) wmma::fill_fragment(dqf[n], 0.f);
  const float* srow = ss + wrow * kTcScoreLd;
  const float* dprow = dps + wrow * kTcScoreLd;
  T* dsrow = dss + wrow * kTcProbLd;
  const int64_t key_end = VisibleKeyEnd(q_first, kTcRows, tq, tk, off);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTcCols) {
    __syncthreads();
    StageTile<kD>(k, ks, b, g, j0, tk, kvh);
    StageTile<kD>(v, vs, b, g, j0, tk, kvh);
    __syncthreads();
    // S = Q K^T and dP = dO V^T for the warp's 16 queries.
    WarpProductPair<kD>(qs, ks, dos, vs, ss, dps, warp);
    __syncwarp();
    const float li = lse_s[wrow], di = delta_s[wrow];
#pragma unroll
    for (int t = 0; t < kHalfCols; ++t) {
      const int c = 2 * t + half;
      const int64_t jj = j0 + c;
      const bool vis = valid && jj < tk && jj <= gi && li != -INFINITY;
      const float ds = vis ? expf(srow[c] * scale - li) * (dprow[c] - di) : 0.f;
      dsrow[c] = FromAcc<T>(ds);
    }
    __syncwarp();
    // dQ += dS K (scaled at the end).
    FragA<T> dsa[kColFrags];
    LoadWarpProbs(dsa, dss, warp);
#pragma unroll
    for (int n = 0; n < kDFrags; ++n) {
#pragma unroll
      for (int kk = 0; kk < kColFrags; ++kk) {
        FragBRow<T> bm;
        wmma::load_matrix_sync(bm, ks + kk * kF * kLd + n * kF, kLd);
        wmma::mma_sync(dqf[n], dsa[kk], bm, dqf[n]);
      }
    }
  }
  __syncthreads();
  float* stage = ss + warp * (TcWarpOutStage(kD) / sizeof(float));
#pragma unroll
  for (int n = 0; n < kDFrags; ++n) {
    wmma::store_matrix_sync(stage + n * kF, dqf[n], kOLd, wmma::mem_row_major);
  }
  __syncwarp();
  WriteWarpRows<kD>(stage, scale, dq, b, h, q_first + warp * kF, tq, heads, lane);
}

// Raises kKernel's dynamic shared memory limit to `smem` (every tensor-core layout exceeds the
// default 48 KiB) once per device: the value is fixed per kernel, and the call can stall the
// runtime (it waits for copies in flight), so the hot path and graph replays skip it after the
// first launch on each device.
template <auto kKernel>
cudaError_t RaiseSmemLimitOnce(size_t smem) {
  static std::atomic<uint64_t> done_devices{0};  // bit i: set on device i (devices >= 64: always)
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done_devices.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e == cudaSuccess && bit != 0) done_devices.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

// Launches kKernel<<<blocks, kTcThreads, smem>>> on `stream`.
template <auto kKernel, typename... Args>
cudaError_t TcLaunch(int64_t blocks, size_t smem, void* stream, Args... args) {
  if (blocks > INT_MAX || smem > kTcMaxSmem) return cudaErrorInvalidValue;
  if (smem > 48 * 1024) {
    const cudaError_t e = RaiseSmemLimitOnce<kKernel>(smem);
    if (e != cudaSuccess) return e;
  }
  kKernel<<<static_cast<unsigned>(blocks), kTcThreads, smem, AsStream(stream)>>>(args...);
  return cudaGetLastError();
}

template <typename T, int kD>
cudaError_t TcForward(const T* q, const T* k, const T* v, T* o, float* lse,
                      const AttentionDims& dims, void* stream) {
  const int64_t row_blocks = TcRowBlocks(dims.tq);
  return TcLaunch<TcForwardKernel<T, kD>>(row_blocks * dims.batch * dims.heads,
                                          TcForwardLayout(kD).total, stream, q, k, v, o, lse,
                                          dims, row_blocks);
}

template <typename T, int kD>
cudaError_t TcGrads(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                    const float* delta, T* dq, T* dk, T* dv, const AttentionDims& dims,
                    void* stream) {
  const int64_t bh = dims.batch * dims.heads;
  const int64_t bg = dims.batch * (dims.kv_heads > 0 ? dims.kv_heads : dims.heads);  // dK/dV
  const size_t smem = TcBackwardLayout(kD).total;
  cudaError_t e = TcLaunch<TcKeyGradKernel<T, kD>>(TcRowBlocks(dims.tk) * bg, smem, stream, q,
                                                    k, v, dout, lse, delta, dk, dv, dims);
  if (e != cudaSuccess) return e;
  const int64_t row_blocks = TcRowBlocks(dims.tq);
  return TcLaunch<TcQueryGradKernel<T, kD>>(row_blocks * bh, smem, stream, q, k, v, dout, lse,
                                            delta, dq, dims, row_blocks);
}

}  // namespace

int LaunchTcForward(const void* q, const void* k, const void* v, void* o, void* lse, DType dtype,
                    const AttentionDims& dims, void* stream) {
  if (!TensorCoreEligible(dtype, dims.head_dim)) return cudaErrorInvalidValue;
  if (dims.batch * dims.heads == 0 || dims.tq == 0) return cudaSuccess;
  auto run = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    const T* qt = static_cast<const T*>(q);
    const T* kt = static_cast<const T*>(k);
    const T* vt = static_cast<const T*>(v);
    T* ot = static_cast<T*>(o);
    float* l = static_cast<float*>(lse);
    return dims.head_dim == 64 ? TcForward<T, 64>(qt, kt, vt, ot, l, dims, stream)
                               : TcForward<T, 128>(qt, kt, vt, ot, l, dims, stream);
  };
  return dtype == DType::kBF16 ? run(__nv_bfloat16{}) : run(__half{});
}

int LaunchTcGrads(const void* q, const void* k, const void* v, const void* dout, const void* lse,
                  const void* delta, void* dq, void* dk, void* dv, DType dtype,
                  const AttentionDims& dims, void* stream) {
  if (!TensorCoreEligible(dtype, dims.head_dim)) return cudaErrorInvalidValue;
  if (dims.batch * dims.heads == 0 || dims.tq == 0 || dims.tk == 0) return cudaSuccess;
  auto run = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    const T* qt = static_cast<const T*>(q);
    const T* kt = static_cast<const T*>(k);
    const T* vt = static_cast<const T*>(v);
    const T* dot = static_cast<const T*>(dout);
    const float* l = static_cast<const float*>(lse);
    const float* dl = static_cast<const float*>(delta);
    T* dqt = static_cast<T*>(dq);
    T* dkt = static_cast<T*>(dk);
    T* dvt = static_cast<T*>(dv);
    return dims.head_dim == 64
               ? TcGrads<T, 64>(qt, kt, vt, dot, l, dl, dqt, dkt, dvt, dims, stream)
               : TcGrads<T, 128>(qt, kt, vt, dot, l, dl, dqt, dkt, dvt, dims, stream);
  };
  return dtype == DType::kBF16 ? run(__nv_bfloat16{}) : run(__half{});
}

}  // namespace shardmap::cuda::attention_kernels
