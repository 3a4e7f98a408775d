#include "tensor/testing/compare.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardmap::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool IsIntegral(DType t) { return t == DType::kI32 || t == DType::kI64; }

Tensor OnHost(const Tensor& t) { return t.is_cuda() ? t.To(Device::Cpu()) : t; }

int64_t IntAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI64 ? t.data<int64_t>()[i] : t.data<int32_t>()[i];
}

std::string IndexString(absl::Span<const int64_t> shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    if (shape[d] != 0) flat /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(idx, ","), "]");
}

std::string ValueString(const Tensor& t, int64_t i) {
  if (IsIntegral(t.dtype())) return absl::StrCat(IntAt(t, i));
  return absl::StrFormat(t.dtype() == DType::kF64 ? "%.17g" : "%.9g", t.at(i));
}

std::string Describe(const Tensor& t) { return t.defined() ? t.ShapeString() : "undefined"; }

// |got - want| for element i, +inf when the NaN/inf pattern differs, 0 when both are the same
// non-finite value. Integers compare exactly (the unsigned difference is exact below 2^64).
double ElementDiff(const Tensor& got, const Tensor& want, int64_t i) {
  if (IsIntegral(got.dtype()) && IsIntegral(want.dtype())) {
    const int64_t g = IntAt(got, i), w = IntAt(want, i);
    const uint64_t d = g > w ? static_cast<uint64_t>(g) - static_cast<uint64_t>(w)
                             : static_cast<uint64_t>(w) - static_cast<uint64_t>(g);
    return static_cast<double>(d);
  }
  const double g = got.at(i), w = want.at(i);
  if (std::isnan(g) || std::isnan(w)) return std::isnan(g) && std::isnan(w) ? 0 : kInf;
  if (std::isinf(g) || std::isinf(w)) return g == w ? 0 : kInf;
  return std::fabs(g - w);
}

// Empty when both tensors can be compared element by element; else why not.
std::string LayoutMismatch(const Tensor& got, const Tensor& want, bool check_dtype) {
  if (!got.defined() && !want.defined()) return "";
  if (!got.defined() || !want.defined() || got.shape() != want.shape() ||
      (check_dtype && got.dtype() != want.dtype())) {
    return absl::StrCat("got ", Describe(got), ", want ", Describe(want),
                        check_dtype ? " (dtype and shape must match)" : " (shapes differ)");
  }
  return "";
}

}  // namespace

::testing::AssertionResult TensorsNear(const Tensor& got_in, const Tensor& want_in, double atol,
                                       double rtol) {
  const std::string mismatch = LayoutMismatch(got_in, want_in, /*check_dtype=*/true);
  if (!mismatch.empty()) return ::testing::AssertionFailure() << mismatch;
  if (!got_in.defined()) return ::testing::AssertionSuccess();
  const Tensor got = OnHost(got_in), want = OnHost(want_in);
  int64_t bad = 0, non_finite_bad = 0, worst = -1;
  double worst_diff = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double diff = ElementDiff(got, want, i);
    const double w = want.at(i);
    const double allowed = atol + (std::isfinite(w) ? rtol * std::fabs(w) : 0.0);
    if (diff == kInf) ++non_finite_bad;
    // !(diff <= allowed) also catches a NaN tolerance, which must never pass silently.
    if (diff == kInf || !(diff <= allowed)) {
      ++bad;
      if (diff > worst_diff) {
        worst_diff = diff;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << got.ShapeString() << " vs " << want.ShapeString() << ": " << bad << " of "
         << got.numel() << " elements differ by more than atol " << atol << " + rtol " << rtol
         << " * |want| (" << non_finite_bad << " of them NaN/inf where the other is not)"
         << "; worst at " << IndexString(got.shape(), worst) << ": got "
         << ValueString(got, worst) << ", want " << ValueString(want, worst) << ", diff "
         << absl::StrFormat("%.3g", worst_diff);
}

::testing::AssertionResult TensorsNearScaled(const Tensor& got, const Tensor& want, double rel) {
  double scale = 0;
  if (want.defined()) {
    const Tensor w = OnHost(want);
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double v = std::fabs(w.at(i));
      if (std::isfinite(v) && v > scale) scale = v;
    }
  }
  return TensorsNear(got, want, rel * scale) << " (atol is " << rel << " * max|want| " << scale
                                              << ")";
}

::testing::AssertionResult TensorsBitwiseEqual(const Tensor& got_in, const Tensor& want_in) {
  const std::string mismatch = LayoutMismatch(got_in, want_in, /*check_dtype=*/true);
  if (!mismatch.empty()) return ::testing::AssertionFailure() << mismatch;
  if (!got_in.defined()) return ::testing::AssertionSuccess();
  const Tensor got = OnHost(got_in), want = OnHost(want_in);
  const size_t size = DTypeSize(got.dtype());
  const char* g = static_cast<const char*>(got.raw_data());
  const char* w = static_cast<const char*>(want.raw_data());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(g + i * size, w + i * size, size) != 0) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << got.ShapeString() << ": " << bad << " of " << got.numel()
         << " elements differ bitwise; first at " << IndexString(got.shape(), first) << ": got "
         << ValueString(got, first) << ", want " << ValueString(want, first);
}

double MaxAbsDiff(const Tensor& a_in, const Tensor& b_in) {
  if (!LayoutMismatch(a_in, b_in, /*check_dtype=*/false).empty()) return kInf;
  if (!a_in.defined()) return 0;
  const Tensor a = OnHost(a_in), b = OnHost(b_in);
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = ElementDiff(a, b, i);
    if (!(d <= m)) m = d;  // a NaN difference (impossible here) would also propagate
  }
  return m;
}

}  // namespace shardmap::testing
