#include "shardmap/ops/routing_ops.h"

#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/nn_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// x [n,4] S0 over dp, w [4,3] R: route each token to its top-2 of softmax(x @ w), pick the
// chosen experts' rows of w^T (R table, V rows), weight them by the gates and scatter them back
// to their tokens; loss = sum((x + combined)^2). Exercises every op and VJP, including the
// R -> V promotion of gather_rows whose cotangent is P.
ShardMap MakeRouted(const Mesh& mesh) {
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& x = in[0];
    const Value& w = in[1];
    const int64_t n = x.dim(0);
    TopKValues tk = top_k(softmax(x.matmul(w), -1), 2);
    Value experts = tk.indices.reshape({2 * n});
    std::vector<int64_t> owner(2 * n);
    for (int64_t i = 0; i < 2 * n; ++i) owner[i] = i / 2;
    Value tokens(Tensor::FromVector<int64_t>({2 * n}, owner), experts.type);
    Value picked = gather_rows(w.T(), experts) * tk.values.reshape({2 * n, 1});  // [2n, 4]
    Value y = x + scatter_add_rows(picked, tokens, n);
    return {all_reduce(sum_partial(y * y, {}), "dp"), y};
  };
  return shard_map(fn, mesh, {P("dp", None), P()}, {P(), P("dp", None)});
}

std::vector<Tensor> Inputs() {
  return {RandomNormal({9, 4}, 1, 0.0, 1.0, DType::kF64),
          RandomNormal({4, 3}, 2, 0.0, 1.0, DType::kF64)};
}

TEST(RoutingOps, ShardedMatchesOneDevice) {
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(MakeRouted, {{{"dp", 3}}}, Inputs()));
}

TEST(RoutingOps, GradientsMatchFiniteDifferences) {
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(MakeRouted(*Mesh::Create({{"dp", 3}})),
                                                            Inputs()));
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(MakeRouted(*Mesh::Create({{"dp", 1}})),
                                                            Inputs()));
}

TEST(RoutingOps, TypesFollowTheRules) {
  Mesh mesh = *Mesh::Create({{"dp", 2}});
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& x = in[0];  // S0
    const Value& w = in[1];  // R
    TopKValues tk = top_k(x, 2);
    EXPECT_EQ(tk.values.type.ToString({"dp"}), "{dp:S0}");
    EXPECT_EQ(tk.indices.dtype(), DType::kI64);
    Value r(Tensor::FromVector<int64_t>({2}, {1, -1}), w.type);     // R rows
    EXPECT_EQ(gather_rows(w, r).type.ToString({"dp"}), "{dp:R}");
    EXPECT_EQ(gather_rows(w, tk.indices.reshape({-1})).type.ToString({"dp"}), "{dp:V}");
    EXPECT_EQ(gather_rows(x, r).type.ToString({"dp"}), "{dp:V}");  // local rows: S0 -> V
    Value p = reinterpret(x, "dp");                                   // P
    EXPECT_EQ(scatter_add_rows(gather_rows(p, r), r, 5).type.ToString({"dp"}), "{dp:P}");
    return {all_reduce(sum_partial(x, {}), "dp")};
  };
  ShardMap f = shard_map(fn, mesh, {P("dp", None), P()}, {P()});
  ASSERT_TRUE(f({RandomNormal({4, 3}, 1), RandomNormal({3, 3}, 2)}).ok());
}

TEST(RoutingOps, WrongProgramsAreRejected) {
  Mesh mesh = *Mesh::Create({{"dp", 2}});
  auto run = [&](ShardFn fn, std::vector<PartitionSpec> specs) {
    return shard_map(fn, mesh, specs, {P()})({RandomNormal({4, 4}, 1), RandomNormal({4, 4}, 2)});
  };
  // A pending sum gathered with rows that differ per device.
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return run(
            [](const std::vector<Value>& in) -> std::vector<Value> {
              Value rows = top_k(in[0], 1).indices.reshape({-1});  // V
              Value g = gather_rows(reinterpret(in[1], "dp"), rows);
              return {all_reduce(sum(g, {}), "dp")};
            },
            {P("dp", None), P("dp", None)});
      },
      {"gather_rows", "partial sum (P)", "row indices vary", "all_reduce x first"}));
  // top_k over a sharded last dim.
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return run(
            [](const std::vector<Value>& in) -> std::vector<Value> {
              return {all_reduce(sum_partial(top_k(in[0], 1).values, {}), "dp")};
            },
            {P(None, "dp"), P()});
      },
      {"top_k", "all_gather"}));
  // top_k of a pending sum.
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return run(
            [](const std::vector<Value>& in) -> std::vector<Value> {
              return {all_reduce(sum(top_k(reinterpret(in[0], "dp"), 1).values, {}), "dp")};
            },
            {P("dp", None), P()});
      },
      {"top_k", "P"}));
}

}  // namespace
}  // namespace shardmap
