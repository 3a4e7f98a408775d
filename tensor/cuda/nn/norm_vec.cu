// Register-resident LayerNorm / RmsNorm forward and backward (plan and layout: norm_plan.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"
#include "tensor/cuda/nn/norm_plan.h"
#include "tensor/cuda/nn/vec_row.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

template <typename T, bool kRms, int kTpr, int kVecs>
__global__ void __launch_bounds__(kTpr > 128 ? kTpr : 128)
    NormForwardVec(const T* __restrict__ x, const float* __restrict__ gamma,
                   const float* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean,
                   float* __restrict__ rstd, int64_t rows, int h, double eps) {
  constexpr int V = VecWidth<T>();
  constexpr int kRowsPerBlock = (kTpr > 128 ? kTpr : 128) / kTpr;
  const int lane = static_cast<int>(threadIdx.x) % kTpr;
  const int slot = static_cast<int>(threadIdx.x) / kTpr;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + r * h;
    float v[kVecs][V];
    float s = 0;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < h) {
        LoadVec(xr + j, v[i]);
#pragma unroll
        for (int e = 0; e < V; ++e) s += v[i][e];
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) v[i][e] = 0;
      }
    }
    float m = 0;
    if constexpr (!kRms) m = RowSum<kTpr>(s) / static_cast<float>(h);
    float ss = 0;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if ((i * kTpr + lane) * V < h) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float d = v[i][e] - m;
          ss += d * d;
        }
      }
    }
    ss = RowSum<kTpr>(ss);
    const float rs =
        static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(h) + eps));
    if (lane == 0) {
      if constexpr (!kRms) mean[r] = m;
      rstd[r] = rs;
    }
    T* yr = y + r * h;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < h) {
        float o[V];
        float g[V], b[V];
        if (gamma != nullptr) LoadFloats<V>(gamma + j, g);
        if (!kRms && beta != nullptr) LoadFloats<V>(beta + j, b);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          float t = kRms ? v[i][e] * rs : (v[i][e] - m) * rs;
          if (gamma != nullptr) t *= g[e];
          if (!kRms && beta != nullptr) t += b[e];
          o[e] = t;
        }
        StoreVec(yr + j, o);
      }
    }
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma (RmsNorm:
// no mean(dxhat) term, xhat = x * rstd). kParams: each row group also accumulates
// dy * xhat (and dy, LayerNorm) per column over its rows and writes them as partial row
// `group` of pdg / pdb ([groups, h] floats).
template <typename T, bool kRms, int kTpr, int kVecs, bool kParams>
__global__ void __launch_bounds__(kTpr > 128 ? kTpr : 128)
    NormBackwardVec(const T* __restrict__ x, const float* __restrict__ gamma,
                    const float* __restrict__ mean, const float* __restrict__ rstd,
                    const T* __restrict__ dy, T* __restrict__ dx, int64_t rows, int h,
                    float* __restrict__ pdg, float* __restrict__ pdb) {
  constexpr int V = VecWidth<T>();
  constexpr int kRowsPerBlock = (kTpr > 128 ? kTpr : 128) / kTpr;
  const int lane = static_cast<int>(threadIdx.x) % kTpr;
  const int slot = static_cast<int>(threadIdx.x) / kTpr;
  float dg[kParams ? kVecs : 1][V];
  float db[kParams && !kRms ? kVecs : 1][V];
  if constexpr (kParams) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        dg[i][e] = 0;
        if constexpr (!kRms) db[i][e] = 0;
      }
    }
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + r * h;
    const T* gr = dy + r * h;
    const float m = kRms ? 0.0f : mean[r], rs = rstd[r];
    float xh[kVecs][V], dxh[kVecs][V];  // xhat and dxhat of this thread's elements
    float s1 = 0, s2 = 0;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < h) {
        float xv[V], gv[V], g[V];
        LoadVec(xr + j, xv);
        LoadVec(gr + j, gv);
        if (gamma != nullptr) LoadFloats<V>(gamma + j, g);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xhat = (xv[e] - m) * rs;
          const float dxhat = gamma != nullptr ? gv[e] * g[e] : gv[e];
          s1 += dxhat;
          s2 += dxhat * xhat;
          xh[i][e] = xhat;
          dxh[i][e] = dxhat;
          if constexpr (kParams) {
            dg[i][e] += gv[e] * xhat;
            if constexpr (!kRms) db[i][e] += gv[e];
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) xh[i][e] = dxh[i][e] = 0;
      }
    }
    if constexpr (!kRms) s1 = RowSum<kTpr>(s1);
    s2 = RowSum<kTpr>(s2);
    const float a = kRms ? 0.0f : s1 / static_cast<float>(h);
    const float c = s2 / static_cast<float>(h);
    T* out = dx + r * h;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < h) {
        float o[V];
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = rs * (dxh[i][e] - a - xh[i][e] * c);
        StoreVec(out + j, o);
      }
    }
  }
  if constexpr (kParams) {
    const int64_t group = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < h) {
        if (pdg != nullptr) StoreFloats<V>(pdg + group * h + j, dg[i]);
        if constexpr (!kRms) {
          if (pdb != nullptr) StoreFloats<V>(pdb + group * h + j, db[i]);
        }
      }
    }
  }
}

constexpr int kFoldCols = 32;
constexpr int kFoldLanes = 16;

// out[j] = sum over g < groups of partial[g, j], in a fixed order: lane l of column j sums
// g = l, l + 16, ...; then the 16 lane sums in order. Block (32, 16), grid ceil(h / 32).
template <typename O>
__global__ void FoldPartialRows(const float* __restrict__ partial, int64_t groups, int64_t h,
                                O* __restrict__ out) {
  __shared__ float sums[kFoldLanes][kFoldCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kFoldCols + threadIdx.x;
  float s = 0;
  if (col < h) {
    for (int64_t g = threadIdx.y; g < groups; g += kFoldLanes) s += partial[g * h + col];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    float t = 0;
#pragma unroll
    for (int l = 0; l < kFoldLanes; ++l) t += sums[l][threadIdx.x];
    out[col] = StoreAs<O>(t);
  }
}

int Fold(const float* partial, int64_t groups, int64_t h, void* out, DType dtype,
         cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((h + kFoldCols - 1) / kFoldCols));
  const dim3 block(kFoldCols, kFoldLanes);
  SM_DISPATCH_FLOAT(dtype, O, {
    FoldPartialRows<O><<<grid, block, 0, s>>>(partial, groups, h, static_cast<O*>(out));
  });
  return cudaGetLastError();
}

}  // namespace

bool VecNormUsable(DType dtype, int64_t h, std::initializer_list<const void*> pointers) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) return false;
  if (h > (int64_t{1} << 30)) return false;
  if (!PlanVecNorm(h, static_cast<int>(DTypeSize(dtype))).ok) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;  // nullptr is aligned
  }
  return true;
}

int64_t VecNormPartialRows(DType dtype, int64_t rows, int64_t h) {
  const VecNormPlan p = PlanVecNorm(h, static_cast<int>(DTypeSize(dtype)));
  if (!p.ok) return 0;
  return VecNormBackwardBlocks(p, rows, h) * p.rows_per_block;
}

int LaunchNormVec(const void* x, const void* gamma, const void* beta, void* y, void* mean,
                  void* rstd, DType dtype, int64_t rows, int64_t h, double eps, bool rms,
                  void* stream) {
  if (rows == 0) return cudaSuccess;
  const VecNormPlan p = PlanVecNorm(h, static_cast<int>(DTypeSize(dtype)));
  if (!p.ok) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  const unsigned blocks = static_cast<unsigned>(VecNormBlocks(p, rows));
  const int hi = static_cast<int>(h);
  SM_VEC_NORM_TYPES(dtype, T, {
    constexpr int V = VecWidth<T>();
    const T* px = static_cast<const T*>(x);
    const float* pg = static_cast<const float*>(gamma);
    const float* pb = static_cast<const float*>(beta);
    T* py = static_cast<T*>(y);
    float* pm = static_cast<float*>(mean);
    float* pr = static_cast<float*>(rstd);
    SM_VEC_NORM_DISPATCH(p, V, {
      if (rms) {
        NormForwardVec<T, true, kTpr, kVecs>
            <<<blocks, p.threads, 0, s>>>(px, pg, pb, py, pm, pr, rows, hi, eps);
      } else {
        NormForwardVec<T, false, kTpr, kVecs>
            <<<blocks, p.threads, 0, s>>>(px, pg, pb, py, pm, pr, rows, hi, eps);
      }
    });
  });
  return cudaGetLastError();
}

int LaunchNormBackwardVec(const void* x, const void* gamma, const void* mean, const void* rstd,
                          const void* dy, void* dx, DType dtype, int64_t rows, int64_t h,
                          bool rms, void* workspace, void* dgamma, DType dgamma_dtype,
                          void* dbeta, DType dbeta_dtype, void* stream) {
  const VecNormPlan p = PlanVecNorm(h, static_cast<int>(DTypeSize(dtype)));
  if (!p.ok) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  const bool params = dgamma != nullptr || dbeta != nullptr;
  const int64_t blocks64 = params ? VecNormBackwardBlocks(p, rows, h) : VecNormBlocks(p, rows);
  const unsigned blocks = static_cast<unsigned>(blocks64);
  const int64_t groups = blocks64 * p.rows_per_block;
  float* pdg = params ? static_cast<float*>(workspace) : nullptr;
  float* pdb = params && !rms ? pdg + groups * h : nullptr;
  const int hi = static_cast<int>(h);
  SM_VEC_NORM_TYPES(dtype, T, {
    constexpr int V = VecWidth<T>();
    const T* px = static_cast<const T*>(x);
    const float* pg = static_cast<const float*>(gamma);
    const float* pm = static_cast<const float*>(mean);
    const float* pr = static_cast<const float*>(rstd);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    SM_VEC_NORM_DISPATCH(p, V, {
      if (rms && params) {
        NormBackwardVec<T, true, kTpr, kVecs, true>
            <<<blocks, p.threads, 0, s>>>(px, pg, pm, pr, pdy, pdx, rows, hi, pdg, pdb);
      } else if (rms) {
        NormBackwardVec<T, true, kTpr, kVecs, false>
            <<<blocks, p.threads, 0, s>>>(px, pg, pm, pr, pdy, pdx, rows, hi, pdg, pdb);
      } else if (params) {
        NormBackwardVec<T, false, kTpr, kVecs, true>
            <<<blocks, p.threads, 0, s>>>(px, pg, pm, pr, pdy, pdx, rows, hi, pdg, pdb);
      } else {
        NormBackwardVec<T, false, kTpr, kVecs, false>
            <<<blocks, p.threads, 0, s>>>(px, pg, pm, pr, pdy, pdx, rows, hi, pdg, pdb);
      }
    });
  });
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (dgamma != nullptr) {
    if (const int e = Fold(pdg, groups, h, dgamma, dgamma_dtype, s); e != cudaSuccess) return e;
  }
  if (dbeta != nullptr && !rms) {
    if (const int e = Fold(pdb, groups, h, dbeta, dbeta_dtype, s); e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
