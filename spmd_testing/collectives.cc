#include "spmd_testing/collectives.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardmap::spmd_testing {
namespace {

ExpectedCollective Make(const char* op, AxisNames axes, int count) {
  return ExpectedCollective{op, std::move(axes.names), count, std::nullopt};
}

// (op, axes) -> bytes of each call, in log order.
using Calls = std::map<std::pair<std::string, std::string>, std::vector<int64_t>>;

Calls Group(const Mesh& mesh, const std::vector<CollectiveRecord>& log, bool backward) {
  Calls calls;
  for (const CollectiveRecord& r : log) {
    if (r.backward == backward) calls[{r.op, mesh.MaskToString(r.axes)}].push_back(r.bytes);
  }
  return calls;
}

std::string Describe(const Calls& calls) {
  std::vector<std::string> parts;
  for (const auto& [key, bytes] : calls) {
    std::map<int64_t, int> sizes;
    for (int64_t b : bytes) ++sizes[b];
    std::vector<std::string> b;
    for (const auto& [size, n] : sizes) {
      b.push_back(sizes.size() == 1 ? absl::StrCat(size, " B each")
                                    : absl::StrCat(n, "x ", size, " B"));
    }
    parts.push_back(absl::StrCat(key.first, "(", key.second, ") x", bytes.size(), " [",
                                 absl::StrJoin(b, ", "), "]"));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

std::string DescribeExpected(const Mesh& mesh, const std::vector<ExpectedCollective>& want) {
  std::vector<std::string> parts;
  for (const ExpectedCollective& e : want) {
    absl::StatusOr<AxisMask> m = mesh.Mask(e.axes);
    std::string axes = m.ok() ? mesh.MaskToString(*m) : absl::StrJoin(e.axes, ",");
    std::string s = absl::StrCat(e.op, "(", axes, ") x", e.count);
    if (e.bytes) absl::StrAppend(&s, " [", *e.bytes, " B each]");
    parts.push_back(s);
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// Empty when the calls of one direction match.
std::string Match(const Mesh& mesh, const std::vector<CollectiveRecord>& log, bool backward,
                  const std::vector<ExpectedCollective>& want) {
  const char* dir = backward ? "backward" : "forward";
  Calls got = Group(mesh, log, backward);
  const std::string got_text = Describe(got);
  std::vector<std::string> problems;
  for (const ExpectedCollective& e : want) {
    absl::StatusOr<AxisMask> mask = mesh.Mask(e.axes);
    if (!mask.ok()) {
      problems.push_back(absl::StrCat("expected ", e.op, " over ", absl::StrJoin(e.axes, ","),
                                      ": ", mask.status().message()));
      continue;
    }
    auto it = got.find({e.op, mesh.MaskToString(*mask)});
    std::vector<int64_t>* calls = it == got.end() ? nullptr : &it->second;
    int matched = 0;
    if (calls != nullptr) {
      for (auto b = calls->begin(); b != calls->end() && matched < e.count;) {
        if (!e.bytes || *b == *e.bytes) {
          b = calls->erase(b);
          ++matched;
        } else {
          ++b;
        }
      }
      if (calls->empty()) got.erase(it);
    }
    if (matched < e.count) {
      problems.push_back(absl::StrCat("missing ", e.count - matched, " of ", e.count, " ", e.op,
                                      "(", mesh.MaskToString(*mask), ")",
                                      e.bytes ? absl::StrCat(" of ", *e.bytes, " B") : ""));
    }
  }
  if (!got.empty()) problems.push_back(absl::StrCat("unexpected ", Describe(got)));
  if (problems.empty()) return "";
  return absl::StrCat(dir, ": want ", DescribeExpected(mesh, want), "; got ", got_text, " (",
                      absl::StrJoin(problems, "; "), ")");
}

}  // namespace

ExpectedCollective AllReduce(AxisNames axes, int count) { return Make("all_reduce", axes, count); }
ExpectedCollective AllGather(AxisNames axes, int count) { return Make("all_gather", axes, count); }
ExpectedCollective ReduceScatter(AxisNames axes, int count) {
  return Make("reduce_scatter", axes, count);
}
ExpectedCollective AllToAll(AxisNames axes, int count) { return Make("all_to_all", axes, count); }
ExpectedCollective Ppermute(AxisNames axes, int count) { return Make("ppermute", axes, count); }
ExpectedCollective Broadcast(AxisNames axes, int count) { return Make("broadcast", axes, count); }

::testing::AssertionResult CollectivesAre(const Mesh& mesh,
                                          const std::vector<CollectiveRecord>& log,
                                          const std::vector<ExpectedCollective>& forward,
                                          const std::vector<ExpectedCollective>& backward) {
  std::vector<std::string> problems;
  for (bool bwd : {false, true}) {
    std::string p = Match(mesh, log, bwd, bwd ? backward : forward);
    if (!p.empty()) problems.push_back(p);
  }
  if (problems.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << absl::StrJoin(problems, "\n");
}

void ExpectCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log,
                       const std::vector<ExpectedCollective>& forward,
                       const std::vector<ExpectedCollective>& backward,
                       std::source_location where) {
  ::testing::AssertionResult r = CollectivesAre(mesh, log, forward, backward);
  if (!r) ADD_FAILURE_AT(where.file_name(), where.line()) << r.message();
}

std::string DescribeCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log,
                                bool backward) {
  return Describe(Group(mesh, log, backward));
}

}  // namespace shardmap::spmd_testing
