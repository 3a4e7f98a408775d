// Learning-rate schedules of a training run, as nanoGPT's get_lr: a linear warmup over the first
// warmup_steps, then a decay from max_lr to min_lr that ends at step decay_steps, min_lr after.
//
//   LrSchedule s{.max_lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 100, .decay_steps = 5000,
//                .kind = "cosine"};
//   if (absl::Status ok = s.Validate(); !ok.ok()) return ok;  // before the first step
//   double lr = s.At(step);  // step 0-based, as the optimizer step about to run
//
// Formulas (step t, warmup W, decay end D, nanoGPT's train.py):
//   t <  W:          max_lr * (t + 1) / (W + 1)
//   W <= t <= D:     ratio r = (t - W) / (D - W)  (0 when D == W)
//                    cosine: min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr)
//                    linear: min_lr + (1 - r) * (max_lr - min_lr)
//                    constant: max_lr
//   t >  D:          min_lr (cosine, linear); max_lr (constant)
// "constant" keeps the warmup (W = 0 gives max_lr at every step) and ignores min_lr / D.
#ifndef SHARDMAP_MODELS_COMPONENTS_LR_SCHEDULE_H_
#define SHARDMAP_MODELS_COMPONENTS_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardmap {

struct LrSchedule {
  double max_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // the step where the decay reaches min_lr (nanoGPT's lr_decay_iters)
  std::string kind = "constant";  // "constant", "cosine" or "linear"

  // InvalidArgument (naming the field, its value and the fix) for an unknown kind, a max_lr that
  // is not finite and > 0, a min_lr that is not finite and >= 0, min_lr > max_lr, negative
  // warmup_steps or decay_steps, and (cosine, linear) warmup_steps > decay_steps.
  absl::Status Validate() const;

  // The learning rate of optimizer step `step` (0-based). Assumes Validate() is OK; a negative
  // step is treated as step 0.
  double At(int64_t step) const;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_LR_SCHEDULE_H_
