// The vec_math kernels for AVX2 (8 floats a register), compiled with -mavx2 -mfma.
// Only vec_math.cc calls in here, after checking that the CPU has the ISA.
#include <immintrin.h>
#include <sleef.h>

#include <cstdint>

#include "tensor/cpu/internal/libmvec.h"
#include "tensor/cpu/vec_math.h"

namespace shardmap::cpu::internal {
namespace {

struct Isa {
  typedef float V __attribute__((vector_size(32)));
  typedef float H __attribute__((vector_size(16)));
  typedef double D __attribute__((vector_size(32)));
  static constexpr int kLanes = 8;
  static V Exp(V x) { return Sleef_expf8_u10avx2(x); }
  static V Log(V x) { return Sleef_logf8_u35avx2(x); }
  static V Tanh(V x) { return _ZGVdN8v_tanhf(x); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  template <bool kStream, class R>
  static void Put(float* p, R v) {
    if constexpr (kStream) {
      _mm256_stream_ps(p, v);
    } else {
      _mm256_storeu_ps(p, v);
    }
  }
  static void StreamFence() { _mm_sfence(); }
  // 8x8: unpack pairs of rows (32-bit, then 64-bit), then swap 128-bit halves.
  template <bool kStream>
  static void Transpose(const void* src, int64_t ss, void* dst, int64_t ds) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    __m256 r[8], t[8], u[8];
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(s + k * ss);
    for (int k = 0; k < 8; k += 2) {
      t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
      t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    // u[4g + c], half L: column 4L + c of rows 4g .. 4g + 3.
    for (int g = 0; g < 2; ++g) {
      const __m256d a = _mm256_castps_pd(t[4 * g]), b = _mm256_castps_pd(t[4 * g + 1]);
      const __m256d c = _mm256_castps_pd(t[4 * g + 2]), e = _mm256_castps_pd(t[4 * g + 3]);
      u[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, c));
      u[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, c));
      u[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b, e));
      u[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b, e));
    }
    for (int c = 0; c < 4; ++c) {
      Put<kStream>(d + c * ds, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
      Put<kStream>(d + (4 + c) * ds, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
  }
};

#include "tensor/cpu/internal/vec_kernels_inl.h"

constexpr VecKernels kKernels = MakeKernels<Isa>("avx2");

}  // namespace

const VecKernels& VecKernelsAvx2() { return kKernels; }

}  // namespace shardmap::cpu::internal
