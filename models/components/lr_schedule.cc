#include "models/components/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("lr schedule: ", msg));
}

}  // namespace

absl::Status LrSchedule::Validate() const {
  if (kind != "constant" && kind != "cosine" && kind != "linear") {
    return Invalid(absl::StrCat("unknown kind '", kind,
                                "'; use \"constant\", \"cosine\" or \"linear\""));
  }
  if (!std::isfinite(max_lr) || max_lr <= 0) {
    return Invalid(absl::StrCat("max_lr ", max_lr,
                                " must be a finite number > 0 (e.g. --lr=6e-4)"));
  }
  if (!std::isfinite(min_lr) || min_lr < 0) {
    return Invalid(absl::StrCat("min_lr ", min_lr,
                                " must be a finite number >= 0 (e.g. --min_lr=6e-5)"));
  }
  if (kind != "constant" && min_lr > max_lr) {
    return Invalid(absl::StrCat("min_lr ", min_lr, " is above max_lr ", max_lr,
                                ": the decay goes from max_lr down to min_lr; lower min_lr"));
  }
  if (warmup_steps < 0) {
    return Invalid(absl::StrCat("warmup_steps ", warmup_steps, " is negative; use 0 for none"));
  }
  if (decay_steps < 0) {
    return Invalid(absl::StrCat("decay_steps ", decay_steps, " is negative"));
  }
  if (kind != "constant" && warmup_steps > decay_steps) {
    return Invalid(absl::StrCat("warmup_steps ", warmup_steps, " is past decay_steps ",
                                decay_steps, ": the ", kind,
                                " decay starts after the warmup and ends at decay_steps; raise "
                                "decay_steps (usually the total step count) or shorten the "
                                "warmup"));
  }
  return absl::OkStatus();
}

double LrSchedule::At(int64_t step) const {
  const double t = static_cast<double>(std::max<int64_t>(step, 0));
  if (step < warmup_steps) return max_lr * (t + 1) / (static_cast<double>(warmup_steps) + 1);
  if (kind == "constant") return max_lr;
  if (step > decay_steps) return min_lr;
  const int64_t span = decay_steps - warmup_steps;
  const double ratio = span == 0 ? 0.0
                                 : static_cast<double>(step - warmup_steps) /
                                       static_cast<double>(span);
  const double coeff = kind == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * ratio)) : 1.0 - ratio;
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace shardmap
