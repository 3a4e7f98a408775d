#include "models/model/recompute_block.h"

#include <memory>
#include <vector>

#include "autograd/checkpoint.h"
#include "shardmap/ops.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"

namespace shardmap {

Value ModelBlock(const Model& model, const ParamFn& use, int64_t i, const Value& x,
                 TypeTrace* types, MoeAccum* moe) {
  if (model.shape().recompute != RecomputeMode::kFull || CurrentRecorder() == nullptr) {
    return model.Block(use, i, x, types, moe);
  }
  const Model* m = &model;
  if (!model.shape().moe.on()) {
    return checkpoint(
        [m, use, i, types](const std::vector<Value>& in) {
          return m->Block(use, i, in[0], IsRecomputing() ? nullptr : types, nullptr);
        },
        {x}, "recompute_block");
  }
  if (moe == nullptr) {
    OpFail("block ", i, ": a MoE model needs a MoeAccum for its load-balancing loss and "
           "drop counts");
  }
  // The block's own load-balancing loss leaves the checkpoint as its second output and is added
  // to the running sum here, as the block adds it; its counts are taken once, in the forward.
  const int64_t groups = moe->total_groups;
  auto stats = std::make_shared<MoeStats>();
  std::vector<Value> out = checkpoint(
      [m, use, i, types, groups, stats](const std::vector<Value>& in) {
        const bool again = IsRecomputing();
        MoeAccum local{groups, Value(), MoeStats()};
        Value y = m->Block(use, i, in[0], again ? nullptr : types, &local);
        if (!again) *stats = local.stats;
        return std::vector<Value>{y, local.aux};
      },
      {x}, "recompute_block");
  moe->aux = moe->aux.defined() ? moe->aux + out[1] : out[1];
  moe->stats.dropped += stats->dropped;
  moe->stats.dropped_tokens += stats->dropped_tokens;
  moe->stats.assignments += stats->assignments;
  return out[0];
}

}  // namespace shardmap
