// PeerFailureBoard: how the ranks of a multi-process world tell each other why they failed, through
// the job's TcpStore. A rank whose call fails publishes its own status (code and message) before
// it tears its transport down; a peer whose call then fails because of it (a remote error, an
// abort, a timeout) reads the first failure of the world and reports that rank's code and message
// instead of a transport error. Calls whose wait failed with nothing published are published
// too, so the ranks of a group can tell a mismatch (different calls) from a lost peer.
//
//   PeerFailureBoard board(store, "nccl/unique_id/1/board");       // one per world, every rank
//   board.Publish(absl::InvalidArgumentError("root 7 is not a rank of this group of 4"));
//   ...                                                              // then abort the transport
//   // On a peer, after its NCCL call failed with `own` (a remote error or the timeout):
//   std::optional<PeerFailure> first = board.First(absl::Seconds(2));
//   absl::Status s = StatusAfterFailure(own, FailureOrigin::kPeer, store->rank(), first);
//   // s: INVALID_ARGUMENT "rank 2 failed: root 7 is not a rank of this group of 4 (...)"
//
// Every store operation is bounded: it runs on a helper thread and is abandoned after its limit,
// so a dead, stopped or slow store never holds up failure handling (the helper finishes or fails
// with the store's own timeout later). Thread-safe. Keys live under `prefix`; distinct worlds on
// one store need distinct prefixes, and a group's call records are keyed by its group key.
#ifndef SHARDMAP_COLLECTIVES_PEER_FAILURE_BOARD_H_
#define SHARDMAP_COLLECTIVES_PEER_FAILURE_BOARD_H_

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

// One rank's published failure.
struct PeerFailure {
  int rank = -1;        // the store (world) rank that published it
  absl::Status status;  // its own code and message (never OK)
};

// Whether a failed call's own error is this rank's doing (bad arguments, a CUDA error, the
// rank's program failing) or the consequence of a peer's failure (a remote error, an abort, a
// timeout waiting for peers): only the latter is replaced by the peer's published status.
enum class FailureOrigin { kLocal, kPeer };

class PeerFailureBoard {
 public:
  // `op_limit` bounds Publish and the publication in DiagnoseStuckCall (reads take their own wait).
  PeerFailureBoard(std::shared_ptr<TcpStore> store, std::string prefix,
                   absl::Duration op_limit = absl::Seconds(2));

  int rank() const { return store_->rank(); }
  const std::string& prefix() const { return prefix_; }

  // Publishes `why` (not OK) as this rank's failure; the first publication of the world is the
  // one First() returns. Returns the store's error, or DeadlineExceeded when it did not answer in
  // op_limit (the publication may still land later).
  absl::Status Publish(const absl::Status& why);

  // The first failure published on this board, waiting at most `wait` for one to appear;
  // nullopt when none did (or the store failed or was too slow).
  std::optional<PeerFailure> First(absl::Duration wait);

  // Non-blocking: starts a check of the board in the background (at most one at a time and one
  // per 100 ms) and returns the first failure once a check has seen one (then always). For wait
  // loops that poll.
  std::optional<PeerFailure> Poll();

  // After the wait of a call of group `group_key` failed here (a timeout, a transport error;
  // group rank `group_rank` of `group_size`): publishes the call this rank is stuck in (e.g.
  // "AllReduce(f32, count=4, sum) #2"), then waits at most `wait` until a failure of the world is
  // published, or the group's published calls disagree (a mismatch, named by MismatchFromCalls),
  // or every rank of the group published the same call (then both stay empty: the ranks agree
  // and wait for something else).
  struct StuckCallDiagnosis {
    std::optional<PeerFailure> first;
    std::optional<absl::Status> mismatch;
  };
  StuckCallDiagnosis DiagnoseStuckCall(absl::string_view group_key, absl::string_view group_name,
                                       int group_rank, int group_size, absl::string_view call,
                                       absl::Duration wait);

 private:
  struct PollState;

  std::string FailureKey(int64_t n) const;
  std::string CallKey(absl::string_view group_key, int group_rank) const;

  const std::shared_ptr<TcpStore> store_;
  const std::string prefix_;
  const absl::Duration op_limit_;
  std::mutex mu_;
  std::shared_ptr<PollState> poll_;  // the check in flight or finished; guarded by mu_
  std::optional<PeerFailure> seen_;  // the first failure once seen; guarded by mu_
};

// What a rank whose call failed with `own` returns, given the first failure published in its
// world. `own` when it is this rank's doing (kLocal), when nothing was published or when this rank
// published first; otherwise the publishing rank's code, with a message naming that rank and its
// message, followed by what this rank saw itself:
//   "rank 2 failed: <its message> (here: <own message>)".
absl::Status StatusAfterFailure(const absl::Status& own, FailureOrigin origin, int own_rank,
                                const std::optional<PeerFailure>& first);

// The calls of a group's ranks whose waits failed (index = group rank; nullopt: not published),
// each ending in "#<its number in the group's sequence>". InvalidArgument naming two that differ,
// "mismatched collectives on group 'G': rank 0 called X but rank 2 called Y" (the first such
// pair, so the same text on every rank that saw the same records), when they differ at the same
// number, or when every rank published (all are stuck, in different calls). nullopt otherwise: a
// rank is missing and the others may wait for it (one may have got one call further).
std::optional<absl::Status> MismatchFromCalls(absl::string_view group,
                                              absl::Span<const std::optional<std::string>> calls);

// The board's record of one failure, and back. DecodePeerFailure refuses malformed records.
std::string EncodePeerFailure(int rank, const absl::Status& status);
absl::StatusOr<PeerFailure> DecodePeerFailure(absl::string_view record);

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_PEER_FAILURE_BOARD_H_
