#include "models/parallel/recompute.h"

#include "absl/strings/str_cat.h"

namespace shardmap {

const char* RecomputeModeName(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::kNone:
      return "none";
    case RecomputeMode::kFull:
      return "full";
    case RecomputeMode::kSelective:
      return "selective";
  }
  return "?";
}

absl::StatusOr<RecomputeMode> ParseRecomputeMode(absl::string_view text) {
  for (RecomputeMode m : {RecomputeMode::kNone, RecomputeMode::kFull, RecomputeMode::kSelective}) {
    if (text == RecomputeModeName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--recompute=", text, ": expected none (keep every activation), full (keep each "
      "transformer block's input, recompute the block in the backward) or selective (recompute "
      "only the attention scores and softmax)"));
}

}  // namespace shardmap
