// The host-side planning of the CUDA reductions (segment lengths, kernel choice), checked without
// a GPU: the pass sequence that reduce_ops.cc's ReduceAxis runs for awkward shapes, and a replay of
// the passes' index math ([outer, n, inner] -> [outer, nseg, inner], pass after pass) against the
// CPU Sum and Max.
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/reduce/reduce_kernels.h"
#include "tensor/ops/reduce.h"
#include "tensor/tensor.h"

namespace shardmap::cuda::kernels {
namespace {

struct Pass {
  int64_t n, seg_len;
  ReducePath path;
  bool operator==(const Pass& o) const {
    return n == o.n && seg_len == o.seg_len && path == o.path;
  }
};

std::string ToString(const std::vector<Pass>& ps) {
  std::string s;
  for (const Pass& p : ps) {
    s += "(n " + std::to_string(p.n) + ", seg " + std::to_string(p.seg_len) + ", " +
         (p.path == ReducePath::kColumn    ? "column"
          : p.path == ReducePath::kRowWarp ? "warp"
                                           : "block") +
         ") ";
  }
  return s;
}

// The passes ReduceAxis (reduce_ops.cc) launches for one reduced run.
std::vector<Pass> PlanAxis(int64_t outer, int64_t n, int64_t inner) {
  std::vector<Pass> ps;
  while (true) {
    const int64_t seg = ReduceSegmentLength(outer, n, inner);
    EXPECT_GE(seg, 1);
    if (seg >= n) {
      ps.push_back({n, n, ChooseReducePath(inner, n)});
      return ps;
    }
    EXPECT_GE(seg, 2) << "a split that does not shrink n never ends";
    ps.push_back({n, seg, ChooseReducePath(inner, seg)});
    n = (n + seg - 1) / seg;
    if (ps.size() > 64) {
      ADD_FAILURE() << "no end: " << ToString(ps);
      return ps;
    }
  }
}

constexpr ReducePath kCol = ReducePath::kColumn, kWarp = ReducePath::kRowWarp,
                     kBlock = ReducePath::kRowBlock;

TEST(ReduceHostTest, PassesForAwkwardShapes) {
  struct Case {
    const char* what;
    int64_t outer, n, inner;
    std::vector<Pass> passes;
  };
  const std::vector<Case> cases = {
      {"[70000,3] over dim 0", 1, 70000, 3, {{70000, 64, kCol}, {1094, 64, kCol}, {18, 18, kCol}}},
      {"[70000,3] over dim 1", 70000, 3, 1, {{3, 3, kCol}}},
      {"[3,70000,5] over dim 1", 3, 70000, 5,
       {{70000, 64, kCol}, {1094, 64, kCol}, {18, 18, kCol}}},
      {"[1] over dim 0", 1, 1, 1, {{1, 1, kCol}}},
      {"[31] over dim 0", 1, 31, 1, {{31, 31, kWarp}}},
      {"[33] over dim 0", 1, 33, 1, {{33, 33, kWarp}}},
      {"[6,70] over dim 1", 6, 70, 1, {{70, 70, kWarp}}},
      {"[6,70] over dim 0", 1, 6, 70, {{6, 6, kCol}}},
      {"[1000003] (few long rows: split for parallelism)", 1, 1000003, 1,
       {{1000003, 2048, kWarp}, {489, 489, kWarp}}},
      {"[3,300007] over dim 1", 3, 300007, 1, {{300007, 2048, kWarp}, {147, 147, kWarp}}},
      {"[1100,5000] over dim 1 (a block per row)", 1100, 5000, 1, {{5000, 5000, kBlock}}},
      {"[2048,100000] over dim 1 (split: > 32K per block)", 2048, 100000, 1,
       {{100000, 25000, kBlock}, {4, 4, kCol}}},
      {"2^31+5 elements in one row", 1, (int64_t{1} << 31) + 5, 1,
       {{(int64_t{1} << 31) + 5, 32768, kBlock}, {65537, 2048, kWarp}, {33, 33, kWarp}}},
  };
  for (const Case& c : cases) {
    const std::vector<Pass> got = PlanAxis(c.outer, c.n, c.inner);
    EXPECT_TRUE(got == c.passes) << c.what << ": got " << ToString(got) << "want "
                                 << ToString(c.passes);
  }
}

TEST(ReduceHostTest, ArgMaxPathsReachedByTheGpuTestShapes) {
  // reduce_cuda_test's ArgMax shapes reach every kernel: [6,5] and [5000,3] columns, [6,40] and
  // [3,2048] a warp per row, [2,3000] and [1000003] a block per row.
  EXPECT_EQ(ChooseArgMaxPath(1, 5), kCol);
  EXPECT_EQ(ChooseArgMaxPath(3, 5000), kCol);
  EXPECT_EQ(ChooseArgMaxPath(1, 16), kCol);
  EXPECT_EQ(ChooseArgMaxPath(1, 17), kWarp);
  EXPECT_EQ(ChooseArgMaxPath(1, 40), kWarp);
  EXPECT_EQ(ChooseArgMaxPath(1, 2048), kWarp);
  EXPECT_EQ(ChooseArgMaxPath(1, 3000), kBlock);
  EXPECT_EQ(ChooseArgMaxPath(1, 1000003), kBlock);
}

// Runs the passes of one reduced run on the host with the kernels' layout: pass p reads
// in[o, k, i] for k in segment s and writes out[(o * nseg + s) * inner + i]. Counts how often
// each input element of the first pass is read.
std::vector<double> ReplayAxis(const std::vector<double>& x, int64_t outer, int64_t n,
                               int64_t inner, bool max, std::vector<int>* reads) {
  std::vector<double> in = x;
  reads->assign(x.size(), 0);
  bool first = true;
  while (true) {
    const int64_t seg = ReduceSegmentLength(outer, n, inner);
    const int64_t len = seg >= n ? n : seg;
    const int64_t nseg = (n + len - 1) / len;
    std::vector<double> out(outer * nseg * inner);
    for (int64_t t = 0; t < static_cast<int64_t>(out.size()); ++t) {  // ColumnKernel's math
      const int64_t rs = t / inner, i = t - rs * inner;
      const int64_t o = rs / nseg, s = rs - o * nseg;
      const int64_t begin = s * len, end = begin + len < n ? begin + len : n;
      double v = max ? -1e300 : 0;
      for (int64_t k = begin; k < end; ++k) {
        const int64_t at = o * n * inner + k * inner + i;
        v = max ? (in[at] > v ? in[at] : v) : v + in[at];
        if (first) ++(*reads)[at];
      }
      out[t] = v;
    }
    first = false;
    if (nseg == 1) return out;
    in = out;
    n = nseg;
  }
}

TEST(ReduceHostTest, MultiPassReplayFoldsEveryElementOnce) {
  struct Case {
    Shape shape;
    int dim;
  };
  const std::vector<Case> cases = {
      {{70000, 3}, 0}, {{70000, 3}, 1}, {{3, 9000, 5}, 1}, {{200003}, 0},
      {{2, 100000}, 1}, {{129, 257, 3}, 1}, {{1, 5000, 1}, 1},
  };
  for (const Case& c : cases) {
    const int64_t numel = NumElements(c.shape);
    std::vector<double> x(numel);
    for (int64_t i = 0; i < numel; ++i) x[i] = static_cast<double>((i * 7919) % 1001) - 500;
    const Tensor t = Tensor::FromVector<double>(c.shape, x, DType::kF64);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < c.dim; ++d) outer *= c.shape[d];
    for (int d = c.dim + 1; d < static_cast<int>(c.shape.size()); ++d) inner *= c.shape[d];
    const int64_t n = c.shape[c.dim];
    for (bool max : {false, true}) {
      std::vector<int> reads;
      const std::vector<double> got = ReplayAxis(x, outer, n, inner, max, &reads);
      const std::string what = ShapeToString(c.shape) + " over dim " + std::to_string(c.dim) +
                               (max ? " max" : " sum");
      // Integer values: every order of summation is exact, so the CPU result must match bitwise.
      const Tensor want = max ? Max(t, {c.dim}) : Sum(t, {c.dim});
      EXPECT_EQ(got, want.ToVector<double>()) << what;
      int64_t bad = 0;
      for (int r : reads) bad += r != 1;
      EXPECT_EQ(bad, 0) << what << ": elements not read exactly once in the first pass";
    }
  }
}

}  // namespace
}  // namespace shardmap::cuda::kernels
