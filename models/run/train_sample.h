// train --sample=N: after training, N tokens generated from --prompt with the trained parameters
// (on the mesh without pp: generation does not pipeline), and printed.
#ifndef SHARDMAP_MODELS_RUN_TRAIN_SAMPLE_H_
#define SHARDMAP_MODELS_RUN_TRAIN_SAMPLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/text_tokenizer.h"
#include "models/model/model.h"
#include "models/run/connection.h"
#include "models/run/model_setup.h"
#include "models/run/train_settings.h"
#include "models/train/trainer.h"

namespace shardmap {

struct SampleRequest {
  SampleSettings settings;  // tokens 0: no sample
  std::vector<int64_t> prompt;
};

// --top_k against the model's vocab and --prompt encoded (bytes, the tokenizer's ids, or
// comma-separated ids for uint16 data), checked before training.
absl::StatusOr<SampleRequest> ParseSampleRequest(const SampleSettings& settings,
                                                 const ModelShape& cfg,
                                                 const TextTokenizer* tokenizer);

// The sampled tokens (every process of a multi-process run takes part); empty on ranks that do
// not print. `remake` builds the same model on another mesh.
absl::StatusOr<std::vector<int64_t>> Sample(const Model& layout, const ModelOnMesh& remake,
                                            const RankWorld& ranks, const TrainResult& r,
                                            const SampleRequest& req);

void PrintSample(const std::vector<int64_t>& sampled, const SampleRequest& req,
                 const TextTokenizer* tokenizer);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_TRAIN_SAMPLE_H_
