// Collectives, nccl-tests style, for the in-process backend (ranks = threads sharing memory) and
// the Gloo backend (ranks = threads, each with its own Gloo context over TCP loopback, i.e. the
// traffic of one process per rank): for each op x backend x ranks x size, time per call, algbw,
// busbw, and for in-process the ratio to a memory-traffic bound measured in the same run.
//
//   bazel run -c opt --config=opt //bench:collectives_bench
//   bazel run -c opt --config=opt //bench:collectives_bench -- --benchmark_filter=all_reduce/backend:gloo/world:2/
//   bench/peers/torch_collectives.sh   # PyTorch's torch.distributed (Gloo) beside ours
//
// Names: <op>/backend:<in_process|gloo>/world:<ranks>/bytes:<size>. After the run a table adds
// the all_reduce speed ratio in_process / gloo per world and size (target: >= 3x at 16 MiB).
// size: all_reduce the buffer; all_gather the gathered output; reduce_scatter the input;
// all_to_all the send buffer (nccl-tests' conventions). algbw = size / time; busbw = algbw *
// 2(n-1)/n for all_reduce and (n-1)/n for the others (nccl-tests' formulas).
// bound (in-process only): each rank reads its input and writes its output once at the
// single-thread memcpy rate R(size) measured here (memcpy of B bytes moves 2B bytes in B/R
// seconds); with more ranks than cores the ranks time-share, so the bound time is multiplied by
// n / cores. bound_ratio = bound time / measured time (1.0 = as fast as each rank streaming its
// own data once; target for all_reduce >= 0.5 at >= 16 MiB). Ours reads ~2x and writes ~1x the
// buffer per rank (reduce own slice from all peers, then copy the others' slices), so 0.67 is
// its ideal. par_ratio = the same bound measured directly: n threads each memcpy-ing that traffic
// at once, right after the collective (captures shared memory bandwidth and time-sharing).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "collectives/communicator.h"
#include "collectives/gloo_threads.h"
#include "collectives/in_process.h"

namespace shardmap::collectives {
namespace {

using Clock = std::chrono::steady_clock;

enum class Bench { kAllReduce, kAllGather, kReduceScatter, kAllToAll };
constexpr const char* kNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
enum class Backend { kInProcess, kGloo };
constexpr const char* kBackends[] = {"in_process", "gloo"};

absl::Status RunWorld(Backend b, int n, const std::function<absl::Status(Communicator&)>& fn) {
  if (b == Backend::kGloo) return RunGlooThreads(n, fn);
  return RunInProcess(n, fn);
}

// Per-config memory cap (all ranks' buffers): the machine is shared.
constexpr size_t kMaxTotalBytes = size_t{5} << 29;  // 2.5 GiB

struct Row {
  Backend backend;
  Bench op;
  int n;
  size_t bytes;
  double seconds;
  double algbw;
  double busbw;
  double bound_ratio;
  double par_ratio;
};
std::vector<Row>* rows = new std::vector<Row>;

int Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Best single-thread memcpy rate (bytes/s) for `bytes`-sized copies, measured right next to each
// collective so that load from other processes on this shared machine hits both alike.
double MemcpyRate(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const int reps = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 3, 20000));
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      benchmark::DoNotOptimize(b.data());
      benchmark::ClobberMemory();
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return bytes / best;
}

// Seconds for n threads that each memcpy their own `bytes` at the same time (best of 3 rounds of
// `reps` copies): what this machine gives n ranks that each stream their data once, now.
double ParallelCopySeconds(int n, size_t bytes, int reps) {
  double best = 1e30;
  std::vector<std::vector<char>> src(n, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> dst(n, std::vector<char>(bytes, 2));
  for (int trial = 0; trial < 3; ++trial) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < reps; ++i) {
          std::memcpy(dst[r].data(), src[r].data(), bytes);
          benchmark::ClobberMemory();
        }
      });
    }
    while (ready.load() < n) std::this_thread::yield();
    const auto t0 = Clock::now();
    go.store(true);
    for (auto& t : threads) t.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return best;
}

// Input / output bytes of one rank.
std::pair<size_t, size_t> RankBytes(Bench op, int n, size_t bytes) {
  switch (op) {
    case Bench::kAllReduce: return {bytes, bytes};
    case Bench::kAllGather: return {bytes / n, bytes};
    case Bench::kReduceScatter: return {bytes, bytes / n};
    case Bench::kAllToAll: return {bytes, bytes};
  }
  return {0, 0};
}

void BM_Collective(benchmark::State& state, Backend backend, Bench op, int n, size_t bytes) {
  const size_t count = bytes / sizeof(float);  // f32 elements of `size`
  const auto [in_bytes, out_bytes] = RankBytes(op, n, bytes);
  if ((in_bytes + out_bytes) * n > kMaxTotalBytes) {
    state.SkipWithError("skipped: buffers would exceed the 2.5 GiB cap on this shared machine");
    for (auto _ : state) {}
    return;
  }
  // Enough calls for ~0.25 s of streaming at ~4 GB/s, at least 3.
  const int iters = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / (bytes * 4), 3, 2000));
  for (auto _ : state) {
    double seconds = 0;
    absl::Status s = RunWorld(backend, n, [&](Communicator& c) -> absl::Status {
      std::vector<float> in(in_bytes / sizeof(float), 1.0f + c.rank());
      std::vector<float> out(out_bytes / sizeof(float), 0.0f);
      auto call = [&]() -> absl::Status {
        switch (op) {
          case Bench::kAllReduce:
            return c.AllReduce(in.data(), out.data(), count, DataType::kF32, ReduceOp::kSum);
          case Bench::kAllGather:
            return c.AllGather(in.data(), out.data(), count / n, DataType::kF32);
          case Bench::kReduceScatter:
            return c.ReduceScatter(in.data(), out.data(), count / n, DataType::kF32,
                                   ReduceOp::kSum);
          case Bench::kAllToAll:
            return c.AllToAll(in.data(), out.data(), count / n, DataType::kF32);
        }
        return absl::OkStatus();
      };
      for (int w = 0; w < 2; ++w) {
        if (absl::Status st = call(); !st.ok()) return st;
      }
      if (absl::Status st = c.Barrier(); !st.ok()) return st;
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (absl::Status st = call(); !st.ok()) return st;
      }
      if (absl::Status st = c.Barrier(); !st.ok()) return st;
      if (c.rank() == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      return absl::OkStatus();
    });
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    state.SetIterationTime(seconds);
    const double algbw = bytes / seconds;
    const double factor = op == Bench::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
    state.counters["algbw_GBps"] = algbw / 1e9;
    state.counters["busbw_GBps"] = algbw * factor / 1e9;
    Row row{backend, op, n, bytes, seconds, algbw / 1e9, algbw * factor / 1e9, 0, 0};
    if (backend == Backend::kInProcess) {
      const double rate = MemcpyRate(std::max(in_bytes, out_bytes));
      const double bound =
          (in_bytes + out_bytes) / (2 * rate) * std::max(1.0, double(n) / Cores());
      // Same traffic as reading the input and writing the output once: a copy of their mean.
      const double par = ParallelCopySeconds(n, std::max<size_t>(1, (in_bytes + out_bytes) / 2),
                                             std::min(iters, 50));
      state.counters["bound_ratio"] = row.bound_ratio = bound / seconds;
      state.counters["par_ratio"] = row.par_ratio = par / seconds;
      state.counters["memcpy_GBps"] = rate / 1e9;
    }
    rows->push_back(row);
  }
}

// In-process up to 256 MiB and 8 ranks; Gloo (TCP) up to 64 MiB and 4 ranks (3: not a power of
// two), which keeps a full run within minutes on a small machine.
void RegisterCollectives() {
  for (Backend b : {Backend::kInProcess, Backend::kGloo}) {
    const bool gloo = b == Backend::kGloo;
    const std::vector<int> worlds = gloo ? std::vector<int>{2, 3, 4} : std::vector<int>{2, 4, 8};
    const int64_t max_bytes = gloo ? int64_t{64} << 20 : int64_t{256} << 20;
    for (int op = 0; op < 4; ++op) {
      for (int n : worlds) {
        for (int64_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
          const std::string name = absl::StrCat(kNames[op], "/backend:", kBackends[int(b)],
                                                "/world:", n, "/bytes:", bytes);
          benchmark::RegisterBenchmark(name.c_str(), BM_Collective, b, static_cast<Bench>(op), n,
                                       static_cast<size_t>(bytes))
              ->Iterations(1)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  double rate = 0;
  for (auto _ : state) {
    rate = MemcpyRate(bytes);
    state.SetIterationTime(bytes / rate);
  }
  state.counters["GBps"] = rate / 1e9;
}
BENCHMARK(BM_Memcpy)->RangeMultiplier(4)->Range(4 << 10, 256 << 20)->Iterations(1)->UseManualTime();

void PrintTable() {
  if (rows->empty()) return;
  std::printf("\n# f32, out of place; %d hardware threads; gloo = ranks as threads over TCP "
              "loopback\n", Cores());
  std::printf("%-15s %-10s %5s %12s %12s %10s %10s %12s %10s\n", "op", "backend", "ranks",
              "size(B)", "time(us)", "algbw GB/s", "busbw GB/s", "bound_ratio", "par_ratio");
  for (const Row& r : *rows) {
    std::printf("%-15s %-10s %5d %12zu %12.1f %10.2f %10.2f %12.2f %10.2f\n",
                kNames[static_cast<int>(r.op)], kBackends[static_cast<int>(r.backend)], r.n,
                r.bytes, r.seconds * 1e6, r.algbw, r.busbw, r.bound_ratio, r.par_ratio);
  }
  // Speed of the in-process backend relative to Gloo, where both ran the same all_reduce.
  bool header = false;
  for (const Row& a : *rows) {
    if (a.op != Bench::kAllReduce || a.backend != Backend::kInProcess) continue;
    for (const Row& g : *rows) {
      if (g.op != a.op || g.backend != Backend::kGloo || g.n != a.n || g.bytes != a.bytes) continue;
      if (!header) {
        std::printf("\n# all_reduce: in_process / gloo speed (target >= 3x at 16 MiB)\n");
        std::printf("%5s %12s %14s %10s %8s\n", "ranks", "size(B)", "in_process us", "gloo us",
                    "ratio");
        header = true;
      }
      std::printf("%5d %12zu %14.1f %10.1f %8.2f\n", a.n, a.bytes, a.seconds * 1e6,
                  g.seconds * 1e6, g.seconds / a.seconds);
    }
  }
}

}  // namespace
}  // namespace shardmap::collectives

int main(int argc, char** argv) {
  shardmap::collectives::RegisterCollectives();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  shardmap::collectives::PrintTable();
  return 0;
}
