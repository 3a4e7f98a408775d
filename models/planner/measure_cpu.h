// A hardware profile of this CPU, measured now, for simulated CPU ranks (threads sharing the
// cores): GEMM rates by smallest dimension (one thread), the memory bandwidth of an elementwise
// op, the arithmetic rate of GELU, the framework's cost per typed op (forward + tape backward,
// per op the OpCounter counts), the effective number of cores (GEMM throughput of several
// threads at once / one thread's; on a machine shared with other jobs this is below the core
// count), and alpha-beta fits of the in-process collectives per op and group size.
//
//   absl::StatusOr<HardwareProfile> cpu = MeasureCpuProfile({.max_group = 4});
//   std::cout << cpu->ToText();      // plan_gpt --profile=FILE reads it back
#ifndef SHARDMAP_MODELS_PLANNER_MEASURE_CPU_H_
#define SHARDMAP_MODELS_PLANNER_MEASURE_CPU_H_

#include "absl/status/statusor.h"
#include "models/planner/hardware_profile.h"

namespace shardmap::planner {

struct CpuMeasureOptions {
  int max_group = 4;          // collectives fitted for groups 2 .. max_group (powers of two)
  int threads_for_cores = 4;  // threads that measure the effective core count
  double memory_bytes = 8e9;  // what the profile says each simulated rank may use
  bool collectives = true;    // false: compute rates and cores only (a few seconds)
};

absl::StatusOr<HardwareProfile> MeasureCpuProfile(const CpuMeasureOptions& options);

// The machine's speed now (for machines shared with other jobs, whose load changes by the
// minute): one thread's GEMM rate at d = 128 and the effective cores, as MeasureCpuProfile
// measures them.
struct LoadSample {
  double gemm_rate = 0, cores = 0;
};
LoadSample SampleLoad(int threads = 4);
// `profile` (measured when the machine ran at `then`) as it would measure at `now`: its compute
// rates scaled by now.gemm_rate / then.gemm_rate, its per-op overhead and collective costs by
// the inverse, its cores now.cores.
HardwareProfile AtLoad(const HardwareProfile& profile, const LoadSample& then,
                       const LoadSample& now);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_MEASURE_CPU_H_
