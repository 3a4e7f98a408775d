// Started all-reduces overlapping a compute loop (DDP's bucketed gradient reduction in
// miniature) against the blocking schedule, on the in-process backend and on a simulated link
// (collectives/simulated_link.h) at two speeds, and on Gloo (threads over TCP loopback). Each step on every rank: K buckets, each "compute c,
// then all-reduce the bucket"; blocking waits for each all-reduce before the next compute,
// overlapped starts it (AllReduceStart) and waits for all of them at the end of the step.
//
//   bazel run -c opt --config=opt //bench:overlap_bench
//
// Compute is a CPU loop (host compute) or a sleep of the same nominal length (an accelerator's
// compute, which leaves the host core idle). Names:
//   step/<backend>/compute:<cpu|sleep>/world:<n>/bucket:<bytes>
// Blocking and overlapped steps alternate in one world (so both see the same load on this
// shared machine); each step's time is the slowest rank's, and the medians over 7 pairs are the
// counters blocking_ms / overlapped_ms / ratio (overlapped / blocking; 1.0: nothing hidden).
// The table after the run sets each ratio
// beside the ideal of the pipeline
//   blocking    = K (c + m)
//   overlapped  = c + (K-1) max(c, m) + m          (the last bucket cannot hide)
// with c one bucket's compute as measured in the blocking steps (the slowest rank's) and m the
// link's modelled time of one bucket's all-reduce (0 for in_process and gloo, whose real
// reductions and transfers run on the lane's thread and compete with compute for this
// machine's 2 cores: a ratio near 1 there is the honest result; the simulated link sleeps,
// which takes no core).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/simulated_link.h"
#include "benchmark/benchmark.h"
#include "collectives/communicator.h"
#include "collectives/gloo_threads.h"
#include "collectives/in_process.h"

namespace shardmap::bench {
namespace {

using collectives::Communicator;
using collectives::DataType;
using collectives::PendingCollective;
using collectives::ReduceOp;
using Clock = std::chrono::steady_clock;

constexpr int kBuckets = 4;
constexpr int kSteps = 7;  // pairs (blocking, overlapped) per configuration
constexpr double kComputeSeconds = 0.006;  // one bucket's compute, nominal (idle core)

struct Link {
  const char* name;
  double busbw;  // 0: no simulated link (the backend as it is)
  double alpha_s;
  bool gloo = false;  // Gloo ranks (threads with their own contexts over TCP loopback)
};
constexpr Link kLinks[] = {{"in_process", 0, 0},
                           {"gloo", 0, 0, true},
                           {"link_400MBps", 400e6, 50e-6},
                           {"link_100MBps", 100e6, 50e-6}};

// What a bucket's compute is: a CPU loop on the rank's thread (host compute, which competes
// with the other ranks, the lane and the machine's other load for the 2 cores), or a sleep of
// the same nominal length (an accelerator's compute: the host thread only waits for it).
enum class Compute { kCpu, kSleep };
const char* ComputeName(Compute c) { return c == Compute::kCpu ? "cpu" : "sleep"; }

// A dependent floating-point chain over a small array (stays in cache): pure core time.
double ComputeChunk(int64_t iters, std::vector<double>& a) {
  double acc = 0;
  for (int64_t i = 0; i < iters; ++i) {
    double& x = a[i & 1023];
    x = x * 0.9999999 + 1e-7;
    acc += x;
  }
  return acc;
}

// Iterations of ComputeChunk lasting about kComputeSeconds alone on an idle core (the fastest
// of several trials: the machine is shared).
int64_t CalibrateCompute() {
  std::vector<double> a(1024, 1.0);
  const int64_t probe = 1 << 22;
  double best = 1e30;
  for (int trial = 0; trial < 7; ++trial) {
    const auto t0 = Clock::now();
    benchmark::DoNotOptimize(ComputeChunk(probe, a));
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return static_cast<int64_t>(probe * kComputeSeconds / best);
}

struct Row {
  std::string config;
  double blocking, overlapped;  // the slowest rank's step, median
  double c, m;  // one bucket's compute (measured in the blocking steps) and modelled link time
};
std::vector<Row>* rows = new std::vector<Row>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One step of one rank: its seconds, and the seconds its compute took.
struct StepTime {
  double step = 0, compute = 0;
};
absl::StatusOr<StepTime> Step(Communicator& c, bool overlapped, Compute kind, int64_t iters,
                              std::vector<std::vector<float>>& buckets,
                              std::vector<double>& work) {
  StepTime t;
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<PendingCollective>> pending;
  for (std::vector<float>& b : buckets) {
    const auto c0 = Clock::now();
    if (kind == Compute::kCpu) {
      benchmark::DoNotOptimize(ComputeChunk(iters, work));
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(kComputeSeconds));
    }
    t.compute += std::chrono::duration<double>(Clock::now() - c0).count();
    if (overlapped) {
      auto h = c.AllReduceStart(b.data(), b.data(), b.size(), DataType::kF32, ReduceOp::kSum);
      if (!h.ok()) return h.status();
      pending.push_back(*std::move(h));
    } else if (absl::Status s = c.AllReduce(b.data(), b.data(), b.size(), DataType::kF32,
                                            ReduceOp::kSum); !s.ok()) {
      return s;
    }
  }
  for (auto& h : pending) {
    if (absl::Status s = h->Wait(); !s.ok()) return s;
  }
  t.step = std::chrono::duration<double>(Clock::now() - t0).count();
  return t;
}

// Blocking and overlapped steps alternate in one world (the order flips every pair), so both
// see the same load; the slowest rank's time of each step, medians over kSteps pairs.
void BM_Step(benchmark::State& state, Link link, Compute kind, int n, size_t bytes) {
  const int64_t iters = CalibrateCompute();
  const collectives::SimulatedLink sim{.ring = {.alpha_s = link.alpha_s, .busbw = link.busbw}};
  const double m = link.busbw > 0 ? collectives::ModelledSeconds(sim, "all_reduce", n, bytes) : 0;
  for (auto _ : state) {
    std::vector<double> blocking, overlapped, compute;
    auto rank = [&](Communicator& world) -> absl::Status {
      std::unique_ptr<Communicator> wrapped;
      if (link.busbw > 0) wrapped = std::make_unique<collectives::SimulatedLinkCommunicator>(&world, sim);
      Communicator& comm = wrapped ? *wrapped : world;
      std::vector<std::vector<float>> buckets(kBuckets, std::vector<float>(bytes / 4, 1e-3f));
      std::vector<double> work(1024, 1.0);
      for (int step = -1; step < 2 * kSteps; ++step) {  // step -1: warm-up (opens the lane)
        const bool over = step < 0 || (step % 2 == 0) == ((step / 2) % 2 == 0);
        if (absl::Status b = world.Barrier(); !b.ok()) return b;
        absl::StatusOr<StepTime> t = Step(comm, over, kind, iters, buckets, work);
        if (!t.ok()) return t.status();
        double slowest[2] = {t->step, t->compute / kBuckets};  // max over ranks of both
        if (absl::Status r = world.AllReduce(slowest, slowest, 2, DataType::kF64, ReduceOp::kMax);
            !r.ok()) return r;
        if (step < 0 || world.rank() != 0) continue;
        (over ? overlapped : blocking).push_back(slowest[0]);
        if (!over) compute.push_back(slowest[1]);
      }
      return absl::OkStatus();
    };
    absl::Status s = link.gloo ? collectives::RunGlooThreads(n, rank)
                               : collectives::RunInProcess(n, rank);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    Row r{absl::StrCat(link.name, " ", ComputeName(kind), " n=", n, " ", bytes >> 20, "MiB"),
          Median(blocking),
          Median(overlapped), Median(compute), m};
    state.SetIterationTime(r.overlapped);
    state.counters["blocking_ms"] = 1e3 * r.blocking;
    state.counters["overlapped_ms"] = 1e3 * r.overlapped;
    state.counters["ratio"] = r.overlapped / r.blocking;
    state.counters["compute_ms"] = 1e3 * r.c;
    state.counters["link_ms"] = 1e3 * m;
    rows->push_back(r);
  }
}

void Register() {
  for (const Link& link : kLinks) {
    for (Compute kind : {Compute::kCpu, Compute::kSleep}) {
      for (int n : {2, 3}) {
        for (size_t bytes : {size_t{1} << 20, size_t{4} << 20}) {
          benchmark::RegisterBenchmark(
              absl::StrCat("step/", link.name, "/compute:", ComputeName(kind), "/world:", n,
                           "/bucket:", bytes).c_str(),
              [=](benchmark::State& st) { BM_Step(st, link, kind, n, bytes); })
              ->Iterations(1)
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
}

void PrintTable() {
  std::printf("\n%-34s %10s %10s %8s %8s %8s %8s\n", "config (K=4 buckets)", "blocking",
              "overlap", "ratio", "ideal", "c ms", "m ms");
  for (const Row& r : *rows) {
    const double ideal_blocking = kBuckets * (r.c + r.m);
    const double ideal_overlap = r.c + (kBuckets - 1) * std::max(r.c, r.m) + r.m;
    std::printf("%-34s %8.1fms %8.1fms %8.2f %8.2f %8.1f %8.1f\n", r.config.c_str(),
                1e3 * r.blocking, 1e3 * r.overlapped, r.overlapped / r.blocking,
                ideal_overlap / ideal_blocking, 1e3 * r.c, 1e3 * r.m);
  }
}

}  // namespace
}  // namespace shardmap::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  shardmap::bench::Register();
  benchmark::RunSpecifiedBenchmarks();
  shardmap::bench::PrintTable();
  benchmark::Shutdown();
  return 0;
}
