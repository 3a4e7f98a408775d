#include "models/train/run_format.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardmap {

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GiB", b / 1073741824.0);
  if (b >= (1 << 20)) return absl::StrFormat("%.1f MiB", b / 1048576.0);
  if (b >= (1 << 10)) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  constexpr double kDay = 86400, kYear = 365.25 * kDay;
  if (s >= 100 * kYear) return absl::StrFormat("%.2g years", s / kYear);
  if (s >= 100 * kDay) return absl::StrFormat("%.0f days", s / kDay);
  // Whole seconds from here on: below 100 days they fit an int64 with room to spare.
  const int64_t whole = static_cast<int64_t>(s);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", whole / 3600, whole / 60 % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", whole / 60, whole % 60);
  return absl::StrFormat("%.1fs", s);
}

}  // namespace shardmap
