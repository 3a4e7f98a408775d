// "When does TP pay": the TP scaling model (bench/tp_model.h), validated on this machine and then
// applied to H100 figures. Prints markdown (every assumption next to its table) and, with
// --json=PATH, writes the same numbers as JSON.
//
//   bazel run -c opt --config=opt //bench:tp_model_report                  # ~1-2 min
//   bazel run -c opt --config=opt //bench:tp_model_report -- --hardware_only
//
// Validation, all in this one run on simulated CPU devices (in-process ranks, f32):
//   1. compute rate: the layer's per-rank GEMM shapes timed on t concurrent threads (t = 1, 2, 4,
//      8), giving a per-rank FLOP rate for wall time (the threads share the cores) and for CPU
//      time (each thread's own CPU clock); the same for the attention score einsums (small
//      batched products, well below the GEMM rate);
//   2. alpha-beta: all_reduce / all_gather / reduce_scatter over t in-process ranks at 3 sizes,
//      timed like collectives_bench (barrier, then the call; rank 0's wall time), fitted per op
//      and t by least squares;
//   3. the tp_bench rows (bench/tp_layers.h) measured, and predicted from 1 and 2.
#include <time.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/tp_layers.h"
#include "bench/tp_model.h"
#include "collectives/in_process.h"
#include "autograd/value_and_grad.h"
#include "shardmap/context.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "tensor/ops/matmul.h"
#include "tensor/random.h"

namespace shardmap::bench {
namespace {

struct Flags {
  int64_t tokens = 512, d = 512;
  int steps = 3;
  bool hardware_only = false;
  std::string json;
} flags;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
double ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::ostringstream json;  // the report's numbers, appended as we go
bool json_first = true;
void JsonItem(const std::string& item) {
  json << (json_first ? "\n  " : ",\n  ") << item;
  json_first = false;
}

// ---- 1. compute rate ------------------------------------------------------------------------

struct Rate {
  double wall = 0, cpu = 0;  // FLOP/s per rank: over wall time (shared cores) and own CPU time
};

// t threads at once, each running the work make_work() builds (on the thread, untimed): once
// to warm up (OpenBLAS sets up its buffers on a thread's first call, which would otherwise count
// as CPU time), then, once every thread is ready, `reps` times on the clock. Rates are per
// thread: wall (the threads share the cores) and own CPU time.
Rate TimeOnThreads(int t, int reps, double flops_per_call,
                   const std::function<std::function<void()>()>& make_work) {
  std::vector<double> cpu(t);
  double wall = 0;
  std::barrier sync(t);
  std::vector<std::thread> threads;
  for (int i = 0; i < t; ++i) {
    threads.emplace_back([&, i] {
      const std::function<void()> work = make_work();
      work();
      sync.arrive_and_wait();
      const double w0 = Now(), c0 = ThreadCpu();
      for (int r = 0; r < reps; ++r) work();
      cpu[i] = ThreadCpu() - c0;
      sync.arrive_and_wait();
      if (i == 0) wall = Now() - w0;
    });
  }
  for (std::thread& th : threads) th.join();
  Rate r;
  r.wall = flops_per_call * reps / wall;
  double c = 0;
  for (double x : cpu) c += x / t;
  r.cpu = flops_per_call * reps / c;
  return r;
}

// The per-rank GEMMs of the MLP at TP t, [T, d] x [d, 4d/t] and [T, 4d/t] x [4d/t, d], on t
// threads at once.
Rate MeasureGemmRate(int t, int reps) {
  const int64_t T = flags.tokens, d = flags.d, f = 4 * flags.d / t;
  Tensor x = RandomNormal({T, d}, 1, 0, 1, DType::kF32), w1 = RandomNormal({d, f}, 2, 0, 1, DType::kF32);
  Tensor h = RandomNormal({T, f}, 3, 0, 1, DType::kF32), w2 = RandomNormal({f, d}, 4, 0, 1, DType::kF32);
  (void)Matmul(x, w1);  // pins BLAS to one thread
  return TimeOnThreads(t, reps, 2.0 * (2.0 * T * d * f), [&] {
    return [&] {
      (void)Matmul(x, w1);
      (void)Matmul(h, w2);
    };
  });
}

// The attention score einsums' per-rank FLOP rate at TP t: t threads at once, each running the
// forward einsums of its heads/t heads (q k^T, then p v; [seq, 64] x [64, seq] products per
// sequence and head) through typed ops, as the layer does.
Rate MeasureAttentionEinsumRate(int t, int reps) {
  const int64_t s = std::min<int64_t>(flags.tokens, 128), b = flags.tokens / s;
  const int64_t h = std::max<int64_t>(1, flags.d / 64 / t), hd = 64;
  struct State {  // per thread: its rank context and operands
    SingleRankContext one{Mesh()};
    Value q, k;
  };
  return TimeOnThreads(t, reps, 2.0 * 2.0 * b * h * s * s * hd, [&]() -> std::function<void()> {
    auto st = std::make_shared<State>();
    st->q = Value::Replicated(RandomNormal({b, s, 1, h, hd}, 7, 0, 1, DType::kF32));
    st->k = Value::Replicated(RandomNormal({b, s, 1, h, hd}, 8, 0, 1, DType::kF32));
    return [st] {
      Value p = einsum("btchd,bschd->bhts", st->q, st->k);
      (void)einsum("bhts,bschd->bthd", p, st->k);
    };
  });
}

// The best of `trials` measurements (each rate separately): on this shared VM two GEMM threads
// sometimes each run at half their rate per CPU second for seconds at a time, so a single short
// sample can read a rate half the true one.
Rate BestOf(int trials, const std::function<Rate()>& measure) {
  Rate best;
  for (int i = 0; i < trials; ++i) {
    const Rate r = measure();
    best.wall = std::max(best.wall, r.wall);
    best.cpu = std::max(best.cpu, r.cpu);
  }
  return best;
}

// CPU seconds per attention-score element of scale + causal mask + softmax (forward, or forward
// + backward through the tape), timed on one thread over the unsharded layer's scores.
double MeasureScoreSecondsPerElement(bool fwd_bwd, int reps) {
  const int64_t s = std::min<int64_t>(flags.tokens, 128), b = flags.tokens / s,
                h = flags.d / 64;
  SingleRankContext one{Mesh()};
  Value x = Value::Replicated(RandomNormal({b, h, s, s}, 5, 0, 1, DType::kF32));
  Value g = Value::Replicated(RandomNormal({b, h, s, s}, 6, 0, 1, DType::kF32));
  auto f = [&](const std::vector<Value>& p) {
    Value y = softmax(causal_mask(p[0] * 0.125), -1);
    return fwd_bwd ? sum(y * g, {}) : y;
  };
  double cpu = 0;
  for (int r = 0; r < reps + 1; ++r) {
    const double c0 = ThreadCpu();
    if (fwd_bwd) {
      (void)value_and_grad(f, {x});
    } else {
      (void)f({x});
    }
    if (r > 0) cpu += ThreadCpu() - c0;
  }
  return cpu / reps / static_cast<double>(b * h * s * s);
}

// ---- 2. alpha-beta --------------------------------------------------------------------------

// Mean seconds of one collective of `full_bytes` over t in-process ranks (rank 0, barrier-fenced).
double TimeCollective(CollectiveKind kind, int t, double full_bytes, int reps) {
  const size_t full = static_cast<size_t>(full_bytes / 4) / t * t;
  double total = 0;
  absl::Status s = collectives::RunInProcess(t, [&](collectives::Communicator& comm) {
    std::vector<float> a(full, 1.0f), b(full, 0.0f);
    for (int r = 0; r < reps + 1; ++r) {
      if (absl::Status st = comm.Barrier(); !st.ok()) return st;
      const double t0 = Now();
      absl::Status st;
      switch (kind) {
        case CollectiveKind::kAllReduce:
          st = comm.AllReduce(a.data(), b.data(), full, collectives::DataType::kF32,
                              collectives::ReduceOp::kSum);
          break;
        case CollectiveKind::kAllGather:
          st = comm.AllGather(a.data(), b.data(), full / t, collectives::DataType::kF32);
          break;
        case CollectiveKind::kReduceScatter:
          st = comm.ReduceScatter(a.data(), b.data(), full / t, collectives::DataType::kF32,
                                  collectives::ReduceOp::kSum);
          break;
      }
      if (!st.ok()) return st;
      if (comm.rank() == 0 && r > 0) total += Now() - t0;  // the first is a warm-up
    }
    return absl::OkStatus();
  });
  if (!s.ok()) {
    fprintf(stderr, "tp_model_report: %s\n", std::string(s.message()).c_str());
    exit(1);
  }
  return total / reps;
}

// ---- 3. validation --------------------------------------------------------------------------

struct Row {
  LayerCase c;
  double wall_ms, pred_wall_ms, comm_ms, pred_comm_ms, cpu_ms, pred_cpu_ms;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Validate() {
  const int tps[] = {1, 2, 4, 8};
  printf("## Validation on this machine (simulated CPU devices)\n\n");
  printf("Machine: %u hardware threads, load average at start %s (other jobs share the cores: "
         "wall times are noisy, CPU times less so).\n\n",
         std::thread::hardware_concurrency(), LoadAverage().c_str());

  // 1.
  std::map<int, Rate> rate;
  printf("### Compute rate (GEMM, f32, one BLAS thread per rank)\n\n");
  printf("Per-rank GEMMs of the MLP at TP t ([%lld, %lld] x [%lld, 4d/t] and back), t threads at "
         "once; best of 3 trials.\n\n| t | per-rank GFLOP/s (wall) | per-rank GFLOP/s (own CPU time) |\n|---|---|---|\n",
         (long long)flags.tokens, (long long)flags.d, (long long)flags.d);
  for (int t : tps) {
    rate[t] = BestOf(3, [t] { return MeasureGemmRate(t, std::max(2, 8 / t)); });
    printf("| %d | %.2f | %.2f |\n", t, rate[t].wall / 1e9, rate[t].cpu / 1e9);
    JsonItem(absl::StrFormat(R"({"kind":"gemm_rate","t":%d,"rank_flops_wall":%.6g,"rank_flops_cpu":%.6g})",
                             t, rate[t].wall, rate[t].cpu));
  }

  std::map<int, Rate> attention_rate;
  printf("\nAttention score einsums (q k^T and p v, [%lld, 64] x [64, %lld] per sequence and head, "
         "heads / t per rank), t threads at once, best of 3 trials:\n\n| t | per-rank GFLOP/s (wall) | per-rank "
         "GFLOP/s (own CPU time) |\n|---|---|---|\n",
         (long long)std::min<int64_t>(flags.tokens, 128),
         (long long)std::min<int64_t>(flags.tokens, 128));
  for (int t : tps) {
    attention_rate[t] =
        BestOf(3, [t] { return MeasureAttentionEinsumRate(t, std::max(2, 8 / t)); });
    printf("| %d | %.2f | %.2f |\n", t, attention_rate[t].wall / 1e9, attention_rate[t].cpu / 1e9);
    JsonItem(absl::StrFormat(
        R"({"kind":"attention_einsum_rate","t":%d,"rank_flops_wall":%.6g,"rank_flops_cpu":%.6g})", t,
        attention_rate[t].wall, attention_rate[t].cpu));
  }

  const double score_s[2] = {MeasureScoreSecondsPerElement(false, 4),
                             MeasureScoreSecondsPerElement(true, 4)};
  printf("\nAttention scores (scale + causal mask + softmax, one thread, CPU time): %.2f ns per "
         "element forward, %.2f ns forward + backward.\n",
         1e9 * score_s[0], 1e9 * score_s[1]);
  JsonItem(absl::StrFormat(R"({"kind":"score_rate","fwd_s_per_elem":%.6g,"fwd_bwd_s_per_elem":%.6g})",
                           score_s[0], score_s[1]));

  // 2.
  FittedTable fit;
  const double act = flags.tokens * flags.d * 4.0;
  const std::vector<double> sizes = {act / 4, act, 4 * act};
  printf("\n### Collectives (in-process, f32), fitted seconds = alpha + bytes / beta\n\n"
         "Sizes %.0f, %.0f, %.0f bytes (full tensor), 4 calls each after a warm-up.\n\n"
         "| op | t | alpha (us) | beta (GB/s) |\n|---|---|---|---|\n",
         sizes[0], sizes[1], sizes[2]);
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    for (int t : tps) {
      std::vector<double> secs;
      for (double b : sizes) secs.push_back(TimeCollective(kind, t, b, 4));
      AlphaBeta ab = FitAlphaBeta(sizes, secs);
      fit[{kind, t}] = ab;
      printf("| %s | %d | %.1f | %.2f |\n", CollectiveName(kind), t, ab.alpha_s * 1e6,
             ab.seconds_per_byte > 0 ? 1e-9 / ab.seconds_per_byte : INFINITY);
      JsonItem(absl::StrFormat(R"({"kind":"alpha_beta","op":"%s","t":%d,"alpha_s":%.6g,"seconds_per_byte":%.6g})",
                               CollectiveName(kind), t, ab.alpha_s, ab.seconds_per_byte));
    }
  }
  const CollectiveCost cost = FittedCost(fit);

  // 3.
  printf("\n### Predicted vs measured layer steps (tokens %lld, d %lld, %d steps each)\n\n",
         (long long)flags.tokens, (long long)flags.d, flags.steps);
  printf("Prediction (wall) = LayerFlops / t / per-rank wall rate(t) + sum of fitted collective "
         "costs; prediction (CPU) = LayerFlops / t / per-rank CPU rate(t), against the ranks' "
         "mean thread CPU time outside collectives. Both rates are the GEMM rates on t threads "
         "as in the table above, measured again just before and just after each row (their mean; "
         "a row whose two rates differ by more than 10%% is measured again, up to 4 times): on "
         "this VM two GEMM threads sometimes each run at half their rate per CPU second for "
         "seconds at a time (the host placing both vCPUs on one core, or beside another tenant), "
         "so a rate from minutes earlier can describe another machine. The attention score einsums' share of "
         "LayerFlops goes at their own measured rate (CPU; on the wall clock scaled like the "
         "GEMMs). Both add the attention scores' elementwise "
         "work (elements / t at the measured ns per element). Other elementwise ops (GELU, "
         "LayerNorm, residual adds, bias), copies and the tape are not in the model, so it "
         "under-predicts by their share. err = (predicted - measured) / measured.\n\n");
  printf("| row | measured ms | predicted ms | err | comm ms meas | comm ms pred | CPU ms meas | "
         "CPU ms pred | CPU err |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  int retries = 0;  // rows measured again because the machine changed under them
  for (Layer layer : {Layer::kMlp, Layer::kAttention, Layer::kBlock}) {
    for (bool fwd_bwd : {false, true}) {
      for (bool sp : {false, true}) {
        for (int t : tps) {
          LayerCase c{layer, t, sp, fwd_bwd, flags.tokens, flags.d};
          // The machine drifts (other jobs; on this VM two GEMM threads sometimes each run at
          // half their rate per CPU second for seconds at a time): the GEMM rate is measured just before and just after the row, and a row
          // whose two rates differ by more than 10% is measured again (up to 4 times), so the
          // prediction and the measurement see the same machine.
          auto gemm_rate = [t] { return MeasureGemmRate(t, std::max(2, 8 / t)); };
          auto attention_rate_now = [&] {
            // 0 (no attention): Predict then puts all FLOPs at the GEMM rate.
            return AttentionEinsumFlops(c) > 0
                       ? MeasureAttentionEinsumRate(t, std::max(2, 8 / t)).cpu
                       : 0.0;
          };
          absl::StatusOr<LayerTiming> m;
          Rate row_rate;
          double attention_cpu = 0;
          int tries = 0;
          for (bool stable = false; !stable && tries < 4; ++tries) {
            const Rate before = gemm_rate();
            const double attention_before = attention_rate_now();
            m = RunLayer(c, 1, flags.steps);
            if (!m.ok()) break;
            const Rate after = gemm_rate();
            const double attention_after = attention_rate_now();
            stable = std::fabs(before.cpu - after.cpu) <= 0.1 * std::max(before.cpu, after.cpu) &&
                     std::fabs(attention_before - attention_after) <=
                         0.1 * std::max(attention_before, attention_after);
            row_rate = {(before.wall + after.wall) / 2, (before.cpu + after.cpu) / 2};
            attention_cpu = (attention_before + attention_after) / 2;
          }
          retries += tries - 1;
          if (!m.ok()) {
            printf("| %s | failed: %s |||||||\n", c.Name().c_str(),
                   std::string(m.status().message()).substr(0, 160).c_str());
            continue;
          }
          // The score einsums at their own rate; on the wall clock slowed down by the t
          // threads sharing the cores as much as the GEMMs are.
          const double slowdown = row_rate.cpu / row_rate.wall;
          Prediction wall = Predict(c, row_rate.wall, attention_cpu / slowdown, 4, cost);
          Prediction cpu = Predict(c, row_rate.cpu, attention_cpu, 4, cost);
          // The attention scores' elementwise work, split over t; on the wall clock slowed down
          // as the GEMMs are.
          const double scores = AttentionScoreElements(c) / t * score_s[fwd_bwd ? 1 : 0];
          cpu.compute_s += scores;
          wall.compute_s += scores * slowdown;
          Row r{c,
                1e3 * m->Mean(),
                1e3 * wall.total(),
                1e3 * m->comm_seconds,
                1e3 * wall.comm_s,
                1e3 * (m->cpu_seconds - m->comm_cpu_seconds),
                1e3 * cpu.compute_s};
          rows.push_back(r);
          printf("| %s | %.2f | %.2f | %+.0f%% | %.2f | %.2f | %.2f | %.2f | %+.0f%% |\n",
                 c.Name().c_str(), r.wall_ms, r.pred_wall_ms,
                 100 * (r.pred_wall_ms / r.wall_ms - 1), r.comm_ms, r.pred_comm_ms, r.cpu_ms,
                 r.pred_cpu_ms, 100 * (r.pred_cpu_ms / r.cpu_ms - 1));
          fflush(stdout);
          JsonItem(absl::StrFormat(
              R"({"kind":"validation","row":"%s","layer":"%s","t":%d,"sp":%s,"fwd_bwd":%s,"wall_ms":%.4f,"pred_wall_ms":%.4f,"comm_ms":%.4f,"pred_comm_ms":%.4f,"cpu_ms":%.4f,"pred_cpu_ms":%.4f})",
              c.Name(), LayerName(layer), t, sp ? "true" : "false", fwd_bwd ? "true" : "false",
              r.wall_ms, r.pred_wall_ms, r.comm_ms, r.pred_comm_ms, r.cpu_ms, r.pred_cpu_ms));
        }
      }
    }
  }
  std::vector<double> wall_err, cpu_err;
  int wall_ok = 0, cpu_ok = 0;
  for (const Row& r : rows) {
    wall_err.push_back(std::fabs(r.pred_wall_ms / r.wall_ms - 1));
    cpu_err.push_back(std::fabs(r.pred_cpu_ms / r.cpu_ms - 1));
    wall_ok += wall_err.back() <= 0.2;
    cpu_ok += cpu_err.back() <= 0.2;
  }
  printf("\nSummary over %zu rows: |err| wall median %.0f%%, max %.0f%%, within 20%%: %d; CPU "
         "median %.0f%%, max %.0f%%, within 20%%: %d. Load average now %s. Rows measured again "
         "because the GEMM rate moved by more than 10%% during them: %d.\n\n",
         rows.size(), 100 * Median(wall_err),
         100 * (wall_err.empty() ? 0 : *std::max_element(wall_err.begin(), wall_err.end())),
         wall_ok, 100 * Median(cpu_err),
         100 * (cpu_err.empty() ? 0 : *std::max_element(cpu_err.begin(), cpu_err.end())), cpu_ok,
         LoadAverage().c_str(), retries);
  JsonItem(absl::StrFormat(
      R"({"kind":"validation_summary","rows":%zu,"wall_median_abs_err":%.4f,"cpu_median_abs_err":%.4f,"wall_within_20pct":%d,"cpu_within_20pct":%d,"rows_measured_again":%d})",
      rows.size(), Median(wall_err), Median(cpu_err), wall_ok, cpu_ok, retries));
}

// ---- 4. H100 --------------------------------------------------------------------------------

void Hardware() {
  constexpr double kPeak = 989e12, kFraction = 0.6;
  constexpr int64_t kTokens = 8192, kSeq = 4096;
  const RingLink nvlink{/*alpha_s=*/20e-6, /*busbw=*/370e9};
  const RingLink ib{/*alpha_s=*/40e-6, /*busbw=*/47e9};
  printf("## H100 SXM: when does TP pay?\n\n");
  printf("Assumptions: one transformer block, forward + backward, bf16 (2 bytes), %lld tokens per "
         "TP group per step (2 sequences of %lld), ffn = 4d, heads of 128; compute at %.0f%% of "
         "989 TFLOP/s dense bf16 = %.0f TFLOP/s per GPU regardless of GEMM size (per-rank GEMMs "
         "shrink with t, so real efficiency at large t is lower: the model is optimistic there); "
         "no overlap of communication with compute (async TP would hide part of it); ring "
         "collectives: all_reduce = alpha + 2(t-1)/t S/B, all_gather / reduce_scatter = alpha + "
         "(t-1)/t S/B. Intra-node: NVLink busbw B = 370 GB/s, alpha = 20 us, t <= 8. Across "
         "nodes: the ring crosses InfiniBand NDR at B = 47 GB/s per GPU's NIC, alpha = 40 us. "
         "Efficiency = time(1) / (t time(t)); TP \"pays\" at t when time(t) < time(t/2) and "
         "efficiency >= 50%%.\n\n",
         (long long)kTokens, (long long)kSeq, 100 * kFraction, kPeak * kFraction / 1e12);
  std::string conclusions;
  for (int net = 0; net < 2; ++net) {
    const bool inter = net == 1;
    const std::vector<int> tps = inter ? std::vector<int>{1, 2, 4, 8, 16, 32}
                                       : std::vector<int>{1, 2, 4, 8};
    const CollectiveCost cost = RingCost(inter ? ib : nvlink);
    for (bool sp : {false, true}) {
      printf("### %s, %s\n\n", inter ? "Across nodes (InfiniBand NDR, 47 GB/s)" : "Intra-node (NVLink, 370 GB/s)",
             sp ? "with sequence parallelism" : "without sequence parallelism");
      printf("| d |");
      for (int t : tps) printf(" t=%d ms (comm %%) eff |", t);
      printf(" largest t that pays |\n|---|");
      for (size_t i = 0; i <= tps.size(); ++i) printf("---|");
      printf("\n");
      for (int64_t d : {4096, 6144, 8192, 12288, 16384}) {
        printf("| %lld |", (long long)d);
        double t1 = 0, prev = 0;
        int pays = 1;
        bool stopped = false;
        for (int t : tps) {
          LayerCase c{Layer::kBlock, t, sp, true, kTokens, d};
          c.head_dim = 128;
          c.seq_len = kSeq;
          Prediction p = Predict(c, kPeak * kFraction, 2, cost);
          if (t == 1) t1 = p.total();
          const double eff = Efficiency(t1, p.total(), t);
          if (t > 1 && !stopped) {
            if (p.total() < prev && eff >= 0.5) {
              pays = t;
            } else {
              stopped = true;
            }
          }
          prev = p.total();
          printf(" %.2f (%.0f%%) %.2f |", 1e3 * p.total(), 100 * p.comm_s / p.total(), eff);
          JsonItem(absl::StrFormat(
              R"({"kind":"h100","network":"%s","sp":%s,"d":%d,"t":%d,"ms":%.5g,"compute_ms":%.5g,"comm_ms":%.5g,"efficiency":%.4f})",
              inter ? "infiniband" : "nvlink", sp ? "true" : "false", d, t, 1e3 * p.total(),
              1e3 * p.compute_s, 1e3 * p.comm_s, eff));
        }
        printf(" %d |\n", pays);
        absl::StrAppend(&conclusions, pays, d == 16384 ? "" : ", ");
      }
      printf("\n");
      absl::StrAppend(&conclusions, "\n");
    }
  }
  // One line per table: the largest paying t for d = 4096, 6144, 8192, 12288, 16384.
  std::vector<std::string> lines;
  std::stringstream ss(conclusions);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  if (lines.size() == 4) {
    printf("**Conclusion (model, under the assumptions above).** Largest TP degree that still "
           "pays, for d = 4096, 6144, 8192, 12288, 16384: intra-node (NVLink) %s without SP and "
           "%s with SP; across nodes (InfiniBand) %s without SP and %s with SP. Communication "
           "grows as O(tokens d) and compute as O(tokens d^2), so the efficiency at a given t "
           "rises with d; the across-node degrees are lower by the ratio of the bandwidths.\n\n",
           lines[0].c_str(), lines[1].c_str(), lines[2].c_str(), lines[3].c_str());
  }
}

}  // namespace
}  // namespace shardmap::bench

ABSL_FLAG(int64_t, tokens, 512, "tokens per layer step (as //bench:tp_bench)");
ABSL_FLAG(int64_t, d, 512, "hidden size (as //bench:tp_bench)");
ABSL_FLAG(int32_t, steps, 3, "measured steps per validated row");
ABSL_FLAG(std::string, json, "", "also write the tables as JSON here");
ABSL_FLAG(bool, hardware_only, false, "skip the validation on this machine (H100 tables only)");

int main(int argc, char** argv) {
  using namespace shardmap::bench;
  absl::ParseCommandLine(argc, argv);
  flags.tokens = absl::GetFlag(FLAGS_tokens);
  flags.d = absl::GetFlag(FLAGS_d);
  flags.steps = absl::GetFlag(FLAGS_steps);
  flags.json = absl::GetFlag(FLAGS_json);
  flags.hardware_only = absl::GetFlag(FLAGS_hardware_only);
  if (flags.tokens < 1 || flags.d < 64 || flags.d % 64 != 0 || flags.steps < 1) {
    fprintf(stderr, "tp_model_report: --tokens=%lld --d=%lld --steps=%d: need tokens >= 1, d a "
            "positive multiple of 64 (heads of 64), steps >= 1\n",
            static_cast<long long>(flags.tokens), static_cast<long long>(flags.d), flags.steps);
    return 2;
  }
  json << "[";
  if (!flags.hardware_only) Validate();
  Hardware();
  json << "\n]\n";
  if (!flags.json.empty()) {
    std::ofstream f(flags.json);
    f << json.str();
    if (!f) {
      fprintf(stderr, "tp_model_report: cannot write %s\n", flags.json.c_str());
      return 1;
    }
  }
  return 0;
}
