// RankThreads: the threads in-process ranks run on, kept alive between calls. RunInProcess used
// to create (and join) one thread per rank on every call; a global-view shard_map call paid that
// each time. Threads now park after their task and the next call reuses them.
//
//   absl::Status s = RankThreads::Shared().Run(8, [&](int r) { ...rank r's work... });
//
// Run(n, task) starts task(0..n-1) on n distinct threads at once (ranks wait for each other, so
// they must all run concurrently) and returns when all have returned. All n threads are secured
// before any task starts: when one cannot be created (the system's thread limit), no task runs
// and Run returns ResourceExhausted, so no rank is left waiting for a peer that never started.
// Thread-local state set by a task must be restored by it (the scopes of shardmap do).
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_RANK_THREADS_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_RANK_THREADS_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace shardmap::collectives::internal {

class RankThreads {
 public:
  // The process-wide pool.
  static RankThreads& Shared();

  RankThreads() = default;
  ~RankThreads();  // joins the parked threads
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  absl::Status Run(int n, const std::function<void(int)>& task);

  // Parked threads now (tests).
  int idle() const;
  // Tests: the next `fail_after` thread creations succeed, then they fail as if the system
  // refused (-1: never fail).
  void FailThreadCreationAfterForTesting(int fail_after);

 private:
  struct Worker;
  struct Batch;
  // A parked worker, or a new one; nullptr with `error` set when a thread cannot be created.
  std::shared_ptr<Worker> Acquire(absl::Status& error);
  void Park(std::shared_ptr<Worker> w);

  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Worker>> idle_;
  std::vector<std::shared_ptr<Worker>> all_;  // joined at destruction
  int fail_after_ = -1;
};

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_RANK_THREADS_H_
