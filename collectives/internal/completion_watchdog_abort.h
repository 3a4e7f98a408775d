// Tearing down a resource that its owner thread uses under a lock, from a watchdog (an NCCL
// communicator: collectives/nccl_watchdog.h). The owner holds `mu` while it makes a call; the
// watchdog, on a failure, wants to abort the resource, which is what unblocks a call stuck on it.
// Waiting for `mu` without bound could hang the watchdog behind an owner stuck inside the call
// (an NCCL enqueue blocked behind a hung kernel); so the watchdog waits `grace` for the lock and
// then aborts without it, as PyTorch's NCCL watchdog does (NCCL's abort is meant to interrupt a
// communicator in use). The right to tear down is taken once, atomically, by whichever of the
// owner (its destructor's finalize, its failed call's abort) and the watchdog (its abort, with
// or without the lock) comes first; the other leaves the resource alone: never two aborts, never
// an abort of a destroyed resource.
//
//   AbortableSlot<ncclComm_t> slot(comm);
//   // owner:    std::lock_guard l(slot.mu); if (slot.torn_down()) refuse; else use slot.handle;
//   //           teardown: if (ncclComm_t c = slot.TakeTeardown()) ncclCommDestroy(c);
//   // watchdog: AbortWithGrace(slot, absl::Seconds(5), [](ncclComm_t c) { ncclCommAbort(c); });
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_COMPLETION_WATCHDOG_ABORT_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_COMPLETION_WATCHDOG_ABORT_H_

#include <algorithm>
#include <atomic>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardmap::collectives::internal {

template <typename Handle>  // a pointer-like handle; Handle{} means none
class AbortableSlot {
 public:
  explicit AbortableSlot(Handle h) : handle(h), teardown_(h) {}
  AbortableSlot(const AbortableSlot&) = delete;
  AbortableSlot& operator=(const AbortableSlot&) = delete;

  std::timed_mutex mu;  // held by the owner while it uses `handle`
  Handle handle;        // guarded by mu: the owner's view (Handle{} once torn down under mu)

  // The teardown right: the handle to tear down for the first caller, Handle{} for the others.
  Handle TakeTeardown() { return teardown_.exchange(Handle{}); }
  // True once someone took the teardown right (the owner must then stop using `handle`).
  bool torn_down() const { return teardown_.load() == Handle{}; }

 private:
  std::atomic<Handle> teardown_;
};

enum class AbortHow {
  kUnderLock,    // the lock came within the grace: aborted under it, `handle` cleared
  kWithoutLock,  // the owner kept the lock past the grace: aborted without it
  kAlreadyGone,  // someone had taken the teardown right: nothing done
};

// Aborts `slot` from a watchdog thread: `abort(handle)` under slot.mu if the lock comes within
// `grace`, else without it (see the header comment). Not from the owner thread while it holds mu.
template <typename Handle, typename Abort>
AbortHow AbortWithGrace(AbortableSlot<Handle>& slot, absl::Duration grace, Abort abort) {
  std::unique_lock<std::timed_mutex> lock(slot.mu, std::defer_lock);
  // try_lock polled, not try_lock_for: libstdc++ times the latter with pthread_mutex_clocklock,
  // which GCC 12's ThreadSanitizer does not intercept (it then reports the unlock as one of an
  // unlocked mutex). A watchdog's abort is rare, so a millisecond's polling costs nothing.
  const absl::Time deadline = absl::Now() + grace;
  bool locked = lock.try_lock();
  while (!locked && absl::Now() < deadline) {
    absl::SleepFor(std::min(absl::Milliseconds(1), deadline - absl::Now()));
    locked = lock.try_lock();
  }
  const Handle h = slot.TakeTeardown();
  if (h == Handle{}) return AbortHow::kAlreadyGone;
  abort(h);
  if (!locked) return AbortHow::kWithoutLock;
  slot.handle = Handle{};
  return AbortHow::kUnderLock;
}

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_COMPLETION_WATCHDOG_ABORT_H_
