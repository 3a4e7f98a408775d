// Data-parallel gradient reduction in buckets, started while the backward pass is still running
// (PyTorch DDP's buckets, Megatron's --overlap-grad-reduce): the tape reports each gradient as
// soon as it is final (Tape::Backward's on_ready), the gradient joins the open bucket of its
// kind, and a bucket that reaches `bucket_bytes` is all-reduced at once on the communicator's
// started-call lane (all_reduce_start) while the VJPs of earlier layers run. Finish() starts the
// partial buckets and waits for every one.
//
//   GradientBuckets buckets(mesh, 25 << 20);
//   tape.Backward(loss, seed, watched, [&](int k, const Value& g) { buckets.Add(k, g); });
//   std::vector<Value> grads = buckets.Finish();   // = ReduceGradients of the same gradients
//
// A bucket holds gradients with the same pending-sum axes (P: dp, dp_replicate under HSDP, tp
// for tp-replicated parameters), the same kinds on the other axes, dtype and device. It is one
// contiguous copy of its gradients, reduced by one all-reduce, and each reduced gradient is a
// view into it with the type the blocking all_reduce gives (P -> R on those axes). The backends
// reduce each element in rank order, wherever it sits in the buffer, so the numbers are
// bitwise ReduceGradients' (gradient k alone): tested per mesh and dtype in grad_buckets_test
// and end to end in gpt_overlap_test. Gradients without a pending sum pass through unchanged.
// Buckets are filled in the order the gradients become final, which every rank shares (SPMD),
// so the n-th bucket matches across ranks.
#ifndef SHARDMAP_MODELS_TRAIN_GRAD_BUCKETS_H_
#define SHARDMAP_MODELS_TRAIN_GRAD_BUCKETS_H_

#include <cstdint>
#include <vector>

#include "shardmap/async_collectives.h"
#include "shardmap/mesh.h"
#include "shardmap/value.h"

namespace shardmap {

// DDP's default bucket size (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=25).
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;

class GradientBuckets {
 public:
  // `count`: the number of gradients (k in [0, count)). bucket_bytes > 0.
  GradientBuckets(const Mesh& mesh, int count, int64_t bucket_bytes);

  // Gradient k is final (each k once). May start a bucket. Throws OpError.
  void Add(int k, const Value& grad);
  // Starts what is left, waits for every bucket and returns the reduced gradients (one per k;
  // every k must have been added). Throws OpError.
  std::vector<Value> Finish();

  // Buckets started so far (each one all-reduce).
  int started() const { return static_cast<int>(pending_.size()); }

 private:
  struct Open {
    SpmdType kinds;  // P on the reduced axes, the gradients' kinds elsewhere (S(d) as V)
    DType dtype;
    Device device;
    std::vector<int> members;
    int64_t bytes = 0;
  };
  struct Started {
    std::vector<int> members;
    AxisMask reduced;
    PendingValue call;
  };
  void Start(Open& open);

  const Mesh& mesh_;
  int64_t bucket_bytes_;
  std::vector<Value> grads_;  // as added; then reduced
  std::vector<bool> added_;
  std::vector<Open> open_;
  std::vector<Started> pending_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_GRAD_BUCKETS_H_
