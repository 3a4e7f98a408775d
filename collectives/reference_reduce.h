// Test inputs and naive serial references for collectives, shared by the backends' tests:
// typed buffers whose values depend on (rank, index), and reductions computed element by
// element in rank order (16-bit floats accumulate in f32 and round once), independently of
// collectives/internal/reduce.
//
//   std::vector<char> in0 = Make(DataType::kBF16, 100, /*r=*/0, /*near_one=*/false);
//   std::vector<char> want = Reference(DataType::kBF16, {in0, in1}, 0, 100, ReduceOp::kSum);
#ifndef SHARDMAP_COLLECTIVES_REFERENCE_REDUCE_H_
#define SHARDMAP_COLLECTIVES_REFERENCE_REDUCE_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/internal/half.h"

namespace shardmap::collectives::reference {

using internal::BF16ToF32;
using internal::F16ToF32;
using internal::F32ToBF16;
using internal::F32ToF16;

constexpr DataType kAllTypes[] = {DataType::kF32, DataType::kF64, DataType::kBF16,
                                  DataType::kF16, DataType::kI32, DataType::kI64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                                ReduceOp::kAvg};

// Element i of rank r as a double; kept near 1 for products so they neither overflow nor vanish.
inline double Value(int r, size_t i, bool near_one) {
  const int k = static_cast<int>((r * 131 + i * 7 + r * i) % 97) - 48;
  return near_one ? 1.0 + k / 256.0 : k / 4.0 + r * 0.375;
}

// Typed byte buffer of `count` elements.
inline std::vector<char> Make(DataType dt, size_t count, int r, bool near_one, size_t offset = 0) {
  std::vector<char> b(count * DataTypeSize(dt));
  for (size_t i = 0; i < count; ++i) {
    const double v = Value(r, i + offset, near_one);
    char* p = b.data() + i * DataTypeSize(dt);
    switch (dt) {
      case DataType::kF32: { float x = v; std::memcpy(p, &x, 4); break; }
      case DataType::kF64: { std::memcpy(p, &v, 8); break; }
      case DataType::kBF16: { uint16_t x = F32ToBF16(v); std::memcpy(p, &x, 2); break; }
      case DataType::kF16: { uint16_t x = F32ToF16(v); std::memcpy(p, &x, 2); break; }
      case DataType::kI32: { int32_t x = near_one ? (int32_t)(i + r) % 3 + 1 : (int32_t)(v * 4); std::memcpy(p, &x, 4); break; }
      case DataType::kI64: { int64_t x = near_one ? (int64_t)(i + r) % 3 + 1 : (int64_t)(v * 4) << 33; std::memcpy(p, &x, 8); break; }
    }
  }
  return b;
}

// Naive serial reference: element by element, ranks in order 0..n-1.
template <typename T, typename Acc>
void RefTyped(const std::vector<const char*>& in, char* out, size_t count, ReduceOp op,
              Acc (*load)(T), T (*store)(Acc)) {
  const int n = in.size();
  for (size_t i = 0; i < count; ++i) {
    T x;
    std::memcpy(&x, in[0] + i * sizeof(T), sizeof(T));
    Acc acc = load(x);
    for (int r = 1; r < n; ++r) {
      std::memcpy(&x, in[r] + i * sizeof(T), sizeof(T));
      const Acc v = load(x);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc = acc + v;
      if (op == ReduceOp::kProd) acc = acc * v;
      if (op == ReduceOp::kMax) acc = v > acc ? v : acc;
      if (op == ReduceOp::kMin) acc = v < acc ? v : acc;
    }
    if (op == ReduceOp::kAvg) acc = acc / static_cast<Acc>(n);
    const T y = store(acc);
    std::memcpy(out + i * sizeof(T), &y, sizeof(T));
  }
}

template <typename T>
T Id(T v) { return v; }

inline std::vector<char> Reference(DataType dt, const std::vector<std::vector<char>>& in, size_t off,
                            size_t count, ReduceOp op) {
  std::vector<const char*> p;
  for (auto& b : in) p.push_back(b.data() + off * DataTypeSize(dt));
  std::vector<char> out(count * DataTypeSize(dt));
  switch (dt) {
    case DataType::kF32: RefTyped<float, float>(p, out.data(), count, op, Id, Id); break;
    case DataType::kF64: RefTyped<double, double>(p, out.data(), count, op, Id, Id); break;
    case DataType::kBF16: RefTyped<uint16_t, float>(p, out.data(), count, op, BF16ToF32, F32ToBF16); break;
    case DataType::kF16: RefTyped<uint16_t, float>(p, out.data(), count, op, F16ToF32, F32ToF16); break;
    // Values are small: no overflow, so plain signed arithmetic is a valid reference.
    case DataType::kI32: RefTyped<int32_t, int32_t>(p, out.data(), count, op, Id, Id); break;
    case DataType::kI64: RefTyped<int64_t, int64_t>(p, out.data(), count, op, Id, Id); break;
  }
  return out;
}

}  // namespace shardmap::collectives::reference

#endif  // SHARDMAP_COLLECTIVES_REFERENCE_REDUCE_H_
