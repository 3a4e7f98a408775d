// The vocab-parallel embedding and cross-entropy of the GPT (models/parallel/layers.h) on GPU ranks
// against CPU ranks: their device paths (shard-local indices, row gather / scatter-add, no host
// round trip) give the CPU's loss and gradients, on one shared GPU with tp = 1, 2, 3 (odd vocab
// shards), f32 and bf16. Skips without a GPU.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "models/parallel/layers.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/cuda/runtime.h"
#include "tensor/random.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

// ids [n] -> embedding (vocab-parallel) -> logits = e @ wte^T (S1 on tp) -> mean loss.
ShardMap VocabLoss(const Mesh& mesh, DType compute, DevicePlacement placement) {
  ShardFn fn = [compute](const std::vector<Value>& in) -> std::vector<Value> {
    const TensorParallel tp{"tp", false};
    Value wte = compute == in[0].dtype() ? in[0] : cast(in[0], compute);
    Value e = VocabParallelEmbedding{wte, tp}(in[1]);                  // [n, d] R
    Value logits = cast(e.matmul(wte, false, true), DType::kF32);      // [n, v] S1 on tp
    Value loss = VocabParallelCrossEntropy(logits, in[2], tp);         // [n] R
    return {sum(loss, {})};
  };
  ShardMapOptions o;
  o.placement = std::move(placement);
  return shard_map(fn, mesh, {P("tp", None), P(), P()}, {P()}, o);
}

class GpuVocabParallelTest : public ::testing::TestWithParam<DType> {};

TEST_P(GpuVocabParallelTest, MatchesCpuRanks) {
  SKIP_WITHOUT_GPU();
  const DType compute = GetParam();
  constexpr int64_t kVocab = 12, kD = 8, kN = 7;
  std::vector<int64_t> ids = {0, 11, 5, 5, 3, 8, 1}, targets = {11, 0, 4, 4, 7, 2, 9};
  const std::vector<Tensor> in = {RandomNormal({kVocab, kD}, 1, 0.0, 0.5),
                                  Tensor::FromVector<int64_t>({kN}, ids),
                                  Tensor::FromVector<int64_t>({kN}, targets)};
  for (int tp : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    const Mesh mesh = *Mesh::Create({{"tp", tp}});
    absl::StatusOr<ShardMapGrads> want =
        value_and_grad(VocabLoss(mesh, compute, DevicePlacement::Cpu()))(in);
    absl::StatusOr<ShardMapGrads> got =
        value_and_grad(VocabLoss(mesh, compute, DevicePlacement::SharedGpu()))(in);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    const double tol = compute == DType::kF32 ? 1e-5 : 2e-2;
    EXPECT_TRUE(testing::TensorsNearScaled(got->outputs[0], want->outputs[0], tol));
    EXPECT_TRUE(testing::TensorsNearScaled(got->grads[0], want->grads[0], tol));
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, GpuVocabParallelTest,
                         ::testing::Values(DType::kF32, DType::kBF16));

}  // namespace
}  // namespace shardmap
