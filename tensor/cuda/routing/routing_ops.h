// CUDA implementations of the routing ops of tensor/ops/routing.h (mixture-of-experts top-k,
// row gather and scatter-add), for tensors on a GPU.
//
//   cuda::TopKOutputs t = cuda::TopK(probs_on_gpu, 2);        // values (dtype), indices i64
//   Tensor buf = cuda::GatherRows(x_on_gpu, slots_on_gpu);     // zeros for index -1
//
// The caller (tensor/ops/routing.cc) has checked ranks, dtypes, k and devices; these check what
// needs the data: NaN in top_k and indices out of range are an OpError with the CPU op's message
// (a kernel records the first bad position in a device word read back after it: one host sync;
// while the stream is captured into a CUDA graph the read-back is skipped and bad entries are
// silently skipped). ScatterAddRows sums with f32 atomics (f64 for f64), so rows hit by several
// indices may differ in the low bits from run to run; everything else is deterministic and
// bitwise equal to the CPU ops (top-k values are copies; its backward sums in f32 like the CPU).
//
// Builds without the CUDA toolkit: every function throws OpError.
#ifndef SHARDMAP_TENSOR_CUDA_ROUTING_ROUTING_OPS_H_
#define SHARDMAP_TENSOR_CUDA_ROUTING_ROUTING_OPS_H_

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace shardmap::cuda {

struct TopKOutputs {
  Tensor values;
  Tensor indices;  // i64
};
TopKOutputs TopK(const Tensor& x, int64_t k);
Tensor TopKBackward(const Tensor& dvalues, const Tensor& indices, int64_t n);
Tensor GatherRows(const Tensor& x, const Tensor& idx);
Tensor ScatterAddRows(const Tensor& x, const Tensor& idx, int64_t n);
// strict: ids outside the range are an OpError "<op>: index <id> at position <i> is out of range
// [start, start + size)<context>".
Tensor LocalIndices(const Tensor& ids, int64_t start, int64_t size, int64_t stride, bool strict,
                    const char* op, const std::string& context);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_ROUTING_ROUTING_OPS_H_
