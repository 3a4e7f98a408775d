// The README's first example, runnable: a Megatron MLP, tensor parallel over tp = 3, forward
// and backward in the global view, then the same loss over a dp-sharded batch on a dp x tp
// mesh. `bazel run //examples/readme:mlp`; //examples/readme:mlp_test runs it in CI and
// readme_snippet_test checks that the README shows exactly the code between the markers.
#include <iostream>
#include <vector>

#include "absl/status/statusor.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/print.h"
#include "tensor/random.h"

using namespace shardmap;

int DpShardedBatch(const Tensor& x, const Tensor& w1, const Tensor& w2);  // below

// [README: per-device code]
int main() {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  // Whole (global) tensors, from //tensor:random: shape, seed; f32 unless a dtype is given.
  Tensor x = RandomNormal({4, 8}, /*seed=*/1);    // [batch, d]
  Tensor w1 = RandomNormal({8, 12}, /*seed=*/2);  // [d, hidden]: hidden splits over tp
  Tensor w2 = RandomNormal({12, 8}, /*seed=*/3);  // [hidden, d]

  // Per-device code: x is R, w1 column-parallel S(1), w2 row-parallel S(0).
  ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& x = in[0]; const Value& w1 = in[1]; const Value& w2 = in[2];
    Value y = all_reduce(gelu(x.matmul(w1)).matmul(w2), "tp");  // f32[4,8]{tp:R}
    return {sum(y * y, {}), y};
  };
  std::vector<CollectiveRecord> log;  // rank 0's collectives of the last call
  ShardMapOptions options;
  options.collective_log = &log;
  ShardMap f = shard_map(mlp, mesh, /*in_specs=*/{P(), P(None, "tp"), P("tp", None)},
                         /*out_specs=*/{P(), P()}, options);
  absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x, w1, w2});  // whole tensors in and out
  if (!r.ok()) {
    std::cerr << r.status() << "\n";  // a type error names the op, the rule and the fix
    return 1;
  }
  std::cout << "loss " << r->outputs[0].item() << "\n";
  std::cout << "dloss/dw1 " << r->grads[1] << "\n";  // a whole [8, 12] tensor (tensor/print.h)
  // Forward: one all_reduce over tp. Backward: one (its transpose). Exactly Megatron.
  for (const CollectiveRecord& c : log) {
    std::cout << (c.backward ? "backward " : "forward ") << c.op << "("
              << mesh.MaskToString(c.axes) << ") " << c.bytes << " B\n";
  }
  return DpShardedBatch(x, w1, w2);
}
// [README: end]

// [README: dp-sharded batch]
int DpShardedBatch(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  // Batch rows split over dp: each device's sum of squares covers its rows only, so the loss
  // is a sum over dp. sum() refuses to reduce a dim sharded over dp; sum_partial() gives the
  // local sum typed P (pending) on dp, and all_reduce makes it R: the loss of the whole batch.
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& x = in[0]; const Value& w1 = in[1]; const Value& w2 = in[2];
    Value y = all_reduce(gelu(x.matmul(w1)).matmul(w2), "tp");  // f32[2,8]{dp:S0,tp:R}
    return {all_reduce(sum_partial(y * y, {}), "dp")};          // f32[]{dp:R,tp:R}
  };
  ShardMap f = shard_map(mlp, mesh, {P("dp"), P(None, "tp"), P("tp", None)}, {P()});
  // Or leave the pending sum to the boundary: return sum_partial(y * y, {}) with the out_spec
  // P().Unreduced({"dp"}); the global view sums the ranks' parts (no collective is issued).
  absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x, w1, w2});
  if (!r.ok()) {
    std::cerr << r.status() << "\n";
    return 1;
  }
  std::cout << "dp x tp loss " << r->outputs[0].item() << "\n";  // the tp-only loss
  return 0;
}
// [README: end]
