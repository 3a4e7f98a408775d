// value_and_grad: differentiate per-device code (a tape per rank) and whole shard_maps.
//
// Per-device (inside shard_map / RunSpmd):
//   ValueAndGrad r = value_and_grad(
//       [](const std::vector<Value>& p) { return sum_partial(gelu(p[0].matmul(p[1])), {}); },
//       {x, w});
//   // r.value: the loss; r.grads[k]: the cotangent of params[k], typed with its dual type (the
//   // gradient of an R parameter is P: a pending sum for the caller to all_reduce, e.g. bucketed;
//   // pass reduce_partial_grads=true to all_reduce them here).
//
// Global view (the differentiable shard_map):
//   ShardMap f = shard_map(fn, mesh, in_specs, out_specs);      // fn's output 0 is the loss
//   absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x, w1, w2});
//   // r->outputs: the assembled outputs; r->grads[k]: d loss / d input k as a whole tensor,
//   // assembled per in_specs[k]; P gradients of inputs replicated over an axis are summed at the
//   // boundary (on the host: no extra collective is issued or logged).
//
// Local view (inside RunSpmd / RunOnCommunicator, e.g. a multi-process training step):
//   LocalGrads g = value_and_grad(f).CallLocal({x_shard, w1_shard, w2_shard});
//   // g.grads[k]: typed local gradients (P where the input was replicated, for bucketed
//   // reduction; CallLocal(..., /*reduce_partial_grads=*/true) all_reduces them).
//
// The seed (docs/design.md 5.1) is the cotangent of the loss, so it follows the dual type: on
// every axis where the loss is I or P the seed is 1; where it is R the seed is 1 on index 0 of
// the axis and 0 elsewhere (like convert(R->P), otherwise the gradient is n times too large); a V
// loss is an error ("reduce it first"). With TypeCheck::kErased, values carry a kind-only summary
// (ops skip all rule evaluation; see shardmap/context.h); an R axis is still recognised exactly
// (R only ever comes from all-R operands or a collective), and P/V are both seeded with 1, which
// is what the checked program does (where V would have been an error): so erased programs get
// bitwise the same gradients.
#ifndef SHARDMAP_AUTOGRAD_VALUE_AND_GRAD_H_
#define SHARDMAP_AUTOGRAD_VALUE_AND_GRAD_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "shardmap/shard_map.h"
#include "shardmap/value.h"

namespace shardmap {

struct ValueAndGrad {
  Value value;
  std::vector<Value> grads;
};

// The backward seed of `loss` per its type (see above). Throws OpError for a V loss.
Value LossSeed(const Value& loss);

// Per-device; throws OpError. Differentiates fn at params (a fresh tape on this thread).
ValueAndGrad value_and_grad(const std::function<Value(const std::vector<Value>&)>& fn,
                            const std::vector<Value>& params, bool reduce_partial_grads = false);

struct ShardMapGrads {
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;  // one per input (undefined for non-floating inputs)
};

struct LocalGrads {
  std::vector<Value> outputs;
  std::vector<Value> grads;  // per input, with the input's dual type (undefined if not floating)
};

class ShardMapValueAndGrad {
 public:
  explicit ShardMapValueAndGrad(ShardMap f) : f_(std::move(f)) {}
  // Global view: whole tensors in; outputs and gradients assembled.
  absl::StatusOr<ShardMapGrads> operator()(const std::vector<Tensor>& inputs) const;
  // Local view (per-device code inside RunSpmd / RunOnCommunicator; throws OpError): this rank's
  // shards in; typed outputs and gradients out. Gradients of inputs replicated over an axis are
  // P there (pending sums, e.g. for bucketed data-parallel reduction) unless
  // reduce_partial_grads, which all_reduces them here.
  LocalGrads CallLocal(const std::vector<Tensor>& local_inputs,
                       bool reduce_partial_grads = false) const;

 private:
  // One rank's forward under a tape, output check, backward: outputs and input gradients.
  ShardMap::RankResult Differentiate(const std::vector<Value>& typed_inputs) const;

  ShardMap f_;
};

inline ShardMapValueAndGrad value_and_grad(ShardMap f) { return ShardMapValueAndGrad(std::move(f)); }

}  // namespace shardmap

#endif  // SHARDMAP_AUTOGRAD_VALUE_AND_GRAD_H_
