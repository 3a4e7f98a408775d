// The "API at a glance" example of shardmap/shard_map.h, compiled and checked, so the snippet
// others copy stays correct.
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tests/test_util.h"

namespace {

using namespace shardmap;  // as in the header example

TEST(ApiExampleTest, MegatronMlpForwardAndBackward) {
  Tensor x = shardmap::testing::Rand({4, 5}, 1), w1 = shardmap::testing::Rand({5, 6}, 2),
         w2 = shardmap::testing::Rand({6, 5}, 3);
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& x = in[0];
    const Value& w1 = in[1];
    const Value& w2 = in[2];
    Value y = all_reduce(gelu(x.matmul(w1)).matmul(w2), "tp");
    Value loss = sum(y * y, {});
    return {loss, y};
  };
  ShardMap f = shard_map(mlp, mesh, {P(), P(None, "tp"), P("tp", None)}, {P(), P()});
  absl::StatusOr<std::vector<Tensor>> out = f({x, w1, w2});
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x, w1, w2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->grads[1].ShapeString(), "f64[5,6]");
  EXPECT_TRUE(shardmap::testing::TensorsBitwiseEqual(r->outputs[1], (*out)[1]));
  // Against the unsharded program on one device.
  SingleRankContext one{Mesh()};
  ValueAndGrad ref = value_and_grad(
      [](const std::vector<Value>& p) {
        Value y = gelu(p[0].matmul(p[1])).matmul(p[2]);
        return sum(y * y, {});
      },
      {Value::Replicated(x), Value::Replicated(w1), Value::Replicated(w2)});
  EXPECT_NEAR(r->outputs[0].item(), ref.value.item(), 1e-12);
  for (int k = 0; k < 3; ++k) EXPECT_TENSOR_NEAR(r->grads[k], ref.grads[k].tensor, 1e-12);
}

}  // namespace
