// shard_map boundaries: input validation, output type checks (DESIGN.md section 3), the local
// view, the runtime replication check and error propagation.
#include "shardmap/shard_map.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
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

TEST(ShardMapTest, SplitsAndAssemblesPerSpecs) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  Tensor a = Rand({4, 9}, 1), b = Rand({5}, 2);
  std::vector<PartitionSpec> specs = {P("dp", "tp"), P()};
  absl::StatusOr<std::vector<Tensor>> out = shard_map(Identity(), mesh, specs, specs)({a, b});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(testing::TensorsBitwiseEqual((*out)[0], a));
  EXPECT_TRUE(testing::TensorsBitwiseEqual((*out)[1], b));
  // Local shapes and types seen by the function.
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        EXPECT_EQ(v[0].ToString(), "f64[2,3]{dp:S0,tp:S1}");
        EXPECT_EQ(v[1].ToString(), "f64[5]{dp:R,tp:R}");
        return {};
      },
      mesh, specs, {})({a, b});
  EXPECT_TRUE(r.ok()) << r.status();
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
                    HasSubstr("pending sum (P)"), HasSubstr("all_reduce(y, \"tp\")"),
                    HasSubstr("Unreduced({\"tp\"})")));
  // V output (S0) under a spec that claims replication on dp.
  r = shard_map(row_parallel, mesh, ins, {P().Unreduced({"tp"})})({x, w});
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("axis 'dp'"), HasSubstr("varies (S0)"),
                    HasSubstr("all_gather(y, 0, \"dp\")")));
  // P output under a sharded spec.
  r = shard_map(row_parallel, mesh, ins, {P("dp", "tp")})({x, w});
  EXPECT_THAT(r.status().message(), HasSubstr("reduce_scatter(y, 1, \"tp\")"));
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

TEST(ShardMapTest, VisualizeSharding) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::string s = VisualizeSharding(mesh, P("dp", "tp"), {4, 9});
  EXPECT_THAT(s, AllOf(HasSubstr("cols 0-2"), HasSubstr("cols 6-8"), HasSubstr("rows 2-3")));
  // Replicated over tp: each block is held by 3 ranks.
  EXPECT_THAT(VisualizeSharding(mesh, P("dp"), {4, 9}), HasSubstr("3,4,5"));
  EXPECT_THAT(VisualizeSharding(mesh, P("dp"), {3, 9}), HasSubstr("invalid"));
}

TEST(ShardMapTest, ErasedModeSkipsOutputChecks) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  ShardMapOptions opts;
  opts.check = TypeCheck::kErased;
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> { return {v[0] + v[1]}; }, mesh,
      {P("tp"), P()}, {P("tp")}, opts)({Rand({4, 2}, 7), Rand({2}, 8)});
  EXPECT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace shardmap
