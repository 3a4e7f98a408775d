// The row-major -> column-major mapping behind every cuBLASLt call, checked on the CPU: a naive
// column-major GEMM that reads the buffers exactly as cuBLAS is told to (rows, cols, ld,
// transpose) must reproduce the row-major product, for every transpose pair and odd sizes, and
// the bias-gradient epilogue of cuBLAS's A (BGRADA, used for our rhs) must be our rhs's row sum.
#include <cstdint>
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

// cuBLASLt's batch count is an int32_t: a larger strided batch runs as chunks, each with its
// operands advanced by the entries (times the element size of its dtype) before it.
TEST(GemmLayoutTest, SplitBatchChunksAndAdvancesThePointers) {
  GemmCall g;
  g.ab_dtype = DType::kBF16;
  g.cd_dtype = DType::kF32;
  g.m = 3;
  g.n = 4;
  g.k = 5;
  g.batch = 5;
  g.stride_a = 15;
  g.stride_b = 20;
  g.stride_c = 12;
  g.a = reinterpret_cast<const void*>(uintptr_t{0x10000});
  g.b = reinterpret_cast<const void*>(uintptr_t{0x20000});
  g.c = reinterpret_cast<void*>(uintptr_t{0x30000});
  const std::vector<GemmCall> parts = SplitBatch(g, 2);
  ASSERT_EQ(parts.size(), 3u);
  const int64_t first[] = {0, 2, 4}, count[] = {2, 2, 1};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(parts[i].batch, count[i]) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(parts[i].a), 0x10000u + first[i] * 15 * 2) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(parts[i].b), 0x20000u + first[i] * 20 * 2) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(parts[i].c), 0x30000u + first[i] * 12 * 4) << i;
    EXPECT_EQ(parts[i].stride_a, 15);
    EXPECT_EQ(parts[i].m, 3);
  }
  // The default limit: every chunk fits an int32_t and together they cover the batch (a plain
  // int32_t cast of 2^32 + 3 would have run 3 entries).
  g.batch = (int64_t{1} << 32) + 3;
  g.stride_a = g.stride_b = g.stride_c = 1;
  int64_t total = 0;
  for (const GemmCall& p : SplitBatch(g)) {
    EXPECT_GE(p.batch, 1);
    EXPECT_LE(p.batch, int64_t{2147483647});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.c), 0x30000u + static_cast<uintptr_t>(total) * 4);
    total += p.batch;
  }
  EXPECT_EQ(total, g.batch);
  // A batch that fits is one part, unchanged.
  g.batch = 7;
  ASSERT_EQ(SplitBatch(g).size(), 1u);
  EXPECT_EQ(SplitBatch(g)[0].a, g.a);
}

TEST(GemmLayoutTest, EpilogueNames) {
  EXPECT_STREQ(EpilogueName(Epilogue::kGeluAuxBias), "gelu_aux_bias");
  EXPECT_STREQ(EpilogueName(Epilogue::kBGradRhs), "bgrad_rhs");
}

}  // namespace
}  // namespace shardmap::cuda::gemm_internal
