#include "tensor/ops/matmul.h"

#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::ExpectOpError;
using testing::RandomTensor;

// Naive C = op(A) op(B) in f64 for one [m,n] result at the given element offsets.
std::vector<double> RefGemm(const Tensor& a, int64_t a_off, const Tensor& b, int64_t b_off,
                            bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = a.at(a_off + (ta ? p * m + i : i * k + p));
        const double bv = b.at(b_off + (tb ? j * k + p : p * n + j));
        s += av * bv;
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

TEST(MatmulTest, TwoDAllTransposesAgainstNaive) {
  struct S {
    int64_t m, k, n;
  };
  // Tiny (plain loops: n = 1, 2, 3, 4, 8 have fixed-width kernels, 5 and 6 the generic one), mid
  // and odd (BLAS), empty, and k = 0 (all zeros).
  const std::vector<S> sizes = {{1, 1, 1},   {4, 4, 4},    {8, 8, 1}, {3, 5, 2}, {2, 5, 3},
                                {2, 4, 8},   {2, 3, 5},    {3, 2, 6}, {3, 5, 7}, {33, 17, 29},
                                {64, 65, 31}, {0, 3, 4},   {3, 0, 4}, {2, 3, 0}};
  uint32_t seed = 1;
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (const S& s : sizes) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a = RandomTensor(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, dt, seed++);
          const Tensor b = RandomTensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, dt, seed++);
          const Tensor c = Matmul(a, b, ta, tb);
          ASSERT_EQ(c.shape(), (Shape{s.m, s.n}));
          ExpectAllClose(c, RefGemm(a, 0, b, 0, ta, tb, s.m, s.n, s.k),
                         dt == DType::kF64 ? 1e-13 : 1e-5, dt == DType::kF64 ? 1e-13 : 1e-5,
                         a.ShapeString() + " @ " + b.ShapeString());
        }
      }
    }
  }
}

TEST(MatmulTest, FoldsLeadingDimsOfLhs) {
  for (bool tb : {false, true}) {
    const Tensor x = RandomTensor({2, 3, 5, 6}, DType::kF32, 7);
    const Tensor w = RandomTensor(tb ? Shape{9, 6} : Shape{6, 9}, DType::kF32, 8);
    const Tensor y = Matmul(x, w, false, tb);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 5, 9}));
    ExpectAllClose(y, RefGemm(x, 0, w, 0, false, tb, 30, 9, 6), 1e-5, 1e-5);
  }
}

TEST(MatmulTest, BatchedAllTransposes) {
  const int64_t b0 = 2, b1 = 3, m = 5, k = 19, n = 7;
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = RandomTensor(ta ? Shape{b0, b1, k, m} : Shape{b0, b1, m, k}, dt, 3);
        const Tensor b = RandomTensor(tb ? Shape{b0, b1, n, k} : Shape{b0, b1, k, n}, dt, 4);
        const Tensor c = Matmul(a, b, ta, tb);
        ASSERT_EQ(c.shape(), (Shape{b0, b1, m, n}));
        std::vector<double> want;
        for (int64_t i = 0; i < b0 * b1; ++i) {
          const auto part = RefGemm(a, i * m * k, b, i * k * n, ta, tb, m, n, k);
          want.insert(want.end(), part.begin(), part.end());
        }
        const double tol = dt == DType::kF64 ? 1e-13 : 1e-5;  // as the 2-D case
        ExpectAllClose(c, want, tol, tol);
      }
    }
  }
}

TEST(MatmulTest, HalfDTypesComputeInF32AndRoundOnce) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const Tensor a = RandomTensor({6, 40}, dt, 5);
    const Tensor b = RandomTensor({40, 3}, dt, 6);
    const Tensor c = Matmul(a, b);
    ASSERT_EQ(c.dtype(), dt);
    const auto ref = RefGemm(a, 0, b, 0, false, false, 6, 3, 40);
    for (int64_t i = 0; i < c.numel(); ++i) {
      // Within one ulp of the correctly rounded value (f32 accumulation order differs).
      const double r = ref[i];
      const double ulp = std::ldexp(1.0, std::ilogb(r) - (dt == DType::kBF16 ? 7 : 10));
      EXPECT_NEAR(c.at(i), r, ulp) << i;
    }
  }
}

// Ranks are threads: ops run concurrently on different tensors (BLAS pinning, the allocator's
// large-block cache). Each thread's results must equal the single-threaded ones.
TEST(MatmulTest, ConcurrentCallsFromRankThreads) {
  const Tensor a = RandomTensor({37, 64}, DType::kF32, 1);
  const Tensor b = RandomTensor({64, 29}, DType::kF32, 2);
  const Tensor big = RandomTensor({300000}, DType::kF32, 3);  // 1.2 MiB: goes through the cache
  const std::vector<float> want_mm = Matmul(a, b).ToVector<float>();
  const std::vector<float> want_add = Add(big, big).ToVector<float>();
  const int kThreads = 3;
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      bool good = true;
      for (int iter = 0; iter < 5; ++iter) {
        good = good && Matmul(a, b).ToVector<float>() == want_mm;
        good = good && Add(big, big).ToVector<float>() == want_add;
      }
      ok[t] = good;
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

TEST(MatmulTest, Errors) {
  const Tensor a = Tensor::Zeros({2, 3}), b = Tensor::Zeros({4, 5});
  ExpectOpError([&] { Matmul(a, b); }, {"matmul", "f32[2,3] @ f32[4,5]", "contracted"});
  ExpectOpError([&] { Matmul(a, b, true, false); }, {"f32[2,3]^T @ f32[4,5]"});
  ExpectOpError([&] { Matmul(Tensor::Zeros({3}), a); }, {"matmul", "rank >= 2"});
  ExpectOpError([&] { Matmul(Tensor::Zeros({2, 2, 3}), Tensor::Zeros({3, 2, 3, 4})); },
                {"matmul", "equal ranks"});
  ExpectOpError([&] { Matmul(Tensor::Zeros({2, 2, 3}), Tensor::Zeros({3, 3, 4})); },
                {"matmul", "batch dims differ"});
  ExpectOpError([&] { Matmul(Tensor::Zeros({2, 3, 4}), Tensor::Zeros({3, 5}), true); },
                {"matmul", "trans_a"});
  ExpectOpError([&] { Matmul(a, Tensor::Zeros({3, 2}, DType::kF64)); }, {"matmul", "dtypes"});
  ExpectOpError([&] { Matmul(Tensor::Zeros({2, 3}, DType::kI64), a); },
                {"matmul", "i64[2,3]", "floating"});
}

}  // namespace
}  // namespace shardmap
