// Non-blocking ppermutes of the in-process backend (Communicator::PpermuteStart), whose copies
// proceed while a rank computes.
//
//   // on every rank of a group, inside RunInProcess:
//   auto call = comm.PpermuteStart(x, y, n, DataType::kF64, {{0, 1}, {1, 2}, {2, 0}});
//   Compute();                          // rank r - 1 may copy x into our y meanwhile
//   absl::Status s = (*call)->Wait();   // y holds rank r - 1's x; x may be reused
//
// Why this design. Ranks are threads of one process, so a "transfer" is a memcpy done by some
// thread. A start only posts the rank's buffers (no barrier, no waiting for peers); each
// transfer (source -> destination) is done by whichever of its two ranks reaches Wait() first
// once both have posted, and the other finds it done. A rank that finishes its matmul early
// thus moves the data of a partner that is still computing, and no rank waits for a partner to
// arrive in the same call (the blocking Ppermute has two group-wide barriers per call). No
// helper thread: on a machine with fewer cores than ranks it would only steal their time.
//
// Matching and checks. The n-th started call of a rank pairs with the n-th of its partners (up to
// kMaxAsyncPpermutes in flight per rank and group). Before copying, the rank that claims a
// transfer compares both sides' call (dtype, count, pairs, the CallTag: op, axes, shape, program
// order); a difference fails the transfer for both ranks, and any error poisons the world, so
// every other rank's collectives fail too. Waits are bounded by InProcessOptions::timeout and
// fail at once when a partner returned from its function. A call destroyed without Wait() poisons
// the world ("never waited"); its buffers are released only once no partner is copying them.
// Host memory only: ranks on GPUs use the default (blocking) PpermuteStart.
#ifndef SHARDMAP_COLLECTIVES_IN_PROCESS_ASYNC_H_
#define SHARDMAP_COLLECTIVES_IN_PROCESS_ASYNC_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "collectives/internal/in_process_group.h"

namespace shardmap::collectives::internal {

inline constexpr int kMaxAsyncPpermutes = 8;

class AsyncPpermutes;

// The shared state of `group`'s non-blocking ppermutes (one per group, created at first use;
// every communicator of the group keeps it).
std::shared_ptr<AsyncPpermutes> AsyncPpermutesOf(const std::shared_ptr<Group>& group);

// Starts rank `rank`'s part of a non-blocking ppermute on the group of `state`.
absl::StatusOr<std::unique_ptr<PendingCollective>> StartAsyncPpermute(
    const std::shared_ptr<AsyncPpermutes>& state, int rank, const CallTag& tag, const void* send,
    void* recv, size_t count, DataType dtype, absl::Span<const std::pair<int, int>> pairs);

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_IN_PROCESS_ASYNC_H_
