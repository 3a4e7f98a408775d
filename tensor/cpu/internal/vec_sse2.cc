// The vec_math kernels for SSE2 (4 floats a register), compiled with no extra flags (the x86-64 baseline).
// Only vec_math.cc calls in here, after checking that the CPU has the ISA.
#include <sleef.h>

#include <cstdint>

#include "tensor/cpu/vec_math.h"

namespace shardmap::cpu::internal {
namespace {

struct Isa {
  typedef float V __attribute__((vector_size(16)));
  typedef float H __attribute__((vector_size(8)));
  typedef double D __attribute__((vector_size(16)));
  static constexpr int kLanes = 4;
  static V Exp(V x) { return Sleef_expf4_u10sse2(x); }
  static V Log(V x) { return Sleef_logf4_u10sse2(x); }
  static V Tanh(V x) { return Sleef_tanhf4_u10sse2(x); }
  static V Erfc(V x) { return Sleef_erfcf4_u15sse2(x); }
};

#include "tensor/cpu/internal/vec_kernels_inl.h"

constexpr VecKernels kKernels = MakeKernels<Isa>("sse2");

}  // namespace

const VecKernels& VecKernelsSse2() { return kKernels; }

}  // namespace shardmap::cpu::internal
