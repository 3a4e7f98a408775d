// Llama 3's registration (models/model/registry.h): `--model=llama3`, torchtitan's flavours as
// presets (llama3_debug, llama3_8b, llama3_70b, llama3_405b).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/llama/llama_model.h"
#include "models/model/registry.h"

namespace shardmap {

namespace {

absl::StatusOr<std::unique_ptr<Model>> CreateLlama3(const ModelArgs& args, const Mesh& mesh,
                                                    bool sp) {
  absl::StatusOr<LlamaConfig> cfg = LlamaConfigFromArgs(args);
  if (!cfg.ok()) return cfg.status();
  absl::StatusOr<LlamaLayout> layout = LlamaLayout::Create(mesh, *cfg, sp);
  if (!layout.ok()) return layout.status();
  return std::make_unique<LlamaLayout>(*std::move(layout));
}

SHARDMAP_REGISTER_MODEL((ModelSpec{
    .name = "llama3",
    .summary = "Llama 3 (Hugging Face LlamaForCausalLM): RMSNorm, rotary positions, grouped-query "
               "attention, SwiGLU MLP, untied head",
    .presets = LlamaPresetNames(),
    .create = CreateLlama3}));

}  // namespace
}  // namespace shardmap
