#include "models/run/trace_merge.h"

#include <cstdio>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "models/components/atomic_file.h"
#include "models/components/bounded_read.h"
#include "nlohmann/json.hpp"

namespace shardmap {
namespace {

// A part or the trace itself: written by this run, but still read within a bound.
constexpr int64_t kMaxTraceBytes = int64_t{16} << 30;

absl::StatusOr<nlohmann::json> ReadTrace(const std::string& path) {
  absl::StatusOr<std::string> text = ReadBoundedFile(path, kMaxTraceBytes, "--trace");
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::DataLossError(absl::StrCat("--trace: '", path, "' is not a trace to merge"));
  }
  return j;
}

}  // namespace

std::string TracePartPath(const std::string& trace, int rank) {
  return absl::StrCat(trace, ".rank", rank);
}

absl::Status MergeTraceParts(const std::string& trace, int processes) {
  absl::StatusOr<nlohmann::json> all = ReadTrace(trace);
  if (!all.ok()) return all.status();
  for (int r = 1; r < processes; ++r) {
    absl::StatusOr<nlohmann::json> part = ReadTrace(TracePartPath(trace, r));
    if (!part.ok()) return part.status();
    for (nlohmann::json& e : *part) all->push_back(std::move(e));
  }
  const std::string text = all->dump() + "\n";
  // An exclusive, unpredictable temporary renamed over the trace: a file or symlink planted at
  // any name beside it is never written through.
  if (absl::Status s = WriteFileAtomically(
          trace, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
      !s.ok()) {
    return absl::DataLossError(absl::StrCat("--trace: cannot replace '", trace, "': ",
                                            s.message()));
  }
  for (int r = 1; r < processes; ++r) std::remove(TracePartPath(trace, r).c_str());
  return absl::OkStatus();
}

}  // namespace shardmap
