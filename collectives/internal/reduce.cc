#include "collectives/internal/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "collectives/internal/half.h"

namespace shardmap::collectives::internal {
namespace {

// Elements per block: the accumulator stays in L1 while the sources stream through.
constexpr size_t kBlock = 1024;

struct Bf16 {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return BF16ToF32(v); }
  static Storage Store(Acc v) { return F32ToBF16(v); }
};
struct F16 {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return F16ToF32(v); }
  static Storage Store(Acc v) { return F32ToF16(v); }
};
template <typename T, bool = std::is_integral_v<T>>
struct AccOf {
  using type = T;
};
template <typename T>
struct AccOf<T, true> {
  using type = std::make_unsigned_t<T>;
};

template <typename T>
struct Plain {
  using Storage = T;
  // Integer sum/prod in unsigned arithmetic: wrapping is defined, signed overflow is not.
  using Acc = typename AccOf<T>::type;
  static Acc Load(Storage v) { return static_cast<Acc>(v); }
  static Storage Store(Acc v) { return static_cast<Storage>(v); }
};

template <typename Traits, ReduceOp kOp>
void ReduceTyped(void* dst_v, const void* const* srcs_v, int n, size_t count) {
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  // max/min compare in the storage's signedness for integers.
  using Cmp = std::conditional_t<std::is_integral_v<A>, S, A>;
  S* dst = static_cast<S*>(dst_v);
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const S* s0 = static_cast<const S*>(srcs_v[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = Traits::Load(s0[i]);
    for (int r = 1; r < n; ++r) {
      const S* s = static_cast<const S*>(srcs_v[r]) + base;
      if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
        for (size_t i = 0; i < m; ++i) acc[i] += Traits::Load(s[i]);
      } else if constexpr (kOp == ReduceOp::kProd) {
        for (size_t i = 0; i < m; ++i) acc[i] *= Traits::Load(s[i]);
      } else if constexpr (kOp == ReduceOp::kMax) {
        for (size_t i = 0; i < m; ++i) {
          A v = Traits::Load(s[i]);
          acc[i] = static_cast<Cmp>(v) > static_cast<Cmp>(acc[i]) ? v : acc[i];
        }
      } else {
        for (size_t i = 0; i < m; ++i) {
          A v = Traits::Load(s[i]);
          acc[i] = static_cast<Cmp>(v) < static_cast<Cmp>(acc[i]) ? v : acc[i];
        }
      }
    }
    if constexpr (kOp == ReduceOp::kAvg) {
      if constexpr (std::is_integral_v<A>) {
        for (size_t i = 0; i < m; ++i) dst[base + i] = static_cast<S>(static_cast<S>(acc[i]) / n);
      } else {
        const A d = static_cast<A>(n);
        for (size_t i = 0; i < m; ++i) dst[base + i] = Traits::Store(acc[i] / d);
      }
    } else {
      for (size_t i = 0; i < m; ++i) dst[base + i] = Traits::Store(acc[i]);
    }
  }
}

template <typename Traits>
void ReduceWithOp(void* dst, const void* const* srcs, int n, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ReduceTyped<Traits, ReduceOp::kSum>(dst, srcs, n, count);
    case ReduceOp::kProd: return ReduceTyped<Traits, ReduceOp::kProd>(dst, srcs, n, count);
    case ReduceOp::kMax: return ReduceTyped<Traits, ReduceOp::kMax>(dst, srcs, n, count);
    case ReduceOp::kMin: return ReduceTyped<Traits, ReduceOp::kMin>(dst, srcs, n, count);
    case ReduceOp::kAvg: return ReduceTyped<Traits, ReduceOp::kAvg>(dst, srcs, n, count);
  }
}

}  // namespace

void ReduceBuffers(void* dst, const void* const* srcs, int n, size_t count, DataType dtype,
                   ReduceOp op) {
  if (count == 0 || n <= 0) return;
  switch (dtype) {
    case DataType::kF32: return ReduceWithOp<Plain<float>>(dst, srcs, n, count, op);
    case DataType::kF64: return ReduceWithOp<Plain<double>>(dst, srcs, n, count, op);
    case DataType::kBF16: return ReduceWithOp<Bf16>(dst, srcs, n, count, op);
    case DataType::kF16: return ReduceWithOp<F16>(dst, srcs, n, count, op);
    case DataType::kI32: return ReduceWithOp<Plain<int32_t>>(dst, srcs, n, count, op);
    case DataType::kI64: return ReduceWithOp<Plain<int64_t>>(dst, srcs, n, count, op);
  }
}

}  // namespace shardmap::collectives::internal
