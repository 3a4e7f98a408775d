#include "models/planner/measure_cpu.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autograd/value_and_grad.h"
#include "collectives/in_process.h"
#include "perfmodel/alpha_beta.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/op_counter.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/random.h"

namespace shardmap::planner {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The best (smallest) per-call seconds of `fn` over `trials` timings of `reps` calls: the
// machine is shared, and the fastest sample is the least disturbed one.
template <typename F>
double BestSeconds(int trials, int reps, F&& fn) {
  fn();  // warm-up
  double best = 1e30;
  for (int t = 0; t < trials; ++t) {
    const double t0 = Now();
    for (int r = 0; r < reps; ++r) fn();
    best = std::min(best, (Now() - t0) / reps);
  }
  return best;
}

double GemmRate(int64_t dim) {
  const int64_t m = std::max<int64_t>(dim, 1024);
  Tensor a = RandomNormal({m, dim}, 1, 0, 1, DType::kF32);
  Tensor b = RandomNormal({dim, dim}, 2, 0, 1, DType::kF32);
  const double flops = 2.0 * m * dim * dim;
  const int reps = static_cast<int>(std::clamp(2e8 / flops, 1.0, 200.0));
  return flops / BestSeconds(3, reps, [&] { (void)Matmul(a, b); });
}

// GEMM throughput (flop/s summed over threads) with n threads at once.
double ConcurrentGemmRate(int n) {
  const int64_t d = 128, m = 1024;
  const double flops = 2.0 * m * d * d;
  const int reps = 40;
  std::barrier sync(n);
  std::vector<double> wall(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Tensor a = RandomNormal({m, d}, 1 + i, 0, 1, DType::kF32);
      Tensor b = RandomNormal({d, d}, 7 + i, 0, 1, DType::kF32);
      (void)Matmul(a, b);
      sync.arrive_and_wait();
      const double t0 = Now();
      for (int r = 0; r < reps; ++r) (void)Matmul(a, b);
      wall[i] = Now() - t0;
    });
  }
  for (std::thread& t : threads) t.join();
  return n * flops * reps / *std::max_element(wall.begin(), wall.end());
}

// Seconds per op of a chain of tiny typed ops, forward and tape backward, per op counted.
double OpOverhead() {
  SingleRankContext one{Mesh()};
  Value x = Value::Replicated(RandomNormal({4}, 3, 0, 1, DType::kF32));
  auto f = [](const std::vector<Value>& p) {
    Value y = p[0];
    for (int i = 0; i < 20; ++i) y = y * p[0] + 1.0;
    return sum(y, {});
  };
  int64_t ops = 0;
  {
    OpCounter counter;
    (void)value_and_grad(f, {x});
    ops = static_cast<int64_t>(counter.ops().size());
  }
  const double s = BestSeconds(5, 20, [&] { (void)value_and_grad(f, {x}); });
  return s / std::max<int64_t>(1, ops);
}

// Mean seconds of one collective (rank bytes per rank) over g in-process ranks.
absl::StatusOr<double> CollectiveSeconds(const std::string& op, int g, size_t rank_bytes) {
  const size_t count = std::max<size_t>(g, rank_bytes / 4 / g * g);
  double best = 1e30;
  const int reps = 6;
  absl::Status s = collectives::RunInProcess(g, [&](collectives::Communicator& c) {
    std::vector<float> in(count * g, 1.0f), out(count * g, 0.0f);
    std::vector<std::pair<int, int>> ring;
    for (int r = 0; r < g; ++r) ring.emplace_back(r, (r + 1) % g);
    for (int r = 0; r < reps + 1; ++r) {
      if (absl::Status st = c.Barrier(); !st.ok()) return st;
      const double t0 = Now();
      absl::Status st;
      using collectives::DataType;
      if (op == "all_reduce") {
        st = c.AllReduce(in.data(), out.data(), count, DataType::kF32, collectives::ReduceOp::kSum);
      } else if (op == "all_gather") {
        st = c.AllGather(in.data(), out.data(), count, DataType::kF32);
      } else if (op == "reduce_scatter") {
        st = c.ReduceScatter(in.data(), out.data(), count / g, DataType::kF32,
                             collectives::ReduceOp::kSum);
      } else if (op == "all_to_all") {
        st = c.AllToAll(in.data(), out.data(), count / g, DataType::kF32);
      } else {
        st = c.Ppermute(in.data(), out.data(), count, DataType::kF32, ring);
      }
      if (!st.ok()) return st;
      if (absl::Status b = c.Barrier(); !b.ok()) return b;
      if (c.rank() == 0 && r > 0) best = std::min(best, Now() - t0);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return best;  // the least disturbed call: the machine may be shared
}

// Seconds of `iters` rounds in which `threads` in-process ranks each run `reps` one-thread GEMMs
// and then (when `sync`) a 64-byte all_reduce over all of them; the best of 3.
absl::StatusOr<double> RoundsSeconds(int threads, int reps, int iters, bool sync) {
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    double wall = 0;
    absl::Status s = collectives::RunInProcess(threads, [&](collectives::Communicator& c) {
      Tensor a = RandomNormal({256, 128}, 1 + c.rank(), 0, 1, DType::kF32);
      Tensor b = RandomNormal({128, 128}, 2, 0, 1, DType::kF32);
      std::vector<float> in(16, 1.0f), out(16, 0.0f);
      (void)Matmul(a, b);
      if (absl::Status st = c.Barrier(); !st.ok()) return st;
      const double t0 = Now();
      for (int i = 0; i < iters; ++i) {
        for (int r = 0; r < reps; ++r) (void)Matmul(a, b);
        if (!sync) continue;
        if (absl::Status st = c.AllReduce(in.data(), out.data(), in.size(),
                                          collectives::DataType::kF32,
                                          collectives::ReduceOp::kSum);
            !st.ok()) {
          return st;
        }
      }
      if (absl::Status st = c.Barrier(); !st.ok()) return st;
      if (c.rank() == 0) wall = Now() - t0;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    best = std::min(best, wall);
  }
  return best;
}

}  // namespace

absl::StatusOr<double> OversubscribedSyncSeconds(int threads, double chunk_s, int iters) {
  if (threads < 2 || !(chunk_s > 0) || iters < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "OversubscribedSyncSeconds: %d threads, chunks of %g s, %d rounds; need >= 2 threads, "
        "a positive chunk and >= 1 round",
        threads, chunk_s, iters));
  }
  Tensor a = RandomNormal({256, 128}, 1, 0, 1, DType::kF32);
  Tensor b = RandomNormal({128, 128}, 2, 0, 1, DType::kF32);
  const double one = BestSeconds(3, 20, [&] { (void)Matmul(a, b); });
  const int reps = std::max(1, static_cast<int>(chunk_s / std::max(one, 1e-9)));
  absl::StatusOr<double> with = RoundsSeconds(threads, reps, iters, true);
  if (!with.ok()) return with.status();
  absl::StatusOr<double> without = RoundsSeconds(threads, reps, iters, false);
  if (!without.ok()) return without.status();
  return std::max(0.0, (*with - *without) / iters);
}

double TimeGemmShape(const GemmKey& g, int trials) {
  // The operands as the op holds them: a^T stored [k, m], b^T stored [n, k]; batched with
  // leading dims (rank 3), else rank 2 (a rank-2 rhs folds the lhs's leading dims into m).
  auto dims = [&](int64_t rows, int64_t cols) {
    return g.batch > 1 ? Shape{g.batch, rows, cols} : Shape{rows, cols};
  };
  Tensor a = RandomNormal(g.trans_a ? dims(g.k, g.m) : dims(g.m, g.k), 11, 0, 1, g.dtype);
  Tensor b = RandomNormal(g.trans_b ? dims(g.n, g.k) : dims(g.k, g.n), 12, 0, 1, g.dtype);
  const double flops = 2.0 * g.batch * g.m * g.n * g.k;
  // About 2 ms a timing (at least one call): enough calls that the clock's resolution and one
  // preemption do not dominate, few enough that a hundred shapes take seconds.
  const int reps = static_cast<int>(std::clamp(5e7 / flops, 1.0, 2000.0));
  return BestSeconds(trials, reps, [&] { (void)Matmul(a, b, g.trans_a, g.trans_b); });
}

absl::StatusOr<int> MeasureGemmShapes(const std::vector<RoleWork>& roles,
                                      HardwareProfile* profile) {
  if (profile == nullptr) return absl::InvalidArgumentError("MeasureGemmShapes: null profile");
  int timed = 0;
  for (const RoleWork& r : roles) {
    for (const GemmWork& w : r.gemms) {
      if (w.batch <= 0 || w.m <= 0 || w.n <= 0 || w.k <= 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "MeasureGemmShapes: role '%s' has a GEMM of batch %d, m %d, n %d, k %d; every "
            "dimension must be >= 1",
            r.role, w.batch, w.m, w.n, w.k));
      }
      const GemmKey key = GemmKey::Of(w);
      if (profile->gemm_exact.count(key)) continue;
      const double s = TimeGemmShape(key);
      profile->gemm_exact[key] = 2.0 * key.batch * key.m * key.n * key.k / std::max(s, 1e-9);
      ++timed;
    }
  }
  return timed;
}

absl::StatusOr<HardwareProfile> MeasureCpuProfile(const CpuMeasureOptions& o) {
  HardwareProfile p;
  p.name = "cpu_measured";
  p.sources.push_back(absl::StrCat("measured on this machine by MeasureCpuProfile (",
                                   std::thread::hardware_concurrency(), " hardware threads)"));
  p.gpus_per_node = 1 << 20;  // every simulated rank shares one memory: one node
  p.memory_bytes = o.memory_bytes;
  p.overlap = 0;  // in-process collectives run inline on the rank's thread
  p.op_overhead_s = OpOverhead();
  for (int64_t d : {8, 16, 32, 64, 128, 256, 512}) {
    p.gemm[DType::kF32].emplace_back(static_cast<double>(d), GemmRate(d));
  }
  p.peak_flops[DType::kF32] = p.gemm[DType::kF32].back().second;
  {
    const int64_t n = int64_t{1} << 22;
    Tensor a = RandomNormal({n}, 4, 0, 1, DType::kF32), b = RandomNormal({n}, 5, 0, 1, DType::kF32);
    p.memory_bandwidth = 3.0 * 4 * n / BestSeconds(3, 5, [&] { (void)Add(a, b); });
    SingleRankContext one{Mesh()};
    Value x = Value::Replicated(a);
    // GELU (tanh): 8 flops per element as the OpCounter counts it.
    p.vector_flops = 8.0 * n / BestSeconds(3, 3, [&] { (void)gelu(x); });
  }
  p.cores = SampleLoad(o.threads_for_cores).cores;
  p.intra = {1e-5, p.memory_bandwidth / 2};  // unused where a fit exists
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ppermute"}) {
    for (int g = 2; o.collectives && g <= o.max_group; g *= 2) {
      std::vector<double> xs, ys;
      for (size_t bytes : {size_t{16} << 10, size_t{256} << 10, size_t{2} << 20}) {
        absl::StatusOr<double> s = CollectiveSeconds(op, g, bytes);
        if (!s.ok()) return s.status();
        xs.push_back(static_cast<double>(bytes));
        ys.push_back(*s);
      }
      const perfmodel::AlphaBeta ab = perfmodel::FitAlphaBeta(xs, ys);
      p.fitted[{op, g}] = {std::max(0.0, ab.alpha_s), std::max(0.0, ab.seconds_per_byte)};
    }
  }
  // Ranks beyond the cores: what each synchronising collective costs them (2x and 4x the
  // hardware threads, the oversubscription of simulated meshes on a small machine).
  const int hw_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int t : {2 * hw_threads, 4 * hw_threads}) {
    if (!o.collectives || t > o.max_oversubscribed) break;
    absl::StatusOr<double> s = OversubscribedSyncSeconds(t);
    if (!s.ok()) return s.status();
    p.oversubscribed_sync[t] = *s;
  }
  p.sources.push_back(absl::StrFormat("effective cores %.2f (GEMM throughput of %d threads / 1)",
                                      p.cores, o.threads_for_cores));
  return p;
}

LoadSample SampleLoad(int threads) {
  // Best of 3 each (a single sample on a shared machine can be off by 2x either way), and no more
  // cores than the hardware has.
  LoadSample s;
  double many = 0;
  for (int i = 0; i < 3; ++i) {
    s.gemm_rate = std::max(s.gemm_rate, ConcurrentGemmRate(1));
    many = std::max(many, ConcurrentGemmRate(threads));
  }
  const double hw = std::max(1u, std::thread::hardware_concurrency());
  s.cores = std::clamp(many / s.gemm_rate, 1.0, std::min<double>(threads, hw));
  return s;
}

HardwareProfile AtLoad(const HardwareProfile& profile, const LoadSample& then,
                       const LoadSample& now) {
  HardwareProfile p = profile;
  const double f = now.gemm_rate / then.gemm_rate;
  for (auto& [d, pts] : p.gemm) {
    for (auto& pt : pts) pt.second *= f;
  }
  for (auto& [k, r] : p.gemm_exact) r *= f;
  for (auto& [k, r] : p.op_rate) r *= f;
  for (auto& [k, r] : p.shared_op_rate) r *= f;
  for (auto& [d, r] : p.peak_flops) r *= f;
  p.memory_bandwidth *= f;
  p.vector_flops *= f;
  p.op_overhead_s /= f;
  for (auto& [k, c] : p.fitted) {
    c.alpha_s /= f;
    c.seconds_per_byte /= f;
  }
  p.cores = now.cores;
  return p;
}

absl::StatusOr<double> FrameworkOpSeconds(double step_s, double modelled_work_s,
                                          int64_t op_count) {
  if (op_count <= 0 || !(step_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FrameworkOpSeconds: a step of ", step_s, " s with ", op_count,
        " ops; give a measured step time > 0 and its profile's op count > 0"));
  }
  return std::max(0.0, step_s - modelled_work_s) / static_cast<double>(op_count);
}

absl::StatusOr<HardwareProfile> WithStepOtherOpRate(const HardwareProfile& profile, double step_s,
                                                    double gemm_s, double other_s,
                                                    double overhead_s, double* slowdown) {
  const double left = step_s - gemm_s - overhead_s;
  if (!(other_s > 0) || !(left > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WithStepOtherOpRate: a step of ", step_s, " s with modelled GEMMs ", gemm_s,
        " s, per-op ", overhead_s, " s and other ops ", other_s,
        " s leaves no time for its other ops; measure a step with non-GEMM work"));
  }
  const double f = left / other_s;
  HardwareProfile p = profile;
  p.memory_bandwidth /= f;
  p.vector_flops /= f;
  if (slowdown != nullptr) *slowdown = f;
  return p;
}

absl::StatusOr<std::vector<OpRateRow>> WithOpRates(const std::vector<OpCount>& timed_ops,
                                                   double fixed_op_s, HardwareProfile* profile) {
  std::map<std::pair<std::string, DType>, OpRateRow> kinds;
  double timed = 0;
  for (const OpCount& o : timed_ops) {
    timed += o.seconds;
    if (o.gemm.has_value() || IsGemmOpName(o.op)) continue;
    OpRateRow& r = kinds[{o.op, o.dtype}];
    r.op = o.op;
    r.dtype = o.dtype;
    ++r.count;
    r.bytes += o.bytes;
    r.seconds += o.seconds;
  }
  if (!timed_ops.empty() && !(timed > 0)) {
    return absl::InvalidArgumentError(
        "WithOpRates: the op records carry no times; count them with OpCounter(OpCounter::kTimed)");
  }
  std::vector<OpRateRow> rows;
  for (auto& [key, r] : kinds) {
    const double beyond = r.seconds - r.count * fixed_op_s;
    if (r.bytes > 0 && beyond > 0.25 * r.seconds) {
      r.rate = r.bytes / beyond;
      profile->op_rate[key] = r.rate;
    }
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end(),
            [](const OpRateRow& a, const OpRateRow& b) { return a.seconds > b.seconds; });
  return rows;
}

}  // namespace shardmap::planner
