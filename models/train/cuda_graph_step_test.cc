// The host-side half of the captured GPU step (models/train/cuda_graph_step.h), without a GPU:
//   - DecideCudaGraph: which options and devices capture, and each refusal's reason;
//   - GlobalGradNormSquaredOnDevice on CPU ranks equals GlobalGradNormSquared (the eager
//     counting: sharded parts summed, replicated parts once, uncounted parts left out) on
//     meshes of 1, 3 and 2x3 ranks;
//   - DeviceOptimizerStep on CPU ranks equals the eager host step (loss reduce, norm, clipping
//     coefficient, AdamW with the schedule's lr), and a NaN/inf loss or gradient skips the update
//     (parameters, moments and the step count unchanged);
//   - AdamW's device control (an lr tensor, a skip flag) against a naive f64 loop.
#include "models/train/cuda_graph_step.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/gpt_test_util.h"
#include "models/parallel/parallel_dims.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/spmd_runner.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

GptLayout LayoutOf(const std::string& mesh, GptConfig c = gpt_testing::SmallConfig()) {
  return *GptLayout::Create(*ParseMesh(mesh), c, false);
}

GptConfig F32Config() {
  GptConfig c = gpt_testing::SmallConfig();
  c.dtype = DType::kF32;
  return c;
}

TrainOptions FiveSteps() {
  TrainOptions o;
  o.steps = 5;
  return o;
}

const std::vector<Device> kOneGpu = {Device::Cuda(0)};

TEST(DecideCudaGraphTest, OneF32GpuRankWithoutPipelineMoeOrTraceCaptures) {
  CudaGraphDecision d = DecideCudaGraph(LayoutOf("", F32Config()), FiveSteps(), kOneGpu);
  EXPECT_TRUE(d.capture) << d.note;
  EXPECT_EQ(d.note, "");
  // grad_accum, evaluation and a resumed run with two steps left still capture.
  TrainOptions o = FiveSteps();
  o.grad_accum = 2;
  o.eval.every = 2;
  EXPECT_TRUE(DecideCudaGraph(LayoutOf("", F32Config()), o, kOneGpu, /*first_step=*/3).capture);
  // A 1-rank mesh with named axes (dp=1) is one rank too.
  EXPECT_TRUE(DecideCudaGraph(LayoutOf("dp=1", F32Config()), FiveSteps(), kOneGpu).capture);
}

TEST(DecideCudaGraphTest, EachRefusalSaysWhy) {
  const GptLayout one = LayoutOf("", F32Config());
  struct Case {
    std::string what;
    CudaGraphDecision got;
    std::string reason;
  };
  TrainOptions off = FiveSteps();
  off.runtime.cuda_graph = false;
  TrainOptions micro = FiveSteps();
  micro.pipeline.microbatches = 2;
  TrainOptions traced = FiveSteps();
  traced.tracing.keep_events = true;
  TrainOptions one_step = FiveSteps();
  one_step.steps = 1;
  GptConfig moe = F32Config();
  moe.moe.experts = 2;
  const std::vector<Device> shared = {Device::Cuda(0), Device::Cuda(0)};
  const std::vector<Device> per_gpu = {Device::Cuda(0), Device::Cuda(1)};
  const std::vector<Case> cases = {
      {"cpu", DecideCudaGraph(one, FiveSteps(), {Device::Cpu()}), "CPU ranks"},
      {"off", DecideCudaGraph(one, off, kOneGpu), "off (cuda_graph = false)"},
      {"virtual ranks", DecideCudaGraph(LayoutOf("dp=2", F32Config()), FiveSteps(), shared),
       "2 in-process ranks (virtual ranks sharing one GPU) whose collectives synchronise"},
      {"per gpu", DecideCudaGraph(LayoutOf("tp=2", F32Config()), FiveSteps(), per_gpu),
       "(one per GPU)"},
      {"pp", DecideCudaGraph(LayoutOf("pp=2", F32Config()), FiveSteps(), shared),
       "in-process ranks"},
      {"microbatches", DecideCudaGraph(one, micro, kOneGpu), "pipeline strategy"},
      {"moe", DecideCudaGraph(LayoutOf("", moe), FiveSteps(), kOneGpu), "MoE"},
      {"trace", DecideCudaGraph(one, traced, kOneGpu), "tracing"},
      {"f64", DecideCudaGraph(LayoutOf(""), FiveSteps(), kOneGpu), "f64 master weights"},
      {"one step", DecideCudaGraph(one, one_step, kOneGpu), "one step to run"},
      {"resumed last step", DecideCudaGraph(one, FiveSteps(), kOneGpu, 4), "one step to run"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.got.capture) << c.what;
    EXPECT_THAT(c.got.note, HasSubstr(c.reason)) << c.what;
  }
}

// Random-ish f64 values in [-1, 1) (a fixed formula, so every rank makes the same ones).
Tensor Values(Shape shape, int seed) {
  Tensor t = Tensor::Zeros(shape, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<double>()[i] = std::sin(0.7 * (i + 1) * (seed + 1) + seed) * 0.9;
  }
  return t;
}

// Gradients of every type the trainer meets on mesh (dp, tp) or its prefixes: replicated,
// sharded over the last axis (dims 0 and 1), and a second replicated one left uncounted.
struct Grads {
  std::vector<Value> values;
  std::vector<bool> counted;
};

Grads MakeGrads(RankContext& ctx) {
  const int n = ctx.mesh().num_axes();
  Grads g;
  auto typed = [&](Tensor t, AxisType last) {
    SpmdType ty(n);
    if (n > 0) ty[n - 1] = last;
    ty.set_mesh_id(ctx.mesh().id());
    g.values.emplace_back(std::move(t), ty);
  };
  const int r = ctx.rank();
  typed(Values({5, 3}, 1), AxisType::R());
  typed(Values({4, 2}, 10 + r), AxisType::Sharded(0));
  typed(Values({3, 7}, 20 + r), AxisType::Sharded(1));
  typed(Values({6}, 30), AxisType::R());
  g.counted = {true, true, true, false};
  return g;
}

class NormOnDeviceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NormOnDeviceTest, EqualsTheEagerCounting) {
  absl::Status s = RunSpmd(*ParseMesh(GetParam()), [&](RankContext& ctx) {
    Grads g = MakeGrads(ctx);
    const double eager = GlobalGradNormSquared(g.values, g.counted);
    const Tensor dev = GlobalGradNormSquaredOnDevice(g.values, g.counted);
    EXPECT_EQ(dev.dtype(), DType::kF64);
    EXPECT_EQ(dev.numel(), 1);
    EXPECT_NEAR(dev.item(), eager, 1e-12 * eager) << "rank " << ctx.rank();
    // All counted: more than without the fourth.
    std::vector<bool> all(g.values.size(), true);
    EXPECT_GT(GlobalGradNormSquaredOnDevice(g.values, all).item(), dev.item());
  });
  ASSERT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Meshes, NormOnDeviceTest, ::testing::Values("", "tp=3", "dp=2,tp=3"));

// The eager host step of TrainGpt (trainer.cc) for the same inputs, as the reference.
struct Stepped {
  std::vector<Tensor> params, exp_avg;
  double loss = 0, sum_sq = 0;
  int64_t steps = 0;
};

AdamWOptions Adam() {
  return AdamWOptions{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                      .weight_decay = 0.1, .no_decay = {"p1"}};
}

// One step of the device tail (or, with eager, of the host path) over MakeGrads on `mesh`, after
// one ordinary AdamW step so the moments are warm. loss_value: each rank's loss share.
Stepped RunStep(const std::string& mesh, bool device, double loss_value, double clip, double lr,
                bool poison_grad = false) {
  Stepped out;
  absl::Status s = RunSpmd(*ParseMesh(mesh), [&](RankContext& ctx) {
    Grads g = MakeGrads(ctx);
    if (poison_grad) g.values[1].tensor.data<double>()[3] = std::numeric_limits<double>::quiet_NaN();
    std::vector<std::string> names;
    std::vector<Value> params;
    for (size_t i = 0; i < g.values.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      params.emplace_back(Values(g.values[i].tensor.shape(), 50 + static_cast<int>(i)),
                          g.values[i].type);
    }
    AdamW opt(Adam());
    {  // warm-up step (moments non-zero)
      std::vector<NamedTensor> local, grads;
      for (size_t i = 0; i < params.size(); ++i) {
        local.push_back({names[i], params[i].tensor});
        grads.push_back({names[i], MulScalar(params[i].tensor, 0.5)});
      }
      ASSERT_TRUE(opt.Step(local, grads).ok());
      for (size_t i = 0; i < params.size(); ++i) params[i].tensor = local[i].tensor;
    }
    // The loss share: P over every axis (each rank's share of the mean).
    SpmdType lt(ctx.mesh().num_axes(), AxisType::P());
    lt.set_mesh_id(ctx.mesh().id());
    const Value loss(Tensor::Scalar(loss_value, DType::kF64), lt);
    double loss_total = 0, sum_sq = 0;
    if (device) {
      const Tensor report =
          DeviceOptimizerStep(loss, g.values, g.counted, clip, Tensor::Scalar(lr, DType::kF64),
                              names, params, opt);
      ASSERT_EQ(report.numel(), 2);
      loss_total = report.at(0);
      sum_sq = report.at(1);
    } else {  // trainer.cc's host path
      Value l = ctx.mesh().num_axes() > 0 ? all_reduce(loss, Axes(ctx.mesh().axis_names())) : loss;
      loss_total = l.item();
      sum_sq = GlobalGradNormSquared(g.values, g.counted);
      const double coef = clip > 0 ? ClipCoefficient(std::sqrt(sum_sq), clip) : 1.0;
      std::vector<NamedTensor> local, grads;
      for (size_t i = 0; i < params.size(); ++i) {
        local.push_back({names[i], params[i].tensor});
        grads.push_back({names[i], coef < 1.0 ? MulScalar(g.values[i].tensor, coef)
                                              : g.values[i].tensor});
      }
      opt.set_lr(lr);
      if (std::isfinite(loss_total) && std::isfinite(sum_sq)) {
        ASSERT_TRUE(opt.Step(local, grads).ok());
      }
      for (size_t i = 0; i < params.size(); ++i) params[i].tensor = local[i].tensor;
    }
    if (ctx.rank() == 0) {
      for (size_t i = 0; i < params.size(); ++i) {
        out.params.push_back(params[i].tensor);
        out.exp_avg.push_back(opt.exp_avg(names[i]));
      }
      out.loss = loss_total;
      out.sum_sq = sum_sq;
      out.steps = opt.steps();
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

double MaxRelDiff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, gpt_testing::RelDiff(a[i], b[i]));
  return worst;
}

class DeviceStepTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceStepTest, EqualsTheEagerHostStepWithClippingAndAScheduledLr) {
  for (double clip : {0.0, 0.3, 100.0}) {  // off, active, inactive
    SCOPED_TRACE(clip);
    const Stepped dev = RunStep(GetParam(), true, 0.75, clip, 3e-3);
    const Stepped host = RunStep(GetParam(), false, 0.75, clip, 3e-3);
    ASSERT_EQ(dev.params.size(), host.params.size());
    EXPECT_NEAR(dev.loss, host.loss, 1e-15);
    EXPECT_NEAR(dev.sum_sq, host.sum_sq, 1e-12 * host.sum_sq);
    EXPECT_LT(MaxRelDiff(dev.params, host.params), 1e-12);
    EXPECT_LT(MaxRelDiff(dev.exp_avg, host.exp_avg), 1e-12);
    EXPECT_EQ(dev.steps, 2);
  }
  // The lr tensor is used: another lr gives other parameters.
  const Stepped a = RunStep(GetParam(), true, 0.75, 0.3, 3e-3);
  const Stepped b = RunStep(GetParam(), true, 0.75, 0.3, 1e-2);
  EXPECT_GT(MaxRelDiff(a.params, b.params), 1e-6);
}

TEST_P(DeviceStepTest, ANonFiniteLossOrGradientSkipsTheUpdate) {
  // The state after the warm-up step alone: the host path with its step not taken.
  const Stepped warm = RunStep(GetParam(), false, std::numeric_limits<double>::quiet_NaN(), 0.3,
                               1e-2);
  EXPECT_EQ(warm.steps, 1);
  const Stepped finite = RunStep(GetParam(), true, 0.75, 0.3, 1e-2);
  EXPECT_GT(MaxRelDiff(finite.params, warm.params), 1e-6);  // a taken step moves them
  for (int kind = 0; kind < 3; ++kind) {  // NaN loss, inf loss, a NaN gradient element
    SCOPED_TRACE(kind);
    const double loss = kind == 0   ? std::numeric_limits<double>::quiet_NaN()
                        : kind == 1 ? std::numeric_limits<double>::infinity()
                                    : 0.75;
    const Stepped got = RunStep(GetParam(), true, loss, 0.3, 1e-2, /*poison_grad=*/kind == 2);
    EXPECT_FALSE(std::isfinite(got.loss) && std::isfinite(got.sum_sq));
    EXPECT_EQ(got.steps, 1);  // the count did not advance
    EXPECT_EQ(MaxRelDiff(got.params, warm.params), 0.0);
    EXPECT_EQ(MaxRelDiff(got.exp_avg, warm.exp_avg), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, DeviceStepTest, ::testing::Values("", "dp=3", "dp=2,tp=3"));

// AdamW's control against a naive loop: p, g, m, v of one f64 tensor, two steps, the first
// skipped by a NaN flag (so the second is t = 1), with grad_scale and an lr tensor.
TEST(AdamWControlTest, LrTensorAndSkipFlagMatchANaiveLoop) {
  const Tensor p0 = Values({7}, 3), g = Values({7}, 4);
  AdamW opt({.lr = 99.0, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.2});
  // A copy: AdamW updates its parameters in place, and `want` reads p0.
  std::vector<NamedTensor> params = {{"w", p0.Clone()}};
  const std::vector<NamedTensor> grads = {{"w", g}};
  const Tensor scale = Tensor::Scalar(0.5, DType::kF32);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  AdamWStepControl skip{Tensor::Scalar(0.1, DType::kF64), Tensor::Scalar(nan, DType::kF32)};
  ASSERT_TRUE(opt.Step(params, grads, scale, skip).ok());
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_FALSE(opt.exp_avg("w").defined());
  EXPECT_EQ(gpt_testing::RelDiff(params[0].tensor, p0), 0.0);
  AdamWStepControl go{Tensor::Scalar(0.1, DType::kF64), Tensor::Scalar(2.5, DType::kF64)};
  ASSERT_TRUE(opt.Step(params, grads, scale, go).ok());
  EXPECT_EQ(opt.steps(), 1);
  for (int64_t i = 0; i < 7; ++i) {
    const double gi = g.at(i) * static_cast<double>(0.5f);
    const double m = 0.2 * gi, v = 0.1 * gi * gi;
    const double want = p0.at(i) * (1 - 0.1 * 0.2) -
                        (0.1 / (1 - 0.8)) * m / (std::sqrt(v) / std::sqrt(1 - 0.9) + 1e-6);
    EXPECT_NEAR(params[0].tensor.at(i), want, 1e-14) << i;
  }
}

TEST(AdamWControlTest, BadControlTensorsAreRefused) {
  AdamW opt;
  std::vector<NamedTensor> params = {{"w", Values({3}, 1)}};
  const std::vector<NamedTensor> grads = {{"w", Values({3}, 2)}};
  absl::Status s = opt.Step(params, grads, Tensor(), {Tensor::Scalar(0.1, DType::kF32), Tensor()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("lr"));
  s = opt.Step(params, grads, Tensor(), {Tensor(), Tensor::Zeros({2}, DType::kF64)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("skip_if_nonfinite"));
  EXPECT_EQ(opt.steps(), 0);
}

}  // namespace
}  // namespace shardmap
