// shard_map boundaries: input validation, output type checks (docs/design.md 4.2), the local
// view, the runtime replication check and error propagation.
#include "shardmap/shard_map.h"

#include <atomic>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/sharding.h"
#include "shardmap/visualize.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Rand;

ShardFn Identity() {
  return [](const std::vector<Value>& v) -> std::vector<Value> { return v; };
}

// a[i, j] = 100 i + j, so every element names its own position.
Tensor Positions(int64_t rows, int64_t cols) {
  return Tensor::Arange(rows * cols, DType::kF64).Reshape({rows, cols});
}

// The block with rows [r0, r0+rows) and cols [c0, c0+cols) of Positions, written out by hand.
Tensor PositionBlock(int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t width) {
  std::vector<double> v;
  for (int64_t i = r0; i < r0 + rows; ++i) {
    for (int64_t j = c0; j < c0 + cols; ++j) v.push_back(static_cast<double>(i * width + j));
  }
  return Tensor::FromVector<double>({rows, cols}, v);
}

TEST(ShardMapTest, SplitsIntoTheHandComputedBlocks) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  const Tensor a = Positions(4, 9), b = Rand({5}, 2);
  std::vector<PartitionSpec> specs = {P("dp", "tp"), P()};
  std::atomic<int> checked{0};
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [&](const std::vector<Value>& v) -> std::vector<Value> {
        const RankContext& ctx = *RankContext::Current();
        const int d = ctx.coord(0), t = ctx.coord(1);
        EXPECT_EQ(v[0].ToString(), "f64[2,3]{dp:S0,tp:S1}");
        EXPECT_TENSOR_EQ(v[0].tensor, PositionBlock(2 * d, 2, 3 * t, 3, 9));
        EXPECT_EQ(v[1].ToString(), "f64[5]{dp:R,tp:R}");
        EXPECT_TENSOR_EQ(v[1].tensor, b);
        ++checked;
        return {};
      },
      mesh, specs, {})({a, b});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(checked, 6);
}

TEST(ShardMapTest, AssemblesPerRankBlocksIntoTheHandComputedGlobal) {
  // Each rank returns values made from its own coordinates (not from its inputs, so a split error
  // cannot cancel an assembly error): S axes place blocks, R axes take index 0, P axes sum.
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  SpmdType s0s1(2), rs1(2), pp(2, AxisType::P());
  s0s1[0] = AxisType::Sharded(0);
  s0s1[1] = AxisType::Sharded(1);
  rs1[1] = AxisType::Sharded(1);
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [&](const std::vector<Value>&) -> std::vector<Value> {
        const RankContext& ctx = *RankContext::Current();
        const double id = 10 * ctx.coord(0) + ctx.coord(1);
        return {Value(Tensor::Full({2, 3}, id, DType::kF64), s0s1),
                Value(Tensor::Full({2, 3}, id, DType::kF64), rs1),
                Value(Tensor::Full({2}, id + 1, DType::kF64), pp)};
      },
      mesh, {}, {P("dp", "tp"), P(None, "tp"), P().Unreduced({"dp", "tp"})})({});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> blocks, first_dp;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 9; ++j) blocks.push_back(10 * (i / 2) + j / 3);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 9; ++j) first_dp.push_back(j / 3);  // dp index 0's block
  }
  EXPECT_TENSOR_EQ((*r)[0], Tensor::FromVector<double>({4, 9}, blocks));
  EXPECT_TENSOR_EQ((*r)[1], Tensor::FromVector<double>({2, 9}, first_dp));
  // sum over dp in {0,1}, tp in {0,1,2} of (10 dp + tp + 1) = 3 * 10 + 2 * (1 + 2 + 3) = 42.
  EXPECT_TENSOR_EQ((*r)[2], Tensor::FromVector<double>({2}, {42, 42}));
}

TEST(ShardMapTest, InputErrors) {
  Mesh mesh = *Mesh::Create({{"tp", 4}});
  absl::StatusOr<std::vector<Tensor>> r =
      shard_map(Identity(), mesh, {P(None, "tp")}, {P(None, "tp")})({Rand({3, 10}, 1)});
  EXPECT_THAT(r.status().message(),
              HasSubstr("while splitting dim 1 of 'input 0' (size 10) over axes (tp) of product 4"));
  ShardMapOptions named;
  named.input_names = {"w1"};
  r = shard_map(Identity(), mesh, {P(None, "tp")}, {P(None, "tp")}, named)({Rand({3, 10}, 1)});
  EXPECT_THAT(r.status().message(), HasSubstr("while splitting dim 1 of 'w1' (size 10)"));
  r = shard_map(Identity(), mesh, {P()}, {P()})({Rand({3}, 1), Rand({3}, 1)});
  EXPECT_THAT(r.status().message(), HasSubstr("2 inputs but has 1 in_specs"));
  r = shard_map(Identity(), mesh, {P("dp")}, {P()})({Rand({4}, 1)});
  EXPECT_THAT(r.status().message(), HasSubstr("unknown mesh axis 'dp'"));
}

TEST(ShardMapTest, OutputTypeChecks) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  Tensor x = Rand({4, 4}, 3), w = Rand({4, 4}, 4);
  auto row_parallel = [](const std::vector<Value>& v) -> std::vector<Value> {
    return {v[0].matmul(v[1])};  // P on tp, S0 on dp
  };
  std::vector<PartitionSpec> ins = {P("dp", "tp"), P("tp", None)};
  // P output under a spec that claims replication.
  absl::StatusOr<std::vector<Tensor>> r = shard_map(row_parallel, mesh, ins, {P("dp")})({x, w});
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("output 0 is f64[2,4]{dp:S0,tp:P}"), HasSubstr("axis 'tp'"),
                    HasSubstr("pending sum (P)"), HasSubstr("all_reduce(output0, \"tp\")"),
                    HasSubstr("Unreduced({\"tp\"})")));
  // V output (S0) under a spec that claims replication on dp.
  r = shard_map(row_parallel, mesh, ins, {P().Unreduced({"tp"})})({x, w});
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("axis 'dp'"), HasSubstr("varies (S0)"),
                    HasSubstr("all_gather(output0, 0, \"dp\")")));
  // P output under a sharded spec.
  r = shard_map(row_parallel, mesh, ins, {P("dp", "tp")})({x, w});
  EXPECT_THAT(r.status().message(), HasSubstr("reduce_scatter(output0, 1, \"tp\")"));
  // Unreduced where the value is not P.
  r = shard_map(Identity(), mesh, {P("dp")}, {P("dp").Unreduced({"tp"})})({x});
  EXPECT_THAT(r.status().message(), HasSubstr("the spec says unreduced"));
  // Correct: unreduced P output is summed at the boundary.
  r = shard_map(row_parallel, mesh, ins, {P("dp").Unreduced({"tp"})})({x, w});
  ASSERT_TRUE(r.ok()) << r.status();
  SingleRankContext one{Mesh()};
  EXPECT_TENSOR_NEAR((*r)[0], Value::Replicated(x).matmul(Value::Replicated(w)).tensor, 1e-12);
}

TEST(ShardMapTest, TypeErrorInsideFnComesBackAsStatusWithoutHanging) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        Value yp = v[0].matmul(v[1]);
        Value y = all_reduce(yp + v[2], "tp");  // bias before the all-reduce
        return {y};
      },
      mesh, {P(None, "tp"), P("tp"), P()}, {P()})({Rand({2, 6}, 1), Rand({6, 2}, 2), Rand({2}, 3)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("bias added before the all-reduce"),
                                          HasSubstr("mesh coordinates (tp=")));
}

TEST(ShardMapTest, LocalViewChecksAndTypesShards) {
  Mesh mesh = *Mesh::Create({{"dp", 2}});
  ShardMap f = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        return {all_reduce(sum_partial(v[0], {0}), "dp")};
      },
      mesh, {P("dp")}, {P()});
  Tensor x = Rand({4, 3}, 5);
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    std::vector<Value> out = f.CallLocal({ShardOf(x, mesh, P("dp"), ctx.rank())});
    EXPECT_EQ(out[0].ToString(), "f64[3]{dp:R}");
    absl::Status bad = CatchOpError([&] { f.CallLocal({x, x}); });
    EXPECT_THAT(bad.message(), HasSubstr("2 local inputs"));
  });
  EXPECT_TRUE(s.ok()) << s;
  Mesh other = *Mesh::Create({{"tp", 2}});
  s = RunSpmd(other, [&](RankContext&) { f.CallLocal({x}); });
  EXPECT_THAT(s.message(), HasSubstr("this shard_map is over Mesh{dp:2}"));
}

TEST(ShardMapTest, RuntimeReplicationCheckCatchesALyingCast) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  ShardFn liar = [](const std::vector<Value>& v) -> std::vector<Value> {
    // Claims R for per-device data (a wrong user cast).
    return {Value(v[0].tensor, SpmdType(1, AxisType::R()))};
  };
  ShardMapOptions opts;
  opts.check_replication = true;
  absl::StatusOr<std::vector<Tensor>> r =
      shard_map(liar, mesh, {P("tp")}, {P()}, opts)({Rand({3, 2}, 6)});
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("differs between rank 0 and rank"), HasSubstr("axis 'tp'")));
  // An honest program passes the check.
  r = shard_map(Identity(), mesh, {P()}, {P()}, opts)({Rand({3, 2}, 6)});
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(ShardMapTest, GradientSpecsAreTheInputsDualTypes) {
  ShardFn id = [](const std::vector<Value>& in) { return in; };
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  auto strings = [](const std::vector<PartitionSpec>& specs) {
    std::vector<std::string> s;
    for (const PartitionSpec& p : specs) s.push_back(p.ToString());
    return s;
  };
  // R axes become unreduced (the gradient is a pending sum there), S stays, I stays.
  ShardMapOptions o;
  o.invariant_inputs = {2};
  ShardMap f = shard_map(id, mesh, {P(), P(None, "tp"), P("dp"), P({"dp", "tp"})},
                         {P(), P(), P(), P()}, o);
  EXPECT_THAT(strings(f.GradientSpecs()),
              ::testing::ElementsAre(P().Unreduced({"dp", "tp"}).ToString(),
                                     P(None, "tp").Unreduced({"dp"}).ToString(),
                                     P("dp").ToString(), P({"dp", "tp"}).ToString()));
  EXPECT_EQ(f.GradientSpecs()[1].ToString(), "P(None,tp, unreduced=dp)");
  // Invalid specs: the in_specs unchanged (the call reports the error).
  ShardMap bad = shard_map(id, mesh, {P("xx")}, {P()});
  EXPECT_EQ(strings(bad.GradientSpecs()), std::vector<std::string>{"P(xx)"});
}

TEST(ShardMapTest, VisualizeSharding) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::string s = VisualizeSharding(mesh, P("dp", "tp"), {4, 9});
  EXPECT_THAT(s, AllOf(HasSubstr("cols 0-2"), HasSubstr("cols 6-8"), HasSubstr("rows 2-3")));
  // Replicated over tp: each block is held by 3 ranks.
  EXPECT_THAT(VisualizeSharding(mesh, P("dp"), {4, 9}), HasSubstr("3,4,5"));
  EXPECT_THAT(VisualizeSharding(mesh, P("dp"), {3, 9}), HasSubstr("invalid"));
}

TEST(ShardMapTest, ErasedModeSkipsOutputChecks) {
  // A row-parallel matmul leaves P on tp; the out_spec claims replication. Checked mode rejects
  // it; erased mode assembles from the spec alone (tp taken from index 0: the partial product of
  // the first two columns of x with the first two rows of w, on each dp block).
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  const Tensor x = Rand({4, 4}, 3), w = Rand({4, 3}, 4);
  ShardFn row_parallel = [](const std::vector<Value>& v) -> std::vector<Value> {
    return {v[0].matmul(v[1])};
  };
  const std::vector<PartitionSpec> ins = {P("dp", "tp"), P("tp", None)};
  absl::StatusOr<std::vector<Tensor>> checked = shard_map(row_parallel, mesh, ins, {P("dp")})({x, w});
  EXPECT_THAT(checked.status().message(), HasSubstr("pending sum (P)"));

  ShardMapOptions opts;
  opts.check = TypeCheck::kErased;
  absl::StatusOr<std::vector<Tensor>> r =
      shard_map(row_parallel, mesh, ins, {P("dp")}, opts)({x, w});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> want(4 * 3, 0.0);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 2; ++k) want[i * 3 + j] += x.at(i * 4 + k) * w.at(k * 3 + j);
    }
  }
  EXPECT_TENSOR_NEAR((*r)[0], Tensor::FromVector<double>({4, 3}, want), 1e-15);
}

}  // namespace
}  // namespace shardmap
