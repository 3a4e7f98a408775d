// What one training step needs at least, known before anything is allocated: a run whose batch
// cannot fit is refused with the figure (a --batch typo, or a batch adopted from a checkpoint's
// metadata, would otherwise allocate until the machine swaps or the kernel kills it).
//
//   absl::StatusOr<double> limit = ParseMemoryLimit(flag);            // "" -> this machine's
//   absl::Status s = CheckStepFitsMemory(cfg, {.batch = 8, .grad_accum = 1}, 1, *limit, "...");
//
// The bound is a lower one, so that it never refuses a run that fits: per process, the model's
// parameters, gradients and two AdamW moments, plus one microstep's logits and their gradient
// ([tokens, vocab] each, VocabParallelCrossEntropy materialises them) and the residual stream
// each layer keeps for the backward ([tokens, d_model]), all shared evenly by the processes.
#ifndef SHARDMAP_MODELS_TRAIN_MEMORY_BOUND_H_
#define SHARDMAP_MODELS_TRAIN_MEMORY_BOUND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"
#include "models/model/model.h"

namespace shardmap {

struct StepBatch {
  int64_t batch = 1;         // global sequences per step
  int64_t grad_accum = 1;    // microsteps per step (each holds batch / grad_accum)
  int64_t microbatches = 1;  // pipeline microbatches (each holds a part of a microstep)
};

// The lower bound in bytes per process (see above), for any model: its parameter count and shape.
double MinStepBytes(double params, const ModelShape& shape, const StepBatch& b, int processes);
// GPT-2's (GptParameterCount counts its parameters).
double MinStepBytes(const GptConfig& cfg, const StepBatch& b, int processes);

// The machine's physical memory in bytes.
double HostMemoryBytes();

// "" -> HostMemoryBytes(); "8GiB", "512MiB", "2.5G", "1000000" (bytes) otherwise.
// InvalidArgument naming the text and the accepted forms.
absl::StatusOr<double> ParseMemoryLimit(const std::string& text);

// InvalidArgument with the figures when MinStepBytes exceeds limit_bytes; `limit_name` says
// whose limit it is (e.g. "this machine's memory", "--max_memory").
absl::Status CheckStepFitsMemory(double params, const ModelShape& shape, const StepBatch& b,
                                 int processes, double limit_bytes,
                                 const std::string& limit_name);
absl::Status CheckStepFitsMemory(const GptConfig& cfg, const StepBatch& b, int processes,
                                 double limit_bytes, const std::string& limit_name);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_MEMORY_BOUND_H_
