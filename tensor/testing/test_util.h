// Test helpers for tensor/ tests: OpError expectations, seeded test data built with std::mt19937
// (independent of tensor/random), naive broadcasting indices and f64 finite differences.
//
//   Tensor x = RandomTensor({3, 4}, DType::kF64, /*seed=*/1);
//   ExpectOpError([&] { Add(x, y); }, {"add", "f64[3,4]"});
//   ExpectGradMatchesFiniteDiff(x, forward, backward);
//   SKIP_WITHOUT_GPU();   // first line of a test that needs a GPU: skips, saying why
#ifndef SHARDMAP_TENSOR_TESTING_TEST_UTIL_H_
#define SHARDMAP_TENSOR_TESTING_TEST_UTIL_H_

#include <cmath>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"

#define SKIP_WITHOUT_GPU()                    \
  if (!::shardmap::cuda::Available())         \
  GTEST_SKIP() << "no GPU: " << ::shardmap::cuda::UnavailableReason()

namespace shardmap::testing {

// Expects fn to throw an OpError (InvalidArgument) whose message contains every fragment.
template <typename Fn>
void ExpectOpError(Fn fn, std::initializer_list<const char*> fragments) {
  const absl::Status s = CatchOpError(fn);
  ASSERT_FALSE(s.ok()) << "expected an OpError";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const char* f : fragments) {
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(f));
  }
}

// Values uniform in [lo, hi), from std::mt19937 (not our Philox generator).
inline Tensor RandomTensor(absl::Span<const int64_t> shape, DType dtype, uint32_t seed,
                           double lo = -2.0, double hi = 2.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(NumElements(shape));
  for (double& x : v) x = dist(rng);
  return Tensor::FromVector<double>(shape, v, dtype);
}

// Multi-index of flat position i in shape.
inline std::vector<int64_t> Unflatten(absl::Span<const int64_t> shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

// Flat index into `shape` of the element an output multi-index reads under NumPy broadcasting.
inline int64_t BroadcastSource(absl::Span<const int64_t> shape,
                               const std::vector<int64_t>& out_idx) {
  const size_t off = out_idx.size() - shape.size();
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    flat = flat * shape[d] + (shape[d] == 1 ? 0 : out_idx[off + d]);
  }
  return flat;
}

inline void ExpectAllClose(const Tensor& got, const std::vector<double>& want, double rtol,
                           double atol, const std::string& what = "") {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.at(i), w = want[i];
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << what << " at " << i;
    } else if (std::isinf(w)) {
      EXPECT_EQ(g, w) << what << " at " << i;
    } else {
      ASSERT_NEAR(g, w, atol + rtol * std::fabs(w)) << what << " at flat index " << i;
    }
  }
}

// Checks a backward kernel against f64 central differences of L(x) = sum(forward(x) * w) for a
// fixed random cotangent w: backward(x, w) must equal dL/dx.
inline void ExpectGradMatchesFiniteDiff(const Tensor& x,
                                        const std::function<Tensor(const Tensor&)>& forward,
                                        const std::function<Tensor(const Tensor&, const Tensor&)>&
                                            backward,
                                        double tol = 1e-6, double h = 1e-5) {
  ASSERT_EQ(x.dtype(), DType::kF64);
  const Tensor y = forward(x);
  const Tensor w = RandomTensor(y.shape(), DType::kF64, 99, -1.0, 1.0);
  auto loss = [&](const Tensor& xx) {
    const Tensor yy = forward(xx);
    double s = 0;
    for (int64_t i = 0; i < yy.numel(); ++i) s += yy.at(i) * w.at(i);
    return s;
  };
  const Tensor g = backward(x, w);
  ASSERT_EQ(g.shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    Tensor xp = x.Clone(), xm = x.Clone();
    xp.data<double>()[i] += h;
    xm.data<double>()[i] -= h;
    const double fd = (loss(xp) - loss(xm)) / (2 * h);
    ASSERT_NEAR(g.at(i), fd, tol * (1 + std::fabs(fd))) << "d/dx at flat index " << i;
  }
}

}  // namespace shardmap::testing

#endif  // SHARDMAP_TENSOR_TESTING_TEST_UTIL_H_
