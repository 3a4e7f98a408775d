// Each GPT layer, sharded over tp = 1, 2, 3 (with and without sequence parallelism), against the
// same layer run unsharded on one device: outputs and the gradients of every input (f64).
#include "models/parallel/layers.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

// fn(inputs, tp) -> the per-device loss (P on tp under SP, R otherwise).
using LayerLoss = std::function<Value(const std::vector<Value>&, const TensorParallel&)>;

void ExpectShardedMatchesUnsharded(const LayerLoss& fn, const std::vector<Tensor>& in,
                                   const std::vector<PartitionSpec>& specs, int tp, bool sp) {
  SCOPED_TRACE(absl::StrCat("tp=", tp, sp ? " sp" : ""));
  Mesh mesh = *Mesh::Create({{"tp", tp}});
  TensorParallel par{"tp", sp};
  ShardFn f = [&](const std::vector<Value>& p) -> std::vector<Value> { return {fn(p, par)}; };
  PartitionSpec out = sp ? P().Unreduced({"tp"}) : P();
  absl::StatusOr<ShardMapGrads> got = value_and_grad(shard_map(f, mesh, specs, {out}))(in);
  ASSERT_TRUE(got.ok()) << got.status();
  SingleRankContext one{Mesh()};
  std::vector<Value> params;
  for (const Tensor& t : in) params.push_back(Value::Replicated(t));
  ValueAndGrad ref = value_and_grad([&](const std::vector<Value>& p) { return fn(p, {}); },
                                    params);
  EXPECT_TENSOR_NEAR(got->outputs[0], ref.value.tensor, 1e-12 * (1 + std::fabs(ref.value.item())));
  for (size_t k = 0; k < in.size(); ++k) {
    if (!got->grads[k].defined()) continue;  // integer ids
    EXPECT_TENSOR_NEAR(got->grads[k], ref.grads[k].tensor, 1e-10) << "input " << k;
  }
}

// Sum of squares of a [rows, d] output: SP outputs are S0 on tp, so their sum is a share (P).
Value SumSquares(const Value& y, const TensorParallel& tp) {
  return tp.on() && tp.sp ? sum_partial(y * y, {}) : sum(y * y, {});
}

constexpr int64_t kRows = 6, kD = 12, kHeads = 6, kSeq = 3, kVocab = 12;

TEST(GptLayersTest, MlpColumnThenRowParallel) {
  std::vector<Tensor> in = {Rand({kRows, kD}, 1), Rand({kD, 4 * kD}, 2), Rand({4 * kD}, 3),
                            Rand({4 * kD, kD}, 4), Rand({kD}, 5)};
  LayerLoss fn = [](const std::vector<Value>& p, const TensorParallel& tp) {
    Mlp mlp{ColumnParallelLinear{p[1], p[2], tp}, RowParallelLinear{p[3], p[4], tp}};
    return SumSquares(mlp(p[0]), tp);
  };
  for (int tp : {1, 2, 3}) {
    for (bool sp : {false, true}) {
      ExpectShardedMatchesUnsharded(
          fn, in, {sp ? P("tp") : P(), P(None, "tp"), P("tp"), P("tp", None), P()}, tp, sp);
    }
  }
}

TEST(GptLayersTest, HeadParallelCausalAttention) {
  std::vector<Tensor> in = {Rand({kRows, kD}, 11), Rand({kD, 3, kD}, 12), Rand({3, kD}, 13),
                            Rand({kD, kD}, 14), Rand({kD}, 15)};
  LayerLoss fn = [](const std::vector<Value>& p, const TensorParallel& tp) {
    CausalSelfAttention attn{p[1], p[2], RowParallelLinear{p[3], p[4], tp}, kD / kHeads, kSeq,
                             tp};
    return SumSquares(attn(p[0]), tp);
  };
  // tp = kHeads: one head per device (its local heads dim has size 1 and must keep the shard).
  for (int tp : {1, 2, 3, static_cast<int>(kHeads)}) {
    for (bool sp : {false, true}) {
      ExpectShardedMatchesUnsharded(
          fn, in, {sp ? P("tp") : P(), P(None, None, "tp"), P(None, "tp"), P("tp", None), P()},
          tp, sp);
    }
  }
}

// The fused path (causal_attention; on the CPU its f64 reference kernel) sharded over heads
// (tp, with and without SP) against the unsharded layer, and against the materialised path.
TEST(GptLayersTest, FusedAttentionPathMatchesShardedAndMaterialised) {
  std::vector<Tensor> in = {Rand({kRows, kD}, 31), Rand({kD, 3, kD}, 32), Rand({3, kD}, 33),
                            Rand({kD, kD}, 34), Rand({kD}, 35)};
  auto layer = [](AttentionPath path) {
    return [path](const std::vector<Value>& p, const TensorParallel& tp) {
      CausalSelfAttention attn{p[1], p[2], RowParallelLinear{p[3], p[4], tp}, kD / kHeads, kSeq,
                               tp, nullptr, "", path};
      return SumSquares(attn(p[0]), tp);
    };
  };
  for (int tp : {1, 2, 3}) {
    for (bool sp : {false, true}) {
      ExpectShardedMatchesUnsharded(
          layer(AttentionPath::kFused), in,
          {sp ? P("tp") : P(), P(None, None, "tp"), P(None, "tp"), P("tp", None), P()}, tp, sp);
    }
  }
  SingleRankContext one{Mesh()};
  std::vector<Value> params;
  for (const Tensor& t : in) params.push_back(Value::Replicated(t));
  ValueAndGrad fused = value_and_grad(
      [&](const std::vector<Value>& p) { return layer(AttentionPath::kFused)(p, {}); }, params);
  ValueAndGrad mat = value_and_grad(
      [&](const std::vector<Value>& p) { return layer(AttentionPath::kMaterialised)(p, {}); },
      params);
  EXPECT_TENSOR_NEAR(fused.value.tensor, mat.value.tensor, 1e-12 * (1 + std::fabs(mat.value.item())));
  for (size_t k = 0; k < in.size(); ++k) {
    EXPECT_TENSOR_NEAR(fused.grads[k].tensor, mat.grads[k].tensor, 1e-10) << "input " << k;
  }
}

TEST(GptLayersTest, AttentionPathChoice) {
  EXPECT_EQ(ResolveAttentionPath(AttentionPath::kFused, Device::Cpu(), 64), AttentionPath::kFused);
  EXPECT_EQ(ResolveAttentionPath(AttentionPath::kMaterialised, Device::Cuda(0), 64),
            AttentionPath::kMaterialised);
  if (std::getenv("SHARDMAP_ATTENTION") == nullptr) {
    EXPECT_EQ(ResolveAttentionPath(AttentionPath::kAuto, Device::Cpu(), 64),
              AttentionPath::kMaterialised);
    EXPECT_EQ(ResolveAttentionPath(AttentionPath::kAuto, Device::Cuda(0), 64),
              AttentionPath::kFused);
    EXPECT_EQ(ResolveAttentionPath(AttentionPath::kAuto, Device::Cuda(0), 256),
              AttentionPath::kMaterialised);  // over the kernel's head_dim limit
  }
}

// Sequence parallel times data parallel: the rows (tokens) are split over (dp, tp), so every
// weight gradient x^T @ g contracts a dim both operands hold as S0 on dp and on tp (P on both).
TEST(GptLayersTest, SequenceParallelTimesDataParallelMlpAndLayerNorm) {
  constexpr int64_t kTokens = 12;
  std::vector<Tensor> in = {Rand({kTokens, kD}, 61), Rand({kD, 4 * kD}, 62), Rand({4 * kD}, 63),
                            Rand({4 * kD, kD}, 64), Rand({kD}, 65), Rand({kD}, 66),
                            Rand({kD}, 67), Rand({kD, kD}, 68)};
  auto fn = [](const std::vector<Value>& p, const TensorParallel& tp) {
    Mlp mlp{ColumnParallelLinear{p[1], p[2], tp}, RowParallelLinear{p[3], p[4], tp}};
    Value y = mlp(LayerNorm{p[5], p[6]}(p[0])).matmul(p[7]);  // a replicated weight at the end
    return sum_partial(y * y, {});
  };
  for (auto [dp, tp] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}});
    TensorParallel par{"tp", /*sp=*/true};
    ShardFn f = [&](const std::vector<Value>& p) -> std::vector<Value> { return {fn(p, par)}; };
    absl::StatusOr<ShardMapGrads> got = value_and_grad(shard_map(
        f, mesh,
        {P({"dp", "tp"}), P(None, "tp"), P("tp"), P("tp", None), P(), P(), P(), P()},
        {P().Unreduced({"dp", "tp"})}))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    SingleRankContext one{Mesh()};
    std::vector<Value> params;
    for (const Tensor& t : in) params.push_back(Value::Replicated(t));
    ValueAndGrad ref = value_and_grad(
        [&](const std::vector<Value>& p) { return sum(fn(p, {}), {}); }, params);
    EXPECT_TENSOR_NEAR(got->outputs[0], ref.value.tensor, 1e-12 * (1 + std::fabs(ref.value.item())));
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TENSOR_NEAR(got->grads[k], ref.grads[k].tensor, 1e-10) << "input " << k;
    }
  }
}

// The same with [batch, seq, d] activations: batch over dp, the sequence over tp. The weight
// gradient of a rank-3 x reshapes x and g to [b*t, d] rows (S0 on dp and tp only when each device
// holds one sequence: otherwise its rows are not one block of the global rows, and V).
TEST(GptLayersTest, SequenceParallelTimesDataParallelRank3WeightGradient) {
  std::vector<Tensor> in = {Rand({4, 6, kD}, 71), Rand({kD, kD}, 72)};
  auto fn = [](const std::vector<Value>& p) { return p[0].matmul(p[1]); };
  for (auto [dp, tp] : {std::pair{2, 2}, std::pair{4, 3}, std::pair{4, 2}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}});
    ShardFn f = [&](const std::vector<Value>& p) -> std::vector<Value> {
      Value y = fn(p);
      return {sum_partial(y * y, {})};
    };
    absl::StatusOr<ShardMapGrads> got = value_and_grad(
        shard_map(f, mesh, {P("dp", "tp"), P()}, {P().Unreduced({"dp", "tp"})}))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    SingleRankContext one{Mesh()};
    std::vector<Value> params;
    for (const Tensor& t : in) params.push_back(Value::Replicated(t));
    ValueAndGrad ref = value_and_grad(
        [&](const std::vector<Value>& p) {
          Value y = fn(p);
          return sum(y * y, {});
        },
        params);
    EXPECT_TENSOR_NEAR(got->outputs[0], ref.value.tensor, 1e-12 * (1 + std::fabs(ref.value.item())));
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TENSOR_NEAR(got->grads[k], ref.grads[k].tensor, 1e-10) << "input " << k;
    }
  }
}

// x^T @ g with the token dim S0 on dp and tp in x and g's tp layout unknown (V: its rows were
// rotated over tp by a ppermute). Was rejected as contracting tp with dp; dp shards both
// contracted dims alike, so the result is P on dp (and V on tp). Checked against the same sum of
// per-device products computed from the global tensors.
TEST(GptLayersTest, SequenceParallelTimesDataParallelContractionOfUnknownLayout) {
  const int64_t kTokens = 12;
  std::vector<Tensor> in = {Rand({kTokens, 4}, 81), Rand({kTokens, 5}, 82)};
  for (auto [dp, tp] : {std::pair{2, 2}, std::pair{2, 3}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}});
    std::vector<std::pair<int, int>> ring;
    for (int j = 0; j < tp; ++j) ring.push_back({j, (j + 1) % tp});
    ShardFn f = [&](const std::vector<Value>& p) -> std::vector<Value> {
      Value g = ppermute(p[1], "tp", ring);  // {dp:S0, tp:V}
      return {reinterpret(matmul(p[0], g, /*ta=*/true, false), "tp")};
    };
    absl::StatusOr<std::vector<Tensor>> got =
        shard_map(f, mesh, {P({"dp", "tp"}), P({"dp", "tp"})}, {P().Unreduced({"dp", "tp"})})(in);
    ASSERT_TRUE(got.ok()) << got.status();
    // Device (i, j) holds row block i*tp + j of x and, after the ring, block i*tp + (j-1) of g.
    const int64_t rows = kTokens / (dp * tp);
    Tensor want = Tensor::Zeros({4, 5}, DType::kF64);
    for (int i = 0; i < dp; ++i) {
      for (int j = 0; j < tp; ++j) {
        Tensor xb = Slice(in[0], 0, (i * tp + j) * rows, rows);
        Tensor gb = Slice(in[1], 0, (i * tp + (j + tp - 1) % tp) * rows, rows);
        want = Add(want, Matmul(xb, gb, true, false));
      }
    }
    EXPECT_TENSOR_NEAR((*got)[0], want, 1e-12);
  }
}

// The attention is causal: changing the last token of a sequence leaves earlier outputs alone.
TEST(GptLayersTest, AttentionIsCausal) {
  SingleRankContext one{Mesh()};
  Tensor x = Rand({kRows, kD}, 21);
  CausalSelfAttention attn{Value::Replicated(Rand({kD, 3, kD}, 22)),
                           Value::Replicated(Rand({3, kD}, 23)),
                           RowParallelLinear{Value::Replicated(Rand({kD, kD}, 24)),
                                             Value::Replicated(Rand({kD}, 25)), {}},
                           kD / kHeads, kSeq, {}};
  Tensor y0 = attn(Value::Replicated(x)).tensor;
  Tensor x2 = x.Clone();
  for (int64_t j = 0; j < kD; ++j) x2.data<double>()[(kSeq - 1) * kD + j] += 1.0;  // row 2
  Tensor y1 = attn(Value::Replicated(x2)).tensor;
  for (int64_t r = 0; r < kRows; ++r) {
    double diff = 0;
    for (int64_t j = 0; j < kD; ++j) diff += std::fabs(y0.at(r * kD + j) - y1.at(r * kD + j));
    if (r < kSeq - 1 || r >= kSeq) {
      EXPECT_EQ(diff, 0.0) << "row " << r;
    } else {
      EXPECT_GT(diff, 0.0) << "row " << r;
    }
  }
}

TEST(GptLayersTest, BlockWithLayerNormsAndResiduals) {
  std::vector<Tensor> in = {Rand({kRows, kD}, 31), Rand({kD}, 32), Rand({kD}, 33),
                            Rand({kD, 3, kD}, 34), Rand({3, kD}, 35),  Rand({kD, kD}, 36),
                            Rand({kD}, 37),        Rand({kD}, 38),     Rand({kD}, 39),
                            Rand({kD, 4 * kD}, 40), Rand({4 * kD}, 41), Rand({4 * kD, kD}, 42),
                            Rand({kD}, 43)};
  LayerLoss fn = [](const std::vector<Value>& p, const TensorParallel& tp) {
    Block block{LayerNorm{p[1], p[2]},
                CausalSelfAttention{p[3], p[4], RowParallelLinear{p[5], p[6], tp}, kD / kHeads,
                                    kSeq, tp},
                LayerNorm{p[7], p[8]},
                Mlp{ColumnParallelLinear{p[9], p[10], tp}, RowParallelLinear{p[11], p[12], tp}}};
    return SumSquares(block(p[0]), tp);
  };
  for (int tp : {1, 2, 3}) {
    for (bool sp : {false, true}) {
      ExpectShardedMatchesUnsharded(fn, in,
                                    {sp ? P("tp") : P(), P(), P(), P(None, None, "tp"),
                                     P(None, "tp"), P("tp", None), P(), P(), P(), P(None, "tp"),
                                     P("tp"), P("tp", None), P()},
                                    tp, sp);
    }
  }
}

TEST(GptLayersTest, VocabParallelEmbeddingTiedHeadAndCrossEntropy) {
  std::vector<int64_t> ids, targets;
  for (int64_t i = 0; i < kRows; ++i) {
    ids.push_back((i * 5 + 1) % kVocab);
    targets.push_back((i * 7 + 3) % kVocab);
  }
  std::vector<Tensor> in = {Rand({kVocab, kD}, 51), Tensor::FromVector<int64_t>({kRows}, ids),
                            Tensor::FromVector<int64_t>({kRows}, targets)};
  LayerLoss fn = [](const std::vector<Value>& p, const TensorParallel& tp) {
    Value x = VocabParallelEmbedding{p[0], tp}(p[1]);        // SP: S0 on tp
    Value h = EnterTensorParallel(tanh(x), tp);              // all rows again
    Value logits = einsum("nd,vd->nv", h, p[0]);             // tied head: S1 on tp
    return sum(VocabParallelCrossEntropy(logits, p[2], tp), {}) / static_cast<double>(kRows);
  };
  for (int tp : {1, 2, 3}) {
    for (bool sp : {false, true}) {
      // The loss is R on tp in both cases (the rows are whole again before the head).
      SCOPED_TRACE(sp ? "sp" : "no sp");
      Mesh mesh = *Mesh::Create({{"tp", tp}});
      TensorParallel par{"tp", sp};
      ShardFn f = [&](const std::vector<Value>& p) -> std::vector<Value> { return {fn(p, par)}; };
      absl::StatusOr<ShardMapGrads> got =
          value_and_grad(shard_map(f, mesh, {P("tp", None), P(), P()}, {P()}))(in);
      ASSERT_TRUE(got.ok()) << got.status();
      SingleRankContext one{Mesh()};
      std::vector<Value> params;
      for (const Tensor& t : in) params.push_back(Value::Replicated(t));
      ValueAndGrad ref = value_and_grad(
          [&](const std::vector<Value>& p) { return fn(p, {}); }, params);
      EXPECT_TENSOR_NEAR(got->outputs[0], ref.value.tensor, 1e-12);
      EXPECT_TENSOR_NEAR(got->grads[0], ref.grads[0].tensor, 1e-10);
    }
  }
}

}  // namespace
}  // namespace shardmap
