// stop_gradient: the value passes, the gradient does not. f(x) = sum(x * stop_gradient(x)) has
// gradient x (not 2x), checked against the analytic gradient in f64 on one device and sharded.
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

TEST(StopGradient, ValuePassesGradientStops) {
  for (int dp : {1, 2}) {
    ShardMap f = shard_map(
        [](const std::vector<Value>& in) -> std::vector<Value> {
          return {all_reduce(sum_partial(in[0] * stop_gradient(in[0]), {}), "dp")};
        },
        *Mesh::Create({{"dp", dp}}), {P("dp", None)}, {P()});
    const Tensor x = Rand({4, 3}, 1);
    absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x});
    ASSERT_TRUE(r.ok()) << r.status();
    double want = 0;
    for (int64_t i = 0; i < x.numel(); ++i) want += x.data<double>()[i] * x.data<double>()[i];
    EXPECT_NEAR(r->outputs[0].item(), want, 1e-12) << "dp=" << dp;
    ASSERT_EQ(r->grads[0].numel(), x.numel());
    for (int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_DOUBLE_EQ(r->grads[0].data<double>()[i], x.data<double>()[i]) << "dp=" << dp;
    }
  }
}

TEST(StopGradient, KeepsTheType) {
  ShardMap f = shard_map(
      [](const std::vector<Value>& in) -> std::vector<Value> {
        const Value s = stop_gradient(in[0]);
        EXPECT_EQ(s.type, in[0].type);
        EXPECT_FALSE(s.requires_grad());
        return {s};
      },
      *Mesh::Create({{"dp", 2}}), {P("dp", None)}, {P("dp", None)});
  absl::StatusOr<std::vector<Tensor>> r = f({Rand({4, 3}, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace shardmap
