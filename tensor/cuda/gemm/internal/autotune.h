// GEMM autotuning policy, host-only and pure so it is tested without a GPU (gemm_autotune_test).
//
// cuBLASLt's heuristic ranks algorithms by a model, and its first answer is not always the
// fastest on the card (0.85x of PyTorch at 8192^3 bf16 on an H200). So on the first eager use of
// a plan (one per device, shape, dtypes, transposes, strides, epilogue, alignments) gemm.cc times
// every usable candidate the heuristic returned on the real operands and keeps the fastest for
// the process. Never while the stream is being captured into a CUDA graph (timing needs a host
// sync): a capture uses the heuristic's first answer (or the winner, if tuning already ran) and
// leaves the plan to be tuned by its next eager call. SHARDMAP_GEMM_AUTOTUNE=0 turns tuning off
// (every plan then uses the heuristic's first answer, as before).
//
//   const TuneAction a = DecideTuning(AutotuneEnabled(), capturing, plan.tuned, candidates);
//   if (a == TuneAction::kTune) plan.chosen = PickFastest(candidates, time_candidate_ms);
#ifndef SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_AUTOTUNE_H_
#define SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_AUTOTUNE_H_

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace shardmap::cuda::gemm_internal {

// Candidates asked of the heuristic per plan.
inline constexpr int kHeuristicCandidates = 16;
// Timed runs per candidate (after one untimed warm-up run).
inline constexpr int kTimedRuns = 3;
// An accumulating GEMM (C is an input) is timed into a scratch C of at most this size; larger
// ones keep the heuristic's first answer.
inline constexpr size_t kMaxTuneScratchBytes = size_t{256} << 20;

// SHARDMAP_GEMM_AUTOTUNE's value: unset, "1", "on", "true" tune; "0", "off", "false" do not.
// Anything else tunes (the default).
inline bool AutotuneEnabledFromEnv(const char* value) {
  if (value == nullptr) return true;
  return std::strcmp(value, "0") != 0 && std::strcmp(value, "off") != 0 &&
         std::strcmp(value, "false") != 0 && std::strcmp(value, "OFF") != 0 &&
         std::strcmp(value, "FALSE") != 0;
}

// Read once per process.
inline bool AutotuneEnabled() {
  static const bool enabled = AutotuneEnabledFromEnv(std::getenv("SHARDMAP_GEMM_AUTOTUNE"));
  return enabled;
}

// Whether plans may be tuned by timing: SHARDMAP_GEMM_AUTOTUNE allows it and the process is not
// deterministic (cuda::Deterministic(): timings differ between processes, so two runs could
// pick different algorithms, whose sums round differently).
inline bool TuningAllowed(bool env_enabled, bool deterministic) {
  return env_enabled && !deterministic;
}

enum class TuneAction {
  kUseCurrent,  // use the plan's current choice (tuned, or the heuristic's first)
  kTune,        // time the candidates now, then use the winner
};

// tuned: the plan was tuned (or found to need no tuning). candidates: usable algorithms.
inline TuneAction DecideTuning(bool enabled, bool capturing, bool tuned, int candidates) {
  if (!enabled || capturing || tuned || candidates < 2) return TuneAction::kUseCurrent;
  return TuneAction::kTune;
}

// The index of the fastest candidate by time_ms (milliseconds; a candidate that failed returns
// infinity or NaN), the earlier one on ties; 0 when none ran (the heuristic's first answer).
inline int PickFastest(int count, const std::function<double(int)>& time_ms) {
  int best = -1;
  double best_ms = 0;
  for (int i = 0; i < count; ++i) {
    const double t = time_ms(i);
    if (!std::isfinite(t) || t < 0) continue;
    if (best < 0 || t < best_ms) {
      best = i;
      best_ms = t;
    }
  }
  return best < 0 ? 0 : best;
}

}  // namespace shardmap::cuda::gemm_internal

#endif  // SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_AUTOTUNE_H_
