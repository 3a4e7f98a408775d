// Block i of any model, with full activation recomputation when the model's shape asks for it
// (models/parallel/recompute.h): the block runs inside a checkpoint that keeps only its input,
// and runs again in the backward. Selective recomputation is the model's own (its Block
// recomputes its attention core).
//
//   x = ModelBlock(model, use, i, x, types, &moe);   // what ModelLoss and pipeline stages call
#ifndef SHARDMAP_MODELS_MODEL_RECOMPUTE_BLOCK_H_
#define SHARDMAP_MODELS_MODEL_RECOMPUTE_BLOCK_H_

#include <cstdint>

#include "models/model/model.h"

namespace shardmap {

// model.Block(use, i, x, ...), under a checkpoint when shape().recompute is kFull and a tape
// records. The checkpoint keeps copies of `use` and the model's address: both must outlive the
// backward. A MoE block's load-balancing loss leaves the checkpoint as its second output.
Value ModelBlock(const Model& model, const ParamFn& use, int64_t i, const Value& x,
                 TypeTrace* types = nullptr, MoeAccum* moe = nullptr);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_MODEL_RECOMPUTE_BLOCK_H_
