// The trainer's CUDA-graph step on one GPU (issue 25; models/train/cuda_graph_step.h). Without a GPU
// every case skips with the reason.
//   - TrainGpt on one GPU rank captures its second step and replays the rest: five steps with a
//     learning-rate change at a replayed step and clipping active (and with grad_accum 2) give
//     the eager GPU run's losses, norms, parameters and moments (--cuda_graph=false) to f32
//     rounding (the same kernels), and the CPU f64 run's to 1e-5.
//   - A divergence at a replayed step (a huge lr) stops the run with the eager run's error,
//     naming the step.
//   - DeviceOptimizerStep captured alone: a NaN gradient written into the captured input skips
//     the update on the device (parameters and moments bitwise unchanged); the lr written into
//     the device scalar before a replay is the one used (replays equal the eager calls).
//   - Runs that do not capture say why (virtual ranks, tracing).
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/cuda_graph_step.h"
#include "models/gpt.h"
#include "shardmap/spmd_runner.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"
#include "tests/gpu_gpt_fixture.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU() \
  if (!cuda::Available()) GTEST_SKIP() << "no usable GPU: " << cuda::UnavailableReason()

using gpu_gpt_fixture::Config;
using gpu_gpt_fixture::Tokens;

// Five AdamW steps, clipping active, the lr dropping at step 3 (a replayed step).
TrainOptions FiveSteps() {
  TrainOptions o;
  o.steps = 5;
  o.batch = 4;
  o.optimizer.adamw.lr = 1e-2;
  o.optimizer.adamw.weight_decay = 0.1;
  o.optimizer.clip = 0.5;
  o.optimizer.lr_at = [](int64_t step) { return step < 3 ? 1e-2 : 4e-3; };
  return o;
}

absl::StatusOr<TrainResult> Train(const std::string& mesh, DType dtype, DevicePlacement placement,
                                  TrainOptions o) {
  const GptConfig c = Config(dtype);
  GptConfig f64 = c;
  f64.dtype = DType::kF64;
  std::vector<NamedTensor> init = InitGpt(f64, 7);  // the same start for f32 and f64
  for (NamedTensor& t : init) t.tensor = Cast(t.tensor, dtype);
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), c, false);
  if (!layout.ok()) return layout.status();
  o.runtime.placement = std::move(placement);
  return TrainGpt(*layout, init, Tokens(600, c.vocab), o);
}

double RelDiff(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.at(i) - b.at(i)));
    scale = std::max(scale, std::fabs(b.at(i)));
  }
  return scale > 0 ? diff / scale : diff;
}

bool Bitwise(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Losses, norms, parameters and moments within rel; returns how many parameters are bitwise equal.
int ExpectClose(const TrainResult& got, const TrainResult& want, double rel) {
  EXPECT_EQ(got.losses.size(), want.losses.size());
  if (got.losses.size() != want.losses.size()) return -1;
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], rel * std::fabs(want.losses[s])) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], want.grad_norms[s], rel * want.grad_norms[s]) << "step " << s;
  }
  EXPECT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(got.adam_state.exp_avg.size(), want.adam_state.exp_avg.size());
  if (got.params.size() != want.params.size() ||
      got.adam_state.exp_avg.size() != want.adam_state.exp_avg.size()) {
    return -1;
  }
  int bitwise = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_LE(RelDiff(got.params[i].tensor, want.params[i].tensor), rel) << want.params[i].name;
    EXPECT_LE(RelDiff(got.adam_state.exp_avg[i].tensor, want.adam_state.exp_avg[i].tensor), rel)
        << want.params[i].name;
    bitwise += Bitwise(got.params[i].tensor, want.params[i].tensor);
  }
  std::printf("%d of %zu parameters bitwise equal\n", bitwise, want.params.size());
  return bitwise;
}

TEST(GpuTrainGraphTest, ReplaysEqualTheEagerGpuSteps) {
  SKIP_WITHOUT_GPU();
  for (int64_t accum : {1, 2}) {
    SCOPED_TRACE(accum);
    TrainOptions o = FiveSteps();
    o.grad_accum = accum;
    absl::StatusOr<TrainResult> graph = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_TRUE(graph->cuda_graph_used) << graph->cuda_graph_note;
    EXPECT_EQ(graph->cuda_graph_replays, 4);
    EXPECT_THAT(graph->cuda_graph_note, HasSubstr("captured at step 1"));
    o.runtime.cuda_graph = false;
    absl::StatusOr<TrainResult> eager = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
    ASSERT_TRUE(eager.ok()) << eager.status();
    EXPECT_FALSE(eager->cuda_graph_used);
    EXPECT_EQ(eager->cuda_graph_note, "off (cuda_graph = false)");
    ASSERT_GT(eager->grad_norms[0], o.optimizer.clip);  // clipping is exercised
    // The same kernels, the same GEMM algorithms (plans are per process) and no atomics: the
    // replays give the eager run's bits.
    EXPECT_EQ(ExpectClose(*graph, *eager, 1e-6), static_cast<int>(eager->params.size()))
        << "parameters of the replayed run that differ from the eager run's bits";
    EXPECT_EQ(graph->losses, eager->losses);
    // And the CPU f64 run of the same steps.
    absl::StatusOr<TrainResult> cpu = Train("", DType::kF64, DevicePlacement::Cpu(), o);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ExpectClose(*graph, *cpu, 1e-5);
  }
}

// The positions of a rank's rows are kept per layout for the whole process (models/gpt_model.cc):
// after 9 other layouts (batch sizes) on this thread, a run still captures its step (a cache
// miss would copy host->device inside the capture, which is refused, and fall back to eager).
TEST(GpuTrainGraphTest, ACapturedStepAfterNineOtherLayoutsInOneProcess) {
  SKIP_WITHOUT_GPU();
  for (int64_t batch = 1; batch <= 9; ++batch) {
    TrainOptions o;
    o.steps = 1;
    o.batch = batch == 4 ? 10 : batch;  // 4 is the captured run's
    o.runtime.cuda_graph = false;
    absl::StatusOr<TrainResult> r = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  absl::StatusOr<TrainResult> graph =
      Train("", DType::kF32, DevicePlacement::SharedGpu(), FiveSteps());
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(graph->cuda_graph_used) << graph->cuda_graph_note;
  EXPECT_EQ(graph->cuda_graph_replays, 4);
}

// An evaluation between replays (eval_every 2: forward-only passes on the eager pool while the
// graph's private pool holds the step's memory) does not disturb the replays: the run equals the
// eager one bitwise. Peak memory of both is printed for the report.
TEST(GpuTrainGraphTest, AnEvalBetweenReplaysKeepsTheReplaysExact) {
  SKIP_WITHOUT_GPU();
  TrainOptions o = FiveSteps();
  o.eval.tokens = Tokens(400, Config(DType::kF32).vocab);
  o.eval.every = 2;
  o.eval.steps = 2;
  std::vector<double> graph_val, eager_val;
  o.hooks.on_step = [&](const StepInfo& s) {
    if (!std::isnan(s.val_loss)) graph_val.push_back(s.val_loss);
  };
  cuda::DeviceAllocator(0).ResetPeakStats();
  absl::StatusOr<TrainResult> graph = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const int64_t graph_peak = cuda::DeviceAllocator(0).stats().peak_allocated_bytes;
  EXPECT_TRUE(graph->cuda_graph_used) << graph->cuda_graph_note;
  EXPECT_EQ(graph->cuda_graph_replays, 4);
  o.runtime.cuda_graph = false;
  o.hooks.on_step = [&](const StepInfo& s) {
    if (!std::isnan(s.val_loss)) eager_val.push_back(s.val_loss);
  };
  cuda::DeviceAllocator(0).ResetPeakStats();
  absl::StatusOr<TrainResult> eager = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
  ASSERT_TRUE(eager.ok()) << eager.status();
  const int64_t eager_peak = cuda::DeviceAllocator(0).stats().peak_allocated_bytes;
  EXPECT_EQ(graph->losses, eager->losses);
  EXPECT_GE(graph_val.size(), 2u);
  EXPECT_EQ(graph_val, eager_val);
  EXPECT_EQ(ExpectClose(*graph, *eager, 1e-6), static_cast<int>(eager->params.size()));
  std::printf("peak device memory: graph run %lld bytes, eager run %lld bytes\n",
              static_cast<long long>(graph_peak), static_cast<long long>(eager_peak));
}

TEST(GpuTrainGraphTest, ADivergenceAtAReplayedStepStopsNamingTheStep) {
  SKIP_WITHOUT_GPU();
  TrainOptions o = FiveSteps();
  o.optimizer.lr_at = [](int64_t step) { return step == 2 ? 1e30 : 1e-2; };  // step 3 overflows
  std::vector<int64_t> seen;
  o.hooks.on_step = [&](const StepInfo& s) { seen.push_back(s.step); };
  absl::StatusOr<TrainResult> graph = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition) << graph.status();
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("(not finite)"));
  const std::vector<int64_t> graph_seen = seen;
  seen.clear();
  o.runtime.cuda_graph = false;
  absl::StatusOr<TrainResult> eager = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
  ASSERT_FALSE(eager.ok());
  EXPECT_EQ(graph.status().code(), eager.status().code());
  EXPECT_EQ(graph_seen, seen);  // the same steps completed
  ASSERT_FALSE(seen.empty());
  EXPECT_GE(seen.back(), 2);  // it stopped at a replayed step (after the capture at step 1)
  const std::string named = absl::StrCat("step ", seen.back() + 1, ": the loss is");
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr(named));
  EXPECT_THAT(std::string(eager.status().message()), HasSubstr(named));
}

TEST(GpuTrainGraphTest, ACapturedDeviceStepSkipsANonFiniteStepAndReadsTheLrOnTheDevice) {
  SKIP_WITHOUT_GPU();
  SpmdOptions spmd;
  spmd.placement = DevicePlacement::SharedGpu();
  absl::Status s = RunSpmd(Mesh(), [&](RankContext& ctx) {
    const Device d = ctx.device();
    const std::vector<std::string> names = {"w", "b"};
    auto make = [&](std::vector<Value>& params, AdamW& opt, Tensor& grad0, Tensor& grad1) {
      params = {Value::Replicated(Cast(InitGpt(Config(DType::kF64), 3)[0].tensor, DType::kF32).To(d)),
                Value::Replicated(Tensor::Full({5}, 0.5, DType::kF32, d))};
      grad0 = MulScalar(params[0].tensor, 0.25);
      grad1 = Tensor::Full({5}, -1.0, DType::kF32, d);
      std::vector<NamedTensor> local = {{"w", params[0].tensor}, {"b", params[1].tensor}};
      ASSERT_TRUE(opt.Step(local, {{"w", grad0}, {"b", grad1}}).ok());  // warm-up
      params[0].tensor = local[0].tensor;
      params[1].tensor = local[1].tensor;
    };
    const Value loss = Value::Replicated(Tensor::Full({}, 2.0, DType::kF32, d));
    const std::vector<bool> counted = {true, true};
    Tensor lr = Tensor::Zeros({}, DType::kF64, d);
    // Captured.
    std::vector<Value> gp;
    AdamW gopt({.lr = 1e-3, .weight_decay = 0.1});
    Tensor g0, g1;
    make(gp, gopt, g0, g1);
    cuda::CopyInto(Tensor::Scalar(5e-3, DType::kF64), lr);
    std::vector<Value> grads = {Value::Replicated(g0), Value::Replicated(g1)};
    Tensor report;
    cuda::CudaGraph graph(d.index);
    absl::Status c = graph.Capture(
        [&] { report = DeviceOptimizerStep(loss, grads, counted, 0.5, lr, names, gp, gopt); });
    ASSERT_TRUE(c.ok()) << c;
    // Eager, the same calls.
    std::vector<Value> ep;
    AdamW eopt({.lr = 1e-3, .weight_decay = 0.1});
    Tensor e0, e1;
    make(ep, eopt, e0, e1);
    std::vector<Value> egrads = {Value::Replicated(e0), Value::Replicated(e1)};
    auto host = [](const std::vector<Value>& p) {
      std::vector<Tensor> h;
      for (const Value& v : p) h.push_back(v.tensor.To(Device::Cpu()));
      return h;
    };
    for (double step_lr : {5e-3, 2e-3}) {
      cuda::CopyInto(Tensor::Scalar(step_lr, DType::kF64), lr);
      ASSERT_TRUE(graph.Replay().ok());
      const Tensor eager_report = DeviceOptimizerStep(loss, egrads, counted, 0.5, lr, names, ep, eopt);
      EXPECT_TRUE(Bitwise(report.To(Device::Cpu()), eager_report.To(Device::Cpu())));
      const std::vector<Tensor> a = host(gp), b = host(ep);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(Bitwise(a[i], b[i])) << names[i];
    }
    // A NaN gradient element: the replay changes nothing.
    const std::vector<Tensor> before = host(gp);
    const Tensor m_before = gopt.exp_avg("w").To(Device::Cpu());
    Tensor poisoned = g0.To(Device::Cpu());
    poisoned.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    cuda::CopyInto(poisoned, g0);
    ASSERT_TRUE(graph.Replay().ok());
    const std::vector<double> r = report.ToVector<double>();
    EXPECT_TRUE(std::isnan(r[1]));
    const std::vector<Tensor> after = host(gp);
    for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(Bitwise(after[i], before[i])) << names[i];
    EXPECT_TRUE(Bitwise(gopt.exp_avg("w").To(Device::Cpu()), m_before));
  }, spmd);
  ASSERT_TRUE(s.ok()) << s;
}

TEST(GpuTrainGraphTest, RunsThatDoNotCaptureSayWhy) {
  SKIP_WITHOUT_GPU();
  TrainOptions o = FiveSteps();
  o.steps = 2;
  absl::StatusOr<TrainResult> dp = Train("dp=2", DType::kF32, DevicePlacement::SharedGpu(), o);
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_FALSE(dp->cuda_graph_used);
  EXPECT_THAT(dp->cuda_graph_note, HasSubstr("2 in-process ranks"));
  o.tracing.keep_events = true;
  absl::StatusOr<TrainResult> traced = Train("", DType::kF32, DevicePlacement::SharedGpu(), o);
  ASSERT_TRUE(traced.ok()) << traced.status();
  EXPECT_FALSE(traced->cuda_graph_used);
  EXPECT_THAT(traced->cuda_graph_note, HasSubstr("tracing"));
}

}  // namespace
}  // namespace shardmap
