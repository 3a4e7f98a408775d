// Ring attention over cp = 1, 2, 3, 4 (and cp2 x tp3) against unsharded causal attention in f64:
// outputs against naive loops, gradients of q, k, v against the autograd of the plain einsum +
// causal_mask + softmax attention (itself checked by finite differences), to 1e-12. Also: the
// blocks computed per device (nothing above the diagonal, the same work on every device), the
// ring of ppermutes forward and backward, the load-balanced layout, and the errors.
#include "models/parallel/ring_attention.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/spmd_runner.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using testing::Rand;

constexpr int64_t kBatch = 2, kHeads = 3, kHeadDim = 5, kChunk = 3;  // odd sizes
constexpr double kScale = 0.37;

// softmax(causal(q k^T * scale)) v with loops, q, k, v [b, t, h, hd].
Tensor NaiveCausalAttention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t b = q.dim(0), t = q.dim(1), h = q.dim(2), d = q.dim(3);
  Tensor o = Tensor::Zeros(q.shape(), DType::kF64);
  auto at = [&](const Tensor& x, int64_t i, int64_t s, int64_t j, int64_t e) {
    return x.data<double>()[((i * t + s) * h + j) * d + e];
  };
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < h; ++j) {
      for (int64_t s = 0; s < t; ++s) {
        std::vector<double> w(s + 1);
        double m = -INFINITY, z = 0;
        for (int64_t r = 0; r <= s; ++r) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += at(q, i, s, j, e) * at(k, i, r, j, e);
          w[r] = dot * kScale;
          m = std::max(m, w[r]);
        }
        for (double& x : w) z += (x = std::exp(x - m));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t r = 0; r <= s; ++r) acc += w[r] * at(v, i, r, j, e);
          o.data<double>()[((i * t + s) * h + j) * d + e] = acc / z;
        }
      }
    }
  }
  return o;
}

// The plain one-device attention (what CausalSelfAttention computes without cp).
Value PlainCausalAttention(const Value& q, const Value& k, const Value& v) {
  Value p = softmax(causal_mask(einsum("bqhd,bkhd->bhqk", q, k) * kScale), -1);
  return einsum("bhqk,bkhd->bqhd", p, v);
}

// Loss: sum(o * w), so every output element gets its own cotangent.
Value WeightedSum(const Value& o, const Value& w) { return sum_partial(o * w, {}); }

// The loss sum(plain(q, k, v) * w) and its gradients on one device; in = {q, k, v, w}.
ValueAndGrad PlainReference(const std::vector<Tensor>& in) {
  std::vector<Value> params;
  for (const Tensor& t : in) params.push_back(Value::Replicated(t));
  return value_and_grad(
      [](const std::vector<Value>& p) {
        return WeightedSum(PlainCausalAttention(p[0], p[1], p[2]), p[3]);
      },
      params);
}

// The ring on a cp x tp mesh (the sequence dim in the load-balanced order, split over cp; heads
// over tp) against the one-device output `naive` and the loss and gradients `ref`;
// global = {q, k, v, w}.
void ExpectRingMatches(const std::vector<Tensor>& global, int cp, int tp, const Tensor& naive,
                       const ValueAndGrad& ref) {
  std::vector<Tensor> in;
  for (const Tensor& t : global) in.push_back(ToLoadBalancedOrder(t, 1, cp));
  Mesh mesh = *Mesh::Create({{"cp", cp}, {"tp", tp}});
  const PartitionSpec spec = P(None, "cp", "tp");
  ShardFn f = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value o = RingCausalAttention(p[0], p[1], p[2], "cp", kScale);
    return {WeightedSum(o, p[3]), o};
  };
  absl::StatusOr<ShardMapGrads> got = value_and_grad(shard_map(
      f, mesh, {spec, spec, spec, spec}, {P().Unreduced({"cp", "tp"}), spec}))(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TENSOR_NEAR(ToLoadBalancedOrder(got->outputs[1], 1, cp, /*inverse=*/true), naive, 1e-12);
  EXPECT_NEAR(got->outputs[0].item(), ref.value.item(), 1e-12 * std::fabs(ref.value.item()));
  for (int k = 0; k < 4; ++k) {
    EXPECT_TENSOR_NEAR(ToLoadBalancedOrder(got->grads[k], 1, cp, true), ref.grads[k].tensor,
                       1e-12)
        << "input " << k;
  }
}

struct RingCase {
  int cp, tp;
};

class RingAttentionTest : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttentionTest, MatchesUnshardedCausalAttentionAndGradients) {
  const int cp = GetParam().cp, tp = GetParam().tp;
  const int64_t seq = 2 * cp * kChunk;
  const std::vector<int64_t> shape = {kBatch, seq, kHeads, kHeadDim};
  const std::vector<Tensor> global = {Rand(shape, 1), Rand(shape, 2), Rand(shape, 3),
                                      Rand(shape, 4)};
  // Unsharded reference.
  SingleRankContext one{Mesh()};
  ValueAndGrad ref = PlainReference(global);
  const Tensor naive = NaiveCausalAttention(global[0], global[1], global[2]);
  EXPECT_TENSOR_NEAR(PlainCausalAttention(Value::Replicated(global[0]),
                                          Value::Replicated(global[1]),
                                          Value::Replicated(global[2]))
                         .tensor,
                     naive, 1e-13);

  ExpectRingMatches(global, cp, tp, naive, ref);
}

INSTANTIATE_TEST_SUITE_P(Meshes, RingAttentionTest,
                         ::testing::Values(RingCase{1, 1}, RingCase{2, 1}, RingCase{3, 1},
                                           RingCase{4, 1}, RingCase{2, 3}),
                         [](const ::testing::TestParamInfo<RingCase>& info) {
                           return absl::StrCat("cp", info.param.cp, "_tp", info.param.tp);
                         });

// Grouped-query attention (Llama 3): kv heads repeated to the query heads with loops, [b, t,
// kv, hd] -> [b, t, kv * rep, hd], query head g * rep + r reading kv head g (HF's repeat_kv).
Tensor RepeatKvLoops(const Tensor& x, int64_t rep) {
  const int64_t b = x.dim(0), t = x.dim(1), g = x.dim(2), d = x.dim(3);
  Tensor out = Tensor::Zeros({b, t, g * rep, d}, DType::kF64);
  for (int64_t i = 0; i < b * t; ++i) {
    for (int64_t j = 0; j < g * rep; ++j) {
      for (int64_t e = 0; e < d; ++e) {
        out.data<double>()[(i * g * rep + j) * d + e] = x.data<double>()[(i * g + j / rep) * d + e];
      }
    }
  }
  return out;
}

// The repeat on the tape (broadcast_to: its VJP sums each group's cotangents).
Value RepeatKvOnTape(const Value& x, int64_t rep) {
  const int64_t b = x.dim(0), t = x.dim(1), g = x.dim(2), d = x.dim(3);
  return broadcast_to(x.reshape({b, t, g, 1, d}), {b, t, g, rep, d}).reshape({b, t, g * rep, d});
}

// The loss sum(plain(q, repeat(k), repeat(v)) * w) and its gradients on one device (for k and
// v: of the un-repeated kv heads); in = {q, k, v, w}.
ValueAndGrad RepeatedKvReference(const std::vector<Tensor>& in, int64_t rep) {
  std::vector<Value> params;
  for (const Tensor& t : in) params.push_back(Value::Replicated(t));
  return value_and_grad(
      [rep](const std::vector<Value>& p) {
        return WeightedSum(PlainCausalAttention(p[0], RepeatKvOnTape(p[1], rep),
                                                RepeatKvOnTape(p[2], rep)),
                           p[3]);
      },
      params);
}

// Inputs first..last of `g` (every stride-th element) against central differences of `loss`.
void ExpectGradsMatchFiniteDifferences(
    const ValueAndGrad& g, const std::vector<Tensor>& t,
    const std::function<double(const std::vector<Tensor>&)>& loss, int first, int last,
    int64_t stride) {
  for (int k = first; k <= last; ++k) {
    for (int64_t e = 0; e < t[k].numel(); e += stride) {
      std::vector<Tensor> plus = t, minus = t;
      plus[k] = t[k].Clone();
      minus[k] = t[k].Clone();
      const double h = 1e-6;
      plus[k].data<double>()[e] += h;
      minus[k].data<double>()[e] -= h;
      const double fd = (loss(plus) - loss(minus)) / (2 * h);
      EXPECT_NEAR(g.grads[k].tensor.at(e), fd, 1e-8) << "input " << k << " element " << e;
    }
  }
}

struct GqaCase {
  int cp, tp;
  int64_t chunk, batch;
};

class RingGqaTest : public ::testing::TestWithParam<GqaCase> {};

// 6 query heads over 2 kv heads: the ring passes k, v with 2 heads and groups the queries.
TEST_P(RingGqaTest, MatchesUnshardedRepeatedKvAttentionAndGradients) {
  const int cp = GetParam().cp, tp = GetParam().tp;
  constexpr int64_t kQHeads = 6, kKvHeads = 2, kRep = kQHeads / kKvHeads;
  const int64_t seq = 2 * cp * GetParam().chunk;
  const int64_t batch = GetParam().batch;
  const std::vector<int64_t> qshape = {batch, seq, kQHeads, kHeadDim};
  const std::vector<int64_t> kvshape = {batch, seq, kKvHeads, kHeadDim};
  const std::vector<Tensor> global = {Rand(qshape, 21), Rand(kvshape, 22), Rand(kvshape, 23),
                                      Rand(qshape, 24)};
  SingleRankContext one{Mesh()};
  ValueAndGrad ref = RepeatedKvReference(global, kRep);
  const Tensor naive = NaiveCausalAttention(global[0], RepeatKvLoops(global[1], kRep),
                                            RepeatKvLoops(global[2], kRep));
  // The kv heads' gradients, summed over each group.
  const auto& kv_grad_shape = ref.grads[1].tensor.shape();
  ASSERT_EQ(std::vector<int64_t>(kv_grad_shape.begin(), kv_grad_shape.end()), kvshape);
  double naive_loss = 0;
  for (int64_t e = 0; e < naive.numel(); ++e) naive_loss += naive.at(e) * global[3].at(e);
  EXPECT_NEAR(ref.value.item(), naive_loss, 1e-12 * std::fabs(naive_loss));

  ExpectRingMatches(global, cp, tp, naive, ref);
}

INSTANTIATE_TEST_SUITE_P(Meshes, RingGqaTest,
                         ::testing::Values(GqaCase{1, 1, 3, 2}, GqaCase{2, 1, 3, 2},
                                           GqaCase{3, 1, 3, 2}, GqaCase{3, 1, 1, 2},
                                           GqaCase{2, 2, 3, 2}, GqaCase{3, 2, 1, 1}),
                         [](const ::testing::TestParamInfo<GqaCase>& info) {
                           return absl::StrCat("cp", info.param.cp, "_tp", info.param.tp,
                                               "_chunk", info.param.chunk, "_batch",
                                               info.param.batch);
                         });

// The repeated-kv reference's gradients (k, v summed over each group) against central
// differences.
TEST(RingAttentionReferenceTest, RepeatedKvGradientMatchesFiniteDifferences) {
  SingleRankContext one{Mesh()};
  std::vector<Tensor> t = {Rand({1, 4, 4, 3}, 25), Rand({1, 4, 2, 3}, 26),
                           Rand({1, 4, 2, 3}, 27), Rand({1, 4, 4, 3}, 28)};
  auto loss = [&](const std::vector<Tensor>& x) {
    return WeightedSum(PlainCausalAttention(Value::Replicated(x[0]),
                                            Value::Replicated(RepeatKvLoops(x[1], 2)),
                                            Value::Replicated(RepeatKvLoops(x[2], 2))),
                       Value::Replicated(x[3]))
        .item();
  };
  ExpectGradsMatchFiniteDifferences(RepeatedKvReference(t, 2), t, loss, /*first=*/1,
                                    /*last=*/2, /*stride=*/2);
}

// The reference's gradient against central differences (so the comparison above is anchored).
TEST(RingAttentionReferenceTest, PlainAttentionGradientMatchesFiniteDifferences) {
  SingleRankContext one{Mesh()};
  const std::vector<int64_t> shape = {1, 4, 2, 3};
  std::vector<Tensor> t = {Rand(shape, 5), Rand(shape, 6), Rand(shape, 7), Rand(shape, 8)};
  auto loss = [&](const std::vector<Tensor>& x) {
    return WeightedSum(PlainCausalAttention(Value::Replicated(x[0]), Value::Replicated(x[1]),
                                            Value::Replicated(x[2])),
                       Value::Replicated(x[3]))
        .item();
  };
  ExpectGradsMatchFiniteDifferences(PlainReference(t), t, loss, /*first=*/0, /*last=*/2,
                                    /*stride=*/5);
}

// Counts the score elements each device computes (the recorded exp ops: one per score block)
// and the ring's ppermutes, forward and backward.
class CountingRecorder : public TapeRecorder {
 public:
  explicit CountingRecorder(Tape* tape) : tape_(tape) {}
  void Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
              VjpFn vjp) override {
    if (std::string(op) == "exp") exp_elements += out.tensor.numel();
    tape_->Record(op, inputs, out, std::move(vjp));
  }
  int64_t exp_elements = 0;

 private:
  Tape* tape_;
};

// With grouped kv heads (kv_heads 1 of 3 heads) the ring carries the kv heads, not repeats.
TEST(RingAttentionWorkTest, SkipsBlocksAboveTheDiagonalAndBalancesTheDevices) {
  for (int64_t kv_heads : {kHeads, int64_t{1}}) {
    for (int cp : {1, 2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat("cp=", cp, " kv_heads=", kv_heads));
      const int64_t seq = 2 * cp * kChunk, local = seq / cp;
      Mesh mesh = *Mesh::Create({{"cp", cp}});
      std::vector<int64_t> elements(cp);
      std::vector<std::vector<std::string>> logs(cp);
      absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
        SpmdType type(1, AxisType::Sharded(1));
        type.set_mesh_id(mesh.id());
        Tape tape;
        std::vector<Value> x;
        for (uint64_t seed : {11, 12, 13}) {
          const int64_t heads = seed == 11 ? kHeads : kv_heads;  // q, then k and v
          x.push_back(tape.Watch(Value(Rand({kBatch, local, heads, kHeadDim}, seed + ctx.rank()),
                                       type)));
        }
        CountingRecorder rec(&tape);
        Value loss;
        {
          ScopedRecorder scope(&rec);
          loss = sum_partial(RingCausalAttention(x[0], x[1], x[2], "cp", kScale), {});
        }
        tape.Backward(loss, LossSeed(loss), x);
        elements[ctx.rank()] = rec.exp_elements;
        for (const CollectiveRecord& r : ctx.collective_log()) {
          logs[ctx.rank()].push_back(absl::StrCat(r.op, r.backward ? " bwd " : " fwd ", r.bytes));
        }
      });
      ASSERT_TRUE(s.ok()) << s;
      // Causal work: 2cp diagonal blocks and (2cp choose 2) full ones of c x c, split evenly.
      const int64_t per_device = kBatch * kHeads * kChunk * kChunk * (2 * cp + 1);
      const int64_t kv_bytes = kBatch * local * 2 * kv_heads * kHeadDim * 8;
      std::vector<std::string> ring;
      for (int step = 1; step < cp; ++step) ring.push_back(absl::StrCat("ppermute fwd ", kv_bytes));
      for (int step = 1; step < cp; ++step) ring.push_back(absl::StrCat("ppermute bwd ", kv_bytes));
      for (int r = 0; r < cp; ++r) {
        EXPECT_EQ(elements[r], per_device) << "rank " << r;
        EXPECT_EQ(logs[r], ring) << "rank " << r;
      }
      EXPECT_EQ(cp * per_device, kBatch * kHeads * (seq * seq / 2 + seq * kChunk / 2));
    }
  }
}

TEST(LoadBalancedLayoutTest, DeviceIHoldsChunksIAnd2cpMinus1MinusI) {
  // seq 8 over cp 2: chunks of 2; device 0 holds chunks 0 and 3, device 1 chunks 1 and 2.
  EXPECT_EQ(LoadBalancedPosition(0, 8, 2, 0), 0);
  EXPECT_EQ(LoadBalancedPosition(2, 8, 2, 0), 6);
  EXPECT_EQ(LoadBalancedPosition(3, 8, 2, 1), 5);
  std::vector<int64_t> ids(2 * 8);
  for (int64_t i = 0; i < 16; ++i) ids[i] = i;
  Tensor tokens = Tensor::FromVector<int64_t>({2, 8}, ids);
  // Two batch ways x cp 2: device (w, i) holds sequence w's chunks i and 3-i.
  std::vector<int64_t> want = {0, 1, 6, 7, 2, 3, 4, 5, 8, 9, 14, 15, 10, 11, 12, 13};
  EXPECT_TENSOR_NEAR(LoadBalancedRows(tokens, 2, 2), Tensor::FromVector<int64_t>({16}, want), 0);
  // One batch way: the cp block holds both sequences' chunks, sequence-major.
  want = {0, 1, 6, 7, 8, 9, 14, 15, 2, 3, 4, 5, 10, 11, 12, 13};
  EXPECT_TENSOR_NEAR(LoadBalancedRows(tokens, 1, 2), Tensor::FromVector<int64_t>({16}, want), 0);
  Tensor x = Rand({3, 12, 2}, 9);
  EXPECT_TENSOR_NEAR(ToLoadBalancedOrder(ToLoadBalancedOrder(x, 1, 3), 1, 3, true), x, 0);
}

TEST(RingAttentionErrorsTest, BadShapesAndSequenceLengthsAreClearErrors) {
  auto message = [](const std::function<void()>& fn) {
    return std::string(CatchOpError(fn).message());
  };
  EXPECT_THAT(message([] { LoadBalancedRows(Tensor::Zeros({2, 6}, DType::kI64), 1, 2); }),
              HasSubstr("seq 6 is not divisible by 2*cp = 4"));
  SingleRankContext one{Mesh()};
  Value odd = Value::Replicated(Rand({1, 3, 1, 2}, 1));
  Value even = Value::Replicated(Rand({1, 4, 1, 2}, 1));
  EXPECT_THAT(message([&] { RingCausalAttention(odd, odd, odd, "", 1); }),
              HasSubstr("t = 3 is odd"));
  EXPECT_THAT(message([&] { RingCausalAttention(even, odd, odd, "", 1); }),
              HasSubstr("kv_heads dividing heads"));
  Value three_heads = Value::Replicated(Rand({1, 4, 3, 2}, 1));
  Value two_heads = Value::Replicated(Rand({1, 4, 2, 2}, 1));
  EXPECT_THAT(message([&] { RingCausalAttention(three_heads, two_heads, two_heads, "", 1); }),
              HasSubstr("kv_heads dividing heads"));
  EXPECT_THAT(message([&] { RingCausalAttention(three_heads, two_heads, even, "", 1); }),
              HasSubstr("kv_heads dividing heads"));
  EXPECT_THAT(message([&] { RingCausalAttention(even, even, even, "cp", 1); }),
              HasSubstr("has no axis 'cp'"));
}

}  // namespace
}  // namespace shardmap
