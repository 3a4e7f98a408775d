// Models register by name, as torchtitan's TrainSpecs do: a ModelSpec says how to build the
// model from the command line's shape flags and a named preset. `--model=gpt2|llama3` picks one
// (models/run/), `--preset` a named shape.
//
//   // in the model's .cc (its cc_library has alwayslink = True):
//   SHARDMAP_REGISTER_MODEL(ModelSpec{.name = "gpt2", .summary = "...", .presets = {...},
//                                     .create = CreateGpt2FromArgs});
//   absl::StatusOr<std::unique_ptr<Model>> m =
//       CreateModel("gpt2", ModelArgs{.preset = "gpt2"}, mesh, /*sp=*/false);
#ifndef SHARDMAP_MODELS_MODEL_REGISTRY_H_
#define SHARDMAP_MODELS_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model/model.h"
#include "shardmap/mesh.h"

namespace shardmap {

// What the command line says about a model's shape. Unset fields come from the preset, or the
// model's defaults without one; a model refuses the fields it has no use for (GPT-2 and
// --kv_heads) with the flag's name.
struct ModelArgs {
  std::string preset;  // "" : no preset
  std::optional<int64_t> layers, d_model, heads, kv_heads, ffn_dim, vocab, seq;
  std::optional<double> rope_theta, norm_eps;
  std::string dtype;   // "f32", "f64", "bf16" (mixed: f32 master weights); "" : the default
  MoeConfig moe;       // experts 0: dense
  RecomputeMode recompute = RecomputeMode::kNone;
};

struct ModelSpec {
  std::string name;                  // "gpt2"
  std::string summary;               // one line for --help and errors
  std::vector<std::string> presets;  // named shapes, first is the default
  std::function<absl::StatusOr<std::unique_ptr<Model>>(const ModelArgs&, const Mesh&, bool sp)>
      create;
  // The args a checkpoint's metadata describes (what Model::ShapeMetadata wrote), validated;
  // errors name the key.
  std::function<absl::StatusOr<ModelArgs>(const std::map<std::string, std::string>& metadata)>
      args_from_metadata;
};

// Adds `spec`; a second spec of the same name is a programming error (aborts at start-up).
bool RegisterModel(ModelSpec spec);
// The registered specs, by name (sorted).
std::vector<const ModelSpec*> RegisteredModels();
// The spec named `name`, or NotFound listing the registered names.
absl::StatusOr<const ModelSpec*> FindModel(const std::string& name);
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name, const ModelArgs& args,
                                                   const Mesh& mesh, bool sp);

// The registered name of the model a checkpoint holds: its metadata "model", or "gpt2" for the
// files written before models registered (their "gpt.*" keys); NotFound when it says neither.
absl::StatusOr<std::string> ModelNameInMetadata(const std::map<std::string, std::string>& m);

// --dtype: "f32", "f64", or "bf16" (mixed precision: f32 master weights, bf16 compute) into
// shape's dtype and compute; "" leaves them. InvalidArgument naming the flag otherwise.
absl::Status ParsePrecision(const std::string& dtype, ModelShape* shape);

}  // namespace shardmap

#define SHARDMAP_MODEL_CONCAT_INNER(a, b) a##b
#define SHARDMAP_MODEL_CONCAT(a, b) SHARDMAP_MODEL_CONCAT_INNER(a, b)
// Registers a ModelSpec at start-up (the defining library needs alwayslink = True).
#define SHARDMAP_REGISTER_MODEL(spec)                                                   \
  static const bool SHARDMAP_MODEL_CONCAT(shardmap_model_registered_, __LINE__) =      \
      ::shardmap::RegisterModel(spec)

#endif  // SHARDMAP_MODELS_MODEL_REGISTRY_H_
