#include "models/gpt/gpt_flags.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardmap {

absl::Status ParsePrecisionFlag(const std::string& dtype, GptConfig* cfg) {
  if (dtype == "f32") {
    cfg->dtype = DType::kF32;
  } else if (dtype == "f64") {
    cfg->dtype = DType::kF64;
  } else if (dtype == "bf16") {
    cfg->dtype = DType::kF32;  // master weights
    cfg->compute = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype ", dtype, ": use f32, f64 or bf16 (mixed precision)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> GptConfigFromFlags(const GptConfigFlagValues& v) {
  GptConfig cfg;
  cfg.layers = v.layers;
  cfg.d_model = v.d_model;
  cfg.heads = v.heads;
  cfg.vocab = v.vocab;
  cfg.seq = v.seq;
  for (const auto& [name, value] : std::vector<std::pair<const char*, int64_t>>{
           {"layers", v.layers}, {"d_model", v.d_model}, {"heads", v.heads},
           {"vocab", v.vocab}, {"seq", v.seq}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " ", value, " must be >= 1"));
    }
  }
  if (v.d_model % v.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--d_model ", v.d_model,
                                                   " is not divisible by --heads ", v.heads));
  }
  if (absl::Status s = ParsePrecisionFlag(v.dtype, &cfg); !s.ok()) return s;
  cfg.moe.experts = v.experts;
  cfg.moe.topk = v.topk;
  cfg.moe.capacity_factor = v.capacity;
  cfg.moe.aux_loss_coef = v.aux_loss_coef;
  for (absl::string_view a : absl::StrSplit(v.expert_axes, ',', absl::SkipWhitespace())) {
    cfg.moe.expert_axes.emplace_back(a);
  }
  return cfg;
}

}  // namespace shardmap
