// GPT-2's registration as "gpt2" (models/model/registry.h) and its presets: OpenAI's four sizes.
//
//   absl::StatusOr<GptConfig> cfg = Gpt2ConfigFromArgs(ModelArgs{.preset = "gpt2-medium"});
//   // 24 layers, d_model 1024, 16 heads, vocab 50257, seq 1024
#ifndef SHARDMAP_MODELS_GPT_GPT_SPEC_H_
#define SHARDMAP_MODELS_GPT_GPT_SPEC_H_

#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"
#include "models/model/registry.h"

namespace shardmap {

// The GptConfig `args` describe: the preset's shape (none: GptConfig's defaults), each field the
// args set in its place, the precision, MoE and recomputation. Llama-only fields (kv_heads,
// ffn_dim, rope_theta, norm_eps) and an unknown preset are InvalidArgument naming the flag.
absl::StatusOr<GptConfig> Gpt2ConfigFromArgs(const ModelArgs& args);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_GPT_SPEC_H_
