// How long an NCCL communicator's destructor waits for ncclCommFinalize, host-only and pure so it
// is tested without a GPU (nccl_finalize_policy_test).
//
// Finalize flushes the communicator's outstanding work and needs its peers; when one died, it
// never completes. Waiting the whole call timeout (5 minutes by default) per communicator makes a
// failing job's exit take minutes, so once the job is known to be failing (this world poisoned,
// or a peer's failure on the failure board) the wait is cut to a short grace period, then the
// communicator is aborted.
//
//   const FinalizeAction a = DecideFinalize({.finished = st == ncclSuccess,
//                                            .error = st != ncclSuccess && st != ncclInProgress,
//                                            .waited = now - start, .timeout = timeout_,
//                                            .failing_for = failing_since ? now - *failing_since
//                                                                         : std::nullopt});
#ifndef SHARDMAP_COLLECTIVES_NCCL_FINALIZE_POLICY_H_
#define SHARDMAP_COLLECTIVES_NCCL_FINALIZE_POLICY_H_

#include <optional>

#include "absl/time/time.h"

namespace shardmap {

// After the job is known to be failing, finalize may still finish (a peer that failed after
// its last collective) for this long.
inline constexpr absl::Duration kFinalizeGraceWhenFailing = absl::Seconds(2);

struct FinalizeState {
  bool finished = false;  // ncclCommFinalize completed (ncclSuccess)
  bool error = false;     // it failed (an error other than in-progress)
  absl::Duration waited;  // since ncclCommFinalize was called
  absl::Duration timeout;  // the communicator's call timeout
  // How long the job has been known to be failing (world poisoned, a peer's published failure);
  // nullopt while nothing is known.
  std::optional<absl::Duration> failing_for;
  absl::Duration grace = kFinalizeGraceWhenFailing;
};

enum class FinalizeAction {
  kWait,     // poll again
  kDestroy,  // finalize done: ncclCommDestroy
  kAbort,    // give up: ncclCommAbort
};

inline FinalizeAction DecideFinalize(const FinalizeState& s) {
  if (s.finished) return FinalizeAction::kDestroy;
  if (s.error) return FinalizeAction::kAbort;
  if (s.waited >= s.timeout) return FinalizeAction::kAbort;
  if (s.failing_for.has_value() && *s.failing_for >= s.grace) return FinalizeAction::kAbort;
  return FinalizeAction::kWait;
}

}  // namespace shardmap

#endif  // SHARDMAP_COLLECTIVES_NCCL_FINALIZE_POLICY_H_
