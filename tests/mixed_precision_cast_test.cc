// The typed cast (shardmap/ops.h) that mixed precision rests on: it keeps every axis's SPMD type
// (R, I, V/S(d), P), its VJP casts the cotangent back to the source dtype (so gradients of f32
// master weights used in bf16 arrive in f32, typed with the dual type), and the gradient through
// an f64 -> f32 -> f64 round trip matches the analytic gradient in f64, also through shard_map on
// (dp=2, tp=3) with a cast of a pending sum (P) before its all_reduce.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

TEST(CastTypeTest, KeepsEveryAxisTypeAndChangesOnlyTheDType) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Tensor t = Rand({4, 6}, 1, DType::kF32);
    SpmdType s0s1(2);
    s0s1[0] = AxisType::Sharded(0);
    s0s1[1] = AxisType::Sharded(1);
    SpmdType pv(2);
    pv[0] = AxisType::P();
    pv[1] = AxisType::V();
    SpmdType ri(2);
    ri[0] = AxisType::R();
    ri[1] = AxisType::I();
    for (const SpmdType& ty : {SpmdType(2), SpmdType(2, AxisType::I()), s0s1, pv, ri}) {
      for (DType to : {DType::kBF16, DType::kF16, DType::kF64, DType::kF32}) {
        Value x(t, ty);
        Value y = cast(x, to);
        EXPECT_EQ(y.type, ty) << y.ToString();
        EXPECT_EQ(y.dtype(), to);
        EXPECT_EQ(y.shape(), x.shape());
      }
    }
    // Linear: a cast of a P value stays P, so a nonlinear op after it is still an error.
    Value p(t, pv);
    EXPECT_THROW(gelu(cast(p, DType::kBF16)), OpError);
    // And all_reduce accepts it: a bf16 pending sum resolved in bf16.
    Value pp(t, SpmdType(2, AxisType::P()));
    Value r = all_reduce(cast(pp, DType::kBF16), {"dp", "tp"});
    EXPECT_EQ(r.dtype(), DType::kBF16);
    EXPECT_EQ(r.type, SpmdType(2));
    (void)ctx;
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(CastTypeTest, GradientComesBackInTheSourceDTypeWithTheDualType) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    // w: an f32 master weight, R on dp, S1 on tp; used in bf16.
    SpmdType wt(2);
    wt[1] = AxisType::Sharded(1);
    Value w(Rand({4, 2}, 2 + ctx.coord(1), DType::kF32), wt);
    SpmdType xt(2);
    xt[0] = AxisType::Sharded(0);
    Value x = cast(Value(Rand({3, 4}, 7 + ctx.coord(0), DType::kF32), xt), DType::kBF16);
    ValueAndGrad g = value_and_grad(
        [&](const std::vector<Value>& p) {
          Value h = x.matmul(cast(p[0], DType::kBF16));          // bf16{dp:S0,tp:S1}
          EXPECT_EQ(h.dtype(), DType::kBF16);
          return sum_partial(cast(h * h, DType::kF32), {});       // f32{dp:P,tp:P}
        },
        {w});
    EXPECT_EQ(g.value.dtype(), DType::kF32);
    EXPECT_EQ(g.grads[0].dtype(), DType::kF32);
    EXPECT_EQ(g.grads[0].type[0].kind, AxisKind::kP);       // dual of R
    EXPECT_TRUE(g.grads[0].type[1].is_sharded());           // dual of S1
    EXPECT_EQ(g.grads[0].type[1].dim, 1);
    // The value: 2 x^T (x w) computed from the bf16 cotangent, upcast exactly.
    for (int64_t i = 0; i < g.grads[0].numel(); ++i) {
      float v = static_cast<float>(g.grads[0].tensor.at(i));
      EXPECT_EQ(static_cast<double>(BF16ToFloat(FloatToBF16(v))), g.grads[0].tensor.at(i))
          << "an f32 gradient upcast from bf16 holds bf16 values exactly";
    }
  });
  ASSERT_TRUE(s.ok()) << s;
}

// f(x) = sum(tanh(f64(f32(x))) * c): the gradient (rounded to f32 by the cast's VJP) against the
// analytic derivative in f64.
TEST(CastGradCheckTest, F64ToF32ToF64MatchesTheAnalyticGradient) {
  SingleRankContext one{Mesh()};
  Tensor x = Rand({3, 5}, 11), c = Rand({3, 5}, 12);
  auto f = [&](const std::vector<Value>& p) {
    Value y = cast(cast(p[0], DType::kF32), DType::kF64);
    EXPECT_EQ(y.dtype(), DType::kF64);
    return sum(tanh(y) * Value::Replicated(c), {});
  };
  ValueAndGrad g = value_and_grad(f, {Value::Replicated(x)});
  ASSERT_EQ(g.grads[0].dtype(), DType::kF64);
  // Analytic: (1 - tanh(r(x))^2) * c with r the rounding to f32, then rounded to f32 by the
  // VJP of the f32 -> f64 cast. Computed in f64, so only that last rounding may differ (1 ulp).
  std::vector<double> want(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double t = std::tanh(static_cast<double>(static_cast<float>(x.at(i))));
    want[i] = static_cast<float>((1 - t * t) * c.at(i));
  }
  EXPECT_TENSOR_NEAR(g.grads[0].tensor, Tensor::FromVector<double>(x.shape(), want), 1e-7);
}

// The same through shard_map on (dp=2, tp=3): x S0 on dp, w1 S1 and w2 S0 on tp. The row-parallel
// partial sum is cast to f32 while still P, all-reduced in f32, and cast back: each cast's VJP
// must keep the types (the cotangent all_reduce runs in f32 too).
TEST(CastGradCheckTest, ShardedRoundTripThroughAPartialSumMatchesTheAnalyticGradient) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::vector<Tensor> in = {Rand({4, 5}, 21), Rand({5, 6}, 22), Rand({6, 5}, 23),
                            Rand({4, 5}, 24)};
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value a = tanh(cast(cast(p[0], DType::kF32), DType::kF64).matmul(p[1]));
    Value yp = cast(a.matmul(p[2]), DType::kF32);                  // f32{dp:S0,tp:P}
    EXPECT_EQ(yp.type[1].kind, AxisKind::kP);
    Value y = cast(all_reduce(yp, "tp"), DType::kF64);             // f64{dp:S0,tp:R}
    return {sum_partial(tanh(y) * p[3], {})};
  };
  std::vector<CollectiveRecord> log;
  ShardMapOptions opts;
  opts.collective_log = &log;
  ShardMap f = shard_map(fn, mesh, {P("dp", None), P(None, "tp"), P("tp", None), P("dp", None)},
                         {P().Unreduced({"dp"})}, opts);
  absl::StatusOr<ShardMapGrads> g = value_and_grad(f)(in);
  ASSERT_TRUE(g.ok()) << g.status();
  // Forward and backward all_reduce over tp, both on f32 payloads (4 bytes per element).
  ASSERT_EQ(log.size(), 2u);
  for (const CollectiveRecord& r : log) EXPECT_EQ(r.bytes, 2 * 5 * 4);
  // Analytic gradients of L = sum(tanh(Y) * C), Y = tanh(r(X) W1) W2, unsharded in f64 (r:
  // rounding to f32). The program also rounds Y's partial sums and the cotangents crossing the
  // casts to f32 (~6e-8 relative each), which bounds the difference.
  const Tensor x0 = Cast(Cast(in[0], DType::kF32), DType::kF64);
  const Tensor a = Tanh(Matmul(x0, in[1]));
  const Tensor t = Tanh(Matmul(a, in[2]));
  auto one_minus_sq = [](const Tensor& u) { return AddScalar(MulScalar(Mul(u, u), -1.0), 1.0); };
  const Tensor dy = Mul(one_minus_sq(t), in[3]);
  const Tensor dh = Mul(Matmul(dy, in[2], false, true), one_minus_sq(a));
  const Tensor want[3] = {Matmul(dh, in[1], false, true), Matmul(x0, dh, true, false),
                          Matmul(a, dy, true, false)};
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(absl::StrCat("input ", k));
    ASSERT_EQ(g->grads[k].dtype(), DType::kF64);
    EXPECT_TENSOR_NEAR(g->grads[k], want[k], 2e-7);  // seen <= 6.2e-8
  }
}

}  // namespace
}  // namespace shardmap
