#include "collectives/internal/completion_watchdog.h"

namespace shardmap::collectives::internal {

WatchdogThread::WatchdogThread(absl::Duration poll_interval, std::function<void()> on_start,
                               std::function<bool()> pass)
    : poll_interval_(poll_interval > absl::ZeroDuration() ? poll_interval
                                                          : absl::Milliseconds(10)),
      on_start_(std::move(on_start)),
      pass_(std::move(pass)),
      thread_([this] { Loop(); }) {}

WatchdogThread::~WatchdogThread() { Stop(); }

void WatchdogThread::Wake() {
  {
    std::lock_guard<std::mutex> l(mu_);
    pending_ = true;
  }
  cv_.notify_all();
}

void WatchdogThread::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

int64_t WatchdogThread::passes() const {
  std::lock_guard<std::mutex> l(mu_);
  return passes_;
}

void WatchdogThread::Loop() {
  if (on_start_) on_start_();
  const auto interval = poll_interval_ == absl::InfiniteDuration()
                            ? std::chrono::nanoseconds(0)
                            : absl::ToChronoNanoseconds(poll_interval_);
  bool pending = false;  // items left by the last pass: look again after the interval
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    if (poll_interval_ == absl::InfiniteDuration()) {
      cv_.wait(l, [this] { return stop_; });  // Sweep() only
    } else if (pending) {
      cv_.wait_for(l, interval, [this] { return stop_; });
    } else {
      cv_.wait(l, [this] { return stop_ || pending_; });  // nothing to watch: no wake-ups
    }
    if (stop_) return;
    pending_ = false;
    ++passes_;
    l.unlock();
    pending = pass_();
    l.lock();
    // Items watched during the pass set pending_ (Wake): pass_ saw them, or the next pass will.
    pending = pending || pending_;
  }
}

}  // namespace shardmap::collectives::internal
