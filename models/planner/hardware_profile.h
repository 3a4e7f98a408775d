// A hardware profile for the planner: GEMM rates by shape and dtype, memory per GPU, the memory
// bandwidth of the non-GEMM ops, a per-op launch overhead, and the links inside and between
// nodes. Shipped profiles live in models/planner/profiles/ (a100_node.txt, h100_node.txt, h200_node.txt, with
// their sources), compiled into the library by the profiles_embedded genrule; a profile can also
// be measured: from a `tp_bench --device=cuda --profile_out=FILE` run (FromTpBenchProfile), or on
// this CPU (models/planner/measure_cpu.h).
//
//   absl::StatusOr<HardwareProfile> p = LoadHardwareProfile("h100_node");   // or a file path
//   double s = p->GemmSeconds({.m = 8192, .n = 8192, .k = 8192, .dtype = DType::kBF16});
//
// Text format: one record per line, fields separated by spaces, '#' starts a comment.
//   name <word>                       source <free text> (any number of lines)
//   gpus_per_node <n>                 memory_bytes <bytes per GPU>
//   memory_reserved_bytes <bytes>     (CUDA context, allocator slack: not for tensors)
//   memory_bandwidth <bytes/s>        achieved by the non-GEMM (elementwise, norm) ops
//   vector_flops <flop/s>             non-GEMM arithmetic rate (0: those ops are bandwidth-bound)
//   attention <dtype> <flop/s>        fused attention's rate (default: the largest GEMM rate)
//   op_overhead_s <seconds>           fixed cost per op (kernel launch / dispatch)
//   peak_flops <dtype> <flop/s>       the MFU denominator
//   gemm <dtype> <min_dim> <flop/s>   achieved rate of a GEMM whose smallest of m, n, k is
//                                     min_dim; log-linear between points, clamped outside
//   gemm_shape <dtype> <batch> <m> <n> <k> <trans_a 0|1> <trans_b 0|1> <flop/s>
//                                     the measured rate of exactly that GEMM (count 1); it
//                                     replaces the min_dim curve for that shape
//   op_rate <op> <dtype> <bytes/s>    the measured speed of the non-GEMM ops of that name and
//                                     dtype (measure_cpu.h's WithOpRates); it replaces
//                                     memory_bandwidth and vector_flops for them
//   link <intra|inter> <alpha_s> <busbw bytes/s>    ring alpha-beta (nccl-tests busbw)
//   collective <op> <group_size> <alpha_s> <seconds_per_byte>   a fitted cost (per rank bytes)
//                                     that replaces the ring formula for that op and size
//   overlap <fraction 0..1>           accepted from older files and ignored: what overlaps follows
//                                     the trainer's schedule (cost_model.h's StepOptions)
//   cores <n>                         ranks share n cores (simulated CPU ranks); 0: a device each
//   shared_op_rate <threads> <op> <dtype> <bytes/s>
//                                     op_rate measured while `threads` ranks ran the same step at
//                                     once (simulated CPU ranks share caches and memory): used,
//                                     interpolated, when several ranks compute at once
//   oversubscribed_sync <ranks> <seconds>   what a collective costs at least when that many
//                                     ranks share the cores (measure_cpu.h); linear between
//                                     entries and from 0 at ranks = cores, the last beyond
#ifndef SHARDMAP_MODELS_PLANNER_HARDWARE_PROFILE_H_
#define SHARDMAP_MODELS_PLANNER_HARDWARE_PROFILE_H_

#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/planner/step_work.h"
#include "tensor/dtype.h"

namespace shardmap::perfmodel {
struct GpuProfile;
}

namespace shardmap::planner {

struct Link {
  double alpha_s = 0;  // per collective step latency
  double busbw = 0;    // bytes/s
};

// One GEMM's shape exactly as it runs (GemmWork less its count): the key of a shape-exact rate.
struct GemmKey {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType dtype = DType::kF32;
  bool trans_a = false, trans_b = false;
  static GemmKey Of(const GemmWork& g) {
    return {g.batch, g.m, g.n, g.k, g.dtype, g.trans_a, g.trans_b};
  }
  auto Tie() const { return std::tie(batch, m, n, k, dtype, trans_a, trans_b); }
  bool operator<(const GemmKey& o) const { return Tie() < o.Tie(); }
  bool operator==(const GemmKey& o) const { return Tie() == o.Tie(); }
};

struct FittedCollective {
  double alpha_s = 0, seconds_per_byte = 0;
};

struct HardwareProfile {
  std::string name;
  std::vector<std::string> sources;
  int gpus_per_node = 1;
  double memory_bytes = 0, memory_reserved_bytes = 0;
  double memory_bandwidth = 0;
  double op_overhead_s = 0;
  double vector_flops = 0;
  std::map<DType, double> attention;
  std::map<DType, double> peak_flops;
  std::map<DType, std::vector<std::pair<double, double>>> gemm;  // (min_dim, flop/s), sorted
  std::map<GemmKey, double> gemm_exact;  // flop/s of exactly that shape (measured: measure_cpu.h)
  // bytes/s of the non-GEMM ops of that (name, dtype), measured (measure_cpu.h's WithOpRates)
  std::map<std::pair<std::string, DType>, double> op_rate;
  Link intra, inter;
  std::map<std::pair<std::string, int>, FittedCollective> fitted;  // (op, group_size)
  // Simulated links (plan.h's PredictOnSimulatedLink), not read from text: the in-process
  // collectives' fitted costs beneath the link. A started call runs its in-process collective on
  // a lane thread of the same process, whose CPU time the ranks' compute then lacks.
  std::map<std::pair<std::string, int>, FittedCollective> lane_cpu;
  double overlap = 0;  // read and ignored (older files)
  double cores = 0;
  std::map<int, double> oversubscribed_sync;  // ranks -> seconds per collective, ranks > cores
  // op_rate as measured while shared_op_rate_threads ranks ran at once (0: not measured).
  int shared_op_rate_threads = 0;
  std::map<std::pair<std::string, DType>, double> shared_op_rate;
  // Ranks computing at once on the shared cores (simulated CPU ranks), set by the cost model
  // (ForConcurrentRanks), not read from text.
  int concurrent_ranks = 1;

  // Seconds of one GEMM work item at the profile's rate for its shape (its count included): the
  // shape-exact rate when gemm_exact has the shape, else the min_dim curve. NotFound naming the
  // dtype when the profile has neither.
  absl::StatusOr<double> GemmSeconds(const GemmWork& g) const;
  // Seconds of non-GEMM ops (see the format above): at their op_rate when the profile has one
  // for their name and dtype, else fused attention at its rate and the rest at
  // memory_bandwidth (and vector_flops). With concurrent_ranks k > 1 and a shared_op_rate for
  // the kind (measured with T ranks at once), its seconds go linearly from the op_rate's at k = 1
  // to the shared rate's at k = T (and stay there beyond T); never below the lone price.
  absl::StatusOr<double> OtherSeconds(const OtherWork& o) const;
  // This profile for `k` ranks computing at once (concurrent_ranks = k).
  HardwareProfile ForConcurrentRanks(int k) const;
  double UsableMemory() const { return memory_bytes - memory_reserved_bytes; }
  // The least a collective costs when `world` ranks share the cores: 0 without cores or
  // oversubscribed_sync entries or with world <= cores; else the entries' value at world
  // (linear between them and from 0 at world = cores to the first, the last one beyond).
  double OversubscribedSyncSeconds(int world) const;
  // The profile's lines (ParseHardwareProfile reads them back).
  std::string ToText() const;
};

// InvalidArgument naming the line number, the line and what was expected; a profile missing
// memory_bytes, memory_bandwidth, a gemm point or the intra link is refused, naming the key.
absl::StatusOr<HardwareProfile> ParseHardwareProfile(std::string_view text);

// A shipped profile by name (a file name of models/planner/profiles/ less ".txt": "h100_node",
// "h200_node") or a profile file's path. NotFound listing the shipped names for anything else.
absl::StatusOr<HardwareProfile> LoadHardwareProfile(const std::string& name_or_path);
std::vector<std::string> ShippedProfileNames();

// A profile from a tp_bench GPU profile file (perfmodel/gpu_profile.h's format): GEMM rates from
// its gemm lines (by smallest dimension), the intra link from its `link` all_reduce lines when it
// has them; everything else (memory, inter-node link, peaks) from `base`.
absl::StatusOr<HardwareProfile> FromTpBenchProfile(const perfmodel::GpuProfile& measured,
                                                   HardwareProfile base);

// Google Benchmark JSON from collectives_bench (in-process rows): fits seconds = alpha +
// bytes * seconds_per_byte per (op, ranks) and stores them as `collective` entries of `base`.
// InvalidArgument when the JSON is not a benchmark report or has no usable rows.
absl::StatusOr<HardwareProfile> WithCollectivesBench(std::string_view json, HardwareProfile base);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_HARDWARE_PROFILE_H_
