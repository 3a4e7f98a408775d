// A 2-D (dp x tp) Megatron MLP block on Values, its MSE loss, and a plain SGD trainer that runs
// the same model sharded (shard_map over a mesh with axes "dp" and "tp") and unsharded (plain
// tensor ops with a hand-written backward pass: an independent check of the sharded numbers).
//
//   MlpConfig cfg;                                   // batch 8, d_model 16, d_hidden 32
//   Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 4}});
//   MlpParams p = InitMlp(cfg);                      // global weights, fixed seeds
//   MlpBatch batch = SyntheticBatch(cfg);            // x [8,16] and its regression targets
//   absl::StatusOr<ShardedStep> s = ShardedTrainStep(mesh, p, batch);   // loss, grads, log
//   ReferenceStep r = ReferenceTrainStep(p, batch);                    // same, on one device
//   SgdUpdate(p, s->grads, /*lr=*/0.5);
//
// Per device (MegatronMlp): x is S0 on dp (R on tp); w1/b1 are column-parallel (S1/S0 on tp),
// w2 is row-parallel (S0 on tp), so a.matmul(w2) is P on tp and one all_reduce over tp makes y R
// on tp. The loss is sum_partial over the dp-sharded rows / global count: P on dp (each device
// holds its share of the mean), assembled by the out_spec P().Unreduced({"dp"}) as a sum. The
// weight gradients are P on dp (replicated weights) and are summed at the shard_map boundary.
#ifndef SHARDMAP_EXAMPLES_MLP_PARALLEL_MLP_H_
#define SHARDMAP_EXAMPLES_MLP_PARALLEL_MLP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shardmap/context.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

struct MlpConfig {
  int64_t batch = 8;
  int64_t d_model = 16;
  int64_t d_hidden = 32;
  uint64_t seed = 1234;
};

// Global (whole) weights.
struct MlpParams {
  Tensor w1, b1, w2, b2;  // [d, h], [h], [h, d], [d]
};

struct MlpBatch {
  Tensor x, target;  // [batch, d] each
};

MlpParams InitMlp(const MlpConfig& cfg);
// x ~ N(0, 1); target = tanh(x @ teacher) for a fixed random teacher (learnable, f32).
MlpBatch SyntheticBatch(const MlpConfig& cfg);

// Intermediate values of the per-device function, for printing (rank 0 only).
struct MlpTrace {
  std::vector<std::pair<std::string, std::string>> types;  // ("h", "f32[4,8]{dp:S0,tp:S1}")
};

// The block: gelu(x @ w1 + b1) @ w2, all_reduce over tp_axis, + b2. With tp_axis empty it runs
// unsharded (no collective). Records the SPMD types into trace when trace is non-null.
Value MegatronMlp(const Value& x, const Value& w1, const Value& b1, const Value& w2,
                  const Value& b2, const std::string& tp_axis, MlpTrace* trace = nullptr);
// sum((y - target)^2) / total_count: P on the axes that shard y's rows (a share of the mean).
Value MseLossShare(const Value& y, const Value& target, int64_t total_count,
                   MlpTrace* trace = nullptr);

// Inputs of the sharded step: x, target, w1, b1, w2, b2.
std::vector<PartitionSpec> MlpInSpecs();

struct ShardedStep {
  double loss = 0;
  MlpParams grads;
  std::vector<CollectiveRecord> log;  // rank 0's, forward and backward
};
// One forward + backward of the sharded model on a mesh with axes "dp" and "tp".
absl::StatusOr<ShardedStep> ShardedTrainStep(const Mesh& mesh, const MlpParams& p,
                                             const MlpBatch& batch, MlpTrace* trace = nullptr);

struct ReferenceStep {
  double loss = 0;
  MlpParams grads;
};
// The same step on one device with plain tensor ops and a hand-written backward pass.
ReferenceStep ReferenceTrainStep(const MlpParams& p, const MlpBatch& batch);

// p -= lr * g.
void SgdUpdate(MlpParams& p, const MlpParams& g, double lr);

// "fwd: all_reduce(tp) x1 | bwd: all_reduce(tp) x1" ("none" for an empty direction).
std::string SummarizeCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log);
// Number of records named op over exactly `axes` in the given direction.
int CountCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log,
                     const std::string& op, const std::string& axes, bool backward);

// Largest |a - b| over the four weights, for the demo's printout; NaN if any weight is NaN.
// Tests use ParamsNear (examples/mlp/params_near.h).
double MaxParamDiff(const MlpParams& a, const MlpParams& b);

}  // namespace shardmap

#endif  // SHARDMAP_EXAMPLES_MLP_PARALLEL_MLP_H_
