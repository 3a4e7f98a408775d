// GPT-2 checkpoints in safetensors with Hugging Face's names and layouts: wte.weight, wpe.weight,
// h.{i}.ln_1.{weight,bias}, h.{i}.attn.c_attn.{weight [d, 3d], bias [3d]} (Conv1D: [in, out]),
// h.{i}.attn.c_proj, h.{i}.ln_2, h.{i}.mlp.c_fc ([d, 4d]), h.{i}.mlp.c_proj, ln_f. Files hold
// whole tensors whatever the mesh; a rank reads only its block (GptLayout's specs), so a file
// saved on one mesh loads on any other. Training state for --resume rides along as
// optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name> and metadata "step".
//
//   SaveGpt("ckpt.safetensors", layout, result.params, &result.adam_state, result.steps_done);
//   SafetensorsFile f = *SafetensorsFile::Open("ckpt.safetensors");
//   absl::Status ok = CheckGptCheckpoint(f, layout, /*need_optimizer=*/false);  // before step 1
//   Tensor shard = *ReadGptShard(f, "h.0.mlp.c_fc.weight", layout.params()[k], mesh, rank, dt);
#ifndef SHARDMAP_MODELS_GPT_GPT_CHECKPOINT_H_
#define SHARDMAP_MODELS_GPT_GPT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/components/checkpoint.h"
#include "models/gpt/gpt_model.h"

namespace shardmap {

// AdamW moments as global tensors, in layout order.
struct AdamState {
  std::vector<NamedTensor> exp_avg, exp_avg_sq;
};

// The tensors a checkpoint holds: each parameter under model.CheckpointName, reshaped to
// CheckpointShape, then its AdamW moments as "optimizer.exp_avg.NAME" / "optimizer.exp_avg_sq.NAME"
// (when moments is set). params / moments: global tensors in params() order; InvalidArgument when
// the count or a name differs.
absl::StatusOr<std::vector<NamedTensor>> CheckpointTensors(const Model& model,
                                                           const std::vector<NamedTensor>& params,
                                                           const AdamState* moments);

// params / moments: global tensors in layout order (moments may be null).
absl::Status SaveGpt(const std::string& path, const Model& layout,
                     const std::vector<NamedTensor>& params, const AdamState* moments,
                     int64_t step);

// Every parameter (and, with need_optimizer, its moments and the step) present with GPT-2's
// shape; errors name the file and the tensor.
absl::Status CheckGptCheckpoint(const SafetensorsFile& file, const Model& layout,
                                bool need_optimizer);

// SafetensorsFile::Open after checking that `path` names a regular file (a directory or a
// device is InvalidArgument naming the path; a missing file NotFound).
absl::StatusOr<SafetensorsFile> OpenGptCheckpoint(const std::string& path);

// The step a --resume file continues from: metadata "step", a whole number in [0, 2^53].
// InvalidArgument naming the file and the value otherwise.
absl::StatusOr<int64_t> CheckpointStep(const SafetensorsFile& file);

// Before training: `path` can be written at the end (its directory exists and is writable, and
// it is not a directory). FailedPrecondition naming the path and the problem.
absl::Status CheckSavePath(const std::string& path);

// This rank's block of `tensor` (a parameter or one of its moments) under p's spec.
absl::StatusOr<Tensor> ReadGptShard(const SafetensorsFile& file, const std::string& tensor,
                                    const ParamInfo& p, const Mesh& mesh, int rank, DType dtype);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_GPT_CHECKPOINT_H_
