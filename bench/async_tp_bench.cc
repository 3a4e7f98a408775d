// Async TP (collective matmul, models/parallel/async_tp.h) against the plain sequence-parallel MLP
// (models/parallel/layers.h): one forward + backward step of the SP MLP (tokens 512, d 512, ffn 2048,
// f32) on TP = 2 and 4 simulated CPU devices (in-process ranks).
//
//   bazel run -c opt --config=opt //bench:async_tp_bench
//
// Each case is one RunSpmd running warm-up + measured steps; every step is fenced by world
// barriers and timed on rank 0 (manual time). Counters: comm_KiB (rank 0's logged collective
// bytes per step: what each call took from the rank, so a reduce_scatter counts its whole input
// and a ring step its one block), and on the ring rows ring_over_plain, the ring step's mean time over the plain step's at
// the same TP in this run (< 1: the ring is faster). On a machine with fewer cores than ranks the
// ranks share cores, so there is no idle core for a transfer to overlap with: read the ratio with
// the core count printed in the context.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "autograd/value_and_grad.h"
#include "benchmark/benchmark.h"
#include "models/parallel/async_tp.h"
#include "models/parallel/layers.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/partition_spec.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

constexpr int64_t kTokens = 512, kD = 512, kFfn = 2048;
constexpr int kWarmup = 2, kMeasured = 8;

struct Measured {
  std::vector<double> seconds;
  double comm_bytes = 0;  // per step, rank 0
  double Mean() const {
    double s = 0;
    for (double x : seconds) s += x;
    return s / seconds.size();
  }
};

Tensor Init(std::vector<int64_t> shape, uint64_t seed) {
  return RandomNormal(shape, seed, 0.0, 0.02, DType::kF32);
}

Measured Run(bool ring, int tp) {
  Mesh mesh = *Mesh::Create({{"tp", tp}});
  const std::vector<Tensor> whole = {Init({kTokens, kD}, 1), Init({kD, kFfn}, 2),
                                     Init({kFfn}, 3), Init({kFfn, kD}, 4), Init({kD}, 5)};
  const std::vector<PartitionSpec> specs = {P("tp"), P(None, "tp"), P("tp"), P("tp", None), P()};
  Measured m;
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    std::vector<Value> params;
    for (size_t k = 0; k < whole.size(); ++k) {
      Value v(ShardOf(whole[k], mesh, specs[k], ctx.rank()), specs[k].InputType(mesh));
      v.type.set_mesh_id(mesh.id());
      params.push_back(v);
    }
    const TensorParallel par{"tp", /*sp=*/true};
    auto loss = [&](const std::vector<Value>& p) {
      Value y = ring ? RingMlp{RingColumnParallelLinear{p[1], p[2], par},
                               RingRowParallelLinear{p[3], p[4], par}}(p[0])
                     : Mlp{ColumnParallelLinear{p[1], p[2], par},
                           RowParallelLinear{p[3], p[4], par}}(p[0]);
      return sum_partial(y * y, {});
    };
    for (int step = 0; step < kWarmup + kMeasured; ++step) {
      if (!ctx.world().Barrier().ok()) OpFail("barrier failed");
      ctx.ClearCollectiveLog();
      const absl::Time t0 = absl::Now();
      ValueAndGrad r = value_and_grad(loss, params);
      if (!ctx.world().Barrier().ok()) OpFail("barrier failed");
      const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
      if (ctx.rank() == 0 && step >= kWarmup) {
        m.seconds.push_back(seconds);
        double bytes = 0;
        for (const CollectiveRecord& c : ctx.collective_log()) bytes += c.bytes;
        m.comm_bytes = bytes;
      }
    }
  });
  if (!s.ok()) {
    m.seconds.assign(1, 0.0);
    m.comm_bytes = -1;
    fprintf(stderr, "async_tp_bench: %s\n", std::string(s.message()).c_str());
  }
  return m;
}

const Measured& Cached(bool ring, int tp) {
  static auto* cache = new std::map<std::pair<bool, int>, Measured>();
  auto it = cache->find({ring, tp});
  if (it == cache->end()) it = cache->emplace(std::make_pair(ring, tp), Run(ring, tp)).first;
  return it->second;
}

void BM_SpMlp(benchmark::State& state, bool ring, int tp) {
  const Measured& m = Cached(ring, tp);
  if (m.comm_bytes < 0) {
    state.SkipWithError("the SPMD run failed (see stderr)");
    return;
  }
  size_t i = 0;
  for (auto _ : state) state.SetIterationTime(m.seconds[i++ % m.seconds.size()]);
  state.counters["comm_KiB"] = m.comm_bytes / 1024;
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kTokens) * state.iterations(),
                         benchmark::Counter::kIsRate);
  if (ring) state.counters["ring_over_plain"] = m.Mean() / Cached(false, tp).Mean();
}

void Register() {
  for (int tp : {2, 4}) {
    for (bool ring : {false, true}) {
      const std::string name = "sp_mlp/impl:" + std::string(ring ? "ring" : "plain") +
                               "/tp:" + std::to_string(tp) + "/tokens:" +
                               std::to_string(kTokens) + "/d:" + std::to_string(kD) + "/fwd_bwd";
      benchmark::RegisterBenchmark(name.c_str(), BM_SpMlp, ring, tp)
          ->UseManualTime()
          ->Iterations(kMeasured)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  shardmap::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
