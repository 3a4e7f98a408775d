#include "base/host_waits.h"

#include <atomic>

namespace shardmap::base {
namespace {

std::array<std::atomic<int64_t>, kHostWaitKinds>& ProcessCounts() {
  static auto* counts = new std::array<std::atomic<int64_t>, kHostWaitKinds>();
  return *counts;
}

thread_local HostWaitCounts this_thread_counts;

}  // namespace

const char* HostWaitName(HostWait kind) {
  switch (kind) {
    case HostWait::kNcclBlockingCall: return "nccl_blocking_call";
    case HostWait::kStreamSync: return "stream_sync";
    case HostWait::kEventSync: return "event_sync";
    case HostWait::kDeviceSync: return "device_sync";
    case HostWait::kDeviceToHostRead: return "d2h_read";
  }
  return "unknown";
}

int64_t HostWaitCounts::total() const {
  int64_t t = 0;
  for (int64_t n : by_kind) t += n;
  return t;
}

HostWaitCounts HostWaitCounts::operator-(const HostWaitCounts& earlier) const {
  HostWaitCounts d;
  for (int k = 0; k < kHostWaitKinds; ++k) d.by_kind[k] = by_kind[k] - earlier.by_kind[k];
  return d;
}

std::string HostWaitCounts::ToString() const {
  std::string s;
  for (int k = 0; k < kHostWaitKinds; ++k) {
    if (by_kind[k] == 0) continue;
    if (!s.empty()) s += ' ';
    s += HostWaitName(static_cast<HostWait>(k));
    s += '=';
    s += std::to_string(by_kind[k]);
  }
  return s.empty() ? "none" : s;
}

void CountHostWait(HostWait kind) {
  const int k = static_cast<int>(kind);
  if (k < 0 || k >= kHostWaitKinds) return;  // a corrupted value: not a kind, not counted
  ProcessCounts()[k].fetch_add(1, std::memory_order_relaxed);
  ++this_thread_counts.by_kind[k];
}

HostWaitCounts HostWaitSnapshot() {
  HostWaitCounts c;
  for (int k = 0; k < kHostWaitKinds; ++k) {
    c.by_kind[k] = ProcessCounts()[k].load(std::memory_order_relaxed);
  }
  return c;
}

HostWaitCounts HostWaitSnapshotThisThread() { return this_thread_counts; }

}  // namespace shardmap::base
