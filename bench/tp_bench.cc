// Tensor-parallel GPT layers (models/gpt_layers.h) on TP = 1, 2, 4, 8 simulated CPU devices
// (in-process ranks, one thread each, BLAS single-threaded): ColumnParallelLinear (d -> 4d),
// RowParallelLinear (4d -> d), the Megatron MLP, causal attention (heads of 64) and a whole
// pre-LN block; forward and forward + backward; with and without sequence parallelism.
//
//   bazel run -c opt --config=opt //bench:tp_bench                       # tokens 512, d 512
//   bazel run -c opt --config=opt //bench:tp_bench -- --d=1024 --steps=5
//       --benchmark_filter=mlp/.*fwd_bwd   (one line)
//
// Each row is one RunInProcess running `--warmup` + `--steps` steps, fenced by barriers, timed on
// rank 0 (manual time = the step's wall time). Counters:
//   FLOP/s        matmul FLOPs of the whole layer per second of step time (all ranks together)
//   comm_bytes    bytes rank 0 passed to collectives per step (bench/timed_communicator.h)
//   comm_ms       rank 0's wall time inside collectives per step (waiting for peers included)
//   compute_ms    step time minus comm_ms
//   cpu_ms        mean rank thread CPU time per step (outside and inside collectives)
//   vs_unsharded  step time over the same layer's unsharded step on one device in this run
//                 (the `.../unsharded/...` rows); < 1 means TP made the step faster
// The ranks share the machine's cores: with more ranks than idle cores, compute cannot speed up
// beyond the core count; read the rows with the core count and load printed in the context.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "bench/tp_layers.h"
#include "benchmark/benchmark.h"

namespace shardmap::bench {
namespace {

struct Flags {
  int64_t tokens = 512, d = 512;
  int steps = 3, warmup = 1;
};
Flags flags;

using Key = std::tuple<int, int, bool, bool>;  // layer, tp (0 = unsharded), sp, fwd_bwd

const absl::StatusOr<LayerTiming>& Cached(const LayerCase& c, bool unsharded) {
  static auto* cache = new std::map<Key, absl::StatusOr<LayerTiming>>();
  const Key key{static_cast<int>(c.layer), unsharded ? 0 : c.tp, unsharded ? false : c.sp,
                c.fwd_bwd};
  auto it = cache->find(key);
  if (it == cache->end()) {
    it = cache
             ->emplace(key, unsharded ? RunUnsharded(c, flags.warmup, flags.steps)
                                      : RunLayer(c, flags.warmup, flags.steps))
             .first;
  }
  return it->second;
}

void SetTimes(benchmark::State& state, const LayerTiming& t) {
  size_t i = 0;
  for (auto _ : state) state.SetIterationTime(t.seconds[i++ % t.seconds.size()]);
}

void BM_Unsharded(benchmark::State& state, LayerCase c) {
  const absl::StatusOr<LayerTiming>& t = Cached(c, true);
  if (!t.ok()) {
    state.SkipWithError(std::string(t.status().message()).c_str());
    return;
  }
  SetTimes(state, *t);
  state.counters["FLOP/s"] = LayerFlops(c) / t->Mean();
  state.counters["cpu_ms"] = 1e3 * t->cpu_seconds;
}

void BM_Layer(benchmark::State& state, LayerCase c) {
  const absl::StatusOr<LayerTiming>& t = Cached(c, false);
  if (!t.ok()) {
    state.SkipWithError(std::string(t.status().message()).c_str());
    return;
  }
  SetTimes(state, *t);
  const double mean = t->Mean();
  state.counters["FLOP/s"] = LayerFlops(c) / mean;
  state.counters["comm_bytes"] = t->comm.Total().bytes;
  state.counters["comm_ms"] = 1e3 * t->comm_seconds;
  state.counters["compute_ms"] = 1e3 * (mean - t->comm_seconds);
  state.counters["cpu_ms"] = 1e3 * t->cpu_seconds;
  const absl::StatusOr<LayerTiming>& one = Cached(c, true);
  if (one.ok()) state.counters["vs_unsharded"] = mean / one->Mean();
}

void Register() {
  for (Layer layer :
       {Layer::kColumn, Layer::kRow, Layer::kMlp, Layer::kAttention, Layer::kBlock}) {
    for (bool fwd_bwd : {false, true}) {
      LayerCase base{layer, 1, false, fwd_bwd, flags.tokens, flags.d};
      const std::string one = std::string(LayerName(layer)) + "/unsharded/tokens:" +
                              std::to_string(flags.tokens) + "/d:" + std::to_string(flags.d) +
                              (fwd_bwd ? "/fwd_bwd" : "/fwd");
      benchmark::RegisterBenchmark(one.c_str(), BM_Unsharded, base)
          ->UseManualTime()
          ->Iterations(flags.steps)
          ->Unit(benchmark::kMillisecond);
      for (bool sp : {false, true}) {
        for (int tp : {1, 2, 4, 8}) {
          LayerCase c{layer, tp, sp, fwd_bwd, flags.tokens, flags.d};
          benchmark::RegisterBenchmark(c.Name().c_str(), BM_Layer, c)
              ->UseManualTime()
              ->Iterations(flags.steps)
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace
}  // namespace shardmap::bench

ABSL_FLAG(int64_t, tokens, 512, "tokens per layer step (global, before the tp split)");
ABSL_FLAG(int64_t, d, 512, "hidden size (ffn 4d; heads of 64)");
ABSL_FLAG(int32_t, steps, 3, "measured steps per row");
ABSL_FLAG(int32_t, warmup, 1, "warm-up steps per row");

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // takes the --benchmark_* flags out of argv
  absl::ParseCommandLine(argc, argv);
  auto& f = shardmap::bench::flags;
  f = {absl::GetFlag(FLAGS_tokens), absl::GetFlag(FLAGS_d), absl::GetFlag(FLAGS_steps),
       absl::GetFlag(FLAGS_warmup)};
  if (f.tokens < 1 || f.d < 64 || f.d % 64 != 0 || f.steps < 1 || f.warmup < 0) {
    std::fprintf(stderr, "tp_bench: --tokens=%lld --d=%lld --steps=%d --warmup=%d: need tokens >= 1, "
                 "d a positive multiple of 64 (heads of 64), steps >= 1, warmup >= 0\n",
                 static_cast<long long>(f.tokens), static_cast<long long>(f.d), f.steps, f.warmup);
    return 2;
  }
  benchmark::AddCustomContext("hardware_threads", std::to_string(std::thread::hardware_concurrency()));
  benchmark::AddCustomContext("loadavg_at_start", shardmap::bench::LoadAverage());
  benchmark::AddCustomContext("devices", "simulated CPU (in-process ranks, f32)");
  shardmap::bench::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
