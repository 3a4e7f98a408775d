// Llama 3's registration (models/model/registry.h): `--model=llama3`, torchtitan's flavours as
// presets (llama3_debug, llama3_8b, llama3_70b, llama3_405b).
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
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

// What LlamaLayout::ShapeMetadata wrote ("llama3.*"), back as the args that rebuild the model;
// each value is checked and an error names its key.
absl::StatusOr<ModelArgs> Llama3ArgsFromMetadata(const std::map<std::string, std::string>& m) {
  auto get = [&](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = m.find("llama3." + key);
    if (it == m.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata lacks 'llama3.", key, "': the file was not written by train --model=llama3 "
          "(or was edited)"));
    }
    return it->second;
  };
  ModelArgs args;
  for (auto [key, field] : {std::pair<const char*, std::optional<int64_t>*>{"layers", &args.layers},
                            {"d_model", &args.d_model},
                            {"heads", &args.heads},
                            {"kv_heads", &args.kv_heads},
                            {"ffn_dim", &args.ffn_dim},
                            {"vocab", &args.vocab},
                            {"seq", &args.seq}}) {
    absl::StatusOr<std::string> v = get(key);
    if (!v.ok()) return v.status();
    int64_t n = 0;
    if (!absl::SimpleAtoi(*v, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'llama3.", key, "' = '", *v,
                                                     "' is not a whole number >= 1"));
    }
    *field = n;
  }
  for (auto [key, field] : {std::pair<const char*, std::optional<double>*>{"rope_theta",
                                                                           &args.rope_theta},
                            {"norm_eps", &args.norm_eps}}) {
    absl::StatusOr<std::string> v = get(key);
    if (!v.ok()) return v.status();
    double x = 0;
    if (!absl::SimpleAtod(*v, &x) || !std::isfinite(x) || x <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'llama3.", key, "' = '", *v,
                                                     "' is not a finite number > 0"));
    }
    *field = x;
  }
  absl::StatusOr<std::string> dtype = get("dtype");
  if (!dtype.ok()) return dtype.status();
  auto compute = m.find("llama3.compute");
  if (compute != m.end()) {
    if (*dtype != "f32" || compute->second != "bf16") {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata: dtype ", *dtype, " with compute ", compute->second,
          " is none of --dtype's f32, f64, bf16"));
    }
    args.dtype = "bf16";
  } else if (*dtype == "f32" || *dtype == "f64") {
    args.dtype = *dtype;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata 'llama3.dtype' = '", *dtype, "' is none of f32, f64"));
  }
  return args;
}

SHARDMAP_REGISTER_MODEL((ModelSpec{
    .name = "llama3",
    .summary = "Llama 3 (Hugging Face LlamaForCausalLM): RMSNorm, rotary positions, grouped-query "
               "attention, SwiGLU MLP, untied head",
    .presets = LlamaPresetNames(),
    .create = CreateLlama3,
    .args_from_metadata = Llama3ArgsFromMetadata}));

}  // namespace
}  // namespace shardmap
