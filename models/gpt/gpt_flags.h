// The GPT model-shape, precision and MoE flags, written once for every binary that builds a
// GptConfig from its command line (train_gpt, plan_gpt, plan_validate). Each binary keeps its
// own defaults, and each lists the flags in its own --help: Abseil's --help shows the flags of
// the binary's main file, so the macro defines them there.
//
//   SHARDMAP_GPT_CONFIG_FLAGS(/*layers=*/12, /*d_model=*/768, /*heads=*/12, /*vocab=*/50304,
//                             /*seq=*/1024, /*dtype=*/"bf16");   // at namespace scope
//   ...
//   absl::StatusOr<GptConfig> cfg = GptConfigFromFlags(SHARDMAP_GPT_CONFIG_FLAG_VALUES());
//   if (!cfg.ok()) ...;   // "--heads 5: --d_model 64 is not divisible by it", "--dtype fp8: ..."
#ifndef SHARDMAP_MODELS_GPT_GPT_FLAGS_H_
#define SHARDMAP_MODELS_GPT_GPT_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"

namespace shardmap {

// The values of the flags SHARDMAP_GPT_CONFIG_FLAGS defines.
struct GptConfigFlagValues {
  int64_t layers = 0, d_model = 0, heads = 0, vocab = 0, seq = 0;
  std::string dtype;
  int64_t experts = 0, topk = 1;
  double capacity = 1.25, aux_loss_coef = 0.01;
  std::string expert_axes;  // comma-separated mesh axes
};

// --dtype: "f32", "f64", or "bf16" (mixed precision: f32 master weights, bf16 compute) into
// cfg's dtype and compute. InvalidArgument naming the flag and the choices otherwise.
absl::Status ParsePrecisionFlag(const std::string& dtype, GptConfig* cfg);

// The config the flags describe: every shape >= 1, d_model divisible by heads, the precision,
// the MoE settings (checked with the model, GptLayout::Create). InvalidArgument naming the flag.
absl::StatusOr<GptConfig> GptConfigFromFlags(const GptConfigFlagValues& values);

}  // namespace shardmap

// Defines --layers, --d_model, --heads, --vocab, --seq, --dtype and the MoE flags (--experts,
// --topk, --capacity, --aux_loss_coef, --expert_axes) in the file that expands it.
#define SHARDMAP_GPT_CONFIG_FLAGS(layers_default, d_model_default, heads_default, vocab_default, \
                                  seq_default, dtype_default)                                   \
  ABSL_FLAG(int64_t, layers, layers_default, "transformer blocks");                             \
  ABSL_FLAG(int64_t, d_model, d_model_default, "model width");                                  \
  ABSL_FLAG(int64_t, heads, heads_default, "attention heads");                                  \
  ABSL_FLAG(int64_t, vocab, vocab_default, "vocabulary size (256 for --text byte data)");       \
  ABSL_FLAG(int64_t, seq, seq_default, "tokens per sequence");                                  \
  ABSL_FLAG(std::string, dtype, dtype_default,                                                  \
            "f32, f64, or bf16 (mixed precision: f32 master weights, bf16 compute)");          \
  ABSL_FLAG(int64_t, experts, 0, "mixture of experts: experts per MoE MLP (0: dense MLP)");    \
  ABSL_FLAG(int64_t, topk, 1, "MoE: experts each token is routed to");                         \
  ABSL_FLAG(double, capacity, 1.25,                                                              \
            "MoE capacity factor: slots per expert and sequence = "                            \
            "ceil(factor * seq * topk / experts)");                                             \
  ABSL_FLAG(double, aux_loss_coef, 0.01, "MoE: weight of the Switch load-balancing loss");     \
  ABSL_FLAG(std::string, expert_axes, "",                                                        \
            "MoE: comma-separated batch axes the experts are split over (default: ep when "     \
            "the mesh has it), e.g. dp or dp_shard,ep")

// The current values of those flags, for GptConfigFromFlags.
#define SHARDMAP_GPT_CONFIG_FLAG_VALUES()                                                  \
  (::shardmap::GptConfigFlagValues{                                                        \
      absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_heads), \
      absl::GetFlag(FLAGS_vocab), absl::GetFlag(FLAGS_seq), absl::GetFlag(FLAGS_dtype),     \
      absl::GetFlag(FLAGS_experts), absl::GetFlag(FLAGS_topk), absl::GetFlag(FLAGS_capacity), \
      absl::GetFlag(FLAGS_aux_loss_coef), absl::GetFlag(FLAGS_expert_axes)})

#endif  // SHARDMAP_MODELS_GPT_GPT_FLAGS_H_
