// The toy backend that proves docs/design.md's "Adding a backend" recipe: "loopback", a
// Communicator that forwards every call to a Gloo communicator (one process per rank, host
// memory), registered by its test rather than built in. With a LoopbackFault it breaks one
// promise of communicator.h on purpose, so that loopback_faults_test can check that the
// conformance suite notices each (a suite that cannot fail proves nothing).
//
//   ASSERT_TRUE(RegisterBackend(LoopbackBackend(LoopbackFault::kNone)).ok());
//   // now --backend=loopback names it: run_world, create_from_env, the conformance suite
#ifndef SHARDMAP_COLLECTIVES_CONFORMANCE_LOOPBACK_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_CONFORMANCE_LOOPBACK_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collectives/backend_registry.h"
#include "collectives/communicator.h"

namespace shardmap::collectives::conformance {

enum class LoopbackFault {
  kNone,
  kAllReduceOffByOne,   // flips the low bit of the first output byte (blocking and started)
  kOutputsOffByOne,     // the same for every other call that writes an output
  kSplitIgnoresKey,     // orders a split group by rank, not by key
  kErrorsLoseTheirCode, // every error becomes Unknown (a mismatch is no longer InvalidArgument)
  kErrorsLoseTheirText, // every error keeps its code but says only "failed"
  kBarrierDoesNotWait,  // Barrier returns at once
  kWaitTwiceIsOk,       // a started call's handle (PpermuteStart, AllReduceStart, ...) accepts a second Wait()
};

// "none", "allreduce_off_by_one", ...; InvalidArgument for an unknown name.
absl::StatusOr<LoopbackFault> ParseLoopbackFault(absl::string_view name);

// Wraps `inner` (which it owns); sub-groups are wrapped too, with the same fault.
std::unique_ptr<Communicator> WrapLoopback(std::unique_ptr<Communicator> inner,
                                           LoopbackFault fault);

// The registry entry: name "loopback", process per rank, host memory.
Backend LoopbackBackend(LoopbackFault fault);

}  // namespace shardmap::collectives::conformance

#endif  // SHARDMAP_COLLECTIVES_CONFORMANCE_LOOPBACK_COMMUNICATOR_H_
