// The shared state of one MemoryTracker: kept alive by every Storage it counted, so a free after
// the tracker is gone (or on another thread) is harmless.
#ifndef SHARDMAP_TENSOR_INTERNAL_MEMORY_TRACKER_STATE_H_
#define SHARDMAP_TENSOR_INTERNAL_MEMORY_TRACKER_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>

namespace shardmap::internal {

struct AccountingTls;

struct TrackerState : std::enable_shared_from_this<TrackerState> {
  std::atomic<int64_t> live{0}, peak{0}, allocated{0}, allocations{0};
  std::shared_ptr<TrackerState> outer;  // the enclosing tracker on the same thread
  const AccountingTls* owner = nullptr;

  // Peak is written only on the owning thread; live may drop concurrently (a free elsewhere),
  // so a CAS keeps the maximum.
  void UpdatePeak() {
    const int64_t now = live.load(std::memory_order_relaxed);
    int64_t old = peak.load(std::memory_order_relaxed);
    while (now > old && !peak.compare_exchange_weak(old, now, std::memory_order_relaxed)) {
    }
  }
};

}  // namespace shardmap::internal

#endif  // SHARDMAP_TENSOR_INTERNAL_MEMORY_TRACKER_STATE_H_
