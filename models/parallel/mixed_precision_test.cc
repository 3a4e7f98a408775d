// PrecisionPolicy presets, AllFinite, LossScaler (static and dynamic: skip, back-off, growth,
// bounds), and the per-device helpers: ToCompute/ToLoss/CastTo, ReduceActivation in its own
// dtype, ReduceGradient over exactly the P axes in f32 (and ReduceScatterGradient).
#include "models/parallel/mixed_precision.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

TEST(PrecisionPolicyTest, Presets) {
  PrecisionPolicy f = PrecisionPolicy::Fp32(), b = PrecisionPolicy::Bf16Mixed(),
                  h = PrecisionPolicy::Fp16Mixed();
  EXPECT_EQ(f.compute, DType::kF32);
  EXPECT_EQ(b.compute, DType::kBF16);
  EXPECT_EQ(b.activation_reduce, DType::kBF16);
  EXPECT_EQ(h.compute, DType::kF16);
  for (const PrecisionPolicy& p : {f, b, h}) {
    EXPECT_EQ(p.param, DType::kF32);
    EXPECT_EQ(p.reduce, DType::kF32);
    EXPECT_EQ(p.loss, DType::kF32);
  }
  EXPECT_EQ(b.ToString(),
            "param f32, compute bf16, activation reduce bf16, grad reduce f32, loss f32");
  PrecisionPolicy got;
  ASSERT_TRUE(PrecisionPolicy::FromName("fp16", &got));
  EXPECT_EQ(got.compute, DType::kF16);
  ASSERT_TRUE(PrecisionPolicy::FromName("f32", &got));
  EXPECT_EQ(got.compute, DType::kF32);
  EXPECT_FALSE(PrecisionPolicy::FromName("int8", &got));
}

TEST(AllFiniteTest, DetectsInfAndNaNInEveryDType) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    EXPECT_TRUE(AllFinite(Tensor::FromVector<float>({3}, {1, -2e4f, 3}, dt)));
    EXPECT_FALSE(AllFinite(Tensor::FromVector<float>({3}, {1, inf, 3}, dt)));
    EXPECT_FALSE(AllFinite(Tensor::FromVector<float>({3}, {1, -inf, 3}, dt)));
    EXPECT_FALSE(AllFinite(Tensor::FromVector<float>({3}, {nan, 2, 3}, dt)));
  }
  // Large finite values whose sum would overflow are still finite.
  EXPECT_TRUE(AllFinite(Tensor::Full({4}, 3e38, DType::kF32)));
  EXPECT_FALSE(AllFinite(Tensor::FromVector<double>({2}, {1, std::nan("")})));
  EXPECT_TRUE(AllFinite(Tensor()));
}

std::vector<NamedTensor> Grads(float v) {
  return {{"w", Tensor::FromVector<float>({2}, {v, 2 * v})}, {"b", Tensor::Full({1}, 4.0)}};
}

TEST(LossScalerTest, DynamicSkipsBacksOffAndGrows) {
  LossScaler s({.init_scale = 8, .growth_interval = 2});
  std::vector<NamedTensor> g = Grads(16);
  EXPECT_TRUE(s.UnscaleAndCheck(g));  // good 1
  EXPECT_EQ(g[0].tensor.at(0), 2);    // unscaled: 16 / 8
  EXPECT_EQ(g[0].tensor.at(1), 4);
  EXPECT_EQ(g[1].tensor.at(0), 0.5);
  EXPECT_EQ(s.scale(), 8);
  g = Grads(16);
  EXPECT_TRUE(s.UnscaleAndCheck(g));  // good 2: grows
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.good_steps(), 0);

  g = Grads(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(s.UnscaleAndCheck(g));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(s.skipped_steps(), 1);
  g = Grads(std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(s.UnscaleAndCheck(g));
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.skipped_steps(), 2);
  // A skip resets the run of good steps.
  g = Grads(1);
  EXPECT_TRUE(s.UnscaleAndCheck(g));
  EXPECT_EQ(s.good_steps(), 1);
  EXPECT_EQ(s.scale(), 4);
}

TEST(LossScalerTest, ScaleStaysWithinBounds) {
  LossScaler s({.init_scale = 2, .growth_interval = 1, .min_scale = 1, .max_scale = 4});
  for (int i = 0; i < 5; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 4);
  for (int i = 0; i < 5; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 1);
}

TEST(LossScalerTest, StaticScaleSkipsButNeverChanges) {
  LossScaler s = LossScaler::Static(128);
  std::vector<NamedTensor> g = Grads(256);
  EXPECT_TRUE(s.UnscaleAndCheck(g));
  EXPECT_EQ(g[0].tensor.at(0), 2);
  g = Grads(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(s.UnscaleAndCheck(g));
  for (int i = 0; i < 3000; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(MixedHelpersTest, CastsAndReductionsUseThePolicyDTypes) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  PrecisionPolicy pol = PrecisionPolicy::Bf16Mixed();
  absl::Status st = RunSpmd(mesh, [&](RankContext& ctx) {
    const float base = static_cast<float>(ctx.rank());
    // A master weight: R on dp, S1 on tp.
    SpmdType wt(2);
    wt[1] = AxisType::Sharded(1);
    Value w(Tensor::Full({4, 2}, 0.5 + base, DType::kF32), wt);
    EXPECT_TRUE(CastTo(w, DType::kF32).tensor.SharesStorageWith(w.tensor)) << "no-op cast";
    Value wc = ToCompute(w, pol);
    EXPECT_EQ(wc.dtype(), DType::kBF16);
    EXPECT_EQ(wc.type, wt);
    EXPECT_EQ(ToLoss(wc, pol).dtype(), DType::kF32);

    // An activation partial sum (P on tp) in bf16: reduced in bf16, 2 bytes per element.
    SpmdType pt(2);
    pt[1] = AxisType::P();
    Value yp(Tensor::Full({3, 4}, 1.0 + base, DType::kBF16), pt);
    ctx.ClearCollectiveLog();
    Value y = ReduceActivation(yp, "tp", pol);
    EXPECT_EQ(y.dtype(), DType::kBF16);
    EXPECT_EQ(y.type[1].kind, AxisKind::kR);
    ASSERT_EQ(ctx.collective_log().size(), 1u);
    EXPECT_EQ(ctx.collective_log()[0].bytes, 3 * 4 * 2);
    PrecisionPolicy f32act = pol;
    f32act.activation_reduce = DType::kF32;
    ctx.ClearCollectiveLog();
    Value y32 = ReduceActivation(yp, "tp", f32act);
    EXPECT_EQ(y32.dtype(), DType::kBF16) << "back in the activation's dtype";
    EXPECT_EQ(ctx.collective_log()[0].bytes, 3 * 4 * 4);
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.tensor.at(i), y32.tensor.at(i));

    // Gradients of parameters R on dp (S1 on tp), R everywhere, and S0 on dp: reduced over
    // exactly the parameter's R axes, in f32.
    SpmdType g1(2);
    g1[0] = AxisType::P();
    g1[1] = AxisType::Sharded(1);
    SpmdType p3(2);
    p3[0] = AxisType::Sharded(0);
    p3[1] = AxisType::I();
    std::vector<Value> params = {Value(Tensor::Zeros({4, 2}), wt), Value(Tensor::Zeros({5}),
                                 SpmdType(2)), Value(Tensor::Zeros({2}), p3)};
    ctx.ClearCollectiveLog();
    std::vector<Value> r = ReduceGradients(
        {Value(Tensor::Full({4, 2}, 1.0, DType::kBF16), g1),
         Value(Tensor::Full({5}, 1.0, DType::kF32), SpmdType(2, AxisType::P())),
         Value(Tensor::Full({2}, 1.0, DType::kBF16), p3)},
        params, pol);
    ASSERT_EQ(ctx.collective_log().size(), 2u);
    EXPECT_EQ(mesh.MaskToString(ctx.collective_log()[0].axes), "dp");
    EXPECT_EQ(ctx.collective_log()[0].bytes, 8 * 4) << "sent in f32";
    EXPECT_EQ(mesh.MaskToString(ctx.collective_log()[1].axes), "(dp,tp)");
    EXPECT_EQ(r[0].dtype(), DType::kF32);
    EXPECT_EQ(r[0].type, wt) << "typed like the parameter";
    EXPECT_EQ(r[0].tensor.at(0), 2);  // summed over dp = 2
    EXPECT_EQ(r[1].tensor.at(0), 6);  // over dp x tp = 6
    EXPECT_EQ(r[1].type, SpmdType(2));
    EXPECT_EQ(r[2].type, p3) << "no R axis: only cast";
    EXPECT_EQ(r[2].dtype(), DType::kF32);
    EXPECT_THROW(ReduceGradients({r[0]}, params, pol), OpError);

    // ZeRO-style: reduce-scatter a P-on-dp gradient over dp along dim 0, in f32.
    SpmdType gp(2);
    gp[0] = AxisType::P();
    ctx.ClearCollectiveLog();
    Value rs = ReduceScatterGradient(Value(Tensor::Full({4, 3}, 1.0, DType::kBF16), gp), 0, "dp",
                                     pol);
    EXPECT_EQ(rs.dtype(), DType::kF32);
    EXPECT_EQ(rs.shape(), Shape({2, 3}));
    EXPECT_EQ(rs.tensor.at(0), 2);
    EXPECT_EQ(ctx.collective_log()[0].bytes, 12 * 4);
  });
  ASSERT_TRUE(st.ok()) << st;
}

TEST(MixedHelpersTest, SequenceParallelReduceScatterAndItsTransposeInTheActivationDType) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  for (DType act : {DType::kBF16, DType::kF32}) {
    PrecisionPolicy pol = PrecisionPolicy::Bf16Mixed();
    pol.activation_reduce = act;
    const int64_t esize = act == DType::kBF16 ? 2 : 4;
    absl::Status st = RunSpmd(mesh, [&](RankContext& ctx) {
      // An f32 master weight, R on tp, used in bf16 by a partial-sum producing activation.
      Value w = Value::Replicated(Tensor::Full({6, 4}, 0.25));
      SpmdType pt(1, AxisType::P());
      ValueAndGrad g = value_and_grad(
          [&](const std::vector<Value>& p) {
            Value yp = Value(Tensor::Full({6, 4}, 1.0, DType::kBF16), pt) * ToCompute(p[0], pol);
            Value y = ReduceScatterActivation(yp, 0, "tp", pol);  // bf16{tp:S0}
            EXPECT_EQ(y.dtype(), DType::kBF16);
            EXPECT_TRUE(y.type[0].is_sharded());
            EXPECT_EQ(y.shape(), Shape({2, 4}));
            EXPECT_EQ(y.tensor.at(0), 0.75);  // 3 ranks x 1 x 0.25
            return sum_partial(ToLoss(y, pol), {});
          },
          {w});
      EXPECT_EQ(g.grads[0].dtype(), DType::kF32);
      const auto& log = ctx.collective_log();
      ASSERT_EQ(log.size(), 2u);
      EXPECT_STREQ(log[0].op, "reduce_scatter");
      EXPECT_EQ(log[0].bytes, 6 * 4 * esize);
      EXPECT_STREQ(log[1].op, "all_gather");  // its transpose, on the cotangent
      EXPECT_TRUE(log[1].backward);
      EXPECT_EQ(log[1].bytes, 2 * 4 * esize);
    });
    ASSERT_TRUE(st.ok()) << st;
  }
}

TEST(MixedHelpersTest, MasterGradientOfAWeightUsedInBf16IsF32) {
  SingleRankContext one{Mesh()};
  PrecisionPolicy pol = PrecisionPolicy::Bf16Mixed();
  Value w = Value::Replicated(Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}));
  Value x = Value::Replicated(Tensor::FromVector<float>({1, 2}, {0.5, -1}));
  ValueAndGrad g = value_and_grad(
      [&](const std::vector<Value>& p) {
        Value y = ToCompute(x, pol).matmul(ToCompute(p[0], pol));
        EXPECT_EQ(y.dtype(), DType::kBF16);
        Value l = ToLoss(y, pol);
        return sum(l * l, {});
      },
      {w});
  EXPECT_EQ(g.value.dtype(), DType::kF32);
  ASSERT_EQ(g.grads[0].dtype(), DType::kF32);
  // y = [0.5 - 3, 1 - 4] = [-2.5, -3]; dL/dw = x^T (2y) = [[-2.5, -3], [5, 6]].
  std::vector<double> want = {-2.5, -3, 5, 6};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.grads[0].tensor.at(i), want[i]);
}

}  // namespace
}  // namespace shardmap
