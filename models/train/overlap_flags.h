// The overlapped step's flags, defined once for every binary that runs or prices that step (the
// trainer, models/run; the planner's plan_gpt): --overlap, --bucket_mb and --fsdp_prefetch, and
// their one check. Linking this library defines the flags; list "models/train/overlap_flags" in
// the binary's base::FlagsSpec::help_files so --help shows them.
//
//   absl::StatusOr<OverlapOptions> o = OverlapOptionsFromFlags();
//   if (!o.ok()) ...;  // "--bucket_mb=0: the gradient bucket size must be a positive number ..."
#ifndef SHARDMAP_MODELS_TRAIN_OVERLAP_FLAGS_H_
#define SHARDMAP_MODELS_TRAIN_OVERLAP_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/train/train_options.h"

namespace shardmap {

// A switch written on|off or true|false (also 1|0, yes|no): the trainer's --overlap=on and the
// planner's --overlap=true mean the same. Printed as on|off (the value run configurations store).
// Other text parses (Abseil would exit 1 with its own words) and is refused by
// OverlapOptionsFromFlags, with the other flags' checks: exit 2, the fix named.
struct OnOff {
  bool on = true;
  std::string invalid;  // the text given when it was none of the above
};
bool AbslParseFlag(absl::string_view text, OnOff* value, std::string* error);
std::string AbslUnparseFlag(OnOff value);

// --overlap, --bucket_mb and --fsdp_prefetch checked (the first problem, with its fix), into
// OverlapOptions (reshard_after_forward left at its default).
absl::StatusOr<OverlapOptions> OverlapOptionsFromFlags();

// The check itself, for values from elsewhere.
absl::StatusOr<OverlapOptions> CheckOverlapSettings(bool on, double bucket_mb, int fsdp_prefetch);

}  // namespace shardmap

ABSL_DECLARE_FLAG(shardmap::OnOff, overlap);
ABSL_DECLARE_FLAG(double, bucket_mb);
ABSL_DECLARE_FLAG(int32_t, fsdp_prefetch);

#endif  // SHARDMAP_MODELS_TRAIN_OVERLAP_FLAGS_H_
