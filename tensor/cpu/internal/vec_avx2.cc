// The vec_math kernels for AVX2 (8 floats a register), compiled with -mavx2 -mfma.
// Only vec_math.cc calls in here, after checking that the CPU has the ISA.
#include <sleef.h>

#include <cstdint>

#include "tensor/cpu/vec_math.h"

namespace shardmap::cpu::internal {
namespace {

struct Isa {
  typedef float V __attribute__((vector_size(32)));
  typedef float H __attribute__((vector_size(16)));
  typedef double D __attribute__((vector_size(32)));
  static constexpr int kLanes = 8;
  static V Exp(V x) { return Sleef_expf8_u10avx2(x); }
  static V Log(V x) { return Sleef_logf8_u10avx2(x); }
  static V Tanh(V x) { return Sleef_tanhf8_u10avx2(x); }
  static V Erfc(V x) { return Sleef_erfcf8_u15avx2(x); }
};

#include "tensor/cpu/internal/vec_kernels_inl.h"

constexpr VecKernels kKernels = MakeKernels<Isa>("avx2");

}  // namespace

const VecKernels& VecKernelsAvx2() { return kKernels; }

}  // namespace shardmap::cpu::internal
