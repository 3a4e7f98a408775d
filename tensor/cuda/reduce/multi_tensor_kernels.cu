// Multi-tensor kernels (see multi_tensor_kernels.h).
#include <cstring>

#include "tensor/cuda/kernels/kernel_util.cuh"
#include "tensor/cuda/reduce/multi_tensor_kernels.h"

namespace shardmap::cuda::kernels {
namespace {

constexpr int kMtThreads = 256;
// Bytes per upload launch: with the other parameters under the classic 4 KiB parameter limit.
constexpr size_t kUploadBytes = 3968;

struct UploadBytes {
  unsigned char b[kUploadBytes];
};

__global__ void UploadKernel(UploadBytes bytes, size_t n, unsigned char* __restrict__ dst) {
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = bytes.b[i];
}

__device__ __forceinline__ double Square(float v) { return static_cast<double>(v) * v; }

template <typename T>
__device__ double ChunkSumSq(const T* __restrict__ x, int64_t begin, int64_t end) {
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(ToAcc(x[i]));
    s += v * v;
  }
  return s;
}

// f32 with 16-byte loads: the chunk's start is a multiple of 4 elements past an aligned base.
__device__ double ChunkSumSqF32Vec(const float* __restrict__ x, int64_t begin, int64_t end) {
  double s = 0;
  const int64_t nvec = (end - begin) / 4;
  const float4* v4 = reinterpret_cast<const float4*>(x + begin);
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
    const float4 v = v4[i];
    s += Square(v.x) + Square(v.y) + Square(v.z) + Square(v.w);
  }
  for (int64_t i = begin + nvec * 4 + threadIdx.x; i < end; i += blockDim.x) s += Square(x[i]);
  return s;
}

// Sum over the block in a fixed order (a tree over the threads): deterministic.
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kMtThreads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x < 32) {
    total = threadIdx.x < kMtThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o /= 2) total += __shfl_down_sync(0xffffffffu, total, o);
  }
  __syncthreads();  // warp_sums may be reused by the caller's next BlockSum
  return total;     // valid in thread 0
}

__global__ void __launch_bounds__(kMtThreads)
    SumOfSquaresPartials(const MultiTensorEntry* __restrict__ table, int count, int64_t chunks,
                         double* __restrict__ partials) {
  double s = 0;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const MultiTensorEntry& e = table[FindEntry(table, count, c)];
    const int64_t begin = (c - e.chunk_begin) * kMultiTensorChunk;
    const int64_t end = min(e.n, begin + kMultiTensorChunk);
    switch (static_cast<DType>(e.dtype)) {
      case DType::kF32:
        s += e.aligned ? ChunkSumSqF32Vec(static_cast<const float*>(e.a), begin, end)
                       : ChunkSumSq(static_cast<const float*>(e.a), begin, end);
        break;
      case DType::kF64: s += ChunkSumSq(static_cast<const double*>(e.a), begin, end); break;
      case DType::kBF16:
        s += ChunkSumSq(static_cast<const __nv_bfloat16*>(e.a), begin, end);
        break;
      case DType::kF16: s += ChunkSumSq(static_cast<const __half*>(e.a), begin, end); break;
      default: break;  // the host admits floating tensors only
    }
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kMtThreads)
    SumPartials(const double* __restrict__ partials, int64_t n, void* out, bool out_f64) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  s = BlockSum(s);
  if (threadIdx.x == 0) {
    if (out_f64) {
      *static_cast<double*>(out) = s;
    } else {
      *static_cast<float*>(out) = static_cast<float>(s);
    }
  }
}

__device__ __forceinline__ double ReadScalar(const void* p, bool f64) {
  return f64 ? *static_cast<const double*>(p) : static_cast<double>(*static_cast<const float*>(p));
}

template <typename T>
__device__ void ScaleChunk(T* __restrict__ x, int64_t begin, int64_t end, Acc<T> s) {
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] = FromAcc<T>(ToAcc(x[i]) * s);
}

__device__ void ScaleChunkF32Vec(float* __restrict__ x, int64_t begin, int64_t end, float s) {
  const int64_t nvec = (end - begin) / 4;
  float4* v4 = reinterpret_cast<float4*>(x + begin);
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
    float4 v = v4[i];
    v.x *= s;
    v.y *= s;
    v.z *= s;
    v.w *= s;
    v4[i] = v;
  }
  for (int64_t i = begin + nvec * 4 + threadIdx.x; i < end; i += blockDim.x) x[i] *= s;
}

__global__ void __launch_bounds__(kMtThreads)
    ScaleInPlaceKernel(const MultiTensorEntry* __restrict__ table, int count, int64_t chunks,
                       const void* scale, bool scale_f64) {
  const double s = ReadScalar(scale, scale_f64);
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const MultiTensorEntry& e = table[FindEntry(table, count, c)];
    const int64_t begin = (c - e.chunk_begin) * kMultiTensorChunk;
    const int64_t end = min(e.n, begin + kMultiTensorChunk);
    switch (static_cast<DType>(e.dtype)) {
      case DType::kF32:
        if (e.aligned) {
          ScaleChunkF32Vec(static_cast<float*>(e.a), begin, end, static_cast<float>(s));
        } else {
          ScaleChunk(static_cast<float*>(e.a), begin, end, static_cast<float>(s));
        }
        break;
      case DType::kF64: ScaleChunk(static_cast<double*>(e.a), begin, end, s); break;
      case DType::kBF16:
        ScaleChunk(static_cast<__nv_bfloat16*>(e.a), begin, end, static_cast<float>(s));
        break;
      case DType::kF16:
        ScaleChunk(static_cast<__half*>(e.a), begin, end, static_cast<float>(s));
        break;
      default: break;
    }
  }
}

__global__ void AdamWPrepareKernel(AdamWScalars* sc, int64_t set_step, double lr, double beta1,
                                   double beta2, double weight_decay, const void* grad_scale,
                                   bool grad_scale_f64, const double* lr_device,
                                   const void* skip_check, bool skip_check_f64) {
  if (skip_check != nullptr && !isfinite(ReadScalar(skip_check, skip_check_f64))) {
    sc->skip = 1;  // the update kernel returns at once; the count stays
    return;
  }
  sc->skip = 0;
  if (lr_device != nullptr) lr = *lr_device;
  const int64_t t = (set_step >= 0 ? set_step : sc->step) + 1;
  sc->step = t;
  const double bc1 = 1.0 - pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - pow(beta2, static_cast<double>(t));
  sc->step_size = static_cast<float>(lr / bc1);
  sc->inv_sqrt_bc2 = static_cast<float>(1.0 / sqrt(bc2));
  sc->decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  sc->grad_scale = grad_scale ? static_cast<float>(ReadScalar(grad_scale, grad_scale_f64)) : 1.0f;
}

struct AdamWConsts {
  float b1, one_minus_b1, b2, one_minus_b2, eps, step_size, inv_sqrt_bc2, decay, grad_scale;
};

__device__ __forceinline__ void AdamWElement(float& p, float g, float& m, float& v,
                                             const AdamWConsts& k) {
  g *= k.grad_scale;
  m = k.b1 * m + k.one_minus_b1 * g;
  v = k.b2 * v + k.one_minus_b2 * (g * g);
  const float denom = sqrtf(v) * k.inv_sqrt_bc2 + k.eps;
  p = p * k.decay - k.step_size * (m / denom);
}

__global__ void __launch_bounds__(kMtThreads)
    AdamWKernel(const MultiTensorEntry* __restrict__ table, int count, int64_t chunks,
                const AdamWScalars* __restrict__ sc, float beta1, float beta2, float eps) {
  if (sc->skip) return;  // the same value for every block: a non-finite step leaves all as is
  AdamWConsts k;
  k.b1 = beta1;
  k.one_minus_b1 = 1.0f - beta1;
  k.b2 = beta2;
  k.one_minus_b2 = 1.0f - beta2;
  k.eps = eps;
  k.step_size = sc->step_size;
  k.inv_sqrt_bc2 = sc->inv_sqrt_bc2;
  k.grad_scale = sc->grad_scale;
  const float decay_factor = sc->decay_factor;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const MultiTensorEntry& e = table[FindEntry(table, count, c)];
    const int64_t begin = (c - e.chunk_begin) * kMultiTensorChunk;
    const int64_t end = min(e.n, begin + kMultiTensorChunk);
    k.decay = e.decay ? decay_factor : 1.0f;
    float* __restrict__ p = static_cast<float*>(e.a) + begin;
    const float* __restrict__ g = static_cast<const float*>(e.b) + begin;
    float* __restrict__ m = static_cast<float*>(e.c) + begin;
    float* __restrict__ v = static_cast<float*>(e.d) + begin;
    const int64_t n = end - begin;
    int64_t done = 0;
    if (e.aligned) {
      const int64_t nvec = n / 4;
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
        float4 pv = reinterpret_cast<float4*>(p)[i];
        const float4 gv = reinterpret_cast<const float4*>(g)[i];
        float4 mv = reinterpret_cast<float4*>(m)[i];
        float4 vv = reinterpret_cast<float4*>(v)[i];
        AdamWElement(pv.x, gv.x, mv.x, vv.x, k);
        AdamWElement(pv.y, gv.y, mv.y, vv.y, k);
        AdamWElement(pv.z, gv.z, mv.z, vv.z, k);
        AdamWElement(pv.w, gv.w, mv.w, vv.w, k);
        reinterpret_cast<float4*>(p)[i] = pv;
        reinterpret_cast<float4*>(m)[i] = mv;
        reinterpret_cast<float4*>(v)[i] = vv;
      }
      done = nvec * 4;
    }
    for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
      float pp = p[i], mm = m[i], vv = v[i];
      AdamWElement(pp, g[i], mm, vv, k);
      p[i] = pp;
      m[i] = mm;
      v[i] = vv;
    }
  }
}

__global__ void ClipCoefficientKernel(const void* sum_sq, bool sum_sq_f64, double max_norm,
                                      void* out, bool out_f64) {
  const double norm = sqrt(ReadScalar(sum_sq, sum_sq_f64));
  double coef = max_norm / (norm + 1e-6);
  if (!(coef < 1.0)) coef = 1.0;  // min(1, coef); a NaN norm leaves NaN (coef < 1 is false)
  if (norm != norm) coef = norm;
  if (out_f64) {
    *static_cast<double*>(out) = coef;
  } else {
    *static_cast<float*>(out) = static_cast<float>(coef);
  }
}

}  // namespace

int LaunchUploadTable(const void* host, size_t nbytes, void* dst, void* stream) {
  const cudaStream_t s = AsStream(stream);
  const unsigned char* src = static_cast<const unsigned char*>(host);
  unsigned char* out = static_cast<unsigned char*>(dst);
  for (size_t off = 0; off < nbytes; off += kUploadBytes) {
    const size_t n = nbytes - off < kUploadBytes ? nbytes - off : kUploadBytes;
    UploadBytes bytes;
    std::memcpy(bytes.b, src + off, n);
    UploadKernel<<<1, kMtThreads, 0, s>>>(bytes, n, out + off);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

int LaunchSumOfSquares(const MultiTensorEntry* table, int count, int64_t chunks, double* partials,
                       void* out, DType out_dtype, void* stream) {
  if (out_dtype != DType::kF32 && out_dtype != DType::kF64) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  const int64_t blocks = MultiTensorBlocks(chunks);
  if (chunks == 0) {
    // No elements: the one "partial" is 0.
    SumPartials<<<1, kMtThreads, 0, s>>>(partials, 0, out, out_dtype == DType::kF64);
    return cudaGetLastError();
  }
  SumOfSquaresPartials<<<static_cast<unsigned>(blocks), kMtThreads, 0, s>>>(table, count, chunks,
                                                                            partials);
  SumPartials<<<1, kMtThreads, 0, s>>>(partials, blocks, out, out_dtype == DType::kF64);
  return cudaGetLastError();
}

int LaunchScaleInPlace(const MultiTensorEntry* table, int count, int64_t chunks,
                       const void* scale, bool scale_f64, void* stream) {
  if (chunks == 0) return cudaSuccess;
  ScaleInPlaceKernel<<<static_cast<unsigned>(MultiTensorBlocks(chunks)), kMtThreads, 0,
                       AsStream(stream)>>>(table, count, chunks, scale, scale_f64);
  return cudaGetLastError();
}

int LaunchAdamWPrepare(AdamWScalars* scalars, int64_t set_step, double lr, double beta1,
                       double beta2, double weight_decay, const void* grad_scale,
                       bool grad_scale_f64, void* stream, const double* lr_device,
                       const void* skip_check, bool skip_check_f64) {
  AdamWPrepareKernel<<<1, 1, 0, AsStream(stream)>>>(scalars, set_step, lr, beta1, beta2,
                                                    weight_decay, grad_scale, grad_scale_f64,
                                                    lr_device, skip_check, skip_check_f64);
  return cudaGetLastError();
}

int LaunchAdamW(const MultiTensorEntry* table, int count, int64_t chunks,
                const AdamWScalars* scalars, double beta1, double beta2, double eps,
                void* stream) {
  if (chunks == 0) return cudaSuccess;
  AdamWKernel<<<static_cast<unsigned>(MultiTensorBlocks(chunks)), kMtThreads, 0,
                AsStream(stream)>>>(table, count, chunks, scalars, static_cast<float>(beta1),
                                    static_cast<float>(beta2), static_cast<float>(eps));
  return cudaGetLastError();
}

int LaunchClipCoefficient(const void* sum_sq, bool sum_sq_f64, double max_norm, void* out,
                          bool out_f64, void* stream) {
  ClipCoefficientKernel<<<1, 1, 0, AsStream(stream)>>>(sum_sq, sum_sq_f64, max_norm, out,
                                                       out_f64);
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::kernels
