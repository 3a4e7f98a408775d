// The trainer's flags (`train`, `train_gpt`), defined once in train_flags.cc; the model-shape
// flags come from models/gpt/gpt_flags.h's macro, the placement flags from placement.h and the
// overlapped step's from models/train/overlap_flags.h. Checked in one place: train_settings.h.
#ifndef SHARDMAP_MODELS_RUN_TRAIN_FLAGS_H_
#define SHARDMAP_MODELS_RUN_TRAIN_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/strings/string_view.h"

namespace shardmap {

// Whether a flag defined in `file` is one of the trainer's run settings (every process of a
// multi-process run must agree on them; connection.h).
bool IsTrainFlagFile(absl::string_view file);

// The files whose flags `train --help` lists (base::FlagsSpec::help_files).
inline constexpr const char* kTrainFlagFiles[] = {"models/run/train_flags", "models/run/placement",
                                                  "models/train/overlap_flags"};

}  // namespace shardmap

ABSL_DECLARE_FLAG(int64_t, microbatches);
ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(std::string, stage_layers);
ABSL_DECLARE_FLAG(int32_t, virtual_stages);
ABSL_DECLARE_FLAG(std::string, devices);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(bool, cuda_graph);
ABSL_DECLARE_FLAG(double, collective_timeout);
ABSL_DECLARE_FLAG(bool, reshard_after_forward);
ABSL_DECLARE_FLAG(std::string, tokenizer);
ABSL_DECLARE_FLAG(std::string, data_order);
ABSL_DECLARE_FLAG(bool, deterministic);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, preset);
ABSL_DECLARE_FLAG(int64_t, kv_heads);
ABSL_DECLARE_FLAG(int64_t, ffn_dim);
ABSL_DECLARE_FLAG(double, rope_theta);
ABSL_DECLARE_FLAG(double, norm_eps);
ABSL_DECLARE_FLAG(int64_t, batch);
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(double, beta1);
ABSL_DECLARE_FLAG(double, beta2);
ABSL_DECLARE_FLAG(double, eps);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(double, clip);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, text);
ABSL_DECLARE_FLAG(std::string, init);
ABSL_DECLARE_FLAG(std::string, save);
ABSL_DECLARE_FLAG(std::string, resume);
ABSL_DECLARE_FLAG(std::string, trace);
ABSL_DECLARE_FLAG(bool, plan);
ABSL_DECLARE_FLAG(std::string, plan_profile);
ABSL_DECLARE_FLAG(bool, print_types);
ABSL_DECLARE_FLAG(int64_t, log_every);
ABSL_DECLARE_FLAG(std::string, lr_schedule);
ABSL_DECLARE_FLAG(double, min_lr);
ABSL_DECLARE_FLAG(int64_t, warmup_steps);
ABSL_DECLARE_FLAG(int64_t, decay_steps);
ABSL_DECLARE_FLAG(std::string, recompute);
ABSL_DECLARE_FLAG(int64_t, grad_accum);
ABSL_DECLARE_FLAG(double, val_fraction);
ABSL_DECLARE_FLAG(std::string, val_data);
ABSL_DECLARE_FLAG(int64_t, eval_every);
ABSL_DECLARE_FLAG(int64_t, eval_steps);
ABSL_DECLARE_FLAG(int64_t, save_every);
ABSL_DECLARE_FLAG(int64_t, keep_last);
ABSL_DECLARE_FLAG(std::string, run_id);
ABSL_DECLARE_FLAG(bool, overwrite);
ABSL_DECLARE_FLAG(std::string, trace_steps);
ABSL_DECLARE_FLAG(int64_t, sample);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(double, peak_flops);
ABSL_DECLARE_FLAG(std::string, max_memory);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(int64_t, top_k);
ABSL_DECLARE_FLAG(int64_t, layers);
ABSL_DECLARE_FLAG(int64_t, d_model);
ABSL_DECLARE_FLAG(int64_t, heads);
ABSL_DECLARE_FLAG(int64_t, vocab);
ABSL_DECLARE_FLAG(int64_t, seq);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int64_t, experts);
ABSL_DECLARE_FLAG(int64_t, topk);
ABSL_DECLARE_FLAG(double, capacity);
ABSL_DECLARE_FLAG(double, aux_loss_coef);
ABSL_DECLARE_FLAG(std::string, expert_axes);
#endif  // SHARDMAP_MODELS_RUN_TRAIN_FLAGS_H_
