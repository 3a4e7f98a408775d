#include "collectives/internal/in_process_group.h"

#include <mutex>

#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardmap::collectives::internal {

std::string FormatCallSite(const CallSite& site) {
  if (site.depth == 0) return "call site not recorded (set InProcessOptions::debug_check_calls)";
  std::vector<std::string> lines;
  char buf[2048];
  // absl::Symbolize is thread-safe through Abseil's own (uninstrumented) locks; serialize it
  // with a lock ThreadSanitizer can see.
  static std::mutex* const symbolize_mu = new std::mutex;
  std::lock_guard<std::mutex> l(*symbolize_mu);
  for (int i = 0; i < site.depth && lines.size() < 6; ++i) {
    const bool ok = absl::Symbolize(site.frames[i], buf, sizeof(buf));
    absl::string_view sym = ok ? absl::string_view(buf) : absl::string_view("??");
    if (sym.find("InProcessCommunicator") != absl::string_view::npos) continue;
    lines.push_back(absl::StrFormat("%s (pc %p)", std::string(sym), site.frames[i]));
  }
  return absl::StrJoin(lines, " <- ");
}

uint64_t HashBytes(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string Describe(const CallDesc& d) {
  std::string args;
  if (HasDtype(d.op)) absl::StrAppend(&args, DataTypeName(d.dtype), ", count=", d.count);
  if (HasReduce(d.op)) absl::StrAppend(&args, ", ", ReduceOpName(d.reduce));
  if (d.op == Op::kBroadcast) absl::StrAppend(&args, ", root=", d.root);
  if (d.op == Op::kAllGatherV || d.op == Op::kReduceScatterV || d.op == Op::kPpermute) {
    absl::StrAppend(&args, absl::StrFormat(", layout hash=%016x", d.shape_hash));
  }
  return absl::StrCat(OpName(d.op), "(", args, ") call #", d.seq,
                      d.device ? " on device memory" : "");
}

int HardwareThreads() {
  static const int n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

void World::WakeAll() {
  std::vector<std::shared_ptr<Group>> groups;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& w : groups_) {
      if (auto g = w.lock()) groups.push_back(std::move(g));
    }
  }
  for (auto& g : groups) g->Wake();
}

}  // namespace shardmap::collectives::internal
