// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// bijection of a 128-bit counter under a 64-bit key, used by tensor/random.cc so that element i
// of a random tensor depends only on (seed, i).
//
//   Block b = Philox(/*index=*/i, /*stream=*/0, /*seed=*/7);   // four uniform 32-bit words
//
// The same code runs in CUDA kernels (tensor/cuda/reduce/random_kernels.cu includes it), so a
// tensor generated on a GPU is bitwise the one generated on the CPU.
#ifndef SHARDMAP_TENSOR_INTERNAL_PHILOX_H_
#define SHARDMAP_TENSOR_INTERNAL_PHILOX_H_

#include <cstdint>

#ifdef __CUDACC__
#define SM_PHILOX_FN __host__ __device__ __forceinline__
#else
#define SM_PHILOX_FN inline
#endif

namespace shardmap::internal {

struct Block {
  uint32_t v[4];
};

SM_PHILOX_FN void MulHiLo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// The raw generator on counter (c0, c1, c2, c3) and key (k0, k1).
SM_PHILOX_FN Block Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                        uint32_t k1) {
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(0xD2511F53u, c0, hi0, lo0);
    MulHiLo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// Counter = (64-bit flat index, stream, 0); key = the 64-bit seed.
SM_PHILOX_FN Block Philox(uint64_t index, uint32_t stream, uint64_t seed) {
  return Philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), stream, 0,
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

}  // namespace shardmap::internal

#undef SM_PHILOX_FN

#endif  // SHARDMAP_TENSOR_INTERNAL_PHILOX_H_
