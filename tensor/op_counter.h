// OpCounter: counts the FLOPs and bytes of the tensor ops this thread issues while it lives, on
// any device (meta, CPU, CUDA), so a shape-only run and a real run can be counted alike.
//
//   OpCounter counter;                      // RAII; nestable (every live counter records)
//   Tensor y = Matmul(x, w);                // x: f32[8,64], w: f32[64,32]
//   counter.flops();                        // 2*8*32*64 = 32768
//   counter.ops()[0].gemm->k;               // 64
//   std::cout << counter.Summary();         // per-op totals
//
//   OpCounter timed(OpCounter::kTimed);     // also each op's wall time (OpCount::seconds)
//
// Only the outermost op is recorded: an op built from other ops (a bf16 op computed in f32, a
// linear calling matmul) is one record with its own formula, identical on every device.
// Each rank of a local SPMD program is a thread, so a counter on a rank's thread sees that
// rank's ops only. When no counter (and no MemoryTracker) is live, an op pays one thread-local
// read.
//
// Formulas (n = elements of the output unless stated; bytes = every input read once plus every
// output written once, at the tensors' dtypes; the ideal traffic of one fused kernel):
//   GEMM (matmul, batched matmul, linear, linear_gelu_backward, linear_weight_grad,
//     matmul_accumulate): flops = 2*batch*m*n*k plus the fused epilogue per output element
//     (bias 1, GELU 8 tanh / 5 erf, GELU grad 14 / 10, bias grad 1 per dy element,
//     accumulate 1); gemm is set. A rank-2 rhs folds the lhs's leading dims into m (batch 1).
//   causal_attention: per visible (query, key) pair of each batch and head -- about half of
//     tq*tk under the causal mask, counted exactly -- 4*d (QK^T and PV) + 5 (softmax);
//     backward 10*d (2.5x: scores recomputed, dP, dV, dQ, dK) + 5. Not a gemm record.
//     Unfused attention is the matmul, causal_softmax and softmax_backward records it is made of.
//   elementwise: 1 flop per output element (add, sub, mul, div, neg, relu, relu_grad, the scalar
//     ops, add_in_place: acc read and written); exp, log, tanh, sqrt: 1 (a transcendental counts
//     as 1: FLOPs here are a work measure comparable across ops, not instruction counts); gelu 8
//     (tanh) or 5 (erf); silu 4; gelu_grad 14 (tanh) or 10 (erf); silu_grad 7; tanh_grad 3.
//   reductions (sum, mean, max, min, argmax, bias_grad): 1 per input element.
//   softmax, log_softmax, causal_softmax (every score): 5 per element; their backward 4.
//   layer_norm: 8 per element; backward 12. rms_norm: 5; backward 9. cross_entropy: 5 per
//   logit; backward 4. embedding_backward, scatter_add_rows, top_k_backward: 1 per input
//   element; top_k: 1 per element; local_indices: 1 per id.
//   sum_of_squares: 2 per element; scale_in_place: 1 per element; clip_coefficient: 4.
//   0 flops (bytes only): embedding, gather_rows, causal_mask, permute/transpose, slice,
//   slice_assign, concat, cast, random fills. Identity casts and reshapes run no kernel and
//   record nothing. The optimizer's update is the elementwise ops it is made of (the fused CUDA
//   AdamW step in models/ is not a tensor op and is not recorded).
#ifndef SHARDMAP_TENSOR_OP_COUNTER_H_
#define SHARDMAP_TENSOR_OP_COUNTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace shardmap {

namespace internal {
class OpScope;
}  // namespace internal

struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType dtype = DType::kF32;
  bool trans_a = false, trans_b = false;
  double flops() const { return 2.0 * batch * m * n * k; }
};

struct OpCount {
  std::string op;        // "matmul", "layer_norm", "layer_norm_backward", "gelu", "adamw", ...
  DType dtype = DType::kF32;
  double flops = 0;      // multiply-add = 2 flops; the formulas are above
  double bytes = 0;      // bytes read + written by the op's kernels (ideal, each operand once)
  std::optional<GemmShape> gemm;  // set for GEMMs (matmul, batched matmul, linear, ...)
  // Wall time of the op on this thread, from its entry to its return (checks, allocation and
  // kernels; not the autograd tape around it): set by a kTimed counter only, 0 otherwise.
  double seconds = 0;
};

// RAII, nestable; records the ops issued on THIS thread while it lives. Counters must be
// destroyed in reverse order of construction on their thread (as scopes are).
class OpCounter {
 public:
  // kTimed also times each op it records (two clock reads per op; where several counters are
  // live, only the innermost one's records get times). A planner measures a CPU's per-op-kind
  // speed with it (models/planner/measure_cpu.h).
  enum Timing { kUntimed, kTimed };
  explicit OpCounter(Timing timing = kUntimed);
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  const std::vector<OpCount>& ops() const { return ops_; }
  bool timed() const { return timed_; }
  double flops() const;       // all ops
  double gemm_flops() const;  // 2*b*m*n*k of the GEMM records (their fused epilogues excluded)
  double bytes() const;
  void Clear() { ops_.clear(); }
  // Per-op-name totals (count, flops, bytes), largest flops first, for humans.
  std::string Summary() const;

 private:
  friend void RecordOpCount(OpCount count);
  friend class internal::OpScope;
  std::vector<OpCount> ops_;
  OpCounter* outer_;
  bool timed_ = false;
};

// Appends `count` to every OpCounter live on this thread (for ops defined outside tensor/ops,
// e.g. a collective's local reduction, that want to be counted).
void RecordOpCount(OpCount count);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OP_COUNTER_H_
