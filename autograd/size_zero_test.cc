// value_and_grad through a shard_map whose batch is empty: the loss is 0, and every gradient has
// its input's shape and is exactly 0 (no NaN from a mean over nothing, no crash on a [0, n]
// matmul or a size-0 all_reduce in the backward pass).
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

TEST(SizeZeroGradTest, EmptyBatchGivesZeroLossAndZeroGradientsOfTheRightShapes) {
  for (int tp : {1, 2, 3}) {
    SCOPED_TRACE(tp);
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    // Megatron column-then-row MLP on a batch of 0 rows: x [0, 4], w1 [4, 6], w2 [6, 4], b [4].
    ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
      Value h = gelu(in[0].matmul(in[1]));                 // [0, 6/tp] S1
      Value y = all_reduce(h.matmul(in[2]), "tp") + in[3];  // [0, 4] R
      return {sum(y * y, {}), y};
    };
    ShardMap f = shard_map(mlp, mesh, {P(), P(None, "tp"), P("tp", None), P()}, {P(), P()});
    const std::vector<Tensor> in = {Tensor::Zeros({0, 4}, DType::kF64),
                                    testing::Rand({4, 6}, 1), testing::Rand({6, 4}, 2),
                                    testing::Rand({4}, 3)};
    absl::StatusOr<ShardMapGrads> r = value_and_grad(f)(in);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_EQ(r->outputs[0], Tensor::Zeros({}, DType::kF64));
    EXPECT_TENSOR_EQ(r->outputs[1], Tensor::Zeros({0, 4}, DType::kF64));
    ASSERT_EQ(r->grads.size(), in.size());
    for (size_t k = 0; k < in.size(); ++k) {
      SCOPED_TRACE(k);
      EXPECT_TENSOR_NEAR(r->grads[k], Tensor::Zeros(in[k].shape(), DType::kF64), 0);
    }
  }
}

}  // namespace
}  // namespace shardmap
