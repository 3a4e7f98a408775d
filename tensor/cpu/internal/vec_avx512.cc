// The vec_math kernels for AVX512 (16 floats a register), compiled with -mavx512f.
// Only vec_math.cc calls in here, after checking that the CPU has the ISA.
#include <sleef.h>

#include <cstdint>

#include "tensor/cpu/vec_math.h"

namespace shardmap::cpu::internal {
namespace {

struct Isa {
  typedef float V __attribute__((vector_size(64)));
  typedef float H __attribute__((vector_size(32)));
  typedef double D __attribute__((vector_size(64)));
  static constexpr int kLanes = 16;
  static V Exp(V x) { return Sleef_expf16_u10avx512f(x); }
  static V Log(V x) { return Sleef_logf16_u10avx512f(x); }
  static V Tanh(V x) { return Sleef_tanhf16_u10avx512f(x); }
  static V Erfc(V x) { return Sleef_erfcf16_u15avx512f(x); }
};

#include "tensor/cpu/internal/vec_kernels_inl.h"

constexpr VecKernels kKernels = MakeKernels<Isa>("avx512");

}  // namespace

const VecKernels& VecKernelsAvx512() { return kKernels; }

}  // namespace shardmap::cpu::internal
