// The overlapped training step on a simulated link (collectives/simulated_link.h): TrainGpt's step time
// on dp=2, dp_shard=2 and dp_replicate=2 x dp_shard=2 at two link speeds, with the overlapped
// schedule (--overlap=on: gradient buckets started during the backward, FSDP's prefetched and
// resharded gathers) and the reference one (off), against the ideal each should reach:
//   off: compute + comm (every collective blocks);
//   on:  per phase, max(compute, the comm started in it) + the comm that cannot overlap
//        (blocking calls such as the loss and norm reductions, the buckets started after the
//        backward, FSDP's first all-gather and last reduce-scatter): max(forward, FSDP's
//        prefetched gathers) + max(backward, buckets + reduce-scatters + regathers) + the rest
//        of the step (AdamW) + what cannot overlap.
// compute is the step on an infinitely fast link (measured in the same run); comm is the sum of
// the link's modelled times of the step's collectives (rank 0's log, perfmodel's RingCost, the
// same model the link sleeps by). The link sleeps, so a waiting rank leaves its core to compute.
//
//   bazel run -c opt //bench:overlap_step_bench
//
// Counters: step_ms (the fastest of the measured steps: this machine's neighbours slow single
// steps by up to 2x), compute_ms, compute_on_ms (the overlapped
// schedule on the instant link: its own lane hand-offs and regathers, no link time), comm_ms,
// nonoverlap_ms,
// ideal_ms, vs_ideal (step_ms / ideal_ms; the target: within 15%), vs_ideal_on (the
// same with compute_on's phases as the compute: overlapped runs only), collectives.
// BM_PipelineFsdpStep: pp=2 x dp_shard=2 with 4 microbatches (FSDP in pipeline stages), step
// time and calls, off and on (filter with --benchmark_filter=Pipeline).
// The model: 4 layers, d_model 256, seq 64, vocab 512, f32 (13 MB of parameters), batch 8, 2 MiB
// gradient buckets (the default 25 MiB would hold the whole model in one bucket, which cannot
// overlap anything).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_help.h"
#include "collectives/simulated_link.h"
#include "models/train/simulated_link_runner.h"
#include "benchmark/benchmark.h"
#include "models/gpt.h"

namespace shardmap {
namespace {

GptConfig Model() {
  return GptConfig{.layers = 4, .d_model = 256, .heads = 4, .vocab = 512, .seq = 64,
                   .dtype = DType::kF32};
}

std::vector<int64_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = (i * 7 + i / 11) % vocab;
  return t;
}

constexpr int kSteps = 7;  // the first is a warm-up, not counted

struct Run {
  double step_s = 1e30;                 // the fastest of steps 1..kSteps-1
  double forward_s = 0, backward_s = 0; // rank 0's fastest phases after step 0 (the trace's)
  std::vector<CollectiveRecord> log;    // rank 0's last step
};

Run Train(const std::string& mesh_text, const collectives::SimulatedLink& link, bool overlap,
          int64_t microbatches = 1) {
  const GptConfig c = Model();
  absl::StatusOr<Mesh> mesh = ParseMesh(mesh_text);
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, c, false);
  if (!layout.ok()) {
    std::fprintf(stderr, "%s\n", layout.status().ToString().c_str());
    std::exit(1);
  }
  TrainOptions o;
  o.steps = kSteps;
  o.batch = 8;
  o.pipeline.microbatches = microbatches;
  o.overlap.on = overlap;
  o.overlap.bucket_bytes = int64_t{2} << 20;
  o.hooks.spmd_runner = SimulatedLinkSpmdRunner(link);
  o.tracing.keep_events = true;
  Run run;
  o.hooks.on_step = [&](const StepInfo& s) {
    if (s.step >= 1) run.step_s = std::min(run.step_s, s.seconds);
    if (s.step == kSteps - 1 && s.log != nullptr) run.log = *s.log;
  };
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(c, 1), Tokens(20000, c.vocab), o);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  // Each phase's fastest after the warm-up step (rank 0's trace holds one per step, in order).
  std::vector<double> fwd, bwd;
  for (const TraceEvent& e : r->trace) {
    if (e.rank != 0 || e.category != "phase") continue;
    if (e.name == "forward") fwd.push_back(e.duration_us * 1e-6);
    if (e.name == "backward") bwd.push_back(e.duration_us * 1e-6);
  }
  if (fwd.size() > 1) run.forward_s = *std::min_element(fwd.begin() + 1, fwd.end());
  if (bwd.size() > 1) run.backward_s = *std::min_element(bwd.begin() + 1, bwd.end());
  return run;
}

double Modelled(const collectives::SimulatedLink& link, const Mesh& mesh, const CollectiveRecord& r) {
  const int t = mesh.GroupSize(r.axes);
  const double bytes = std::string(r.op) == "all_gather" ? static_cast<double>(r.bytes) * t
                                                         : static_cast<double>(r.bytes);
  return collectives::ModelledSeconds(link, r.op, t, bytes);
}

// The step's modelled comm: what the forward's compute can hide (started in the forward: FSDP's
// prefetched all-gathers), what the backward's can (started in it: buckets, reduce-scatters,
// regathers), and what nothing can (see the top).
struct Comm {
  double total = 0, forward = 0, backward = 0, fixed = 0;
};

Comm Split(const collectives::SimulatedLink& link, const Mesh& mesh,
           const std::vector<CollectiveRecord>& log) {
  Comm c;
  int first_gather = -1, last_scatter = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    const std::string op = log[i].op;
    if (log[i].started && op == "all_gather" && !log[i].backward && first_gather < 0) {
      first_gather = static_cast<int>(i);
    }
    if (log[i].started && op == "reduce_scatter" && log[i].backward) last_scatter = static_cast<int>(i);
  }
  for (size_t i = 0; i < log.size(); ++i) {
    const CollectiveRecord& r = log[i];
    const double m = Modelled(link, mesh, r);
    c.total += m;
    const bool after_backward = std::string(r.op) == "all_reduce" && !r.backward;
    if (!r.started || after_backward || static_cast<int>(i) == first_gather ||
        static_cast<int>(i) == last_scatter) {
      c.fixed += m;
    } else if (r.backward) {
      c.backward += m;
    } else {
      c.forward += m;
    }
  }
  return c;
}

const std::vector<std::string> kMeshes = {"dp=2", "dp_shard=2", "dp_replicate=2,dp_shard=2"};
// Two links: 100 and 400 MB/s of bus bandwidth, 100 us per collective.
const std::vector<double> kBusBw = {100e6, 400e6};

void BM_Step(benchmark::State& state) {
  const std::string mesh_text = kMeshes[state.range(0)];
  const collectives::SimulatedLink link{.ring = {.alpha_s = 100e-6, .busbw = kBusBw[state.range(1)]}};
  const bool overlap = state.range(2) != 0;
  const collectives::SimulatedLink instant{.ring = {.alpha_s = 0, .busbw = 1e18}};
  const Mesh mesh = *ParseMesh(mesh_text);
  Run compute, compute_on, run;
  for (auto _ : state) {
    compute = Train(mesh_text, instant, false);
    compute_on = Train(mesh_text, instant, true);
    run = Train(mesh_text, link, overlap);
  }
  const Comm comm = Split(link, mesh, run.log);
  // compute = forward + backward + the rest (reductions' local work, clipping, AdamW).
  const double rest = std::max(0.0, compute.step_s - compute.forward_s - compute.backward_s);
  const double ideal = overlap ? std::max(compute.forward_s, comm.forward) +
                                     std::max(compute.backward_s, comm.backward) + rest + comm.fixed
                               : compute.step_s + comm.total;
  state.SetLabel(mesh_text + (overlap ? " overlap on" : " overlap off") +
                 (state.range(1) == 0 ? " 100 MB/s" : " 400 MB/s"));
  state.counters["step_ms"] = run.step_s * 1e3;
  state.counters["compute_ms"] = compute.step_s * 1e3;
  state.counters["compute_on_ms"] = compute_on.step_s * 1e3;
  state.counters["fwd_ms"] = compute.forward_s * 1e3;
  state.counters["bwd_ms"] = compute.backward_s * 1e3;
  state.counters["comm_ms"] = comm.total * 1e3;
  state.counters["nonoverlap_ms"] = (overlap ? comm.fixed : comm.total) * 1e3;
  state.counters["ideal_ms"] = ideal * 1e3;
  state.counters["vs_ideal"] = run.step_s / ideal;
  // The same ideal from the overlapped schedule's own compute (compute_on: its lanes and
  // regathers on an instant link): how far the link's overlap is from perfect once the CPU the
  // overlapped machinery takes on this machine's shared cores is counted as compute.
  const double rest_on =
      std::max(0.0, compute_on.step_s - compute_on.forward_s - compute_on.backward_s);
  const double ideal_on = std::max(compute_on.forward_s, comm.forward) +
                          std::max(compute_on.backward_s, comm.backward) + rest_on + comm.fixed;
  if (overlap) state.counters["vs_ideal_on"] = run.step_s / ideal_on;
  state.counters["collectives"] = static_cast<double>(run.log.size());
}
BENCHMARK(BM_Step)
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// FSDP in pipeline stages (models/train/stage_fsdp.h): pp=2 x dp_shard=2, 4 microbatches (1F1B),
// on an instant link and the two simulated ones; step_ms (the fastest step after the warm-up)
// and rank 0's collectives per step, overlap off and on. No ideal: the timetable's bubble and
// the two stages' different work make one phase split meaningless.
void BM_PipelineFsdpStep(benchmark::State& state) {
  const collectives::SimulatedLink link =
      state.range(0) == 2 ? collectives::SimulatedLink{.ring = {.alpha_s = 0, .busbw = 1e18}}
                          : collectives::SimulatedLink{.ring = {.alpha_s = 100e-6,
                                                                .busbw = kBusBw[state.range(0)]}};
  const bool overlap = state.range(1) != 0;
  Run run;
  for (auto _ : state) run = Train("pp=2,dp_shard=2", link, overlap, /*microbatches=*/4);
  const Comm comm = Split(link, *ParseMesh("pp=2,dp_shard=2"), run.log);
  const char* speed = state.range(0) == 0 ? " 100 MB/s" : state.range(0) == 1 ? " 400 MB/s"
                                                                           : " instant";
  state.SetLabel(std::string("pp=2,dp_shard=2 m=4") + (overlap ? " overlap on" : " overlap off") +
                 speed);
  state.counters["step_ms"] = run.step_s * 1e3;
  state.counters["comm_ms"] = comm.total * 1e3;
  state.counters["collectives"] = static_cast<double>(run.log.size());
}
BENCHMARK(BM_PipelineFsdpStep)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  shardmap::bench::InitializeBenchmark(&argc, argv, "overlap_step_bench");
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
