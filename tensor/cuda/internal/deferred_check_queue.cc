#include "tensor/cuda/internal/deferred_check_queue.h"

#include <utility>

#include "tensor/error.h"

namespace shardmap::cuda::internal {

DeferredCheckQueue::DeferredCheckQueue(int slots, SlotOps ops)
    : capacity_(slots), ops_(std::move(ops)) {
  if (slots < 1) OpFail("DeferredCheckQueue: ", slots, " slots; at least 1 is needed");
  if (!ops_.done || !ops_.wait || !ops_.value) {
    OpFail("DeferredCheckQueue: done, wait and value must all be given");
  }
  for (int i = slots - 1; i >= 0; --i) free_.push_back(i);
}

int DeferredCheckQueue::Acquire() {
  if (free_.empty()) {
    ops_.wait(pending_.front().slot);  // the oldest: the others' streams may be long gone
    RunFinished();
  }
  const int slot = free_.back();
  free_.pop_back();
  return slot;
}

void DeferredCheckQueue::Release(int slot) { free_.push_back(slot); }

void DeferredCheckQueue::Add(int slot, Fail fail) {
  pending_.push_back(Pending{slot, std::move(fail)});
}

void DeferredCheckQueue::RunFinished() {
  // Asked first for every check: a throwing `done` (a CUDA error) leaves the queue as it was.
  std::vector<char> landed;
  for (const Pending& p : pending_) landed.push_back(ops_.done(p.slot) ? 1 : 0);
  Fail first_fail;
  int64_t first_pos = -1;
  std::vector<Pending> keep;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    if (!landed[i]) {
      keep.push_back(std::move(p));
      continue;
    }
    const int64_t pos = ops_.value(p.slot);
    free_.push_back(p.slot);
    if (pos >= 0 && first_pos < 0) {
      first_pos = pos;
      first_fail = std::move(p.fail);
    }
  }
  pending_ = std::move(keep);
  if (first_pos >= 0) first_fail(first_pos);
}

}  // namespace shardmap::cuda::internal
