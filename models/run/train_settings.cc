#include "models/run/train_settings.h"

#include <cmath>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/components/lr_schedule.h"
#include "models/data/batch_order.h"
#include "models/parallel/pipeline.h"
#include "models/parallel/recompute.h"
#include "models/run/placement.h"
#include "models/run/train_flags.h"
#include "models/train/memory_bound.h"
#include "models/train/overlap_flags.h"

namespace shardmap {
namespace {

// The optimizer, the learning-rate schedule (models/components/lr_schedule.h) and the batches.
absl::Status SetOptimization(TrainOptions& o) {
  o.steps = absl::GetFlag(FLAGS_steps);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.optimizer.adamw.lr = absl::GetFlag(FLAGS_lr);
  o.optimizer.adamw.beta1 = absl::GetFlag(FLAGS_beta1);
  o.optimizer.adamw.beta2 = absl::GetFlag(FLAGS_beta2);
  o.optimizer.adamw.eps = absl::GetFlag(FLAGS_eps);
  o.optimizer.adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.optimizer.clip = absl::GetFlag(FLAGS_clip);
  o.grad_accum = absl::GetFlag(FLAGS_grad_accum);
  absl::StatusOr<BatchOrder> order =
      ParseBatchOrder(absl::GetFlag(FLAGS_data_order), absl::GetFlag(FLAGS_seed));
  if (!order.ok()) return order.status();
  o.batch_order = *order;
  LrSchedule schedule_lr;
  schedule_lr.kind = absl::GetFlag(FLAGS_lr_schedule);
  schedule_lr.max_lr = absl::GetFlag(FLAGS_lr);
  schedule_lr.min_lr = absl::GetFlag(FLAGS_min_lr);
  schedule_lr.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  schedule_lr.decay_steps = absl::GetFlag(FLAGS_decay_steps) >= 0
                                ? absl::GetFlag(FLAGS_decay_steps)
                                : absl::GetFlag(FLAGS_steps);
  if (schedule_lr.kind != "constant" || schedule_lr.warmup_steps != 0) {
    if (absl::Status s = schedule_lr.Validate(); !s.ok()) return s;
    o.optimizer.lr_at = [schedule_lr](int64_t step) { return schedule_lr.At(step); };
  }
  return absl::OkStatus();
}

// --microbatches, --schedule, --virtual_stages and --stage_layers.
absl::Status SetPipeline(TrainOptions& o) {
  o.pipeline.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.pipeline.schedule = absl::GetFlag(FLAGS_schedule);
  o.pipeline.virtual_stages = absl::GetFlag(FLAGS_virtual_stages);
  absl::StatusOr<Schedule> schedule = ParseSchedule(o.pipeline.schedule);
  if (!schedule.ok()) return schedule.status();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_stage_layers), ',',
                                               absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stage_layers: '", part, "' is not a number (e.g. --stage_layers=2,1,1)"));
    }
    o.pipeline.stage_layers.push_back(n);
  }
  return absl::OkStatus();
}

// --overlap, --bucket_mb, --fsdp_prefetch (overlap_flags.h), --reshard_after_forward,
// --recompute.
absl::Status SetStepSchedule(TrainOptions& o) {
  absl::StatusOr<OverlapOptions> overlap = OverlapOptionsFromFlags();
  if (!overlap.ok()) return overlap.status();
  o.overlap = *overlap;
  o.overlap.reshard_after_forward = absl::GetFlag(FLAGS_reshard_after_forward);
  absl::StatusOr<RecomputeMode> mode = ParseRecomputeMode(absl::GetFlag(FLAGS_recompute));
  if (!mode.ok()) return mode.status();
  o.recompute = *mode;
  return absl::OkStatus();
}

// --sample, --temperature and --top_k (the prompt and top_k's bound need the model).
absl::StatusOr<SampleSettings> SampleFlags() {
  SampleSettings s{absl::GetFlag(FLAGS_sample), absl::GetFlag(FLAGS_temperature),
                   absl::GetFlag(FLAGS_top_k)};
  if (s.tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--sample ", s.tokens, " must be >= 0"));
  }
  if (s.tokens > 0 && (!std::isfinite(s.temperature) || s.temperature < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature ", s.temperature, " must be finite and >= 0 (0: greedy)"));
  }
  return s;
}

// --devices, --collective_timeout, --device, --gpu_ranks (placement.h).
absl::Status SetWhere(TrainSettings& t) {
  const std::string devices = absl::GetFlag(FLAGS_devices);
  if (!devices.empty() &&
      (!absl::StartsWith(devices, "cpu:") || !absl::SimpleAtoi(devices.substr(4), &t.devices))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices ", devices, ": write cpu:N (simulated CPU ranks)"));
  }
  const double timeout_s = absl::GetFlag(FLAGS_collective_timeout);
  if (!std::isfinite(timeout_s) || timeout_s <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--collective_timeout ", timeout_s, " must be a finite number of seconds > 0 (e.g. 60)"));
  }
  t.collective_timeout = absl::Seconds(timeout_s);
  return CheckPlacementFlags();
}

// --run_id, --save_every, --eval_every / --eval_steps, --trace_steps, --max_memory.
absl::Status SetOutputs(TrainSettings& t) {
  const std::string id = absl::GetFlag(FLAGS_run_id);
  if (id.find_first_of(",\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run_id '", id, "' holds a comma or a newline; use letters and digits"));
  }
  t.options.checkpoint.save_every = absl::GetFlag(FLAGS_save_every);
  if (t.options.checkpoint.save_every > 0 && absl::GetFlag(FLAGS_save).empty()) {
    return absl::InvalidArgumentError(
        "--save_every needs --save (the prefix of the periodic checkpoints)");
  }
  t.options.eval.every = absl::GetFlag(FLAGS_eval_every);
  t.options.eval.steps = absl::GetFlag(FLAGS_eval_steps);
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    absl::StatusOr<StepFilter> steps = StepFilter::Parse(absl::GetFlag(FLAGS_trace_steps));
    if (!steps.ok()) return steps.status();
    t.trace_steps = *steps;
  }
  absl::StatusOr<double> limit = ParseMemoryLimit(absl::GetFlag(FLAGS_max_memory));
  if (!limit.ok()) return limit.status();
  t.memory_limit = *limit;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainSettings> ValidateTrainFlags() {
  TrainSettings t;
  TrainOptions& o = t.options;
  if (absl::Status s = SetWhere(t); !s.ok()) return s;
  if (absl::Status s = SetOptimization(o); !s.ok()) return s;
  if (absl::Status s = SetPipeline(o); !s.ok()) return s;
  if (absl::Status s = SetStepSchedule(o); !s.ok()) return s;
  if (absl::Status s = SetOutputs(t); !s.ok()) return s;
  absl::StatusOr<SampleSettings> sample = SampleFlags();
  if (!sample.ok()) return sample.status();
  t.sample = *sample;
  o.runtime.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  o.checkpoint.init_path = absl::GetFlag(FLAGS_init);
  return t;
}

}  // namespace shardmap
