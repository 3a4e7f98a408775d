// The GPT attention layer on GPU ranks (fused causal_attention, the AttentionPath kAuto picks on
// CUDA tensors) against the same layer on CPU ranks (the materialised einsum + causal_softmax
// path): loss and every gradient, f32 and bf16, one rank and tp = 2 heads with and without
// sequence parallelism on one shared GPU, odd sequence length, head_dim 64 and 128.
// Skips without a GPU.
#include <cmath>
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

struct Sizes {
  int64_t batch, seq, heads, head_dim;
};

ShardMap AttentionLoss(const Mesh& mesh, const Sizes& s, bool sp, DType compute,
                       DevicePlacement placement) {
  ShardFn fn = [s, sp, compute](const std::vector<Value>& in) -> std::vector<Value> {
    std::vector<Value> p;
    for (const Value& v : in) p.push_back(compute == v.dtype() ? v : cast(v, compute));
    TensorParallel tp{"tp", sp};  // the mesh's one axis (size 1 for the reference)
    CausalSelfAttention attn{p[1], p[2], RowParallelLinear{p[3], p[4], tp}, s.head_dim, s.seq,
                             tp};
    Value y = cast(attn(p[0]), DType::kF32);
    return {sp ? all_reduce(sum_partial(y * y, {}), "tp") : sum(y * y, {})};
  };
  ShardMapOptions o;
  o.placement = std::move(placement);
  return shard_map(fn, mesh,
                   {sp ? P("tp") : P(), P(None, None, "tp"), P(None, "tp"),
                    P("tp", None), P()},
                   {P()}, o);
}

class GpuAttentionTest : public ::testing::TestWithParam<std::tuple<int64_t, DType>> {};

TEST_P(GpuAttentionTest, FusedGpuLayerMatchesMaterialisedCpuLayer) {
  SKIP_WITHOUT_GPU();
  const auto [head_dim, compute] = GetParam();
  const Sizes s{2, 33, 2, head_dim};
  const int64_t d = s.heads * s.head_dim, rows = s.batch * s.seq;
  const std::vector<Tensor> in = {
      RandomNormal({rows, d}, 1, 0.0, 1.0), RandomNormal({d, 3, d}, 2, 0.0, 0.05),
      RandomNormal({3, d}, 3, 0.0, 0.05), RandomNormal({d, d}, 4, 0.0, 0.05),
      RandomNormal({d}, 5, 0.0, 0.05)};
  absl::StatusOr<ShardMapGrads> want = value_and_grad(AttentionLoss(
      *Mesh::Create({{"tp", 1}}), s, false, compute, DevicePlacement::Cpu()))(in);
  ASSERT_TRUE(want.ok()) << want.status();
  // bf16: the CPU reference rounds scores, probabilities and outputs to bf16, the fused kernel
  // keeps them in f32, so the two differ by a few bf16 ulps of the largest values.
  const double tol = compute == DType::kF32 ? 2e-5 : 5e-2;
  for (int tp : {1, 2}) {
    for (bool sp : {false, true}) {
      if (tp == 1 && sp) continue;
      SCOPED_TRACE(absl::StrCat("tp=", tp, sp ? " sp" : ""));
      absl::StatusOr<ShardMapGrads> got = value_and_grad(AttentionLoss(
          *Mesh::Create({{"tp", tp}}), s, sp, compute, DevicePlacement::SharedGpu()))(in);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(testing::TensorsNearScaled(got->outputs[0], want->outputs[0], tol));
      for (size_t k = 0; k < in.size(); ++k) {
        EXPECT_TRUE(testing::TensorsNearScaled(got->grads[k], want->grads[k], tol))
            << "gradient " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuAttentionTest,
                         ::testing::Combine(::testing::Values(int64_t{64}, int64_t{128}),
                                            ::testing::Values(DType::kF32, DType::kBF16)));

}  // namespace
}  // namespace shardmap
