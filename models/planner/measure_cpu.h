// A hardware profile of this CPU, measured now, for simulated CPU ranks (threads sharing the
// cores): GEMM rates by smallest dimension (one thread), the memory bandwidth of an elementwise
// op, the arithmetic rate of GELU, the framework's cost per typed op (forward + tape backward,
// per op the OpCounter counts), the effective number of cores (GEMM throughput of several
// threads at once / one thread's; on a machine shared with other jobs this is below the core
// count), alpha-beta fits of the in-process collectives per op and group size, and what a
// collective costs ranks that outnumber the cores (2x and 4x the hardware threads:
// OversubscribedSyncSeconds). Per-op-kind speeds and shape-exact GEMM rates are added by
// WithOpRates and MeasureGemmShapes.
//
//   absl::StatusOr<HardwareProfile> cpu = MeasureCpuProfile({.max_group = 4});
//   std::cout << cpu->ToText();      // plan_gpt --profile=FILE reads it back
#ifndef SHARDMAP_MODELS_PLANNER_MEASURE_CPU_H_
#define SHARDMAP_MODELS_PLANNER_MEASURE_CPU_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/planner/hardware_profile.h"
#include "tensor/op_counter.h"

namespace shardmap::planner {

struct CpuMeasureOptions {
  int max_group = 4;          // collectives fitted for groups 2 .. max_group (powers of two)
  int threads_for_cores = 4;  // threads that measure the effective core count
  double memory_bytes = 8e9;  // what the profile says each simulated rank may use
  bool collectives = true;    // false: compute rates and cores only (a few seconds)
  int max_oversubscribed = 64;  // threads of the largest oversubscribed_sync measured
};

absl::StatusOr<HardwareProfile> MeasureCpuProfile(const CpuMeasureOptions& options);

// The rate of every distinct GEMM shape of `roles` (GemmKey: batch, m, n, k, dtype, operand
// layouts) that profile->gemm_exact lacks, each timed once (Matmul on this thread, one BLAS
// thread, best of 3) and stored there; GemmSeconds then prices those GEMMs at their own rate
// rather than the min_dim curve (the step's transposed backward products and small batched
// attention GEMMs run well off that curve on a CPU). Shapes already in the map are not timed
// again: the profile is the cache. Returns how many shapes it timed.
//
//   absl::StatusOr<int> n = MeasureGemmShapes(roles, &*cpu);
absl::StatusOr<int> MeasureGemmShapes(const std::vector<RoleWork>& roles, HardwareProfile* profile);
// The seconds of one call of exactly that GEMM on this CPU (best of `trials`).
double TimeGemmShape(const GemmKey& g, int trials = 3);

// The framework's cost per recorded op, from a measured step whose ops do (almost) no work: a
// tiny-shape GPT step goes through the same type checks, tape and value wrappers per op as the
// real one, so (step seconds - its modelled GEMM and other-op seconds) / its op count is what
// each recorded op costs beyond its arithmetic (a bare tensor op's op_overhead_s misses most of
// it). InvalidArgument for a non-positive op count or step time; never below 0.
//
//   absl::StatusOr<double> per_op = FrameworkOpSeconds(tiny_step_s, tiny_parts, tiny_ops);
//   profile.op_overhead_s = *per_op;
absl::StatusOr<double> FrameworkOpSeconds(double step_s, double modelled_work_s, int64_t op_count);

// The non-GEMM ops' effective speed with a step's own op mix (layer norms, softmax, GELU, AdamW,
// cross entropy at their shapes), from one measured step: its time less the modelled GEMMs and
// per-op cost is what its other ops took; returns `profile` with memory_bandwidth and
// vector_flops divided by (that / their modelled seconds), so ComputeBreakdown's other_s for
// that step equals what was measured. InvalidArgument when the parts leave no time for the
// other ops or there are none.
//
//   absl::StatusOr<HardwareProfile> fit = WithStepOtherOpRate(*hw, step_s, parts);
absl::StatusOr<HardwareProfile> WithStepOtherOpRate(const HardwareProfile& profile, double step_s,
                                                    double gemm_s, double other_s,
                                                    double overhead_s, double* slowdown = nullptr);

// What one synchronising collective costs ranks that share too few cores: `threads` in-process
// ranks alternate chunks of `chunk_s` one-thread GEMM work with a 64-byte all_reduce over all
// of them, `iters` rounds, against the same chunks without the collectives; per round, the best
// of 3 each. More ranks than cores wait at each collective for the OS to run the others (a
// share of a scheduler slice, not the collective's own microseconds); with a core each this is
// the collective's own cost. InvalidArgument for fewer than 2 threads, chunk_s <= 0 or iters < 1.
//
//   absl::StatusOr<double> s = OversubscribedSyncSeconds(4);   // 4 ranks on this CPU
absl::StatusOr<double> OversubscribedSyncSeconds(int threads, double chunk_s = 1e-3,
                                                 int iters = 40);

// The non-GEMM ops' own speeds, per (name, dtype), from the records of a timed OpCounter
// (OpCounter::kTimed) over one real step, e.g. one rank's step of the model on this CPU: each
// kind's bytes over its time less `fixed_op_s` per call (what a bare op costs whatever its size,
// which op_overhead_s charges already) becomes profile->op_rate for it. A kind whose time is
// mostly that fixed cost (under a quarter beyond it), or that moves no bytes, gets no rate and
// keeps the profile's memory_bandwidth. The rows, largest time first, say what was measured.
// InvalidArgument when the records carry no times (an untimed counter).
//
//   OpCounter timed(OpCounter::kTimed);   // on the rank's thread, around one step
//   absl::StatusOr<std::vector<OpRateRow>> rows = WithOpRates(timed.ops(), bare_op_s, &*cpu);
struct OpRateRow {
  std::string op;
  DType dtype = DType::kF32;
  int64_t count = 0;
  double bytes = 0, seconds = 0;
  double rate = 0;  // bytes/s stored in op_rate; 0: none (fixed cost, no bytes)
};
absl::StatusOr<std::vector<OpRateRow>> WithOpRates(const std::vector<OpCount>& timed_ops,
                                                   double fixed_op_s, HardwareProfile* profile);

// The machine's speed now (for machines shared with other jobs, whose load changes by the
// minute): one thread's GEMM rate at d = 128 and the effective cores, as MeasureCpuProfile
// measures them.
struct LoadSample {
  double gemm_rate = 0, cores = 0;
};
LoadSample SampleLoad(int threads = 4);
// `profile` (measured when the machine ran at `then`) as it would measure at `now`: its compute
// rates (shape-exact ones too) scaled by now.gemm_rate / then.gemm_rate, its per-op overhead and collective costs by
// the inverse, its cores now.cores.
HardwareProfile AtLoad(const HardwareProfile& profile, const LoadSample& then,
                       const LoadSample& now);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_MEASURE_CPU_H_
