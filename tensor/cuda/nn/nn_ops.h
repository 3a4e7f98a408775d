// CUDA implementations of the neural-network ops of tensor/ops/nn.h, for tensors on a GPU.
//
//   Tensor x = RandomTensor({8, 50257}, DType::kBF16, 1).To(Device::Cuda(0));
//   Tensor p = cuda::Softmax(x, /*dim=*/1, /*log=*/false);        // bf16, computed in f32
//   Tensor loss = cuda::CrossEntropy(x, targets_on_gpu, -100);    // f32[8]
//
// Callers are the public ops in tensor/ops/nn.cc: they check arguments (the same checks and
// messages as on the CPU) and then call these when the inputs are on a GPU; these assume checked
// arguments on one device. Semantics (dtypes of results, undefined gamma/beta, ignore_index,
// causal-mask offset) are those of nn.h. Work runs on cuda::CurrentStream(device) of the inputs'
// device. bf16/f16 compute in f32 and round once; f64 computes in f64.
//
// Out-of-range embedding ids and cross-entropy targets are an OpError naming the first bad id and
// its position, as on the CPU: the kernel records the first bad position in a device word that is
// read back after it (a host sync). While the stream is being captured into a CUDA graph, host
// syncs are illegal, so that read-back is skipped: bad ids then give zero embedding rows (and no
// gradient), bad targets a zero loss and zero gradient, silently.
//
// EmbeddingBackward sums rows with f32 atomics (f64 for f64 dy) into a zeroed accumulator, cast
// to dy's dtype at the end: the summation order, hence the low bits of rows hit by repeated ids,
// can vary from run to run. Everything else is deterministic.
//
// Builds without the CUDA toolkit: every function then throws OpError ("built without CUDA").
#ifndef SHARDMAP_TENSOR_CUDA_NN_NN_OPS_H_
#define SHARDMAP_TENSOR_CUDA_NN_NN_OPS_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace shardmap::cuda {

// dim is already normalised to [0, rank).
Tensor Softmax(const Tensor& x, int dim, bool log);
Tensor SoftmaxBackward(const Tensor& y, const Tensor& dy, int dim, bool log);

struct NormForward {
  Tensor y;
  Tensor mean;  // LayerNorm only
  Tensor rstd;
};
struct NormBackward {
  Tensor dx;
  Tensor dgamma;  // undefined when gamma is
  Tensor dbeta;   // LayerNorm only
};
NormForward LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps);
NormBackward LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dy);
NormForward RmsNorm(const Tensor& x, const Tensor& gamma, double eps);
NormBackward RmsNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                             const Tensor& dy);

Tensor Embedding(const Tensor& table, const Tensor& ids);
Tensor EmbeddingBackward(const Tensor& ids, const Tensor& dy, int64_t num_rows);

Tensor CrossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& dloss,
                            int64_t ignore_index);

Tensor CausalMask(const Tensor& scores, int64_t offset, double fill);
// One kernel: softmax over the visible keys (j <= i + offset), zeros elsewhere; offset already
// clamped by the caller.
Tensor CausalSoftmax(const Tensor& scores, int64_t offset);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_NN_NN_OPS_H_
