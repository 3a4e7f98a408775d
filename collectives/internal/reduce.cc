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

// acc op v, in the accumulator type; max/min compare in the storage's signedness for integers.
template <typename A, typename Cmp, ReduceOp kOp>
inline A Combine(A acc, A v) {
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    return acc + v;
  } else if constexpr (kOp == ReduceOp::kProd) {
    return acc * v;
  } else if constexpr (kOp == ReduceOp::kMax) {
    return static_cast<Cmp>(v) > static_cast<Cmp>(acc) ? v : acc;
  } else {
    return static_cast<Cmp>(v) < static_cast<Cmp>(acc) ? v : acc;
  }
}

// The last step: avg divides by n (integers truncate in the storage type), then store.
template <typename Traits, ReduceOp kOp>
inline typename Traits::Storage Finish(typename Traits::Acc acc, int n) {
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  if constexpr (kOp == ReduceOp::kAvg) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<S>(static_cast<S>(acc) / n);
    } else {
      return Traits::Store(acc / static_cast<A>(n));
    }
  } else {
    return Traits::Store(acc);
  }
}

// Per block: the first two sources combine into the accumulator (no separate load pass), the
// middle ones accumulate, and the last one combines on the way to dst (no separate store pass).
// The operations and their order are those of acc = s0; acc op= s1; ...; dst = finish(acc).
template <typename Traits, ReduceOp kOp>
void ReduceTyped(void* dst_v, const void* const* srcs_v, int n, size_t count) {
  using S = typename Traits::Storage;
  using A = typename Traits::Acc;
  using Cmp = std::conditional_t<std::is_integral_v<A>, S, A>;
  S* dst = static_cast<S*>(dst_v);
  auto src = [&](int r, size_t base) { return static_cast<const S*>(srcs_v[r]) + base; };
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const S* s0 = src(0, base);
    S* d = dst + base;
    if (n == 1) {
      for (size_t i = 0; i < m; ++i) d[i] = Finish<Traits, kOp>(Traits::Load(s0[i]), n);
      continue;
    }
    const S* s1 = src(1, base);
    if (n == 2) {
      for (size_t i = 0; i < m; ++i) {
        d[i] = Finish<Traits, kOp>(
            Combine<A, Cmp, kOp>(Traits::Load(s0[i]), Traits::Load(s1[i])), n);
      }
      continue;
    }
    for (size_t i = 0; i < m; ++i) {
      acc[i] = Combine<A, Cmp, kOp>(Traits::Load(s0[i]), Traits::Load(s1[i]));
    }
    for (int r = 2; r < n - 1; ++r) {
      const S* s = src(r, base);
      for (size_t i = 0; i < m; ++i) acc[i] = Combine<A, Cmp, kOp>(acc[i], Traits::Load(s[i]));
    }
    const S* last = src(n - 1, base);
    for (size_t i = 0; i < m; ++i) {
      d[i] = Finish<Traits, kOp>(Combine<A, Cmp, kOp>(acc[i], Traits::Load(last[i])), n);
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
