// Activation recomputation modes of a transformer (GptConfig::recompute, TrainOptions::recompute,
// train_gpt --recompute), built on autograd/checkpoint.h:
//
//   absl::StatusOr<RecomputeMode> m = ParseRecomputeMode("selective");   // kSelective
//   RecomputeModeName(*m);                                                // "selective"
//
//   kNone       the tape keeps every activation (the default).
//   kFull       per transformer block only the block's input is kept; the block (its FSDP
//               all_gathers and tensor-parallel collectives included) runs again in the backward.
//   kSelective  only the attention core (q * scale, the scores, the causal softmax and the
//               probabilities' product with v; under cp the ring attention) is recomputed: the
//               [b, heads, t, t] tensors are not kept (Megatron's selective recomputation,
//               Korthikanti et al. 2022). The fused attention kernel keeps no scores anyway, so
//               there it changes nothing.
#ifndef SHARDMAP_MODELS_PARALLEL_RECOMPUTE_H_
#define SHARDMAP_MODELS_PARALLEL_RECOMPUTE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardmap {

enum class RecomputeMode { kNone, kFull, kSelective };

// "none", "full", "selective".
const char* RecomputeModeName(RecomputeMode mode);

// The inverse of RecomputeModeName; InvalidArgument naming the value and the choices.
absl::StatusOr<RecomputeMode> ParseRecomputeMode(absl::string_view text);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_RECOMPUTE_H_
