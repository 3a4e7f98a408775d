// Private hooks of OpCounter and MemoryTracker: the thread-local state they share, and OpScope,
// which every public op in tensor/ops opens first.
//
//   Tensor Gelu(const Tensor& x) {
//     internal::OpScope scope;            // one thread-local read when nothing is counted
//     ...checks...
//     if (scope.counting()) scope.Record("gelu", x.dtype(), flops, bytes);
//
// OpScope marks the outermost op on this thread: only it is recorded by OpCounter, and the
// storage allocated and freed inside it is scratch for MemoryTracker (memory_tracker.h).
#ifndef SHARDMAP_TENSOR_INTERNAL_ACCOUNTING_H_
#define SHARDMAP_TENSOR_INTERNAL_ACCOUNTING_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "tensor/dtype.h"
#include "tensor/op_counter.h"

namespace shardmap::internal {

struct TrackerState;

struct AccountingTls {
  OpCounter* counter = nullptr;     // innermost live OpCounter on this thread
  TrackerState* tracker = nullptr;  // innermost live MemoryTracker's state on this thread
  int op_depth = 0;                 // open OpScopes
  uint64_t op_scope = 0;            // serial of the open outermost OpScope, 0 when none
};
inline thread_local AccountingTls tls_accounting;

class OpScope {
 public:
  OpScope() {
    const AccountingTls& t = tls_accounting;
    if (t.counter != nullptr || t.tracker != nullptr) [[unlikely]] Enter();
  }
  ~OpScope() {
    if (entered_) [[unlikely]] Exit();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  // True when this is the outermost op and an OpCounter is live: then compute and Record.
  bool counting() const { return outermost_ && tls_accounting.counter != nullptr; }
  void Record(const char* op, DType dtype, double flops, double bytes,
              std::optional<GemmShape> gemm = std::nullopt) const;

 private:
  void Enter();
  void Exit();
  bool entered_ = false;
  bool outermost_ = false;
  // A timed innermost OpCounter: the index its record of this op will take, and the entry time.
  OpCounter* timed_ = nullptr;
  size_t record_index_ = 0;
  int64_t start_ns_ = 0;
};

// Records a GEMM: 2*batch*m*n*k flops plus `extra_flops` (a fused epilogue), and `bytes`.
inline void RecordGemm(const OpScope& scope, const char* op, DType dtype, int64_t batch, int64_t m,
                       int64_t n, int64_t k, bool trans_a, bool trans_b, double bytes,
                       double extra_flops = 0) {
  GemmShape g{batch, m, n, k, dtype, trans_a, trans_b};
  scope.Record(op, dtype, g.flops() + extra_flops, bytes, g);
}

}  // namespace shardmap::internal

#endif  // SHARDMAP_TENSOR_INTERNAL_ACCOUNTING_H_
