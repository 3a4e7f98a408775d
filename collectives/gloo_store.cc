#include "collectives/gloo_store.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"

namespace shardmap::collectives {
namespace {

[[noreturn]] void Throw(const absl::Status& s) {
  throw gloo::IoException(std::string("rendezvous through the TCP store failed: ") +
                          std::string(s.message()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_.Set(Key(key), absl::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_.Get(Key(key));
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(store_.options().timeout)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  for (const std::string& k : keys) full.push_back(Key(k));
  const absl::Duration limit = absl::Milliseconds(timeout.count());
  absl::StatusOr<std::vector<std::string>> missing = store_.MissingAfter(full, limit);
  if (!missing.ok()) Throw(missing.status());
  if (missing->empty()) return;
  // Gloo's rendezvous keys are the peers' ranks: say which did not join, not which key.
  std::vector<int> ranks;
  for (const std::string& k : *missing) {
    int r = -1;
    if (!absl::SimpleAtoi(absl::string_view(k).substr(prefix_.size() + 1), &r)) {
      Throw(absl::DeadlineExceededError(absl::StrCat(
          "no rank set '", absl::StrJoin(*missing, "', '"), "' within ",
          absl::FormatDuration(limit))));
    }
    ranks.push_back(r);
  }
  std::sort(ranks.begin(), ranks.end());
  if (!group_.has_value()) {
    Throw(absl::DeadlineExceededError(
        RanksDidNotJoin(ranks, store_.world_size(), limit, "train: --collective_timeout")));
  }
  Throw(absl::DeadlineExceededError(GroupRanksDidNotArrive(ranks, limit)));
}

// Every member joined the job before this group formed, so "start every rank" would mislead:
// the missing ones were started and are stopped, hung, or still busy elsewhere.
std::string GlooStore::GroupRanksDidNotArrive(const std::vector<int>& group_ranks,
                                              absl::Duration limit) const {
  std::vector<int> world;
  for (int g : group_ranks) {
    world.push_back(g >= 0 && g < static_cast<int>(group_->world_ranks.size())
                        ? group_->world_ranks[g]
                        : g);
  }
  return absl::StrCat(
      world.size() == 1 ? "rank " : "ranks ", absl::StrJoin(world, ", "), " of ",
      store_.world_size(), " did not reach ", group_->what, " within ",
      absl::FormatDuration(limit), " (", world.size() == 1 ? "it" : "they",
      " joined the job earlier: stopped, hung, or busy that long elsewhere); find what holds ",
      world.size() == 1 ? "it" : "them", ", or raise the timeout (train: --collective_timeout)");
}

}  // namespace shardmap::collectives
