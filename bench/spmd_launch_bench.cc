// The fixed cost of starting an in-process SPMD program: a global-view shard_map call of a
// trivial function, RunSpmd and RunInProcess, next to what creating and joining one thread per
// rank costs (what every call paid before rank threads were kept alive between calls).
//
//   bazel run -c opt --config=opt //bench:spmd_launch_bench
//   bazel run -c opt --config=opt //bench:spmd_launch_bench -- --benchmark_filter='world:8'
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "benchmark/benchmark.h"
#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"

namespace shardmap {
namespace {

// Raw reference: one thread per rank, created and joined (the old RunInProcess).
void SpawnJoin(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([] { benchmark::ClobberMemory(); });
    for (auto& t : threads) t.join();
  }
}

void RunInProcessBarrier(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    absl::Status s = collectives::RunInProcess(
        n, [](collectives::Communicator& comm) { return comm.Barrier(); });
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
  }
}

// A global-view call: split a [n, 4] input over tp, add one, all_gather, assemble.
void GlobalViewCall(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  Mesh mesh = *Mesh::Create({{"tp", n}});
  ShardMap f = shard_map(
      [](const std::vector<Value>& in) -> std::vector<Value> {
        return {all_gather(add_scalar(in[0], 1.0), 0, "tp")};
      },
      mesh, {P("tp", None)}, {P()});
  Tensor x = Tensor::Zeros({n, 4}, DType::kF32);
  for (auto _ : state) {
    absl::StatusOr<std::vector<Tensor>> out = f({x});
    if (!out.ok()) state.SkipWithError(std::string(out.status().message()).c_str());
  }
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgName("world");
  for (int n : {2, 8}) b->Arg(n);
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(SpawnJoin)->Name("spawn_join_threads")->Apply(Args);
BENCHMARK(RunInProcessBarrier)->Name("run_in_process_barrier")->Apply(Args);
BENCHMARK(GlobalViewCall)->Name("shard_map_global_call")->Apply(Args);

}  // namespace
}  // namespace shardmap
