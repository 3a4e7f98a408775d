// GPT-2's registration (models/model/registry.h): `--model=gpt2`, presets of OpenAI's four sizes.
#include "models/gpt/gpt_spec.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
namespace shardmap {
namespace {

// OpenAI's GPT-2 sizes (Radford et al. 2019, Table 2; Hugging Face's config.json of each):
// vocab 50257, n_positions 1024.
struct Gpt2Preset {
  const char* name;
  int64_t layers, d_model, heads;
};
constexpr Gpt2Preset kPresets[] = {{"gpt2", 12, 768, 12},
                                   {"gpt2-medium", 24, 1024, 16},
                                   {"gpt2-large", 36, 1280, 20},
                                   {"gpt2-xl", 48, 1600, 25}};

}  // namespace

absl::StatusOr<GptConfig> Gpt2ConfigFromArgs(const ModelArgs& args) {
  for (const auto& [flag, set] : {std::pair<const char*, bool>{"kv_heads", args.kv_heads.has_value()},
                                  {"ffn_dim", args.ffn_dim.has_value()},
                                  {"rope_theta", args.rope_theta.has_value()},
                                  {"norm_eps", args.norm_eps.has_value()}}) {
    if (set) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " is a Llama setting; GPT-2 (--model=gpt2) has no such shape (its MLP is "
          "4*d_model wide, its heads are all full, its LayerNorm eps is 1e-5)"));
    }
  }
  GptConfig cfg;  // defaults: the library's small test shape, unless a preset names one
  bool known = args.preset.empty();
  for (const Gpt2Preset& p : kPresets) {
    known = known || args.preset == p.name;
    if (args.preset == p.name) {
      cfg.layers = p.layers;
      cfg.d_model = p.d_model;
      cfg.heads = p.heads;
      cfg.vocab = 50257;
      cfg.seq = 1024;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--preset ", args.preset, ": GPT-2's presets are gpt2, gpt2-medium, gpt2-large, gpt2-xl"));
  }
  cfg.layers = args.layers.value_or(cfg.layers);
  cfg.d_model = args.d_model.value_or(cfg.d_model);
  cfg.heads = args.heads.value_or(cfg.heads);
  cfg.vocab = args.vocab.value_or(cfg.vocab);
  cfg.seq = args.seq.value_or(cfg.seq);
  ModelShape precision;
  if (absl::Status s = ParsePrecision(args.dtype, &precision); !s.ok()) return s;
  cfg.dtype = precision.dtype;
  cfg.compute = precision.compute;
  cfg.moe = args.moe;
  cfg.recompute = args.recompute;
  return cfg;
}

namespace {

absl::StatusOr<std::unique_ptr<Model>> CreateGpt2(const ModelArgs& args, const Mesh& mesh,
                                                  bool sp) {
  absl::StatusOr<GptConfig> cfg = Gpt2ConfigFromArgs(args);
  if (!cfg.ok()) return cfg.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(mesh, *cfg, sp);
  if (!layout.ok()) return layout.status();
  return std::make_unique<GptLayout>(*std::move(layout));
}

SHARDMAP_REGISTER_MODEL((ModelSpec{
    .name = "gpt2",
    .summary = "GPT-2 (OpenAI / Hugging Face): learned positions, LayerNorm, GELU MLP, tied head",
    .presets = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"},
    .create = CreateGpt2}));

}  // namespace
}  // namespace shardmap
