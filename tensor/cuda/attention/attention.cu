// Fused causal attention kernels (see kernels.h and tiling.h). SIMT: every product and sum in the
// accumulator type A (f32 for bf16/f16/f32 data, f64 for f64), inputs converted once when staged.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <initializer_list>

#include "tensor/cuda/attention/kernels.h"
#include "tensor/cuda/attention/tc_kernels.h"
#include "tensor/cuda/attention/tc_tiling.h"
#include "tensor/cuda/attention/tiling.h"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::attention_kernels {
namespace {

using kernels::Acc;
using kernels::AsStream;
using kernels::FromAcc;
using kernels::ToAcc;

__device__ __forceinline__ float Exp(float v) { return expf(v); }
__device__ __forceinline__ double Exp(double v) { return exp(v); }
__device__ __forceinline__ float Log(float v) { return logf(v); }
__device__ __forceinline__ double Log(double v) { return log(v); }
template <typename A> __device__ __forceinline__ A NegInf() { return A(-INFINITY); }

// Sum over the kG consecutive lanes of a group (kG divides 32; every lane of the warp calls it).
// Every lane of the group ends with the same bits (each butterfly step adds the same two values).
template <int kG, typename A>
__device__ __forceinline__ A GroupSum(A v) {
#pragma unroll
  for (int o = kG / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Flat element index of (b, i, h, c) in a contiguous [b, t, heads, d] tensor.
__device__ __forceinline__ int64_t At(int64_t b, int64_t i, int64_t h, int64_t c, int64_t t,
                                      int64_t heads, int64_t d) {
  return ((b * t + i) * heads + h) * d + c;
}

// Stages rows [first, first + kRows) of x (and y) [b, t, heads, d] for (b, h) into shared memory
// as A, [kRows][kDPad], zero past t and past d. The whole block calls it.
template <int kRows, int kDPad, typename T, typename A>
__device__ __forceinline__ void StageRows(const T* __restrict__ x, const T* __restrict__ y,
                                          A* xs, A* ys, int64_t b, int64_t h, int64_t first,
                                          int64_t t, int64_t heads, int64_t d) {
  for (int e = threadIdx.x; e < kRows * kDPad; e += blockDim.x) {
    const int r = e / kDPad, c = e - r * kDPad;
    const int64_t row = first + r;
    A xv = A(0), yv = A(0);
    if (row < t && c < d) {
      const int64_t at = At(b, row, h, c, t, heads, d);
      xv = ToAcc(x[at]);
      yv = ToAcc(y[at]);
    }
    xs[e] = xv;
    ys[e] = yv;
  }
}

// Forward: one block per (query block, batch*head); kG lanes per query row.
template <typename T, int kDPad>
__global__ void __launch_bounds__(kQueryRows * (kDPad / kPerThread))
    ForwardKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  T* __restrict__ o, Acc<T>* __restrict__ lse, AttentionDims dims,
                  int64_t row_blocks) {
  using A = Acc<T>;
  constexpr int kG = kDPad / kPerThread;
  constexpr int kBN = KeyTile<sizeof(A)>::kRows;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  A* ks = reinterpret_cast<A*>(attn_smem);
  A* vs = ks + kBN * kDPad;

  const int64_t heads = dims.heads, d = dims.head_dim, tq = dims.tq, tk = dims.tk;
  const int64_t off = dims.q_offset, bh_count = dims.batch * heads;
  const int64_t blk = blockIdx.x;
  const int64_t qblock = row_blocks - 1 - blk / bh_count;  // the longest (last) blocks first
  const int64_t bh = blk % bh_count, b = bh / heads, h = bh % heads;
  const int64_t kvh = dims.kv_heads > 0 ? dims.kv_heads : heads, g = h / (heads / kvh);
  const int row = threadIdx.x / kG, sub = threadIdx.x % kG;
  const int64_t q_first = qblock * kQueryRows, i = q_first + row;
  const bool valid = i < tq;
  const int64_t gi = i + off;  // sees keys j <= gi
  const A scale = static_cast<A>(dims.scale);

  A qr[kPerThread], acc[kPerThread];
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int dim = sub + c * kG;
    qr[c] = valid && dim < d ? ToAcc(q[At(b, i, h, dim, tq, heads, d)]) : A(0);
    acc[c] = A(0);
  }
  // m: running max of the visible scores, l: sum of exp(score - m). poison is 0, or NaN once a
  // visible score is NaN or infinite (then the row's output is NaN, as the materialised path's).
  A m = NegInf<A>(), l = A(0), poison = A(0);
  const int64_t key_end = VisibleKeyEnd(q_first, kQueryRows, tq, tk, off);
  for (int64_t j0 = 0; j0 < key_end; j0 += kBN) {
    __syncthreads();  // the previous tile's readers are done
    StageRows<kBN, kDPad>(k, v, ks, vs, b, g, j0, tk, kvh, d);
    __syncthreads();
    A s[kBN];
    A tile_max = NegInf<A>();
#pragma unroll
    for (int jj = 0; jj < kBN; ++jj) {
      A part = A(0);
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) part += qr[c] * ks[jj * kDPad + sub + c * kG];
      part = GroupSum<kG>(part) * scale;
      const int64_t j = j0 + jj;
      const bool vis = valid && j < tk && j <= gi;
      if (vis) {
        poison += part * A(0);
        tile_max = part > tile_max ? part : tile_max;
      }
      s[jj] = vis ? part : NegInf<A>();
    }
    const A m_new = tile_max > m ? tile_max : m;
    if (m_new == NegInf<A>()) continue;  // nothing visible yet (no sync or shuffle below)
    const A alpha = Exp(m - m_new);      // 0 while m is -inf
    l *= alpha;
#pragma unroll
    for (int c = 0; c < kPerThread; ++c) acc[c] *= alpha;
#pragma unroll
    for (int jj = 0; jj < kBN; ++jj) {
      if (s[jj] == NegInf<A>()) continue;  // masked: 0 * v would leak a NaN of a future value
      const A p = Exp(s[jj] - m_new);
      l += p;
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) acc[c] += p * vs[jj * kDPad + sub + c * kG];
    }
    m = m_new;
  }
  if (!valid) return;
  const A inv = l > A(0) ? A(1) / l : A(0);
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int dim = sub + c * kG;
    if (dim < d) o[At(b, i, h, dim, tq, heads, d)] = FromAcc<T>(acc[c] * inv + poison);
  }
  if (sub == 0) lse[bh * tq + i] = (l > A(0) ? m + Log(l) : NegInf<A>()) + poison;
}

// delta[b, h, i] = sum_c dout[b, i, h, c] * o[b, i, h, c]: one warp per row.
template <typename T>
__global__ void DeltaKernel(const T* __restrict__ o, const T* __restrict__ dout,
                            Acc<T>* __restrict__ delta, AttentionDims dims) {
  using A = Acc<T>;
  const int64_t heads = dims.heads, d = dims.head_dim, tq = dims.tq;
  const int64_t rows = dims.batch * tq * heads;
  const int64_t warps_per_block = blockDim.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_block;
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x * warps_per_block + threadIdx.x / 32; r < rows; r += stride) {
    A s = A(0);
    for (int64_t c = lane; c < d; c += 32) s += ToAcc(o[r * d + c]) * ToAcc(dout[r * d + c]);
    s = GroupSum<32>(s);
    if (lane == 0) {
      const int64_t h = r % heads, i = (r / heads) % tq, b = r / (heads * tq);
      delta[(b * heads + h) * tq + i] = s;
    }
  }
}

// dK and dV: one block per (key block, batch*kv head); kG lanes per key row; queries stream
// through shared memory kQueryTile rows at a time, from the first one that sees the block, for
// each query head of the kv head's group in turn (grouped-query attention sums over them).
template <typename T, int kDPad>
__global__ void __launch_bounds__(kKeyRows * (kDPad / kPerThread))
    KeyGradKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const T* __restrict__ dout, const Acc<T>* __restrict__ lse,
                  const Acc<T>* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                  AttentionDims dims, int64_t row_blocks) {
  using A = Acc<T>;
  constexpr int kG = kDPad / kPerThread;
  constexpr int kBM = kQueryTile;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  A* qs = reinterpret_cast<A*>(attn_smem);
  A* dos = qs + kBM * kDPad;
  A* ls = dos + kBM * kDPad;
  A* dls = ls + kBM;

  const int64_t heads = dims.heads, d = dims.head_dim, tq = dims.tq, tk = dims.tk;
  const int64_t kvh = dims.kv_heads > 0 ? dims.kv_heads : heads, rep = heads / kvh;
  const int64_t off = dims.q_offset, bg_count = dims.batch * kvh;
  const int64_t blk = blockIdx.x;
  const int64_t kblock = blk / bg_count;  // the first key blocks (seen by most queries) first
  const int64_t bg = blk % bg_count, b = bg / kvh, g = bg % kvh;
  const int row = threadIdx.x / kG, sub = threadIdx.x % kG;
  const int64_t k_first = kblock * kKeyRows, j = k_first + row;
  const bool valid = j < tk;
  const A scale = static_cast<A>(dims.scale);
  (void)row_blocks;

  A kr[kPerThread], vr[kPerThread], gk[kPerThread], gv[kPerThread];
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int dim = sub + c * kG;
    const bool in = valid && dim < d;
    kr[c] = in ? ToAcc(k[At(b, j, g, dim, tk, kvh, d)]) : A(0);
    vr[c] = in ? ToAcc(v[At(b, j, g, dim, tk, kvh, d)]) : A(0);
    gk[c] = A(0);
    gv[c] = A(0);
  }
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const int64_t bh = b * heads + h;
    for (int64_t i0 = FirstQuerySeeing(k_first, off); i0 < tq; i0 += kBM) {
      __syncthreads();
      StageRows<kBM, kDPad>(q, dout, qs, dos, b, h, i0, tq, heads, d);
      for (int e = threadIdx.x; e < kBM; e += blockDim.x) {
        const int64_t i = i0 + e;
        ls[e] = i < tq ? lse[bh * tq + i] : NegInf<A>();
        dls[e] = i < tq ? delta[bh * tq + i] : A(0);
      }
      __syncthreads();
      const int n = tq - i0 < kBM ? static_cast<int>(tq - i0) : kBM;  // uniform over the block
      for (int ii = 0; ii < n; ++ii) {
        A sp = A(0), dp = A(0);
  #pragma unroll
        for (int c = 0; c < kPerThread; ++c) {
          sp += qs[ii * kDPad + sub + c * kG] * kr[c];
          dp += dos[ii * kDPad + sub + c * kG] * vr[c];
        }
        sp = GroupSum<kG>(sp) * scale;
        dp = GroupSum<kG>(dp);
        const A li = ls[ii];
        if (valid && j <= i0 + ii + off && li != NegInf<A>()) {
          const A p = Exp(sp - li);
          const A ds = p * (dp - dls[ii]);
  #pragma unroll
          for (int c = 0; c < kPerThread; ++c) {
            gv[c] += p * dos[ii * kDPad + sub + c * kG];
            gk[c] += ds * qs[ii * kDPad + sub + c * kG];
          }
        }
      }
    }
  }  // query heads of the group
  if (!valid) return;
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int dim = sub + c * kG;
    if (dim < d) {
      dk[At(b, j, g, dim, tk, kvh, d)] = FromAcc<T>(gk[c] * scale);
      dv[At(b, j, g, dim, tk, kvh, d)] = FromAcc<T>(gv[c]);
    }
  }
}

// dQ: one block per (query block, batch*head), laid out as the forward.
template <typename T, int kDPad>
__global__ void __launch_bounds__(kQueryRows * (kDPad / kPerThread))
    QueryGradKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ dout, const Acc<T>* __restrict__ lse,
                    const Acc<T>* __restrict__ delta, T* __restrict__ dq, AttentionDims dims,
                    int64_t row_blocks) {
  using A = Acc<T>;
  constexpr int kG = kDPad / kPerThread;
  constexpr int kBN = KeyTile<sizeof(A)>::kRows;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  A* ks = reinterpret_cast<A*>(attn_smem);
  A* vs = ks + kBN * kDPad;

  const int64_t heads = dims.heads, d = dims.head_dim, tq = dims.tq, tk = dims.tk;
  const int64_t off = dims.q_offset, bh_count = dims.batch * heads;
  const int64_t blk = blockIdx.x;
  const int64_t qblock = row_blocks - 1 - blk / bh_count;
  const int64_t bh = blk % bh_count, b = bh / heads, h = bh % heads;
  const int64_t kvh = dims.kv_heads > 0 ? dims.kv_heads : heads, g = h / (heads / kvh);
  const int row = threadIdx.x / kG, sub = threadIdx.x % kG;
  const int64_t q_first = qblock * kQueryRows, i = q_first + row;
  const bool valid = i < tq;
  const int64_t gi = i + off;
  const A scale = static_cast<A>(dims.scale);

  A qr[kPerThread], dor[kPerThread], gq[kPerThread];
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int dim = sub + c * kG;
    const bool in = valid && dim < d;
    qr[c] = in ? ToAcc(q[At(b, i, h, dim, tq, heads, d)]) : A(0);
    dor[c] = in ? ToAcc(dout[At(b, i, h, dim, tq, heads, d)]) : A(0);
    gq[c] = A(0);
  }
  const A li = valid ? lse[bh * tq + i] : NegInf<A>();
  const A di = valid ? delta[bh * tq + i] : A(0);
  const int64_t key_end = VisibleKeyEnd(q_first, kQueryRows, tq, tk, off);
  for (int64_t j0 = 0; j0 < key_end; j0 += kBN) {
    __syncthreads();
    StageRows<kBN, kDPad>(k, v, ks, vs, b, g, j0, tk, kvh, d);
    __syncthreads();
#pragma unroll 4
    for (int jj = 0; jj < kBN; ++jj) {
      A sp = A(0), dp = A(0);
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) {
        sp += qr[c] * ks[jj * kDPad + sub + c * kG];
        dp += dor[c] * vs[jj * kDPad + sub + c * kG];
      }
      sp = GroupSum<kG>(sp) * scale;
      dp = GroupSum<kG>(dp);
      const int64_t j = j0 + jj;
      if (valid && j < tk && j <= gi && li != NegInf<A>()) {
        const A ds = Exp(sp - li) * (dp - di);
#pragma unroll
        for (int c = 0; c < kPerThread; ++c) gq[c] += ds * ks[jj * kDPad + sub + c * kG];
      }
    }
  }
  if (!valid) return;
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int dim = sub + c * kG;
    if (dim < d) dq[At(b, i, h, dim, tq, heads, d)] = FromAcc<T>(gq[c] * scale);
  }
}

// Launches kernel<<<t.blocks, t.threads, t.smem>>>, raising the dynamic shared memory limit
// first when the tiles need more than the default 48 KiB (f64 dK/dV with head_dim > 64).
template <typename Kernel, typename... Args>
cudaError_t Launch(Kernel kernel, const AttentionTiling& t, void* stream, Args... args) {
  if (t.smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(t.smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<static_cast<unsigned>(t.blocks), t.threads, t.smem, AsStream(stream)>>>(args...);
  return cudaGetLastError();
}

bool Launchable(const AttentionTiling& t) { return t.d_pad != 0 && t.blocks <= INT_MAX; }

template <typename T>
cudaError_t Forward(const T* q, const T* k, const T* v, T* o, Acc<T>* lse,
                    const AttentionDims& dims, void* stream) {
  const AttentionTiling t =
      ForwardTiling(dims.batch * dims.heads, dims.tq, dims.head_dim, sizeof(Acc<T>));
  if (!Launchable(t)) return cudaErrorInvalidValue;
  switch (t.d_pad) {
    case 32: return Launch(ForwardKernel<T, 32>, t, stream, q, k, v, o, lse, dims, t.row_blocks);
    case 64: return Launch(ForwardKernel<T, 64>, t, stream, q, k, v, o, lse, dims, t.row_blocks);
    default: return Launch(ForwardKernel<T, 128>, t, stream, q, k, v, o, lse, dims, t.row_blocks);
  }
}

// The tensor-core kernels stage rows with 16-byte loads.
bool Aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// dK/dV and dQ after delta: the tensor-core kernels when `tc` (bf16/f16 only), SIMT otherwise.
template <typename T>
cudaError_t Backward(const T* q, const T* k, const T* v, const T* o, const Acc<T>* lse,
                     const T* dout, T* dq, T* dk, T* dv, Acc<T>* delta, const AttentionDims& dims,
                     DType dtype, bool tc, void* stream) {
  const int64_t bh = dims.batch * dims.heads;
  const int64_t bg = dims.batch * (dims.kv_heads > 0 ? dims.kv_heads : dims.heads);  // dK/dV
  const AttentionTiling tq = ForwardTiling(bh, dims.tq, dims.head_dim, sizeof(Acc<T>));
  const AttentionTiling tk = KeyGradTiling(bg, dims.tk, dims.head_dim, sizeof(Acc<T>));
  if (!Launchable(tq) || (dims.tk > 0 && !Launchable(tk))) return cudaErrorInvalidValue;
  if (dims.tk > 0 && dims.tq == 0) {  // no query: dK = dV = 0
    const size_t bytes = static_cast<size_t>(bg * dims.tk * dims.head_dim) * sizeof(T);
    cudaError_t e = cudaMemsetAsync(dk, 0, bytes, AsStream(stream));
    if (e == cudaSuccess) e = cudaMemsetAsync(dv, 0, bytes, AsStream(stream));
    return e;
  }
  if (dims.tq == 0) return cudaSuccess;
  const int64_t rows = bh * dims.tq;
  constexpr int kDeltaThreads = 256;
  int64_t delta_blocks = (rows + kDeltaThreads / 32 - 1) / (kDeltaThreads / 32);
  if (delta_blocks > 65535 * 32) delta_blocks = 65535 * 32;
  DeltaKernel<T><<<static_cast<unsigned>(delta_blocks), kDeltaThreads, 0, AsStream(stream)>>>(
      o, dout, delta, dims);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (tc && dims.tk > 0) {
    return static_cast<cudaError_t>(
        LaunchTcGrads(q, k, v, dout, lse, delta, dq, dk, dv, dtype, dims, stream));
  }
  if (dims.tk > 0) {
    switch (tk.d_pad) {
      case 32:
        e = Launch(KeyGradKernel<T, 32>, tk, stream, q, k, v, dout, lse,
                   static_cast<const Acc<T>*>(delta), dk, dv, dims, tk.row_blocks);
        break;
      case 64:
        e = Launch(KeyGradKernel<T, 64>, tk, stream, q, k, v, dout, lse,
                   static_cast<const Acc<T>*>(delta), dk, dv, dims, tk.row_blocks);
        break;
      default:
        e = Launch(KeyGradKernel<T, 128>, tk, stream, q, k, v, dout, lse,
                   static_cast<const Acc<T>*>(delta), dk, dv, dims, tk.row_blocks);
    }
    if (e != cudaSuccess) return e;
  }
  switch (tq.d_pad) {
    case 32:
      return Launch(QueryGradKernel<T, 32>, tq, stream, q, k, v, dout, lse,
                    static_cast<const Acc<T>*>(delta), dq, dims, tq.row_blocks);
    case 64:
      return Launch(QueryGradKernel<T, 64>, tq, stream, q, k, v, dout, lse,
                    static_cast<const Acc<T>*>(delta), dq, dims, tq.row_blocks);
    default:
      return Launch(QueryGradKernel<T, 128>, tq, stream, q, k, v, dout, lse,
                    static_cast<const Acc<T>*>(delta), dq, dims, tq.row_blocks);
  }
}

}  // namespace

int LaunchForward(const void* q, const void* k, const void* v, void* o, void* lse, DType dtype,
                  const AttentionDims& dims, void* stream) {
  if (dims.batch * dims.heads == 0 || dims.tq == 0) return cudaSuccess;
  if (UseTensorCores(dtype, dims.head_dim, dims.kernel, Aligned16({q, k, v}))) {
    return LaunchTcForward(q, k, v, o, lse, dtype, dims, stream);
  }
  SM_DISPATCH_FLOAT(dtype, T, {
    return Forward<T>(static_cast<const T*>(q), static_cast<const T*>(k),
                      static_cast<const T*>(v), static_cast<T*>(o), static_cast<Acc<T>*>(lse),
                      dims, stream);
  });
  return cudaSuccess;
}

int LaunchBackward(const void* q, const void* k, const void* v, const void* o, const void* lse,
                   const void* dout, void* dq, void* dk, void* dv, void* delta, DType dtype,
                   const AttentionDims& dims, void* stream) {
  if (dims.batch * dims.heads == 0) return cudaSuccess;
  const bool tc = UseTensorCores(dtype, dims.head_dim, dims.kernel, Aligned16({q, k, v, dout}));
  SM_DISPATCH_FLOAT(dtype, T, {
    return Backward<T>(static_cast<const T*>(q), static_cast<const T*>(k),
                       static_cast<const T*>(v), static_cast<const T*>(o),
                       static_cast<const Acc<T>*>(lse), static_cast<const T*>(dout),
                       static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv),
                       static_cast<Acc<T>*>(delta), dims, dtype, tc, stream);
  });
  return cudaSuccess;
}

}  // namespace shardmap::cuda::attention_kernels
