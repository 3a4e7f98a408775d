#include "tensor/memory_tracker.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tensor/internal/accounting.h"
#include "tensor/internal/memory_tracker_state.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace internal {

namespace {
std::atomic<uint64_t> next_op_scope{1};

// allocated and allocations change only on the tracker's own thread (Track runs on the
// allocating thread, whose trackers these are; Untrack takes scratch back only inside the op
// that allocated it, on that thread): a load and a store, not a locked read-modify-write, which
// cost ~5% of the planner's shape-only runs. Other threads only read them (atomically).
void AddOnOwner(std::atomic<int64_t>& a, int64_t n) {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void OpScope::Enter() {
  entered_ = true;
  AccountingTls& t = tls_accounting;
  if (t.op_depth++ == 0) {
    outermost_ = true;
    if (t.tracker != nullptr) t.op_scope = next_op_scope.fetch_add(1, std::memory_order_relaxed);
    if (t.counter != nullptr && t.counter->timed_) {
      timed_ = t.counter;
      record_index_ = timed_->ops_.size();
      start_ns_ = NowNs();
    }
  }
}

void OpScope::Exit() {
  AccountingTls& t = tls_accounting;
  // The op recorded itself (ops that run no kernel record nothing) into a counter still live.
  if (timed_ != nullptr && timed_ == t.counter && timed_->ops_.size() > record_index_) {
    timed_->ops_[record_index_].seconds = 1e-9 * static_cast<double>(NowNs() - start_ns_);
  }
  if (--t.op_depth == 0) {
    t.op_scope = 0;
    for (TrackerState* s = t.tracker; s != nullptr; s = s->outer.get()) s->UpdatePeak();
  }
}

void OpScope::Record(const char* op, DType dtype, double flops, double bytes,
                     std::optional<GemmShape> gemm) const {
  RecordOpCount(OpCount{op, dtype, flops, bytes, gemm, 0.0});
}

}  // namespace internal

void Storage::Track() {
  internal::AccountingTls& t = internal::tls_accounting;
  tracker_ = t.tracker->shared_from_this();
  op_scope_ = t.op_scope;
  const int64_t n = static_cast<int64_t>(nbytes_);
  for (internal::TrackerState* s = t.tracker; s != nullptr; s = s->outer.get()) {
    s->live.fetch_add(n, std::memory_order_relaxed);
    internal::AddOnOwner(s->allocated, n);
    internal::AddOnOwner(s->allocations, 1);
    if (op_scope_ == 0) s->UpdatePeak();  // outside an op: peak now; inside: when it returns
  }
}

void Storage::Untrack() {
  // Freed inside the op that allocated it, on its thread: scratch, as if never allocated.
  const bool scratch = op_scope_ != 0 && op_scope_ == internal::tls_accounting.op_scope;
  const int64_t n = static_cast<int64_t>(nbytes_);
  for (internal::TrackerState* s = tracker_.get(); s != nullptr; s = s->outer.get()) {
    s->live.fetch_sub(n, std::memory_order_relaxed);
    if (scratch) {  // on the allocating thread (its op scope), which owns these trackers
      internal::AddOnOwner(s->allocated, -n);
      internal::AddOnOwner(s->allocations, -1);
    }
  }
}

MemoryTracker::MemoryTracker() : state_(std::make_shared<internal::TrackerState>()) {
  internal::AccountingTls& t = internal::tls_accounting;
  if (t.tracker != nullptr) state_->outer = t.tracker->shared_from_this();
  state_->owner = &t;
  t.tracker = state_.get();
}

MemoryTracker::~MemoryTracker() {
  internal::AccountingTls& t = internal::tls_accounting;
  // Out-of-order destruction would leave a dangling innermost pointer: fail loudly instead.
  if (t.tracker != state_.get() || state_->owner != &t) {
    std::fprintf(stderr, "MemoryTracker destroyed out of order or on another thread\n");
    std::abort();
  }
  t.tracker = state_->outer.get();
}

int64_t MemoryTracker::live_bytes() const { return state_->live.load(std::memory_order_relaxed); }
int64_t MemoryTracker::peak_bytes() const { return state_->peak.load(std::memory_order_relaxed); }
int64_t MemoryTracker::allocated_bytes() const {
  return state_->allocated.load(std::memory_order_relaxed);
}
int64_t MemoryTracker::allocations() const {
  return state_->allocations.load(std::memory_order_relaxed);
}
void MemoryTracker::ResetPeak() {
  state_->peak.store(state_->live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace shardmap
