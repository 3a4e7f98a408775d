// Shared state of the in-process backend: a World (its ranks' liveness and poisoning) and its
// Groups (one per communicator: slots where ranks publish their calls, a barrier, mailboxes for
// send/recv). See in_process.cc for the protocol built on them.
//
//   auto world = std::make_shared<World>(n, absl::Seconds(30), /*debug_check_calls=*/false);
//   auto group = std::make_shared<Group>(world, /*world_ranks=*/{0, 1, 2}, "world(3)");
//   world->Register(group);
//   absl::Status s = group->Barrier(rank, [] { return std::string("Barrier()"); });
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_IN_PROCESS_GROUP_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_IN_PROCESS_GROUP_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/internal/collective_op.h"
#include "collectives/internal/status_macros.h"

namespace shardmap::collectives::internal {

constexpr int kMaxFrames = 32;

struct CallSite {
  void* frames[kMaxFrames];
  int depth = 0;
};

// Symbolized frames of the caller, skipping our own.
std::string FormatCallSite(const CallSite& site);

uint64_t HashBytes(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);

struct CallDesc {
  Op op = Op::kBarrier;
  DataType dtype = DataType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  size_t count = 0;
  int root = -1;
  uint64_t shape_hash = 0;  // of per-rank counts or ppermute pairs
  uint64_t seq = 0;
  bool device = false;  // buffers in GPU memory

  bool operator==(const CallDesc&) const = default;
};

std::string Describe(const CallDesc& d);

int HardwareThreads();

// Yields rather than pauses: on a loaded machine the peer we wait for may need this core.
inline void CpuRelax() { std::this_thread::yield(); }

class Group;

struct Slot {
  CallDesc desc;
  CallSite site;
  CallTag tag;  // the caller's tag for this call (zero when untagged)
  const void* send = nullptr;
  void* recv = nullptr;
  int device_index = 0;
  std::vector<size_t> counts;   // counts / send_counts
  std::vector<size_t> counts2;  // recv_counts
  int color = 0;
  int key = 0;
  std::shared_ptr<Group> new_group;  // Split: set by the new group's leader
};

class World {
 public:
  World(int size, absl::Duration timeout, bool debug_check_calls)
      : size_(size),
        timeout_(timeout),
        debug_(debug_check_calls),
        exited_(new std::atomic<bool>[size]),
        reported_(new std::atomic<bool>[size]),
        activity_(size) {
    for (int i = 0; i < size; ++i) {
      exited_[i].store(false);
      reported_[i].store(false);
    }
  }

  int size() const { return size_; }
  // How long any wait may take (InProcessOptions::timeout).
  absl::Duration timeout() const { return timeout_; }
  // InProcessOptions::debug_check_calls.
  bool debug() const { return debug_; }

  void Register(const std::shared_ptr<Group>& g) {
    std::lock_guard<std::mutex> l(mu_);
    std::erase_if(groups_, [](const std::weak_ptr<Group>& w) { return w.expired(); });
    groups_.push_back(g);
  }

  bool poisoned() const { return poisoned_.load(std::memory_order_acquire); }
  // Valid once poisoned() returned true.
  absl::Status first_failure() const {
    std::lock_guard<std::mutex> l(mu_);
    return first_failure_;
  }
  int failed_rank() const {
    std::lock_guard<std::mutex> l(mu_);
    return failed_rank_;
  }

  // The first call wins; wakes every waiter of every group. Every call marks world_rank as
  // having reported a failure (see Refusal). One exception: an ABORTED failure is what a rank
  // reports while an exception unwinds its stack (a started call abandoned on the way,
  // collectives/async_lane.h: "the exception is the error to look at"); the same rank's next,
  // real failure (that exception, reaching RunInProcess) replaces it, so the run reports the
  // cause rather than the clean-up.
  void Poison(int world_rank, const absl::Status& why) {
    reported_[world_rank].store(true, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> l(mu_);
      const absl::Status status(why.code(),
                                absl::StrCat("rank ", world_rank, ": ", why.message()));
      if (poisoned_.load(std::memory_order_relaxed)) {
        if (first_is_unwinding_ && world_rank == failed_rank_ &&
            why.code() != absl::StatusCode::kAborted) {
          first_failure_ = status;
          first_is_unwinding_ = false;
        }
        return;
      }
      failed_rank_ = world_rank;
      first_failure_ = status;
      first_is_unwinding_ = why.code() == absl::StatusCode::kAborted;
      poisoned_.store(true, std::memory_order_release);
    }
    WakeAll();
  }

  // A call refused on a poisoned world. The first time a rank hears of the failure it gets the
  // failing rank's own code, as a call in flight would have (so every rank reports a mismatch
  // as INVALID_ARGUMENT, however the ranks were timed); ABORTED once it has reported a failure.
  absl::Status Refusal(int world_rank, absl::string_view what) {
    const bool knew = reported_[world_rank].exchange(true, std::memory_order_relaxed);
    const absl::Status first = first_failure();
    return absl::Status(knew ? absl::StatusCode::kAborted : first.code(),
                        absl::StrCat(what, " refused: the world was poisoned by ",
                                     first.message()));
  }

  void MarkExited(int world_rank) {
    exited_[world_rank].store(true, std::memory_order_release);
    WakeAll();
  }
  bool exited(int world_rank) const { return exited_[world_rank].load(std::memory_order_acquire); }

  // Debug mode: what each rank is doing, for timeout messages.
  void SetActivity(int world_rank, std::string what) {
    std::lock_guard<std::mutex> l(mu_);
    activity_[world_rank] = std::move(what);
  }
  std::string Activity(int world_rank) {
    std::lock_guard<std::mutex> l(mu_);
    return activity_[world_rank].empty() ? "not in a collective" : activity_[world_rank];
  }

 private:
  void WakeAll();

  const int size_;
  const absl::Duration timeout_;
  const bool debug_;
  std::unique_ptr<std::atomic<bool>[]> exited_;
  std::unique_ptr<std::atomic<bool>[]> reported_;  // the rank returned a failure already
  std::atomic<bool> poisoned_{false};
  absl::Status first_failure_;
  int failed_rank_ = -1;
  bool first_is_unwinding_ = false;  // first_failure_ is an ABORTED clean-up report (Poison)
  // std::mutex, not absl::Mutex: Debian's Abseil is not built for ThreadSanitizer, which then
  // cannot see its happens-before edges.
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<Group>> groups_;  // guarded by mu_
  std::vector<std::string> activity_;         // guarded by mu_
};

class Group {
 public:
  struct Mailbox {
    const void* data = nullptr;
    size_t count = 0;
    DataType dtype = DataType::kF32;
    bool posted = false;
    bool taking = false;  // the receiver is copying from `data`, unlocked
    bool done = false;
  };

  Group(std::shared_ptr<World> world, std::vector<int> world_ranks, std::string name)
      : world_(std::move(world)),
        world_ranks_(std::move(world_ranks)),
        name_(std::move(name)),
        here_(world_ranks_.size(), 0),
        busy_(world_ranks_.size(), 0),
        gave_up_(world_ranks_.size(), 0),
        slots_(world_ranks_.size()),
        mail_(world_ranks_.size() * world_ranks_.size()) {}

  World& world() { return *world_; }
  const std::shared_ptr<World>& world_ptr() { return world_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  int world_rank(int r) const { return world_ranks_[r]; }
  const std::string& name() const { return name_; }
  Slot& slot(int rank, uint64_t seq) { return slots_[rank][seq & 1]; }

  std::string RankName(int r) const {
    if (world_ranks_[r] == r) return absl::StrCat("rank ", r);
    return absl::StrCat("rank ", r, " (world rank ", world_ranks_[r], ")");
  }

  // A rank's call is over. After a failure, waits until no peer is still between two barriers
  // of this call (it may be reading our buffers); such a peer only runs a bounded copy or
  // reduction before it reaches a barrier or leaves.
  void Leave(int rank, bool failed) {
    std::unique_lock<std::mutex> l(mu_);
    busy_[rank] = 0;
    cv_.notify_all();
    if (failed) {
      // A rank that left its function (e.g. threw out of a copy) is no longer reading anything.
      auto quiet = [&] {
        for (int p = 0; p < size(); ++p) {
          if (busy_[p] && !world_->exited(world_ranks_[p])) return false;
        }
        return true;
      };
      cv_.wait_until(l, absl::ToChronoTime(absl::Now() + world_->timeout()), quiet);
    }
  }

  void Wake() {
    std::lock_guard<std::mutex> l(mu_);
    cv_.notify_all();
  }

  absl::Status Barrier(int rank, const std::function<std::string()>& what) {
    const absl::Time deadline = absl::Now() + world_->timeout();
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = generation_;
    here_[rank] = 1;
    busy_[rank] = 0;
    if (++arrived_ == size()) {
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), 0);
      std::fill(busy_.begin(), busy_.end(), 1);  // everyone may now read peers' buffers
      ++generation_;
      generation_atomic_.store(generation_, std::memory_order_release);
      cv_.notify_all();
      return absl::OkStatus();
    }
    // With a core per rank, a short spin beats a futex sleep and wake-up (tens of microseconds
    // per barrier); with more ranks than cores spinning would only steal the peers' time.
    if (world_->size() <= HardwareThreads()) {
      l.unlock();
      const absl::Time spin_until = absl::Now() + absl::Microseconds(30);
      bool done = false;
      while (!(done = generation_atomic_.load(std::memory_order_acquire) != gen) &&
             !world_->poisoned() && absl::Now() < spin_until) {
        CpuRelax();
      }
      if (done) return absl::OkStatus();
      l.lock();
    }
    absl::Status s = WaitLocked(
        l, deadline, [&] { return generation_ != gen; }, what,
        [&] {
          std::vector<int> missing;
          for (int p = 0; p < size(); ++p) {
            if (!here_[p] && !gave_up_[p]) missing.push_back(p);
          }
          return missing;
        });
    if (!s.ok()) {  // withdraw, so the barrier cannot complete (and mark us busy) without us
      here_[rank] = 0;
      gave_up_[rank] = 1;
      --arrived_;
      if (absl::IsDeadlineExceeded(s)) {  // poison now: peers timing out too then say why
        l.unlock();
        world_->Poison(world_ranks_[rank], s);
      }
    }
    return s;
  }

  absl::Status Send(int rank, const void* data, size_t count, DataType dtype, int peer,
                    const std::function<std::string()>& what) {
    const absl::Time deadline = absl::Now() + world_->timeout();
    std::unique_lock<std::mutex> l(mu_);
    Mailbox& m = mail_[rank * size() + peer];
    m = Mailbox{data, count, dtype, /*posted=*/true, /*taking=*/false, /*done=*/false};
    cv_.notify_all();
    absl::Status s = WaitLocked(
        l, deadline, [&] { return m.done; }, what, [&] { return std::vector<int>{peer}; });
    // Failed while the receiver copies from our buffer: let it finish (a bounded memcpy).
    cv_.wait(l, [&] { return !m.taking || m.done; });
    m = Mailbox{};
    return s;
  }

  absl::Status Recv(int rank, void* data, size_t count, DataType dtype, int peer,
                    const std::function<std::string()>& what,
                    const std::function<absl::Status(void*, const void*, size_t)>& copy) {
    const absl::Time deadline = absl::Now() + world_->timeout();
    const void* src;
    {
      std::unique_lock<std::mutex> l(mu_);
      Mailbox& m = mail_[peer * size() + rank];
      SM_COLL_RETURN_IF_ERROR(WaitLocked(
          l, deadline, [&] { return m.posted && !m.done; }, what,
          [&] { return std::vector<int>{peer}; }));
      if (m.count != count || m.dtype != dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            what(), ": mismatched Send/Recv: ", RankName(peer), " sends ", m.count, " x ",
            DataTypeName(m.dtype), " but this rank receives ", count, " x ",
            DataTypeName(dtype), "; both sides must agree on count and dtype"));
      }
      src = m.data;
      m.taking = true;
    }
    // The sender is blocked until `done`, so its buffer stays valid while we copy unlocked.
    absl::Status s = copy(data, src, count * DataTypeSize(dtype));
    std::lock_guard<std::mutex> l(mu_);
    mail_[peer * size() + rank].taking = false;
    mail_[peer * size() + rank].done = true;
    cv_.notify_all();
    return s;
  }

 private:
  // Waits until pred() holds; fails at once if the world is poisoned or a rank we wait for has
  // returned from its function, and after the deadline otherwise.
  absl::Status WaitLocked(std::unique_lock<std::mutex>& lock, absl::Time deadline,
                          const std::function<bool()>& pred,
                          const std::function<std::string()>& what,
                          const std::function<std::vector<int>()>& waiting_for) {
    while (!pred()) {
      if (world_->poisoned()) {  // the failing rank's own code: a mismatch stays one
        return absl::Status(world_->first_failure().code(),
                            absl::StrCat(what(), " aborted: the world was poisoned by ",
                                         world_->first_failure().message()));
      }
      for (int p : waiting_for()) {
        if (world_->exited(world_ranks_[p])) {
          return absl::FailedPreconditionError(absl::StrCat(
              what(), ": ", RankName(p),
              " returned from its function without joining this call (every rank of the group "
              "must issue the same collectives in the same order)"));
        }
      }
      if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
          !pred() && absl::Now() >= deadline) {
        std::vector<std::string> missing;
        for (int p : waiting_for()) {
          std::string m = RankName(p);
          if (world_->debug()) {
            absl::StrAppend(&m, " is in: ", world_->Activity(world_ranks_[p]));
          }
          missing.push_back(std::move(m));
        }
        return absl::DeadlineExceededError(absl::StrCat(
            what(), ": timed out after ", absl::FormatDuration(world_->timeout()),
            " waiting for ", absl::StrJoin(missing, "; "),
            world_->debug()
                ? ""
                : " (set InProcessOptions::debug_check_calls to see what they are doing)"));
      }
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<World> world_;
  const std::vector<int> world_ranks_;
  const std::string name_;
  std::mutex mu_;  // guards the barrier and mailbox state below
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> generation_atomic_{0};  // generation_, for spinning without the lock
  std::vector<char> here_;  // arrived at the current barrier
  std::vector<char> busy_;  // passed a barrier and not yet at the next one or out of the call
  std::vector<char> gave_up_;  // left a barrier with an error (the group is dead from then on)
  std::vector<std::array<Slot, 2>> slots_;  // slots_[r] written by r before a barrier only
  std::vector<Mailbox> mail_;  // [src * n + dst]
};



}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_IN_PROCESS_GROUP_H_
