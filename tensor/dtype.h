// Element types of tensors, with bf16/f16 <-> f32 conversion (round to nearest even).
//
//   DType t = DType::kBF16;
//   DTypeSize(t);                 // 2
//   DTypeName(t);                 // "bf16"
//   uint16_t h = FloatToBF16(1.0f / 3);  float back = BF16ToFloat(h);
#ifndef SHARDMAP_TENSOR_DTYPE_H_
#define SHARDMAP_TENSOR_DTYPE_H_

// shardmap is C++20. Checked here, at the root of every target's includes, so that a workspace
// built without -std=c++20 stops with this line instead of pages of template errors.
#if __cplusplus < 202002L
#error "shardmap needs C++20: add `build --cxxopt=-std=c++20 --host_cxxopt=-std=c++20` to your .bazelrc (see shardmap's deps.bzl)"
#endif


#include <cstddef>
#include <cstdint>


namespace shardmap {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64 };

size_t DTypeSize(DType t);
const char* DTypeName(DType t);
bool IsFloating(DType t);  // f32, f64, bf16, f16
// False for a value outside the enum (e.g. a cast from a corrupted integer).
bool IsValidDType(DType t);

// Round-to-nearest-even conversions; NaN stays NaN, overflow goes to infinity.
uint16_t FloatToBF16(float f);
float BF16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);
float F16ToFloat(uint16_t h);

// Maps a C++ element type to its DType: DTypeOf<float>() == DType::kF32.
template <typename T> constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kF32; }
template <> constexpr DType DTypeOf<double>() { return DType::kF64; }
template <> constexpr DType DTypeOf<int32_t>() { return DType::kI32; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kI64; }

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_DTYPE_H_
