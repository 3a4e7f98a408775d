// glibc's vector tanh (libmvec, glibc >= 2.35), declared by its x86-64 vector-function ABI
// names, which <math.h> only exposes to OpenMP SIMD loops:
//
//   __m256 y = _ZGVdN8v_tanhf(x);  // 8 lanes, AVX2; 'b' = SSE (4 lanes), 'e' = AVX-512 (16)
//
// tanhf measured within 1.4 ulp and 1.15x (AVX-512), 1.15x (AVX2), 1.6x (SSE2) faster than
// SLEEF's 3.5-ulp one on 4M floats; its 16-lane version is the faster one on AVX-512.
// Include only from a file compiled for the ISA of the function it calls.
#ifndef SHARDMAP_TENSOR_CPU_INTERNAL_LIBMVEC_H_
#define SHARDMAP_TENSOR_CPU_INTERNAL_LIBMVEC_H_

#include <immintrin.h>

extern "C" {
__m128 _ZGVbN4v_tanhf(__m128 x);
#ifdef __AVX2__
__m256 _ZGVdN8v_tanhf(__m256 x);
#endif
#ifdef __AVX512F__
__m512 _ZGVeN16v_tanhf(__m512 x);
#endif
}

#endif  // SHARDMAP_TENSOR_CPU_INTERNAL_LIBMVEC_H_
