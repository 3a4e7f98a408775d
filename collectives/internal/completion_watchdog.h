// CompletionWatchdog: a background thread that watches work handed to it (an NCCL call enqueued
// on a CUDA stream, marked by an event recorded after it) until the work is done, and reports
// the items that fail (an asynchronous error, a deadline passed) through a callback. What "done"
// and "failed" mean is in the callbacks, so the class is generic and runs without a GPU in its
// test (collectives/nccl_watchdog.h gives it NCCL's meaning).
//
//   CompletionWatchdog<Call>::Callbacks cb;
//   cb.is_done = [](Call& c) -> absl::StatusOr<bool> { return EventDone(c.event); };
//   cb.poll_error = [](Call& c, absl::Duration pending_for) { return AsyncError(c); };
//   cb.on_failure = [](Call& c, const absl::Status& why) { AbortAndPoison(c, why); };
//   CompletionWatchdog<Call> dog(std::move(cb), WatchdogOptions{});
//   dog.Watch(Call{...}, absl::Now() + timeout, "AllReduce(f32, count=4)");
//   absl::Status s = dog.Sweep();  // one pass on the calling thread, e.g. at a sync point
//
// A pass looks at each pending item in the order they were watched: poll_error first (non-OK
// fails the item), then is_done (true drops the item; an error fails it), then the deadline
// (passed: fails it with DeadlineExceeded naming the item). The failed items leave the list and
// on_failure is called once for each, in watch order, after the pass looked at every item and
// outside the watchdog's own locks (so a callback may Watch() new items; it must not call
// Sweep()). Items are destroyed (their resources released) by the pass that drops them, or at
// shutdown. Passes never overlap: Sweep() waits for a pass of the thread in progress.
//
// The thread sleeps between passes (WatchdogOptions::poll_interval: a condition variable's
// timed wait, no spinning) and, with nothing pending, until the next Watch(). Shutdown (Stop()
// or the destructor) wakes it and joins it after the pass in progress, if any: pending items are
// destroyed without callbacks (the owner has torn down, or is tearing down, what they watch),
// and later Watch() calls are refused. Thread-safe.
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_COMPLETION_WATCHDOG_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_COMPLETION_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardmap::collectives::internal {

struct WatchdogOptions {
  // Time between two passes of the thread while items are pending (> 0). Infinite: the thread
  // never passes (only Sweep() does; for tests and owners that sweep themselves).
  absl::Duration poll_interval = absl::Milliseconds(10);
  // Runs once on the thread before its first pass (e.g. cudaSetDevice); may be empty.
  std::function<void()> on_thread_start;
};

// The non-template part: the thread, its sleep and its shutdown. `pass` runs one pass and
// returns whether items are still pending (false: sleep until Wake()).
class WatchdogThread {
 public:
  WatchdogThread(absl::Duration poll_interval, std::function<void()> on_start,
                 std::function<bool()> pass);
  ~WatchdogThread();  // Stop()
  WatchdogThread(const WatchdogThread&) = delete;
  WatchdogThread& operator=(const WatchdogThread&) = delete;

  // Something new is pending: the thread passes again within poll_interval.
  void Wake();
  // Wakes the thread and joins it (after the pass in progress). Idempotent. Not from `pass`.
  void Stop();
  // Passes the thread made so far (for tests: the thread sleeps while nothing is pending).
  int64_t passes() const;

 private:
  void Loop();

  const absl::Duration poll_interval_;
  const std::function<void()> on_start_;
  const std::function<bool()> pass_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;     // guarded by mu_
  bool pending_ = false;  // guarded by mu_: Wake() since the last sleep
  int64_t passes_ = 0;    // guarded by mu_
  std::thread thread_;    // last: started once the members above exist
};

template <typename Item>
class CompletionWatchdog {
 public:
  struct Callbacks {
    // OK(true) once the item's work is done, OK(false) while it is pending; an error (the query
    // itself failed) fails the item with it.
    std::function<absl::StatusOr<bool>(Item&)> is_done;
    // Non-OK fails the item (checked before is_done); `pending_for`: the time since Watch().
    std::function<absl::Status(Item&, absl::Duration pending_for)> poll_error;
    // Reports a failed item (once per item; see the header comment for where it runs).
    std::function<void(Item&, const absl::Status&)> on_failure;
  };

  // poll_error may be empty (nothing but is_done and the deadline); the others may not.
  CompletionWatchdog(Callbacks callbacks, WatchdogOptions options)
      : callbacks_(std::move(callbacks)),
        thread_(options.poll_interval, std::move(options.on_thread_start),
                [this] { return Pass().pending; }) {}
  ~CompletionWatchdog() { Stop(); }
  CompletionWatchdog(const CompletionWatchdog&) = delete;
  CompletionWatchdog& operator=(const CompletionWatchdog&) = delete;

  // Watches `item` until it is done, fails, or the watchdog stops. `what` names it in the
  // deadline's error. FailedPrecondition after Stop() (the item is destroyed here).
  absl::Status Watch(Item item, absl::Time deadline, std::string what) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopped_) {
        return absl::FailedPreconditionError(
            absl::StrCat("the completion watchdog was stopped; cannot watch ", what));
      }
      incoming_.push_back(Entry{std::move(item), deadline, absl::Now(), std::move(what)});
      ++pending_count_;
    }
    thread_.Wake();
    return absl::OkStatus();
  }

  // One pass on the calling thread now (after the thread's pass in progress, if any). Returns
  // the first failure this pass found (OK when none; failures found earlier are not repeated).
  absl::Status Sweep() { return Pass().first_failure; }

  // Items watched and not yet gone (done and destroyed, or failed, reported and destroyed).
  size_t pending() const {
    std::lock_guard<std::mutex> l(mu_);
    return pending_count_;
  }

  int64_t thread_passes() const { return thread_.passes(); }

  // Joins the thread; pending items are destroyed without callbacks; later Watch() fails.
  // Idempotent; not from a callback.
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopped_ = true;
    }
    thread_.Stop();
    std::lock_guard<std::mutex> p(pass_mu_);  // a Sweep() in progress finishes first
    std::list<Entry> drop;
    {
      std::lock_guard<std::mutex> l(mu_);
      drop.swap(incoming_);
      pending_count_ = 0;
    }
    watched_.clear();
    drop.clear();
  }

 private:
  struct Entry {
    Item item;
    absl::Time deadline;
    absl::Time since;
    std::string what;
  };
  struct PassResult {
    bool pending = false;
    absl::Status first_failure;
  };

  // Looks at every pending item (see the header comment); calls on_failure for the failed ones.
  PassResult Pass() {
    std::lock_guard<std::mutex> p(pass_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopped_) return {};
      watched_.splice(watched_.end(), incoming_);
    }
    std::vector<std::pair<Entry, absl::Status>> failed;
    size_t gone = 0;
    const absl::Time now = absl::Now();
    for (auto it = watched_.begin(); it != watched_.end();) {
      absl::Status why = callbacks_.poll_error ? callbacks_.poll_error(it->item, now - it->since)
                                               : absl::OkStatus();
      if (why.ok()) {
        absl::StatusOr<bool> done = callbacks_.is_done(it->item);
        if (!done.ok()) {
          why = done.status();
        } else if (*done) {
          it = watched_.erase(it);  // destroys the item
          ++gone;
          continue;
        } else if (now >= it->deadline) {
          why = absl::DeadlineExceededError(absl::StrCat(
              it->what, ": not done after ", absl::FormatDuration(now - it->since),
              " (the deadline passed; a peer may have failed, left, or issued a different "
              "call)"));
        }
      }
      if (why.ok()) {
        ++it;
        continue;
      }
      failed.emplace_back(std::move(*it), std::move(why));
      it = watched_.erase(it);
    }
    PassResult r;
    for (auto& [entry, why] : failed) {
      if (r.first_failure.ok()) r.first_failure = why;
      callbacks_.on_failure(entry.item, why);
    }
    gone += failed.size();
    failed.clear();  // destroys them: pending() counts an item until it is reported and gone
    std::lock_guard<std::mutex> l(mu_);
    pending_count_ -= gone;
    r.pending = !watched_.empty() || !incoming_.empty();
    return r;
  }

  const Callbacks callbacks_;
  std::mutex pass_mu_;         // one pass at a time; held across the callbacks
  std::list<Entry> watched_;   // guarded by pass_mu_
  mutable std::mutex mu_;      // never held across a callback
  std::list<Entry> incoming_;  // guarded by mu_: watched, not yet looked at by a pass
  size_t pending_count_ = 0;   // guarded by mu_: watched and not gone (see pending())
  bool stopped_ = false;       // guarded by mu_
  WatchdogThread thread_;      // last: its pass uses the members above
};

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_COMPLETION_WATCHDOG_H_
