// rope: the fused rotation against a naive loop of HF's formula (f32, f64), its gradient
// against finite differences (f64, heads split over tp), one device against tp=2 and dp=2,
// and the errors for bad shapes, dtypes and a split head_dim.
#include "shardmap/ops/rope_ops.h"

#include <cmath>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

// cos/sin [n, 1, hd] of positions 3 (first + r) (both halves equal) in `dtype`.
std::pair<Tensor, Tensor> Tables(int64_t n, int64_t hd, DType dtype, int64_t first = 0) {
  std::vector<double> c(n * hd), s(n * hd);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = 3.0 * (first + r) * std::pow(100.0, -2.0 * i / hd);
      c[r * hd + i] = c[r * hd + hd / 2 + i] = std::cos(a);
      s[r * hd + i] = s[r * hd + hd / 2 + i] = std::sin(a);
    }
  }
  return {Tensor::FromVector<double>({n, 1, hd}, c, dtype),
          Tensor::FromVector<double>({n, 1, hd}, s, dtype)};
}

// loss = sum(rope(x) * w), and rope(x). The tables are constants built per device for its rows
// (dp: S0 on dp; tp splits the heads, the tables are R there), not inputs: they get no gradient.
ShardMap RopeMap(const Mesh& mesh) {
  const bool tp = mesh.AxisIndex("tp") >= 0;
  ShardFn fn = [tp](const std::vector<Value>& in) {
    const Value& x = in[0];
    const int64_t n = x.dim(0);
    SpmdType type(1);  // one mesh axis (tp or dp)
    int64_t first = 0;
    if (!tp) {
      first = axis_index("dp") * n;
      type[0] = AxisType::Sharded(0);
    }
    auto [c, s] = Tables(n, x.dim(2), x.dtype(), first);
    Value y = rope(x, Value(c, type), Value(s, type));
    Value loss = all_reduce(sum_partial(y * in[1], {}), tp ? "tp" : "dp");
    return std::vector<Value>{loss, y};
  };
  PartitionSpec x = tp ? P(None, "tp", None) : P("dp", None, None);
  return ShardMap(fn, mesh, {x, x}, {P(), x});
}

TEST(RopeTest, MatchesNaiveLoop) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    const int64_t n = 5, heads = 3, hd = 6, half = 3;
    Tensor x = RandomNormal({n, heads, hd}, 1, 0, 1, dt);
    auto [c, s] = Tables(n, hd, dt);
    Tensor w = RandomNormal({n, heads, hd}, 2, 0, 1, dt);
    absl::StatusOr<std::vector<Tensor>> out = RopeMap(*Mesh::Create({{"dp", 1}}))({x, w});
    ASSERT_TRUE(out.ok()) << out.status();
    const Tensor& y = (*out)[1];
    const double tol = dt == DType::kF64 ? 1e-14 : 1e-6;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t e = (r * heads + h) * hd + i;
          const double rot = i < half ? -x.at(e + half) : x.at(e - half);
          EXPECT_NEAR(y.at(e), x.at(e) * c.at(r * hd + i) + rot * s.at(r * hd + i), tol);
        }
      }
    }
  }
}

TEST(RopeTest, GradientMatchesFiniteDifferencesAndShardsMatchOneDevice) {
  const int64_t n = 6, heads = 4, hd = 8;
  Tensor x = RandomNormal({n, heads, hd}, 3, 0, 1, DType::kF64);
  Tensor w = RandomNormal({n, heads, hd}, 4, 0, 1, DType::kF64);
  spmd_testing::FiniteDifferenceOptions o;
  o.max_probes = 24;
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      RopeMap(*Mesh::Create({{"tp", 2}})), {x, w}, o));
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      RopeMap(*Mesh::Create({{"dp", 2}})), {x, w}, o));
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(RopeMap, {{{"tp", 2}}}, {x, w}));
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(RopeMap, {{{"dp", 2}}}, {x, w}));
}

TEST(RopeTest, RejectsBadShapesDtypesAndSplitHeadDim) {
  auto run = [](const Tensor& x, const Tensor& c, const Tensor& s, PartitionSpec xs) {
    ShardFn fn = [](const std::vector<Value>& in) {
      return std::vector<Value>{rope(in[0], in[1], in[2])};
    };
    return ShardMap(fn, *Mesh::Create({{"tp", 2}}), {xs, P(), P()}, {xs})({x, c, s}).status();
  };
  auto [c, s] = Tables(4, 8, DType::kF64);
  Tensor x = RandomNormal({4, 2, 8}, 5, 0, 1, DType::kF64);
  EXPECT_THAT(run(RandomNormal({4, 2, 7}, 5, 0, 1, DType::kF64), c, s, P()).message(),
              HasSubstr("even head_dim"));
  EXPECT_THAT(run(RandomNormal({4, 16}, 5, 0, 1, DType::kF64), c, s, P()).message(),
              HasSubstr("[rows, heads, head_dim]"));
  auto [c3, s3] = Tables(3, 8, DType::kF64);
  EXPECT_THAT(run(x, c3, s3, P()).message(), HasSubstr("must both be"));
  auto [c32, s32] = Tables(4, 8, DType::kF32);
  EXPECT_THAT(run(x, c32, s32, P()).message(), HasSubstr("x's dtype"));
  EXPECT_THAT(run(x, c, s, P(None, None, "tp")).message(), HasSubstr("all_gather head_dim"));
}

}  // namespace
}  // namespace shardmap
