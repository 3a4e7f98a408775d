// The row-major -> column-major mapping behind every cuBLASLt call, checked on the CPU: a naive
// column-major GEMM that reads the buffers exactly as cuBLAS is told to (rows, cols, ld,
// transpose) must reproduce the row-major product, for every transpose pair and odd sizes, and
// the bias-gradient epilogue of cuBLAS's A (BGRADA, used for our rhs) must be our rhs's row sum.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/gemm/internal/gemm.h"

namespace shardmap::cuda::gemm_internal {
namespace {

// Element (r, c) of op(x) where x is column-major with ld.
double At(const std::vector<double>& x, const ColumnMajorMatrix& l, int64_t r, int64_t c) {
  return l.trans ? x[c + r * l.ld] : x[r + c * l.ld];
}
int64_t OpRows(const ColumnMajorMatrix& l) { return l.trans ? l.cols : l.rows; }
int64_t OpCols(const ColumnMajorMatrix& l) { return l.trans ? l.rows : l.cols; }

std::vector<double> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

TEST(GemmLayoutTest, ColumnMajorViewReproducesTheRowMajorProduct) {
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 129}, {129, 7, 13}, {13, 1, 7}, {4, 5, 6}};
  uint32_t seed = 1;
  for (const auto& s : sizes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        GemmCall g;
        g.m = s[0];
        g.k = s[1];
        g.n = s[2];
        g.trans_a = ta;
        g.trans_b = tb;
        const std::string what = "m=" + std::to_string(g.m) + " k=" + std::to_string(g.k) +
                                 " n=" + std::to_string(g.n) + " ta=" + std::to_string(ta) +
                                 " tb=" + std::to_string(tb);
        // Row-major operands as our ops store them.
        const std::vector<double> a = Random(g.m * g.k, seed++);  // [m,k] or [k,m]
        const std::vector<double> b = Random(g.k * g.n, seed++);  // [k,n] or [n,k]
        auto A = [&](int64_t i, int64_t p) { return ta ? a[p * g.m + i] : a[i * g.k + p]; };
        auto B = [&](int64_t p, int64_t j) { return tb ? b[j * g.k + p] : b[p * g.n + j]; };

        const ColumnMajorProblem cm = ToColumnMajor(g);
        // cuBLAS: C[c.rows, c.cols] = op(A = our b) @ op(B = our a), column-major.
        ASSERT_EQ(OpRows(cm.a), cm.c.rows) << what;
        ASSERT_EQ(OpCols(cm.b), cm.c.cols) << what;
        ASSERT_EQ(OpCols(cm.a), OpRows(cm.b)) << what;
        ASSERT_EQ(OpCols(cm.a), g.k) << what;
        ASSERT_EQ(cm.c.rows, g.n) << what << ": the bias vector must index cuBLAS's rows";
        ASSERT_GE(cm.a.ld, cm.a.rows);
        ASSERT_GE(cm.b.ld, cm.b.rows);
        ASSERT_GE(cm.c.ld, cm.c.rows);
        std::vector<double> c(cm.c.ld * cm.c.cols, 0.0);
        for (int64_t r = 0; r < cm.c.rows; ++r) {
          for (int64_t col = 0; col < cm.c.cols; ++col) {
            double acc = 0;
            for (int64_t p = 0; p < g.k; ++p) acc += At(b, cm.a, r, p) * At(a, cm.b, p, col);
            c[r + col * cm.c.ld] = acc;
          }
        }
        // Read back as row-major [m, n] (ld = n) and compare with the naive row-major product.
        for (int64_t i = 0; i < g.m; ++i) {
          for (int64_t j = 0; j < g.n; ++j) {
            double want = 0;
            for (int64_t p = 0; p < g.k; ++p) want += A(i, p) * B(p, j);
            ASSERT_NEAR(c[i * g.n + j], want, 1e-12) << what << " at " << i << "," << j;
          }
        }
        // BGRADA: for each row of op(cuBLAS A), the sum over k. For the weight gradient
        // dw = x^T @ dy (our b = dy, [rows, n], not transposed) that is dy's row sum: db.
        if (!tb) {
          for (int64_t r = 0; r < cm.c.rows; ++r) {
            double bgrad = 0, want = 0;
            for (int64_t p = 0; p < g.k; ++p) bgrad += At(b, cm.a, r, p);
            for (int64_t p = 0; p < g.k; ++p) want += B(p, r);
            ASSERT_NEAR(bgrad, want, 1e-12) << what;
          }
        }
      }
    }
  }
}

TEST(GemmLayoutTest, EpilogueNames) {
  EXPECT_STREQ(EpilogueName(Epilogue::kGeluAuxBias), "gelu_aux_bias");
  EXPECT_STREQ(EpilogueName(Epilogue::kBGradRhs), "bgrad_rhs");
}

}  // namespace
}  // namespace shardmap::cuda::gemm_internal
