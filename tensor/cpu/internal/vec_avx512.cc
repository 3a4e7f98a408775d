// The vec_math kernels for AVX512 (16 floats a register), compiled with -mavx512f.
// Only vec_math.cc calls in here, after checking that the CPU has the ISA.
// GCC 12's unmasked AVX-512 shuffle intrinsics start from _mm512_undefined_*() and warn
// "'__Y' is (may be) used uninitialized" once inlined (GCC bug 105593, fixed in GCC 13): silenced
// for this file's intrinsics only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <sleef.h>

#include <cstdint>

#include "tensor/cpu/internal/libmvec.h"
#include "tensor/cpu/vec_math.h"

namespace shardmap::cpu::internal {
namespace {

struct Isa {
  typedef float V __attribute__((vector_size(64)));
  typedef float H __attribute__((vector_size(32)));
  typedef double D __attribute__((vector_size(64)));
  static constexpr int kLanes = 16;
  static V Exp(V x) { return Sleef_expf16_u10avx512f(x); }
  static V Log(V x) { return Sleef_logf16_u35avx512f(x); }
  static V Tanh(V x) { return _ZGVeN16v_tanhf(x); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  template <bool kStream, class R>
  static void Put(float* p, R v) {
    if constexpr (kStream) {
      _mm512_stream_ps(p, v);
    } else {
      _mm512_storeu_ps(p, v);
    }
  }
  static void StreamFence() { _mm_sfence(); }
  // 16x16: unpack pairs of rows (32-bit, then 64-bit), then a 4x4 transpose of 128-bit lanes.
  template <bool kStream>
  static void Transpose(const void* src, int64_t ss, void* dst, int64_t ds) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    __m512 r[16], t[16];
    for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(s + k * ss);
    for (int k = 0; k < 16; k += 2) {
      t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
      t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    }
    // u[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3.
    __m512 u[16];
    for (int g = 0; g < 4; ++g) {
      const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * g + 2]), e = _mm512_castps_pd(t[4 * g + 3]);
      u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
      const __m512 b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
      const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const __m512 f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      Put<kStream>(d + c * ds, _mm512_shuffle_f32x4(a, e, 0x88));
      Put<kStream>(d + (4 + c) * ds, _mm512_shuffle_f32x4(a, e, 0xDD));
      Put<kStream>(d + (8 + c) * ds, _mm512_shuffle_f32x4(b, f, 0x88));
      Put<kStream>(d + (12 + c) * ds, _mm512_shuffle_f32x4(b, f, 0xDD));
    }
  }
};

#include "tensor/cpu/internal/vec_kernels_inl.h"

constexpr VecKernels kKernels = MakeKernels<Isa>("avx512");

}  // namespace

const VecKernels& VecKernelsAvx512() { return kKernels; }

}  // namespace shardmap::cpu::internal
