#include "models/train/overlap_flags.h"

#include <algorithm>
#include <cmath>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(shardmap::OnOff, overlap, shardmap::OnOff{true},
          "on (or true): data-parallel gradients are reduced in buckets started during the "
          "backward (overlapped with it; DDP's schedule) and FSDP gathers run ahead; off (or "
          "false): one blocking all-reduce per gradient after the backward (the reference "
          "schedule). Both give the same numbers bitwise");
ABSL_FLAG(double, bucket_mb, 25,
          "--overlap=on: the gradient bucket size in MiB (> 0, at most 1e6; DDP's default 25)");
ABSL_FLAG(int32_t, fsdp_prefetch, 1,
          "--overlap=on with dp_shard: units (embeddings, blocks, head) whose all-gathers run "
          "ahead of the one computing, in the forward and the backward (>= 1)");

namespace shardmap {

bool AbslParseFlag(absl::string_view text, OnOff* value, std::string* /*error*/) {
  const std::string t = absl::AsciiStrToLower(text);
  *value = OnOff{};
  if (t == "off" || t == "false" || t == "0" || t == "no") {
    value->on = false;
  } else if (t != "on" && t != "true" && t != "1" && t != "yes") {
    value->invalid = std::string(text);
  }
  return true;
}

std::string AbslUnparseFlag(OnOff value) {
  return !value.invalid.empty() ? value.invalid : value.on ? "on" : "off";
}

absl::StatusOr<OverlapOptions> CheckOverlapSettings(bool on, double bucket_mb, int fsdp_prefetch) {
  if (!(bucket_mb > 0) || !std::isfinite(bucket_mb) || bucket_mb > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bucket_mb=", bucket_mb, ": the gradient bucket size must be a positive number of MiB "
        "(at most 1e6; e.g. 25, DDP's default)"));
  }
  if (fsdp_prefetch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fsdp_prefetch=", fsdp_prefetch,
        ": the prefetch depth must be at least 1 (the next unit's all-gather runs beside this "
        "one's compute); --overlap=off gathers each parameter at its use"));
  }
  OverlapOptions o;
  o.on = on;
  o.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20)));
  o.fsdp_prefetch = fsdp_prefetch;
  return o;
}

absl::StatusOr<OverlapOptions> OverlapOptionsFromFlags() {
  const OnOff overlap = absl::GetFlag(FLAGS_overlap);
  if (!overlap.invalid.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--overlap='", overlap.invalid, "': give on (the default) or off (or true / false)"));
  }
  return CheckOverlapSettings(overlap.on, absl::GetFlag(FLAGS_bucket_mb),
                              absl::GetFlag(FLAGS_fsdp_prefetch));
}

}  // namespace shardmap
