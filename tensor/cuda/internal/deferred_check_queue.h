// The bookkeeping of the deferred index checks (tensor/cuda/device_memory.h), without CUDA so
// that it is tested on any machine. A fixed number of slots (in device_memory.cc: a pinned host
// word and a CUDA event each); a check holds its slot from the op that queued it until its copy
// is found landed. Checks are run by their slot's event, never by their stream: one queued on a
// stream destroyed since runs like any other (an event outlives its stream), and a full queue
// waits for its oldest check's event, never for a stream handle.
//
//   DeferredCheckQueue q(256, ops);   // ops: done(slot) (never blocks), wait(slot), value(slot)
//   int slot = q.Acquire();           // full: waits for the oldest, runs the landed ones
//   ... queue the copy into slot ...  // or q.Release(slot) if that failed
//   q.Add(slot, fail);
//   q.RunFinished();                  // after a wait: runs every landed check, throws the first
#ifndef SHARDMAP_TENSOR_CUDA_INTERNAL_DEFERRED_CHECK_QUEUE_H_
#define SHARDMAP_TENSOR_CUDA_INTERNAL_DEFERRED_CHECK_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace shardmap::cuda::internal {

class DeferredCheckQueue {
 public:
  // Called with the bad position (>= 0) a check's word holds; throws (OpError) naming the op.
  using Fail = std::function<void(int64_t)>;
  struct SlotOps {
    std::function<bool(int slot)> done;      // the slot's copy has landed; never blocks
    std::function<void(int slot)> wait;      // blocks until it has
    std::function<int64_t(int slot)> value;  // the landed word (< 0: no bad index)
  };

  // slots >= 1 (else OpError).
  DeferredCheckQueue(int slots, SlotOps ops);

  int capacity() const { return capacity_; }
  size_t pending() const { return pending_.size(); }

  // A free slot for a new check. When every slot is taken: waits for the oldest check, then runs
  // the landed ones (RunFinished, which may throw the error of an earlier op).
  int Acquire();
  // Gives back a slot from Acquire whose copy could not be queued.
  void Release(int slot);
  // Queues `fail` for the copy queued into `slot` (from Acquire).
  void Add(int slot, Fail fail);
  // Runs and drops every check whose copy has landed (those still in flight stay queued), then
  // calls the earliest failing one's `fail` (in the order the checks were added). Every landed
  // check is dropped and its slot freed before that call, so a throw leaves the queue usable.
  void RunFinished();

 private:
  struct Pending {
    int slot;
    Fail fail;
  };
  const int capacity_;
  const SlotOps ops_;
  std::vector<int> free_;         // slots not in use
  std::vector<Pending> pending_;  // in the order they were added
};

}  // namespace shardmap::cuda::internal

#endif  // SHARDMAP_TENSOR_CUDA_INTERNAL_DEFERRED_CHECK_QUEUE_H_
