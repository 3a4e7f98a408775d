// Activation recomputation of GPT blocks (GptConfig::recompute, models/parallel/recompute.h), on
// autograd/checkpoint.h. GptBlock calls these; every strategy that runs GptBlock under a tape
// (one program, pipeline stages, MoE, tp + SP, cp, mixed precision) gets it.
//
//   GptConfig cfg = ...;
//   cfg.recompute = RecomputeMode::kFull;       // or kSelective
//   GptLayout layout = *GptLayout::Create(mesh, cfg, /*sp=*/true);
//   Value loss = GptLoss(layout, watched, ids, targets, tokens);   // under a tape: one
//   // "recompute_block" node per block; the backward runs each block again (its FSDP
//   // all_gathers and SP all_gathers / reduce_scatters logged as recomputed) and gives the
//   // gradients of the run without recomputation bit for bit.
//
// Full: the block's input is the checkpoint's input, its parameters are found through `use`
// (the FSDP shards, or the parameters themselves, become the node's inputs: their gradients
// flow out of it). A MoE block's load-balancing loss is a second output; its drop counts and the
// type trace are taken in the forward only.
// Selective: CausalSelfAttention::recompute_core (models/parallel/layers.h).
#ifndef SHARDMAP_MODELS_GPT_GPT_RECOMPUTE_H_
#define SHARDMAP_MODELS_GPT_GPT_RECOMPUTE_H_

#include <cstdint>

#include "models/gpt/gpt_model.h"

namespace shardmap {

// Block i computed once (what GptBlock does without full recomputation; selective
// recomputation of the attention core still applies). Defined in gpt_model.cc.
Value GptBlockBody(const GptLayout& layout, const ParamFn& use, int64_t i, const Value& x,
                   TypeTrace* types, MoeAccum* moe);

// Block i under full recomputation: GptBlockBody inside a checkpoint whose function keeps copies
// of `use` and the layout's address (both must outlive the backward).
Value RecomputedGptBlock(const GptLayout& layout, const ParamFn& use, int64_t i, const Value& x,
                         TypeTrace* types, MoeAccum* moe);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_GPT_RECOMPUTE_H_
