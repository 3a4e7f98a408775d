// OpCounter: counts the FLOPs and bytes of the tensor ops this thread issues while it lives, on
// any device (meta, CPU, CUDA), so a shape-only run and a real run can be counted alike.
//
//   OpCounter counter;                      // RAII; nestable (every live counter records)
//   Tensor y = Matmul(x, w);                // x: f32[8,64], w: f32[64,32]
//   counter.flops();                        // 2*8*32*64 = 32768
//   counter.ops()[0].gemm->k;               // 64
//   std::cout << counter.Summary();         // per-op totals
//
// Only the outermost op is recorded: an op built from other ops (a bf16 op computed in f32, a
// linear calling matmul) is one record with its own formula, identical on every device.
// Each rank of a local SPMD program is a thread, so a counter on a rank's thread sees that
// rank's ops only. When no counter (and no MemoryTracker) is live, an op pays one thread-local
// read.
//
// Formulas (n = elements of the output unless stated; bytes = every input read once plus every
// output written once, at the tensors' dtypes; the ideal traffic of one fused kernel):
//   GEMM (matmul, batched matmul, linear, matmul_accumulate, linear weight grad):
//     flops = 2*batch*m*n*k (+ epilogue flops per output element below); gemm is set.
//   causal_attention: per visible (query, key) pair of each batch and head -- about half of
//     tq*tk under the causal mask, counted exactly -- 4*d (QK^T and PV) + 5 (softmax);
//     backward 10*d (2.5x: scores recomputed, dP, dV, dQ, dK) + 5. Not a gemm record.
//     Unfused attention is the matmul, causal_softmax and softmax_backward records it is made of.
//   elementwise: 1 flop per output element (add, sub, mul, div, neg, relu, relu_grad, the scalar
//     ops, add_in_place); exp, log, tanh, sqrt: 1 (a transcendental counts as 1: FLOPs here are
//     a work measure comparable across ops, not instruction counts); gelu 8 (tanh) or 5 (erf);
//     silu 4; gelu_grad 14 (tanh) or 10 (erf); silu_grad 7; tanh_grad 3.
//   reductions: 1 flop per input element. softmax/log_softmax: 5 per element; backward 4.
//   layer_norm: 8 per element; backward 12. rms_norm: 5; backward 9. cross_entropy: 5 per
//   logit; backward 4. embedding / gather / scatter / copies / casts / concat: 0 flops.
//   adamw: 15 per parameter element; sum_of_squares: 2 per element; scale: 1 per element.
#ifndef SHARDMAP_TENSOR_OP_COUNTER_H_
#define SHARDMAP_TENSOR_OP_COUNTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace shardmap {

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
};

// RAII, nestable; records the ops issued on THIS thread while it lives. Counters must be
// destroyed in reverse order of construction on their thread (as scopes are).
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  const std::vector<OpCount>& ops() const { return ops_; }
  double flops() const;       // all ops
  double gemm_flops() const;  // ops with a gemm
  double bytes() const;
  void Clear() { ops_.clear(); }
  // Per-op-name totals (count, flops, bytes), largest flops first, for humans.
  std::string Summary() const;

 private:
  friend void RecordOpCount(OpCount count);
  std::vector<OpCount> ops_;
  OpCounter* outer_;
};

// Appends `count` to every OpCounter live on this thread (for ops defined outside tensor/ops,
// e.g. a collective's local reduction, that want to be counted).
void RecordOpCount(OpCount count);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OP_COUNTER_H_
