#include "collectives/internal/rank_threads.h"

#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardmap::collectives::internal {

// One parked thread: waits for a task, runs it, reports to its batch, parks again.
struct RankThreads::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> task;  // set by Run, cleared by the worker
  bool exit = false;
  std::thread thread;
};

// The tasks of one Run: counts those still running.
struct RankThreads::Batch {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
};

RankThreads& RankThreads::Shared() {
  static RankThreads* pool = new RankThreads();  // never destroyed: rank threads may outlive main
  return *pool;
}

RankThreads::~RankThreads() {
  std::vector<std::shared_ptr<Worker>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all.swap(all_);
    idle_.clear();
  }
  for (auto& w : all) {
    {
      std::lock_guard<std::mutex> l(w->mu);
      w->exit = true;
    }
    w->cv.notify_one();
    if (w->thread.joinable()) w->thread.join();
  }
}

int RankThreads::idle() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(idle_.size());
}

void RankThreads::FailThreadCreationAfterForTesting(int fail_after) {
  std::lock_guard<std::mutex> l(mu_);
  fail_after_ = fail_after;
}

std::shared_ptr<RankThreads::Worker> RankThreads::Acquire(absl::Status& error) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!idle_.empty()) {
      std::shared_ptr<Worker> w = std::move(idle_.back());
      idle_.pop_back();
      return w;
    }
    if (fail_after_ == 0) {
      error = absl::ResourceExhaustedError(
          "could not create a rank thread: thread creation failed (test injection)");
      return nullptr;
    }
    if (fail_after_ > 0) --fail_after_;
  }
  auto w = std::make_shared<Worker>();
  try {
    w->thread = std::thread([w = w.get()] {
      std::unique_lock<std::mutex> l(w->mu);
      for (;;) {
        w->cv.wait(l, [w] { return w->exit || w->task != nullptr; });
        if (w->task == nullptr) return;  // exit
        std::function<void()> task = std::move(w->task);
        w->task = nullptr;
        l.unlock();
        task();  // reports to its batch and parks this worker
        l.lock();
      }
    });
  } catch (const std::system_error& e) {
    error = absl::ResourceExhaustedError(
        absl::StrCat("could not create a rank thread: ", e.what(),
                     " (the process or system thread limit; `ulimit -u`, or fewer ranks)"));
    return nullptr;
  }
  std::lock_guard<std::mutex> l(mu_);
  all_.push_back(w);
  return w;
}

void RankThreads::Park(std::shared_ptr<Worker> w) {
  std::lock_guard<std::mutex> l(mu_);
  idle_.push_back(std::move(w));
}

absl::Status RankThreads::Run(int n, const std::function<void(int)>& task) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("RankThreads: n must be >= 1, got ", n));
  std::vector<std::shared_ptr<Worker>> workers;
  workers.reserve(n);
  absl::Status error;
  for (int r = 0; r < n; ++r) {
    std::shared_ptr<Worker> w = Acquire(error);
    if (w == nullptr) {
      for (auto& got : workers) Park(std::move(got));
      return absl::Status(error.code(), absl::StrCat("starting ", n, " ranks: ", error.message()));
    }
    workers.push_back(std::move(w));
  }
  Batch batch;
  batch.running = n;
  for (int r = 0; r < n; ++r) {
    Worker* w = workers[r].get();
    std::shared_ptr<Worker> self = workers[r];
    {
      std::lock_guard<std::mutex> l(w->mu);
      w->task = [this, &task, &batch, r, self]() mutable {
        task(r);
        Park(std::move(self));  // before the batch ends: the next Run may reuse it at once
        std::lock_guard<std::mutex> bl(batch.mu);
        if (--batch.running == 0) batch.cv.notify_all();
      };
    }
    w->cv.notify_one();
  }
  std::unique_lock<std::mutex> l(batch.mu);
  batch.cv.wait(l, [&] { return batch.running == 0; });
  return absl::OkStatus();
}

}  // namespace shardmap::collectives::internal
