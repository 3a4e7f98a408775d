// The vec_math kernels for SSE2 (4 floats a register), compiled with no extra flags (the x86-64 baseline).
// Only vec_math.cc calls in here, after checking that the CPU has the ISA.
#include <emmintrin.h>
#include <sleef.h>
#include <xmmintrin.h>

#include <cstdint>

#include "tensor/cpu/internal/libmvec.h"
#include "tensor/cpu/vec_math.h"

namespace shardmap::cpu::internal {
namespace {

struct Isa {
  typedef float V __attribute__((vector_size(16)));
  typedef float H __attribute__((vector_size(8)));
  typedef double D __attribute__((vector_size(16)));
  static constexpr int kLanes = 4;
  static V Exp(V x) { return Sleef_expf4_u10sse2(x); }
  static V Log(V x) { return Sleef_logf4_u35sse2(x); }
  static V Tanh(V x) { return _ZGVbN4v_tanhf(x); }
  static V Min(V a, V b) { return _mm_min_ps(a, b); }
  static V Fma(V a, V b, V c) { return a * b + c; }  // two roundings: no FMA on the baseline
  template <bool kStream, class R>
  static void Put(float* p, R v) {
    if constexpr (kStream) {
      _mm_stream_ps(p, v);
    } else {
      _mm_storeu_ps(p, v);
    }
  }
  static void StreamFence() { _mm_sfence(); }
  template <bool kStream>
  static void Transpose(const void* src, int64_t ss, void* dst, int64_t ds) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    __m128 r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + ss);
    __m128 r2 = _mm_loadu_ps(s + 2 * ss), r3 = _mm_loadu_ps(s + 3 * ss);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    Put<kStream>(d, r0);
    Put<kStream>(d + ds, r1);
    Put<kStream>(d + 2 * ds, r2);
    Put<kStream>(d + 3 * ds, r3);
  }
};

#include "tensor/cpu/internal/vec_kernels_inl.h"

constexpr VecKernels kKernels = MakeKernels<Isa>("sse2");

}  // namespace

const VecKernels& VecKernelsSse2() { return kKernels; }

}  // namespace shardmap::cpu::internal
