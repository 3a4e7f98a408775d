#include "tensor/cpu/vec_math.h"

#include <initializer_list>

namespace shardmap::cpu {
namespace internal {
// Defined in vec_sse2.cc / vec_avx2.cc / vec_avx512.cc, each compiled for its ISA.
const VecKernels& VecKernelsSse2();
const VecKernels& VecKernelsAvx2();
const VecKernels& VecKernelsAvx512();
}  // namespace internal

const VecKernels* VecFor(VecIsa isa) {
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV).
  switch (isa) {
    case VecIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") ? &internal::VecKernelsAvx512() : nullptr;
    case VecIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                 ? &internal::VecKernelsAvx2()
                 : nullptr;
    case VecIsa::kSse2:
      return &internal::VecKernelsSse2();  // part of x86-64
  }
  return nullptr;
}

const VecKernels& Vec() {
  static const VecKernels* const best = [] {
    for (VecIsa isa : {VecIsa::kAvx512, VecIsa::kAvx2}) {
      if (const VecKernels* k = VecFor(isa)) return k;
    }
    return VecFor(VecIsa::kSse2);
  }();
  return *best;
}

}  // namespace shardmap::cpu
