// The model a run trains: --model's registration with the shape from --preset, the shape flags
// or a checkpoint (resume.h), refused before anything is allocated when the model or its step
// cannot fit this machine; and the tokenizer, whose ids must fit its vocab.
//
//   ModelArgs args = ModelArgsFromFlags();
//   absl::StatusOr<RunModel> m = MakeRunModel("gpt2", args, cfg, mesh, processes, source_name);
#ifndef SHARDMAP_MODELS_RUN_MODEL_SETUP_H_
#define SHARDMAP_MODELS_RUN_MODEL_SETUP_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/data/text_tokenizer.h"
#include "models/gpt/gpt_model.h"
#include "models/model/registry.h"
#include "shardmap/mesh.h"

namespace shardmap {

// The model the flags describe: --preset's shape, with every shape flag given on the command line
// in its place (without --preset, every shape flag's value, its default included).
ModelArgs ModelArgsFromFlags();

// The same model on another mesh (generation runs without pp).
using ModelOnMesh = std::function<absl::StatusOr<std::unique_ptr<Model>>(const Mesh&)>;

struct RunModel {
  std::unique_ptr<Model> model;  // on the run's mesh
  ModelOnMesh remake;
};
// `model_name`'s model on `mesh` (--sp when the mesh has more than one rank): GPT-2 from `cfg`
// (its size checked before its layout is built), any other model from its registration and
// `args`. A model whose parameters, gradients and AdamW moments cannot fit this machine's memory
// (shared by `processes`) is refused, naming `shape_source`.
absl::StatusOr<RunModel> MakeRunModel(const std::string& model_name, const ModelArgs& args,
                                      const GptConfig& cfg, const Mesh& mesh, int processes,
                                      const std::string& shape_source);

// The step's least memory (models/train/memory_bound.h) against `limit_bytes` (--max_memory, or
// the machine's): an impossible --batch (given, or adopted from a checkpoint) is refused before
// allocating.
absl::Status CheckBatchFits(const Model& model, int processes, double limit_bytes);

// --tokenizer=PATH: Llama 3's tokenizer.model, or GPT-2's byte-level BPE from a folder; null
// without the flag. Its ids must fit the model's vocab.
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizer(const ModelShape& cfg);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_MODEL_SETUP_H_
