// AsyncLane: the started calls of one communicator (AllReduceStart, AllGatherStart,
// ReduceScatterStart), run one after another on a background thread over a dedicated duplicate
// of the group, so that they proceed while the caller computes and never interleave with the
// blocking calls the caller makes on the communicator meanwhile.
//
//   // In a backend's AllReduceStart (the lane opened lazily at the first started call, which
//   // every rank of the group reaches at the same program point):
//   if (lane_ == nullptr) {
//     absl::StatusOr<std::unique_ptr<AsyncLane>> l = OpenAsyncLane(*this, {.name = name()});
//     if (!l.ok()) return l.status();
//     lane_ = std::move(*l);
//   }
//   return lane_->Start("AllReduceStart(f32, count=4)", tag, [=](Communicator& dup) {
//     return dup.AllReduce(send, recv, count, dtype, op);   // the blocking call, on the lane
//   });
//
// Semantics (communicator.h's contract for started calls):
//   - Calls run FIFO on the lane's thread, on `dup` (made by Split(0, rank) of the group: same
//     ranks, same order, its own sequence of calls). Every rank starts the same calls in the same
//     order, so the n-th started call of each rank meets the n-th of its peers on `dup`.
//   - The tag (TagNextCall before the start) goes to `dup` before the call, so a backend that
//     compares tags still catches mismatched started calls.
//   - Wait() blocks until the call is over and returns its status; a second Wait() is
//     FailedPrecondition. The caller's writes before the start happen-before the lane's reads,
//     and the lane's writes happen-before Wait() returns (a mutex hand-off: tsan-clean).
//   - A handle destroyed without Wait() first reports the misuse (LaneOptions::report_misuse: a
//     backend poisons its world, so the call and the peers' matching ones fail at once rather
//     than wait out a timeout), then waits for the call: its buffers are never touched after the
//     destructor returned. The misuse also fails the lane (below).
//   - The first failure on the lane fails every later started call with the same code (the
//     message names the earlier call); calls already queued are not run.
//   - The destructor runs the calls still queued (a rank's peers expect them; each is bounded by
//     the backend's timeout), then joins the thread.
#ifndef SHARDMAP_COLLECTIVES_ASYNC_LANE_H_
#define SHARDMAP_COLLECTIVES_ASYNC_LANE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace shardmap::collectives {

struct LaneOptions {
  // The owner's name, for messages ("gloo world(4)").
  std::string name;
  // Called on the caller's thread when a handle is destroyed without Wait(), before the handle
  // waits for its call; null: the misuse only fails the lane's later calls.
  std::function<void(const absl::Status&)> report_misuse;
};

class AsyncLane {
 public:
  // One started call: runs on the lane's thread with the duplicate group.
  using Call = std::function<absl::Status(Communicator& dup)>;

  // `dup` is owned and from now on used by the lane's thread only.
  AsyncLane(std::unique_ptr<Communicator> dup, LaneOptions options);
  ~AsyncLane();
  AsyncLane(const AsyncLane&) = delete;
  AsyncLane& operator=(const AsyncLane&) = delete;

  // Queues `call` (`what` names it in messages; `tag` is given to dup.TagNextCall first when it
  // is not all zero). Returns at once; the lane's earlier failure, if any, comes back here.
  absl::StatusOr<std::unique_ptr<PendingCollective>> Start(std::string what, const CallTag& tag,
                                                           Call call);

  // The duplicate group's description (for tests and messages).
  const std::string& dup_name() const { return dup_name_; }

  struct State;  // shared with the handles (async_lane.cc)

 private:
  void Run();

  std::shared_ptr<State> state_;
  std::unique_ptr<Communicator> dup_;
  const std::string dup_name_;
  std::thread thread_;
};

// Makes `group`'s duplicate (group.Split(0, group.rank()): collective over the group, untagged)
// and starts a lane on it. Call it with no tag pending on `group` (take the tag first).
absl::StatusOr<std::unique_ptr<AsyncLane>> OpenAsyncLane(Communicator& group,
                                                         LaneOptions options);

// A lane opened at the first started call (OpenAsyncLane on `self`), then reused: what a
// communicator keeps to implement the *Start calls. Used by one thread (the rank's).
class LazyAsyncLane {
 public:
  explicit LazyAsyncLane(LaneOptions options) : options_(std::move(options)) {}
  // Opens the lane on `self` if needed (a failure to open fails this and every later call with
  // that status), then AsyncLane::Start. No tag may be pending on `self` (it would go to Split).
  absl::StatusOr<std::unique_ptr<PendingCollective>> Start(Communicator& self, std::string what,
                                                           const CallTag& tag, AsyncLane::Call call);
  bool open() const { return lane_ != nullptr; }
  const AsyncLane* lane() const { return lane_.get(); }

 private:
  LaneOptions options_;
  absl::Status open_failure_;
  std::unique_ptr<AsyncLane> lane_;
};

// Whether a tag carries anything (all zero words and no describe: untagged).
bool IsTagged(const CallTag& tag);

// "AllReduceStart(f32, sum, count=7) on 'NAME'", the start's name in messages.
std::string StartedCallName(const char* op, DataType dtype, const ReduceOp* reduce, size_t count,
                            const std::string& group);

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_ASYNC_LANE_H_
