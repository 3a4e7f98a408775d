// The NCCL overlap check of the GPU bundle (tools/gpu_run.sh, section "overlap"): one process
// per rank, started by collectives/launch (one GPU per process, or two processes sharing one GPU
// where NCCL allows it). Two parts, both on the NCCL backend:
//   streams  a started all-reduce (64 Mi floats) beside 8 bf16 4096^3 matmuls on the compute
//            stream: the communication stream's span against the compute stream's.
//   gpt      a small GPT (4 layers, d 768) trained with data parallelism over every rank,
//            --overlap on then off, `--steps` steps each: per step the started calls' spans
//            (SetNcclStartedCallTimeline: CUDA events on both streams), the host waits
//            (base/host_waits.h, this process), the step time and the host waits
//            expected: the loss read alone (d2h_read=1). The blocking collectives are
//            stream-ordered (collectives/nccl_communicator.h: enqueued, watched by the world's
//            watchdog, no host wait); they are listed per step, and the world's status
//            (CheckNcclWorld) must be OK after each step.
// Per step: comm_ms (union of the collectives' spans), compute_ms (union of [ready, joined] less
// the times the compute stream stood waiting for a collective, [joined, end]), overlap_ms (their
// intersection). Rank 0 writes everything as JSON (--json=PATH) and a summary on stdout.
//
//   collectives/launch --nproc_per_node=2 -- tests/gpu_nccl_overlap_check --json=/tmp/o.json
//
// Exit 0: the check ran and passed (overlap > 0 where a started collective moved data between
// ranks, or, alone, in the streams part; in every step after the first exactly one host wait,
// the loss read, and any other kind of wait fails the check; the NCCL world OK after each step);
// 1: it ran and failed, or an error; 2: no GPU or no NCCL.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/host_waits.h"
#include "collectives/nccl_communicator.h"
#include "collectives/stream_overlap.h"
#include "models/gpt/gpt_model.h"
#include "models/parallel/parallel_dims.h"
#include "models/train/trainer.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/matmul.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

using base::HostWait;
using base::HostWaitCounts;
using base::HostWaitSnapshot;
using collectives::StartedCallSpan;

using Overlap = collectives::StreamOverlap;

Overlap Measure(const std::vector<StartedCallSpan>& spans) {
  std::vector<collectives::StartedCallTimes> times;
  for (const StartedCallSpan& s : spans) {
    times.push_back({s.ready_ms, s.begin_ms, s.end_ms, s.joined_ms});
  }
  return collectives::MeasureStartedCalls(times);
}

std::string WaitsJson(const HostWaitCounts& w) {
  std::vector<std::string> kinds;
  for (int k = 0; k < base::kHostWaitKinds; ++k) {
    if (w.by_kind[k] == 0) continue;
    kinds.push_back(absl::StrFormat("\"%s\": %d", base::HostWaitName(static_cast<HostWait>(k)),
                                    w.by_kind[k]));
  }
  return absl::StrCat("{\"total\": ", w.total(), ", \"by_kind\": {", absl::StrJoin(kinds, ", "),
                      "}}");
}

std::string OverlapJson(const Overlap& o) {
  return absl::StrFormat("\"calls\": %d, \"comm_ms\": %.4f, \"compute_ms\": %.4f, "
                         "\"overlap_ms\": %.4f",
                         o.calls, o.comm, o.compute, o.overlap);
}

// The streams part: started all-reduces beside matmuls, 3 repetitions after a warm-up.
absl::StatusOr<std::string> StreamsPart(collectives::Communicator& comm, bool* overlapped,
                                        bool* no_waits) {
  const int dev = comm.memory_space().device_index;
  cuda::StreamScope scope(dev, static_cast<cuda::StreamHandle>(comm.memory_space().stream));
  const int64_t n = 4096, count = int64_t{64} << 20;
  std::vector<std::string> reps;
  absl::Status status = CatchOpError([&] {
    Tensor a = Tensor::Ones({n, n}, DType::kBF16, Device::Cuda(dev));
    Tensor b = Tensor::Ones({n, n}, DType::kBF16, Device::Cuda(dev));
    Tensor buf = Tensor::Ones({count}, DType::kF32, Device::Cuda(dev));
    Tensor out = Tensor::Zeros({count}, DType::kF32, Device::Cuda(dev));
    for (int rep = -1; rep < 3; ++rep) {  // -1: the warm-up (opens the lane, tunes the GEMM)
      collectives::SetNcclStartedCallTimeline(rep >= 0);
      const HostWaitCounts before = HostWaitSnapshot();
      auto h = comm.AllReduceStart(buf.raw_data(), out.raw_data(), count,
                                   collectives::DataType::kF32, collectives::ReduceOp::kSum);
      if (!h.ok()) OpFail(h.status().ToString());
      for (int i = 0; i < 8; ++i) Tensor c = Matmul(a, b);
      if (absl::Status s = (*h)->Wait(); !s.ok()) OpFail(s.ToString());
      const HostWaitCounts waits = HostWaitSnapshot() - before;
      cuda::Synchronize(dev);
      absl::StatusOr<std::vector<StartedCallSpan>> spans =
          collectives::TakeNcclStartedCallTimeline();
      if (!spans.ok()) OpFail(spans.status().ToString());
      if (rep < 0) continue;
      const Overlap o = Measure(*spans);
      if (o.overlap > 0) *overlapped = true;
      if (rep > 0 && waits.total() != 0) *no_waits = false;
      reps.push_back(absl::StrCat("{\"rep\": ", rep, ", ", OverlapJson(o),
                                  ", \"host_waits\": ", WaitsJson(waits), "}"));
      std::printf("streams rep %d: comm %.3f ms, compute %.3f ms, overlap %.3f ms, host waits %s\n",
                  rep, o.comm, o.compute, o.overlap, waits.ToString().c_str());
    }
  });
  collectives::SetNcclStartedCallTimeline(false);
  if (!status.ok()) return status;
  return absl::StrCat("[", absl::StrJoin(reps, ", "), "]");
}

struct StepSample {
  int64_t step = 0;
  double seconds = 0;
  HostWaitCounts waits;
  int64_t expected = 1;  // the loss read (d2h_read), the only host wait of a step
  std::vector<std::string> blocking;  // its blocking collectives over > 1 rank (stream-ordered)
  absl::Status world;                 // CheckNcclWorld after the step
  Overlap overlap;
};

GptConfig SmallGpt() {
  GptConfig cfg;
  cfg.layers = 4;
  cfg.d_model = 768;
  cfg.heads = 12;
  cfg.vocab = 8192;
  cfg.seq = 512;
  cfg.dtype = DType::kF32;
  cfg.compute = DType::kBF16;
  return cfg;
}

// One run of `steps` steps with overlap `on`; per-step samples of this process.
absl::StatusOr<std::vector<StepSample>> GptRun(collectives::Communicator& comm, bool on,
                                               int64_t steps) {
  const GptConfig cfg = SmallGpt();
  absl::StatusOr<Mesh> mesh = ParseMesh(absl::StrCat("dp=", comm.size()));
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, cfg, /*sp=*/false);
  if (!layout.ok()) return layout.status();
  std::vector<int64_t> tokens(200000);
  std::mt19937_64 rng(1);
  for (int64_t& t : tokens) t = static_cast<int64_t>(rng() % cfg.vocab);
  TrainOptions o;
  o.steps = steps;
  o.batch = 8 * comm.size();
  o.runtime.comm = &comm;
  o.runtime.cuda_graph = false;  // not captured with a process communicator anyway
  o.overlap.on = on;
  o.overlap.bucket_bytes = int64_t{8} << 20;  // several buckets started in each backward
  std::vector<StepSample> samples;
  HostWaitCounts at_start;
  o.hooks.on_phase = [&](const char* phase) {
    if (std::string(phase) != "step") return;
    (void)collectives::TakeNcclStartedCallTimeline();  // nothing of an earlier step
    at_start = HostWaitSnapshot();
  };
  o.hooks.on_step = [&](const StepInfo& s) {
    StepSample x;
    x.waits = HostWaitSnapshot() - at_start;
    x.step = s.step;
    x.seconds = s.seconds;
    x.expected = 1;
    x.world = collectives::CheckNcclWorld(comm);
    if (s.log != nullptr && comm.size() > 1) {
      for (const CollectiveRecord& r : *s.log) {
        if (r.started || r.axes == 0) continue;
        x.blocking.push_back(r.op);
      }
    }
    absl::StatusOr<std::vector<StartedCallSpan>> spans = collectives::TakeNcclStartedCallTimeline();
    if (spans.ok()) x.overlap = Measure(*spans);
    samples.push_back(std::move(x));
  };
  collectives::SetNcclStartedCallTimeline(on);
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, /*seed=*/1), tokens, o);
  collectives::SetNcclStartedCallTimeline(false);
  if (!r.ok()) return r.status();
  return samples;
}

std::string SamplesJson(const std::vector<StepSample>& v) {
  std::vector<std::string> rows;
  for (const StepSample& s : v) {
    std::vector<std::string> ops;
    for (const std::string& op : s.blocking) ops.push_back(absl::StrCat("\"", op, "\""));
    rows.push_back(absl::StrFormat(
        "{\"step\": %d, \"seconds\": %.6f, \"host_waits\": %s, \"expected_host_waits\": %d, "
        "\"blocking_collectives\": [%s], %s}",
        s.step, s.seconds, WaitsJson(s.waits), s.expected, absl::StrJoin(ops, ", "),
        OverlapJson(s.overlap)));
  }
  return absl::StrCat("[", absl::StrJoin(rows, ", "), "]");
}

// The mean step time after the first step; 0 without such steps.
double MeanSeconds(const std::vector<StepSample>& v) {
  double sum = 0;
  int n = 0;
  for (size_t i = 1; i < v.size(); ++i, ++n) sum += v[i].seconds;
  return n > 0 ? sum / n : 0;
}

// Prints the summary and writes the JSON (rank 0); returns the exit status.
int Report(const collectives::Communicator& comm, const std::string& streams, bool overlapped,
           bool no_waits, const std::vector<StepSample>& on, const std::vector<StepSample>& off,
           const std::string& json_path) {
  double gpt_overlap = 0, gpt_comm = 0;
  bool waits_ok = true;
  std::string why;
  for (const std::vector<StepSample>* run : {&on, &off}) {
    for (size_t i = 1; i < run->size(); ++i) {  // step 0 warms up (lane, autotuning, caches)
      const StepSample& s = (*run)[i];
      if (run == &on) {
        gpt_overlap += s.overlap.overlap;
        gpt_comm += s.overlap.comm;
      }
      // The loss read and nothing else: a wait of any other kind (a blocking collective, a
      // stream or device synchronisation) fails, even if the total happens to match.
      if (s.waits.total() != s.expected || s.waits[HostWait::kDeviceToHostRead] != s.expected) {
        waits_ok = false;
        absl::StrAppend(&why, "overlap ", run == &on ? "on" : "off", " step ", s.step, ": ",
                        s.waits.total(), " host waits (", s.waits.ToString(), "), expected ",
                        s.expected, " (d2h_read=1, the loss read); ");
      }
      if (!s.world.ok()) {
        waits_ok = false;
        absl::StrAppend(&why, "overlap ", run == &on ? "on" : "off", " step ", s.step,
                        ": the NCCL world failed: ",
                        absl::StrReplaceAll(s.world.message(), {{"\"", "'"}, {"\\", "/"}}),
                        "; ");
      }
    }
  }
  const bool overlap_ok = comm.size() > 1 ? gpt_overlap > 0 : overlapped;
  if (!overlap_ok) {
    absl::StrAppend(&why, comm.size() > 1 ? "the GPT steps' collectives never overlapped compute"
                                          : "the streams part never overlapped", "; ");
  }
  if (!no_waits) absl::StrAppend(&why, "a started call and its Wait() waited on the host; ");
  const bool pass = overlap_ok && waits_ok && no_waits;
  const double t_on = MeanSeconds(on), t_off = MeanSeconds(off);
  const double ratio = t_off > 0 ? t_on / t_off : 0;
  if (comm.rank() != 0) return pass ? 0 : 1;
  std::printf("gpt overlap on: %.3f ms of %.3f ms of collectives overlapped (steps 1..%zu); "
              "step %.4f s on, %.4f s off (on/off %.3f)\n",
              gpt_overlap, gpt_comm, on.size() - 1, t_on, t_off, ratio);
  for (const std::vector<StepSample>* run : {&on, &off}) {
    for (const StepSample& s : *run) {
      std::printf("gpt overlap %s step %lld: %.4f s, host waits %s (expected %lld), "
                  "%d started, overlap %.3f ms\n",
                  run == &on ? "on" : "off", static_cast<long long>(s.step), s.seconds,
                  s.waits.ToString().c_str(), static_cast<long long>(s.expected),
                  s.overlap.calls, s.overlap.overlap);
    }
  }
  const std::string json = absl::StrFormat(
      "{\"world\": %d, \"pass\": %s, \"why\": \"%s\", \"streams\": %s, \"gpt\": "
      "{\"config\": \"4 layers, d 768, 12 heads, vocab 8192, seq 512, batch 8 per rank, f32 "
      "master, bf16 compute, dp over every rank, buckets of 8 MiB\", \"overlap_ms\": %.4f, "
      "\"comm_ms\": %.4f, \"step_s_on\": %.6f, \"step_s_off\": %.6f, \"ratio_on_off\": "
      "%.4f, \"on\": %s, \"off\": %s}}\n",
      comm.size(), pass ? "true" : "false", why, streams, gpt_overlap, gpt_comm, t_on, t_off,
      ratio, SamplesJson(on), SamplesJson(off));
  if (!json_path.empty()) std::ofstream(json_path) << json;
  std::printf("gpu_nccl_overlap_check %s: %d ranks%s%s\n", pass ? "PASS" : "FAIL", comm.size(),
              why.empty() ? "" : ": ", why.c_str());
  return pass ? 0 : 1;
}

int Main(int argc, char** argv) {
  std::string json_path;
  int64_t steps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--json=", 0) == 0) {
      json_path = a.substr(7);
    } else if (a.rfind("--steps=", 0) != 0 || !absl::SimpleAtoi(a.substr(8), &steps) ||
               steps < 2) {
      std::fprintf(stderr, "gpu_nccl_overlap_check: unknown or bad flag '%s' (flags: "
                   "--json=PATH, --steps=N with N >= 2)\n", a.c_str());
      return 1;
    }
  }
  if (!cuda::Available() || !collectives::NcclCompiledIn()) {
    std::fprintf(stderr, "gpu_nccl_overlap_check: no GPU or NCCL: %s\n",
                 cuda::UnavailableReason().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> made =
      collectives::CreateNcclCommunicatorFromEnv({});
  if (!made.ok()) {
    std::fprintf(stderr, "gpu_nccl_overlap_check: %s\n", made.status().ToString().c_str());
    return 1;
  }
  collectives::Communicator& comm = **made;
  bool overlapped = false, no_waits = true;
  absl::StatusOr<std::string> streams = StreamsPart(comm, &overlapped, &no_waits);
  if (!streams.ok()) {
    std::fprintf(stderr, "gpu_nccl_overlap_check: streams part: %s\n",
                 streams.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::vector<StepSample>> on = GptRun(comm, true, steps);
  absl::StatusOr<std::vector<StepSample>> off =
      on.ok() ? GptRun(comm, false, steps) : on.status();
  if (!on.ok() || !off.ok()) {
    std::fprintf(stderr, "gpu_nccl_overlap_check: gpt part: %s\n",
                 (on.ok() ? off.status() : on.status()).ToString().c_str());
    return 1;
  }
  return Report(comm, *streams, overlapped, no_waits, *on, *off, json_path);
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) { return shardmap::Main(argc, argv); }
