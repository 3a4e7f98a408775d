// Pipeline parallelism on simulated CPU devices: for GPipe and 1F1B at pp 2 and 4 and several
// microbatch counts m, one GPT-2 training step (4 layers, d_model 128, 4 heads, seq 128, vocab
// 256, batch 16, f32) reports
//   bubble_measured  1 - (time in forwards and backwards) / (time of the whole timetable),
//                    mean over ranks, of the second step (the first creates communicators);
//   bubble_theory    (p-1)/(m+p-1), the idle share of the lockstep ticks;
//   peak_act_KiB     rank 0's (stage 0's) peak of activations held for backward
//                    (Tape::peak_saved_bytes), and its ratio to GPipe's at the same p and m
//                    (theory: min(p, m) / m).
// The ranks are threads sharing the machine's cores, so the measured bubble also holds the
// threads' contention; compare rows of one run.
//
//   bazel run -c opt --config=opt //bench:pipeline_bench
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_tokens.h"
#include "models/gpt.h"

namespace shardmap {
namespace {

GptConfig BenchConfig() {
  GptConfig c;
  c.layers = 4;
  c.d_model = 128;
  c.heads = 4;
  c.vocab = 256;
  c.seq = 128;
  c.dtype = DType::kF32;
  return c;
}

std::vector<int64_t> Tokens() { return bench::RandomTokens(1 << 15, 256); }

int Main() {
  std::printf("%-6s %3s %3s %16s %14s %13s %15s %10s\n", "sched", "p", "m", "bubble_measured",
              "bubble_theory", "peak_act_KiB", "peak_vs_gpipe", "ms/step");
  for (int p : {2, 4}) {
    for (int m : {1, 4, 16}) {
      std::map<std::string, double> gpipe_peak;
      for (const char* sched : {"gpipe", "1f1b"}) {
        GptLayout layout =
            *GptLayout::Create(*ParseMesh("pp=" + std::to_string(p)), BenchConfig(), false);
        TrainOptions o;
        o.steps = 2;
        o.batch = 16;
        o.pipeline.microbatches = m;
        o.pipeline.schedule = sched;
        double seconds = 0;
        o.hooks.on_step = [&](const StepInfo& s) {
          if (s.step == 1) seconds = s.seconds;
        };
        absl::StatusOr<TrainResult> r =
            TrainGpt(layout, InitGpt(BenchConfig(), 1), Tokens(), o);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
          return 1;
        }
        const double peak = r->peak_activation_bytes_per_rank / 1024.0;
        if (std::string(sched) == "gpipe") gpipe_peak["p"] = peak;
        std::printf("%-6s %3d %3d %16.3f %14.3f %13.0f %15.3f %10.1f\n", sched, p, m,
                    r->pipeline_bubble, static_cast<double>(p - 1) / (m + p - 1), peak,
                    peak / gpipe_peak["p"], seconds * 1e3);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace shardmap

int main() { return shardmap::Main(); }
