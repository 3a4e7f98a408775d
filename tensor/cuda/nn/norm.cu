// LayerNorm / RmsNorm forward and backward kernels (see kernels.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

// A row per group: mean (LayerNorm), then the centred sum of squares, then the write pass.
// kCache: the row is kept in shared memory after the first read.
template <typename T, bool kWarp, bool kCache, bool kRms>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    NormRows(const T* __restrict__ x, const Acc<T>* __restrict__ gamma,
             const Acc<T>* __restrict__ beta, T* __restrict__ y, Acc<T>* __restrict__ mean,
             Acc<T>* __restrict__ rstd, int64_t rows, int64_t h, double eps) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  A* cache = kCache ? G::template Cache<A>(h, 1) : nullptr;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* xr = x + r * h;
    T* yr = y + r * h;
    A m = 0;
    if (!kRms) {
      A s = 0;
      for (int64_t j = G::Lane(); j < h; j += G::Size()) {
        const A v = ToAcc(xr[j]);
        if (kCache) cache[j] = v;
        s += v;
      }
      s = GroupSum<kWarp>(s);
      m = h == 0 ? A(0) : s / static_cast<A>(h);
    }
    A ss = 0;
    for (int64_t j = G::Lane(); j < h; j += G::Size()) {
      A v;
      if (kCache && !kRms) {
        v = cache[j];
      } else {
        v = ToAcc(xr[j]);
        if (kCache) cache[j] = v;
      }
      const A d = v - m;
      ss += d * d;
    }
    ss = GroupSum<kWarp>(ss);
    const double var = h == 0 ? 0.0 : static_cast<double>(ss) / static_cast<double>(h);
    const A rs = static_cast<A>(1.0 / sqrt(var + eps));
    if (G::Lane() == 0) {
      if (!kRms) mean[r] = m;
      rstd[r] = rs;
    }
    for (int64_t j = G::Lane(); j < h; j += G::Size()) {
      const A xv = kCache ? cache[j] : ToAcc(xr[j]);
      A v = kRms ? xv * rs : (xv - m) * rs;
      if (gamma != nullptr) v *= gamma[j];
      if (!kRms && beta != nullptr) v += beta[j];
      yr[j] = FromAcc<T>(v);
    }
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma (RmsNorm:
// without the mean(dxhat) term, xhat = x * rstd). kCache: x and dy are kept in shared memory.
template <typename T, bool kWarp, bool kCache, bool kRms>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    NormBackwardRows(const T* __restrict__ x, const Acc<T>* __restrict__ gamma,
                     const Acc<T>* __restrict__ mean, const Acc<T>* __restrict__ rstd,
                     const T* __restrict__ dy, T* __restrict__ dx, int64_t rows, int64_t h) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  A* cx = kCache ? G::template Cache<A>(h, 2) : nullptr;
  A* cg = kCache ? cx + h : nullptr;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* xr = x + r * h;
    const T* gr = dy + r * h;
    T* out = dx + r * h;
    const A m = kRms ? A(0) : mean[r], rs = rstd[r];
    A s1 = 0, s2 = 0;
    for (int64_t j = G::Lane(); j < h; j += G::Size()) {
      const A xv = ToAcc(xr[j]), gv = ToAcc(gr[j]);
      if (kCache) {
        cx[j] = xv;
        cg[j] = gv;
      }
      const A xhat = (xv - m) * rs;
      const A dxhat = gamma != nullptr ? gv * gamma[j] : gv;
      s1 += dxhat;
      s2 += dxhat * xhat;
    }
    if (!kRms) s1 = GroupSum<kWarp>(s1);
    s2 = GroupSum<kWarp>(s2);
    const A a = kRms ? A(0) : s1 / static_cast<A>(h), c = s2 / static_cast<A>(h);
    for (int64_t j = G::Lane(); j < h; j += G::Size()) {
      const A xv = kCache ? cx[j] : ToAcc(xr[j]), gv = kCache ? cg[j] : ToAcc(gr[j]);
      const A xhat = (xv - m) * rs;
      const A dxhat = gamma != nullptr ? gv * gamma[j] : gv;
      out[j] = FromAcc<T>(rs * (dxhat - a - xhat * c));
    }
  }
}

constexpr int kColTile = 32;   // columns per block (a warp reads 32 consecutive columns)
constexpr int kRowLanes = 8;   // warps per block, striding over the chunk's rows

// Partial column sums over one chunk of rows: pdg[chunk, j] = sum dy * xhat, pdb[chunk, j] =
// sum dy. Block (32, 8), grid (column tiles, chunks). Fixed order: deterministic.
template <typename T, bool kRms>
__global__ void NormParamPartials(const T* __restrict__ x, const Acc<T>* __restrict__ mean,
                                  const Acc<T>* __restrict__ rstd, const T* __restrict__ dy,
                                  Acc<T>* __restrict__ pdg, Acc<T>* __restrict__ pdb,
                                  int64_t rows, int64_t h, int64_t rows_per_chunk) {
  using A = Acc<T>;
  __shared__ A sg[kRowLanes][kColTile + 1];
  __shared__ A sb[kRowLanes][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  A g = 0, b = 0;
  if (col < h) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const A d = ToAcc(dy[r * h + col]);
      const A xhat = (ToAcc(x[r * h + col]) - (kRms ? A(0) : mean[r])) * rstd[r];
      g += d * xhat;
      b += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    for (int k = 1; k < kRowLanes; ++k) {
      g += sg[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    pdg[static_cast<int64_t>(blockIdx.y) * h + col] = g;
    pdb[static_cast<int64_t>(blockIdx.y) * h + col] = b;
  }
}

template <typename A, typename O>
__global__ void SumChunks(const A* __restrict__ partial, int64_t chunks, int64_t h,
                          O* __restrict__ out) {
  SM_GRID_STRIDE_LOOP(j, h) {
    A v = 0;
    for (int64_t c = 0; c < chunks; ++c) v += partial[c * h + j];
    out[j] = StoreAs<O>(v);
  }
}

template <typename A>
int FinishColumn(const A* partial, int64_t chunks, int64_t h, void* out, DType dtype,
                 cudaStream_t s) {
  SM_DISPATCH_FLOAT(dtype, O, {
    SumChunks<A, O><<<Blocks(h), kThreads, 0, s>>>(partial, chunks, h, static_cast<O*>(out));
  });
  return cudaSuccess;
}

}  // namespace

int LaunchNorm(const void* x, const void* gamma, const void* beta, void* y, void* mean,
               void* rstd, DType dtype, int64_t rows, int64_t h, double eps, bool rms,
               void* stream) {
  if (rows == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    using A = Acc<T>;
    const RowLaunch l = RowConfig(rows, h, 1, sizeof(A));
    const T* px = static_cast<const T*>(x);
    const A* pg = static_cast<const A*>(gamma);
    const A* pb = static_cast<const A*>(beta);
    T* py = static_cast<T*>(y);
    A* pm = static_cast<A*>(mean);
    A* pr = static_cast<A*>(rstd);
    if (rms) {
      SM_ROW_CACHE_DISPATCH(l, NormRows<T, kWarp, kCache, true><<<l.blocks, l.threads, l.smem, s>>>(
                                   px, pg, pb, py, pm, pr, rows, h, eps));
    } else {
      SM_ROW_CACHE_DISPATCH(l, NormRows<T, kWarp, kCache, false><<<l.blocks, l.threads, l.smem, s>>>(
                                   px, pg, pb, py, pm, pr, rows, h, eps));
    }
  });
  return cudaGetLastError();
}

int LaunchNormBackwardDx(const void* x, const void* gamma, const void* mean, const void* rstd,
                         const void* dy, void* dx, DType dtype, int64_t rows, int64_t h, bool rms,
                         void* stream) {
  if (rows * h == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    using A = Acc<T>;
    const RowLaunch l = RowConfig(rows, h, 2, sizeof(A));
    const T* px = static_cast<const T*>(x);
    const A* pg = static_cast<const A*>(gamma);
    const A* pm = static_cast<const A*>(mean);
    const A* pr = static_cast<const A*>(rstd);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    if (rms) {
      SM_ROW_CACHE_DISPATCH(l, NormBackwardRows<T, kWarp, kCache, true>
                            <<<l.blocks, l.threads, l.smem, s>>>(px, pg, pm, pr, pdy, pdx, rows, h));
    } else {
      SM_ROW_CACHE_DISPATCH(l, NormBackwardRows<T, kWarp, kCache, false>
                            <<<l.blocks, l.threads, l.smem, s>>>(px, pg, pm, pr, pdy, pdx, rows, h));
    }
  });
  return cudaGetLastError();
}

int64_t NormParamChunks(int64_t rows) {
  int64_t c = (rows + 63) / 64;  // ~64 rows per chunk, at most 512 chunks
  if (c < 1) c = 1;
  if (c > 512) c = 512;
  return c;
}

int LaunchNormBackwardParams(const void* x, const void* mean, const void* rstd, const void* dy,
                             DType dtype, int64_t rows, int64_t h, bool rms, void* workspace,
                             void* dgamma, DType dgamma_dtype, void* dbeta, DType dbeta_dtype,
                             void* stream) {
  if (h == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  const int64_t chunks = NormParamChunks(rows);
  const int64_t per = (rows + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>((h + kColTile - 1) / kColTile),
                  static_cast<unsigned>(chunks));
  const dim3 block(kColTile, kRowLanes);
  SM_DISPATCH_FLOAT(dtype, T, {
    using A = Acc<T>;
    A* pdg = static_cast<A*>(workspace);
    A* pdb = pdg + chunks * h;
    const T* px = static_cast<const T*>(x);
    const A* pm = static_cast<const A*>(mean);
    const A* pr = static_cast<const A*>(rstd);
    const T* pdy = static_cast<const T*>(dy);
    if (rms) {
      NormParamPartials<T, true><<<grid, block, 0, s>>>(px, pm, pr, pdy, pdg, pdb, rows, h, per);
    } else {
      NormParamPartials<T, false><<<grid, block, 0, s>>>(px, pm, pr, pdy, pdg, pdb, rows, h, per);
    }
    if (dgamma != nullptr) {
      const int e = FinishColumn<A>(pdg, chunks, h, dgamma, dgamma_dtype, s);
      if (e != cudaSuccess) return e;
    }
    if (dbeta != nullptr) {
      const int e = FinishColumn<A>(pdb, chunks, h, dbeta, dbeta_dtype, s);
      if (e != cudaSuccess) return e;
    }
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
