// Activation recomputation for the planner: what --recompute=none|selective|full does to one
// rank role's memory and work. The planner profiles each mesh once without recomputation and
// applies a RecomputeEstimator to that profile. The shipped estimator, KorthikantiRecompute,
// takes its numbers from Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models" (arXiv 2205.05198), section 4 and table 2: per layer and microbatch a
// transformer block keeps
//     s b h (10 + 24/t + 5 a s / (h t))  bytes with tensor parallelism t and no SP,
//     s b h (34 + 5 a s / h) / t          with SP,
// for 2-byte activations (scaled here by the compute dtype's size / 2); selective
// recomputation drops the 5 a s / h term (the attention core: scores, softmax, dropout); full
// recomputation keeps 2 s b h (the block input; / t with SP) and rebuilds one block at a time
// in the backward (one block's working set live). The estimate scales the shape-only run's own
// activation peak (what the framework stores, often more than Megatron's count) by kept /
// none of that accounting, and for full adds back one block's share of the profile (its peak
// over the blocks and microbatches in flight). A fused attention kernel never stores the
// scores (FlashAttention keeps O(s) statistics), so it has no 5 a s / h term and selective
// recomputation changes nothing there.
// Work: full reruns each block's forward in the backward (its GEMMs: one per 2-D weight of the
// model's block, e.g. GPT-2's QKV 3h^2, projection h^2, MLP 8h^2 per token, Llama's q, k and v
// at their GQA widths, o and SwiGLU's three matrices (/ t); the attention's two batched products,
// 2 s hd per token and query head each; the forward's non-GEMM ops, a third of the step's) and
// the forward's TP collectives; selective reruns the attention core (the two products and the
// softmax) unless attention is fused. The memory accounting above is a GPT block's (4h MLP,
// full heads); for other blocks it is an estimate's ratio, and the planner measures recomputing
// steps by default.
//
//   RecomputeEstimator e = KorthikantiRecompute();
//   absl::StatusOr<RoleWork> full = e(role, Recompute::kFull, shape);
//   full->peak_bytes;        // less than role.peak_bytes
//   full->recompute_gemms;   // the forward GEMMs again
//
// The planner takes the work from here (the trainer's --recompute adds exactly these GEMM
// FLOPs: recompute_vs_trainer_test.cc) and, by default, the memory from a shape-only step with
// the trainer's own --recompute (PlanRequest::measure_recompute): this framework keeps 1.3-1.8x
// what the accounting counts.
#ifndef SHARDMAP_MODELS_PLANNER_RECOMPUTE_H_
#define SHARDMAP_MODELS_PLANNER_RECOMPUTE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include <vector>

#include "models/model/model.h"
#include "models/planner/step_work.h"

namespace shardmap::planner {

enum class Recompute { kNone, kSelective, kFull };

const char* RecomputeName(Recompute r);  // "none", "selective", "full"
// InvalidArgument naming the choices.
absl::StatusOr<Recompute> ParseRecompute(const std::string& name);

// One weight GEMM of a block on one rank: [rows, k] x [k, n] per token row.
struct BlockMatmul {
  int64_t n = 0, k = 0;
};

// A model's block-0 weights as the GEMMs one rank runs with tensor parallelism `tp`: each
// decayed parameter of the block whose checkpoint shape (Model::CheckpointShape) is a matrix
// [k, n] (a stack of experts' [E, k, n]: one expert per token, as a dense MLP), in params()
// order, the dim holding the elements the spec splits over "tp" divided by tp. nn.Linear's
// [out, in] (Llama) comes out as n and k swapped: the same FLOPs and smallest dim, the rate
// hardware_profile.h prices a GEMM at.
std::vector<BlockMatmul> BlockMatmuls(const Model& model, int tp);

// What the estimate needs to know of the run besides the role's profile.
struct RecomputeShape {
  ModelShape config;                       // seq: the rank's (/ cp)
  std::vector<BlockMatmul> block_matmuls;  // BlockMatmuls of the candidate's model
  int tp = 1;
  bool sp = false;
  int64_t microbatch_rows = 1;  // sequences in one microbatch (or microstep) on one rank
  int64_t passes = 1;           // forward passes per step on this rank (microbatches x ga)
  bool fused_attention = false;
};

using RecomputeEstimator = std::function<absl::StatusOr<RoleWork>(
    const RoleWork& base, Recompute mode, const RecomputeShape& shape)>;

// The formulas above. InvalidArgument for a role without layers or rows < 1.
RecomputeEstimator KorthikantiRecompute();

// Bytes one block keeps for the backward per microbatch under `mode` (Korthikanti et al.'s
// accounting above, at the compute dtype's element size).
double BlockActivationBytes(const RecomputeShape& shape, Recompute mode);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_RECOMPUTE_H_
