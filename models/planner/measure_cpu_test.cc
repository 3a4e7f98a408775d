#include "models/planner/measure_cpu.h"

#include <cmath>
#include <tuple>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tensor/op_counter.h"
#include "tensor/ops/elementwise.h"
#include "tensor/tensor.h"

namespace shardmap::planner {
namespace {

HardwareProfile CurveOnly() {
  HardwareProfile p;
  p.name = "test";
  p.gemm[DType::kF32] = {{8, 1e9}, {512, 1e10}};
  return p;
}

TEST(MeasureGemmShapesTest, TimesEachDistinctShapeOnceAndPricesItsGemmsAtThatRate) {
  RoleWork a, b;
  a.gemms.push_back({.m = 64, .n = 96, .k = 32, .count = 4});
  a.gemms.push_back({.m = 64, .n = 96, .k = 32, .count = 2, .backward = true, .trans_a = true});
  a.gemms.push_back({.batch = 6, .m = 16, .n = 16, .k = 8, .trans_b = true});
  b.gemms.push_back({.m = 64, .n = 96, .k = 32, .count = 7});  // a's first shape again
  b.gemms.push_back({.m = 96, .n = 64, .k = 32});              // other dims
  HardwareProfile p = CurveOnly();
  absl::StatusOr<int> n = MeasureGemmShapes({a, b}, &p);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4);
  ASSERT_EQ(p.gemm_exact.size(), 4u);
  for (const auto& [k, r] : p.gemm_exact) {
    EXPECT_TRUE(std::isfinite(r) && r > 1e5) << r;  // any CPU does more than 0.1 Mflop/s
  }
  // Priced at the shape's own rate, count included.
  const GemmWork& w = b.gemms[0];
  EXPECT_DOUBLE_EQ(*p.GemmSeconds(w), w.flops() / p.gemm_exact.at(GemmKey::Of(w)));
  // The profile is the cache: nothing is timed again, and the rates stay.
  const auto before = p.gemm_exact;
  absl::StatusOr<int> again = MeasureGemmShapes({b, a}, &p);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0);
  EXPECT_EQ(p.gemm_exact, before);
}

TEST(MeasureGemmShapesTest, TimeGemmShapeRunsEveryLayout) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const double s = TimeGemmShape({.batch = ta ? 1 : 3, .m = 5, .n = 7, .k = 3,
                                      .trans_a = ta, .trans_b = tb}, 1);
      EXPECT_TRUE(std::isfinite(s) && s > 0 && s < 1) << ta << tb << " " << s;
    }
  }
}

TEST(MeasureGemmShapesTest, BadInputIsRefusedWithTheRoleAndShape) {
  RoleWork r;
  r.role = "stage 1 of 2";
  r.gemms.push_back({.m = 0, .n = 4, .k = 4});
  HardwareProfile p = CurveOnly();
  absl::StatusOr<int> n = MeasureGemmShapes({r}, &p);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(n.status().message(), "stage 1 of 2")) << n.status();
  EXPECT_TRUE(absl::StrContains(n.status().message(), "m 0")) << n.status();
  EXPECT_EQ(MeasureGemmShapes({}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FrameworkOpSecondsTest, ChargesTheStepLessItsArithmeticPerOp) {
  // 1 ms step, 0.2 ms of modelled arithmetic, 400 ops: 2 us per op.
  EXPECT_DOUBLE_EQ(*FrameworkOpSeconds(1e-3, 2e-4, 400), 2e-6);
  // Arithmetic modelled above the step: no negative cost.
  EXPECT_DOUBLE_EQ(*FrameworkOpSeconds(1e-3, 2e-3, 400), 0.0);
  // Nothing to divide by, or no measured step: a clear error.
  EXPECT_FALSE(FrameworkOpSeconds(1e-3, 0, 0).ok());
  EXPECT_FALSE(FrameworkOpSeconds(0, 0, 10).ok());
  EXPECT_TRUE(absl::StrContains(FrameworkOpSeconds(-1, 0, 10).status().message(), "step time"));
}

TEST(WithStepOtherOpRateTest, PricesTheStepsOtherOpsAtWhatTheyTook) {
  HardwareProfile p = CurveOnly();
  p.memory_bandwidth = 1e10;
  p.vector_flops = 1e9;
  const OtherWork bw{.flops = 1e6, .bytes = 4e7};   // 4 ms at 1e10 B/s, bandwidth-bound
  const OtherWork alu{.flops = 4e6, .bytes = 1e3};  // 4 ms at 1e9 flop/s
  // Step 20 ms: GEMMs 10 ms, per-op 2 ms, the other ops modelled 4 ms took 8 ms: twice as slow.
  double f = 0;
  absl::StatusOr<HardwareProfile> q = WithStepOtherOpRate(p, 20e-3, 10e-3, 4e-3, 2e-3, &f);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(f, 2.0);
  EXPECT_NEAR(*q->OtherSeconds(bw), 8e-3, 1e-12);
  EXPECT_NEAR(*q->OtherSeconds(alu), 8e-3, 1e-12);
  EXPECT_EQ(q->gemm, p.gemm);  // GEMM rates untouched
  // No time left for the other ops, or none modelled: a clear error.
  absl::StatusOr<HardwareProfile> bad = WithStepOtherOpRate(p, 10e-3, 10e-3, 4e-3, 2e-3);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "no time for its other ops"));
  EXPECT_FALSE(WithStepOtherOpRate(p, 10e-3, 1e-3, 0, 0).ok());
}

TEST(WithOpRatesTest, EachKindAtItsBytesOverItsTimeBeyondTheFixedCost) {
  HardwareProfile p = *LoadHardwareProfile("h100_node");
  const double copy_bw = p.memory_bandwidth;
  std::vector<OpCount> ops;
  // layer_norm: 2 calls, 4 MB in 2 ms + 2 x 10 us fixed: 4e6 / 2e-3 = 2e9 B/s.
  ops.push_back({"layer_norm", DType::kF32, 0, 1e6, std::nullopt, 0.5e-3 + 10e-6});
  ops.push_back({"layer_norm", DType::kF32, 0, 3e6, std::nullopt, 1.5e-3 + 10e-6});
  // add in f64: its own kind.
  ops.push_back({"add", DType::kF64, 0, 1e6, std::nullopt, 1e-4 + 10e-6});
  // A GEMM is priced by its shape, not here; a zero-byte op and an op that is all fixed cost get
  // no rate.
  ops.push_back({"matmul", DType::kF32, 1e9, 1e6, GemmShape{1, 10, 10, 10}, 5e-3});
  ops.push_back({"fill", DType::kF32, 0, 0, std::nullopt, 1e-3});
  ops.push_back({"slice", DType::kF32, 0, 100, std::nullopt, 11e-6});
  absl::StatusOr<std::vector<OpRateRow>> rows = WithOpRates(ops, 10e-6, &p);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 4u);  // layer_norm, fill, add, slice: largest time first
  EXPECT_EQ((*rows)[0].op, "layer_norm");
  EXPECT_EQ((*rows)[0].count, 2);
  EXPECT_NEAR((*rows)[0].rate, 2e9, 1);
  EXPECT_NEAR(p.op_rate.at({"layer_norm", DType::kF32}), 2e9, 1);
  EXPECT_NEAR(p.op_rate.at({"add", DType::kF64}), 1e10, 1e-3 * 1e10);
  EXPECT_EQ(p.op_rate.count({"fill", DType::kF32}), 0u);
  EXPECT_EQ(p.op_rate.count({"slice", DType::kF32}), 0u);
  EXPECT_EQ(p.op_rate.count({"matmul", DType::kF32}), 0u);
  // Priced at it; other kinds still at the copy bandwidth; AtLoad scales it with the machine.
  EXPECT_NEAR(*p.OtherSeconds({"layer_norm", DType::kF32, 0, 2e9}), 1.0, 1e-9);
  EXPECT_NEAR(*p.OtherSeconds({"gelu", DType::kF32, 0, copy_bw}), 1.0, 1e-9);
  p.shared_op_rate_threads = 2;
  p.shared_op_rate[{"layer_norm", DType::kF32}] = 1e9;  // the speeds with 2 ranks at once too
  const HardwareProfile half = AtLoad(p, {.gemm_rate = 2e9, .cores = 2}, {.gemm_rate = 1e9, .cores = 1});
  EXPECT_NEAR(half.op_rate.at({"layer_norm", DType::kF32}), 1e9, 1);
  EXPECT_NEAR(half.shared_op_rate.at({"layer_norm", DType::kF32}), 5e8, 1);
}

TEST(WithOpRatesTest, RealTimedOpsGetPlausibleRatesAndUntimedOnesAreRefused) {
  HardwareProfile p = *LoadHardwareProfile("h100_node");
  const Tensor x = Tensor::Zeros({1 << 20}, DType::kF32);
  std::vector<OpCount> timed_ops, untimed_ops;
  {
    OpCounter c(OpCounter::kTimed);
    for (int i = 0; i < 5; ++i) Exp(x);
    timed_ops = c.ops();
  }
  {
    OpCounter c;
    Exp(x);
    untimed_ops = c.ops();
  }
  absl::StatusOr<std::vector<OpRateRow>> rows = WithOpRates(timed_ops, 0, &p);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1u);
  // 8 MB per call: somewhere between a slow shared core and any memory system's bound.
  EXPECT_GT((*rows)[0].rate, 1e8);
  EXPECT_LT((*rows)[0].rate, 1e13);
  absl::StatusOr<std::vector<OpRateRow>> bad = WithOpRates(untimed_ops, 0, &p);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "kTimed")) << bad.status();
}

TEST(OversubscribedSyncSecondsTest, MeasuresAWaitPerRoundAndRefusesBadInput) {
  // Whatever the machine's load: a per-round time, not negative, far below the run's length.
  absl::StatusOr<double> s = OversubscribedSyncSeconds(4, 2e-4, 10);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(*s, 0);
  EXPECT_LT(*s, 1.0);
  for (auto [threads, chunk, iters] : {std::tuple{1, 1e-3, 10}, std::tuple{4, 0.0, 10},
                                       std::tuple{4, 1e-3, 0}}) {
    absl::StatusOr<double> bad = OversubscribedSyncSeconds(threads, chunk, iters);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "need >= 2 threads")) << bad.status();
  }
}

}  // namespace
}  // namespace shardmap::planner
