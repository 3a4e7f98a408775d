// The NCCL backend's world state and its watchdog (private to collectives/nccl_communicator.cc;
// CUDA builds only). A stream-ordered call returns once enqueued; its completion is watched here:
// an event recorded after it on its stream goes to the world's CompletionWatchdog
// (collectives/internal/completion_watchdog.h), whose thread polls, every kPollInterval,
//   - the event (done: the call is forgotten),
//   - the communicator's asynchronous NCCL error (ncclCommGetAsyncError),
//   - the world: failed in this process already (poisoned), or, once the call has been pending
//     kWatchAfter, a failure a peer published on the world's PeerFailureBoard,
//   - the deadline (the call's start + NcclOptions::timeout),
// and on a failure does what a failed blocking call does: reports it
// (internal::ReportNcclCallFailure: the peer's status, or the group's mismatch, or its own,
// published for the peers), poisons the world with it (later calls of every communicator of the
// world are refused with it), then aborts the call's communicator (ncclCommAbort: the stuck
// kernel exits, so the stream and the caller's next read of it move on).
//
//   NcclWorld& w = ...;                      // shared by a world and its splits
//   absl::Status s = w.Watch(std::move(call), deadline);   // after enqueueing the call
//   absl::Status now = w.Check();            // a pass now + the world's failure (OK: none)
//
// Sharing the communicator with the watchdog: an NcclCommSlot holds the ncclComm_t
// (collectives/internal/completion_watchdog_abort.h). The thread that makes the communicator's
// calls holds slot.mu while it uses the communicator (NCCL: one thread at a time per
// communicator) and refuses once the slot is torn down; the watchdog aborts it under slot.mu if
// it gets the lock within kAbortLockGrace, else without it (the owner is stuck inside a call:
// an enqueue behind a hung kernel, say; NCCL's abort is what unblocks it, as in PyTorch's
// watchdog), and asks for its asynchronous error only when slot.mu is free (try_lock: a call in
// progress checks the error itself). The teardown right is taken once (TakeTeardown): the
// owner's finalize or abort and the watchdog's abort never both run. A watched call keeps its
// slot alive, never the communicator: a communicator destroyed while its calls are watched
// finalizes or aborts its ncclComm_t and the watchdog only waits for the events then. The world
// stops its watchdog (joins the thread) when the last communicator and started call of the world
// are gone; calls still pending are dropped (their events destroyed).
#ifndef SHARDMAP_COLLECTIVES_NCCL_WATCHDOG_H_
#define SHARDMAP_COLLECTIVES_NCCL_WATCHDOG_H_

#if SHARDMAP_HAS_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collectives/internal/completion_watchdog.h"
#include "collectives/internal/completion_watchdog_abort.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_failure_board.h"

namespace shardmap::collectives::internal {

// A wait looks at the world's failures (its other groups in this process, the board for other
// processes) once it has lasted this long, so that calls that finish quickly never do.
inline constexpr absl::Duration kWatchAfter = absl::Milliseconds(100);
// How often the watchdog's thread looks at the pending calls.
inline constexpr absl::Duration kWatchdogPollInterval = absl::Milliseconds(10);

// How long the watchdog's abort waits for the owner's lock before aborting without it.
inline constexpr absl::Duration kAbortLockGrace = absl::Seconds(5);

// One communicator's ncclComm_t, shared with the watchdog (see the header comment): `handle`
// (guarded by mu) is null once the owner tore it down or the watchdog aborted it under mu.
using NcclCommSlot = AbortableSlot<ncclComm_t>;

// A stream-ordered call being watched. Owns `done` (destroyed with the call).
struct NcclWatchedCall {
  NcclWatchedCall() = default;
  NcclWatchedCall(NcclWatchedCall&& o) noexcept { *this = std::move(o); }
  NcclWatchedCall& operator=(NcclWatchedCall&& o) noexcept;
  ~NcclWatchedCall();

  cudaEvent_t done = nullptr;  // recorded on the call's stream after the call
  int device = 0;
  std::shared_ptr<NcclCommSlot> slot;
  // How the call reports a failure (own and origin are filled in at the failure).
  NcclCallFailure failure;
};

// Shared by a world communicator and every communicator split from it (and their started
// calls): one failure aborts all.
class NcclWorld {
 public:
  NcclWorld(int world_rank, int device, absl::Duration peer_failure_wait,
            absl::Duration watch_timeout, std::shared_ptr<PeerFailureBoard> board);
  ~NcclWorld();  // stops the watchdog first
  NcclWorld(const NcclWorld&) = delete;
  NcclWorld& operator=(const NcclWorld&) = delete;

  int world_rank() const { return world_rank_; }
  absl::Duration peer_failure_wait() const { return peer_failure_wait_; }
  // How long a stream-ordered call of the world may run before the watchdog fails it
  // (NcclOptions::watch_timeout).
  absl::Duration watch_timeout() const { return watch_timeout_; }
  // Where this world's ranks publish their failures; null when the store was not kept.
  PeerFailureBoard* board() const { return board_.get(); }

  // The world's failure (OK while none).
  absl::Status failure() const;
  // Records `why` as the world's failure unless it failed already; true if this one was first.
  bool Poison(const absl::Status& why);

  // Watches `call` until its event is done (see the header comment). Starts the watchdog's
  // thread at the first call. An error only when the watchdog was stopped.
  absl::Status Watch(NcclWatchedCall call, absl::Time deadline);
  // One pass of the watchdog now, on this thread (without waiting for the GPU: it asks the
  // events), then the world's failure. Not while holding a slot's lock.
  absl::Status Check();
  // Calls watched and not yet done or failed.
  size_t pending() const;

 private:
  using Watchdog = CompletionWatchdog<NcclWatchedCall>;
  absl::Status PollError(NcclWatchedCall& call, absl::Duration pending_for);
  void OnFailure(NcclWatchedCall& call, const absl::Status& why);

  const int world_rank_;
  const int device_;
  const absl::Duration peer_failure_wait_;
  const absl::Duration watch_timeout_;
  const std::shared_ptr<PeerFailureBoard> board_;
  mutable std::mutex mu_;
  absl::Status why_;                    // guarded by mu_: the first failure
  std::unique_ptr<Watchdog> watchdog_;  // guarded by mu_ (made once; never reset but in ~)
};

// ncclCommAbort on the slot's communicator unless it is torn down already: under slot.mu if it
// comes within `grace`, else without it (see the header comment). Not while holding slot.mu.
void AbortSlot(NcclCommSlot& slot, int device, absl::Duration grace = kAbortLockGrace);

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_HAS_CUDA

#endif  // SHARDMAP_COLLECTIVES_NCCL_WATCHDOG_H_
