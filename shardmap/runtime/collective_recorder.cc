#include "shardmap/runtime/collective_recorder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardmap {
namespace {

// This thread's recorders, outermost first (a rank thread's begin with those inherited from
// the thread that started its program).
thread_local std::vector<CollectiveRecorder*> active;

}  // namespace

namespace internal {

bool AnyRecorderActive() { return !active.empty(); }

void RecordCollective(int rank, const Mesh& mesh, const CollectiveRecord& r) {
  for (CollectiveRecorder* rec : active) rec->Add(rank, mesh, r);
}

std::vector<CollectiveRecorder*> ActiveRecorders() { return active; }

ScopedInheritedRecorders::ScopedInheritedRecorders(std::vector<CollectiveRecorder*> recorders)
    : saved_(std::exchange(active, std::move(recorders))) {}

ScopedInheritedRecorders::~ScopedInheritedRecorders() { active = std::move(saved_); }

}  // namespace internal

CollectiveRecorder::CollectiveRecorder() {
  const RankContext* ctx = RankContext::Current();
  home_rank_ = ctx != nullptr ? ctx->rank() : -1;
  active.push_back(this);
}

CollectiveRecorder::~CollectiveRecorder() {
  // Normally the innermost; a recorder destroyed out of order (one on the heap) is found.
  auto it = std::find(active.rbegin(), active.rend(), this);
  if (it != active.rend()) active.erase(std::next(it).base());
}

void CollectiveRecorder::Add(int rank, const Mesh& mesh, const CollectiveRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = by_rank_.try_emplace(rank);
  if (inserted) it->second.mesh = mesh;
  it->second.records.push_back(r);
}

int CollectiveRecorder::RankOrDefault(int rank) const {
  if (rank >= 0) return rank;
  return home_rank_ >= 0 ? home_rank_ : 0;
}

std::vector<CollectiveRecord> CollectiveRecorder::records(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_rank_.find(rank);
  return it == by_rank_.end() ? std::vector<CollectiveRecord>() : it->second.records;
}

std::vector<CollectiveRecord> CollectiveRecorder::records() const {
  return records(RankOrDefault(-1));
}

std::vector<int> CollectiveRecorder::ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& [rank, log] : by_rank_) {
    if (!log.records.empty()) out.push_back(rank);
  }
  return out;
}

int CollectiveRecorder::Count(absl::string_view op, AxisMask axes, bool backward,
                              int rank) const {
  int n = 0;
  for (const CollectiveRecord& r : records(RankOrDefault(rank))) {
    n += r.op == op && r.axes == axes && r.backward == backward ? 1 : 0;
  }
  return n;
}

int64_t CollectiveRecorder::Bytes(int rank) const {
  int64_t n = 0;
  for (const CollectiveRecord& r : records(RankOrDefault(rank))) n += r.bytes;
  return n;
}

std::string CollectiveRecorder::ToString(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_rank_.find(RankOrDefault(rank));
  if (it == by_rank_.end()) return "";
  std::string s;
  for (const CollectiveRecord& r : it->second.records) {
    absl::StrAppend(&s, r.op, " over ", it->second.mesh.MaskToString(r.axes), ": ",
                    DTypeName(r.dtype), ", ", r.bytes, " bytes", r.recomputed ? " (backward, recomputed)" : r.backward ? " (backward)" : "",
                    "\n");
  }
  return s;
}

void CollectiveRecorder::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  by_rank_.clear();
}

}  // namespace shardmap
