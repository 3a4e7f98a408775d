#include "collectives/nccl_watchdog.h"

#if SHARDMAP_HAS_CUDA

#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/internal/cuda_check.h"

namespace shardmap::collectives::internal {

NcclWatchedCall& NcclWatchedCall::operator=(NcclWatchedCall&& o) noexcept {
  if (this != &o) {
    if (done != nullptr) cudaEventDestroy(done);
    done = std::exchange(o.done, nullptr);
    device = o.device;
    slot = std::move(o.slot);
    failure = std::move(o.failure);
  }
  return *this;
}

NcclWatchedCall::~NcclWatchedCall() {
  if (done != nullptr) cudaEventDestroy(done);  // fine while pending: freed once it completes
}

void AbortSlot(NcclCommSlot& slot, int device, absl::Duration grace) {
  const AbortHow how = AbortWithGrace(slot, grace, [device](ncclComm_t c) {
    cudaSetDevice(device);
    ncclCommAbort(c);
  });
  if (how == AbortHow::kWithoutLock) {
    std::fprintf(stderr, "shardmap: NCCL watchdog: the communicator's owner kept its lock for %s "
                 "(stuck in a call): aborted without it\n", absl::FormatDuration(grace).c_str());
  }
}

NcclWorld::NcclWorld(int world_rank, int device, absl::Duration peer_failure_wait,
                     absl::Duration watch_timeout, std::shared_ptr<PeerFailureBoard> board)
    : world_rank_(world_rank),
      device_(device),
      peer_failure_wait_(peer_failure_wait),
      watch_timeout_(watch_timeout),
      board_(std::move(board)) {}

NcclWorld::~NcclWorld() {
  // Every communicator of the world is gone (their ncclComm_t finalized or aborted): the
  // pending calls are dropped without reports.
  std::unique_ptr<Watchdog> w;
  {
    std::lock_guard<std::mutex> l(mu_);
    w = std::move(watchdog_);
  }
  if (w != nullptr) w->Stop();
}

absl::Status NcclWorld::failure() const {
  std::lock_guard<std::mutex> l(mu_);
  return why_;
}

bool NcclWorld::Poison(const absl::Status& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (!why_.ok() || why.ok()) return false;
  why_ = why;
  return true;
}

absl::Status NcclWorld::Watch(NcclWatchedCall call, absl::Time deadline) {
  Watchdog* dog = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (watchdog_ == nullptr) {
      Watchdog::Callbacks cb;
      cb.is_done = [](NcclWatchedCall& c) -> absl::StatusOr<bool> {
        const cudaError_t e = cudaEventQuery(c.done);
        if (e == cudaSuccess) return true;
        if (e == cudaErrorNotReady) return false;
        cudaGetLastError();
        return CudaStatus(e, "cudaEventQuery (the NCCL watchdog)", __FILE__, __LINE__);
      };
      cb.poll_error = [this](NcclWatchedCall& c, absl::Duration pending_for) {
        return PollError(c, pending_for);
      };
      cb.on_failure = [this](NcclWatchedCall& c, const absl::Status& why) { OnFailure(c, why); };
      WatchdogOptions o;
      o.poll_interval = kWatchdogPollInterval;
      o.on_thread_start = [device = device_] {
        cudaSetDevice(device);
        // Another thread's capture (global mode) must not forbid this thread's event queries.
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&mode);
      };
      watchdog_ = std::make_unique<Watchdog>(std::move(cb), std::move(o));
    }
    dog = watchdog_.get();
  }
  // The report names the call (ReportNcclCallFailure: "<where> failed: <this>: not done ...").
  return dog->Watch(std::move(call), deadline, "stream-ordered call");
}

absl::Status NcclWorld::Check() {
  Watchdog* dog = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    dog = watchdog_.get();
  }
  if (dog != nullptr) (void)dog->Sweep();  // its failures poison the world
  return failure();
}

size_t NcclWorld::pending() const {
  std::lock_guard<std::mutex> l(mu_);
  return watchdog_ == nullptr ? 0 : watchdog_->pending();
}

absl::Status NcclWorld::PollError(NcclWatchedCall& c, absl::Duration pending_for) {
  if (absl::Status w = failure(); !w.ok()) {
    return absl::AbortedError(absl::StrCat("the NCCL world failed meanwhile: ", w.message()));
  }
  {
    std::unique_lock<std::timed_mutex> l(c.slot->mu, std::try_to_lock);
    // Busy: the owner is in a call, which checks the error itself. Torn down: destroyed
    // (finalized: the event completes) or aborted (the world is poisoned: seen above next pass).
    if (l.owns_lock() && c.slot->handle != nullptr && !c.slot->torn_down()) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(c.slot->handle, &st);
      if (r != ncclSuccess) st = r;
      if (st != ncclSuccess && st != ncclInProgress) {
        return NcclStatus(st, c.slot->handle, "asynchronous NCCL error (found by the watchdog)",
                          __FILE__, __LINE__);
      }
    }
  }
  if (pending_for >= kWatchAfter && board_ != nullptr) {
    if (std::optional<PeerFailure> f = board_->Poll(); f.has_value()) {
      return absl::AbortedError(absl::StrCat("rank ", f->rank, " published a failure"));
    }
  }
  return absl::OkStatus();
}

void NcclWorld::OnFailure(NcclWatchedCall& c, const absl::Status& why) {
  if (failure().ok()) {
    // The first failure of the world found here: report it as a failed blocking call would
    // (the call was enqueued: a wait's failure), then poison the world before the abort, so a
    // stream that moves on because of the abort finds the world failed.
    NcclCallFailure f = c.failure;
    f.own = why;
    f.origin = FailureOrigin::kPeer;
    const absl::Status failed = ReportNcclCallFailure(board_.get(), f);
    if (Poison(failed)) {
      std::fprintf(stderr, "shardmap: NCCL watchdog (rank %d): %s\n", world_rank_,
                   failed.ToString().c_str());
    }
  }
  AbortSlot(*c.slot, c.device);
}

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_HAS_CUDA
