// bf16 / f16 <-> f32 conversions (round to nearest even), used by the reductions: 16-bit inputs
// are widened to f32, reduced, and rounded once.
//
//   uint16_t h = F32ToBF16(1.5f);   // 0x3fc0
//   float f = BF16ToF32(h);         // 1.5f
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_HALF_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_HALF_H_

#include <bit>
#include <cmath>
#include <cstdint>

namespace shardmap::collectives::internal {

inline float BF16ToF32(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t F32ToBF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(x >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in f32
    float v = std::ldexp(static_cast<float>(m), -24);
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t F32ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf / nan
    return sign | 0x7c00u | (a > 0x7f800000u ? (0x200u | ((a >> 13) & 0x3ffu)) : 0u);
  }
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                          // below 2^-14: f16 subnormal or zero
    const int e = static_cast<int>(a >> 23);
    if (e < 102) return sign;  // below 2^-25
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - e;  // value = m * 2^(e-150) = (m >> shift) * 2^-24
    uint32_t k = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) ++k;
    return static_cast<uint16_t>(sign | k);
  }
  uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ffu);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry into the exponent is correct
  return static_cast<uint16_t>(sign | h);
}

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_HALF_H_
