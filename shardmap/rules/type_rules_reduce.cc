#include "shardmap/rules/type_rules_reduce.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "shardmap/internal/type_rule_cases.h"
#include "shardmap/rules/type_rules_elementwise.h"

namespace shardmap {

using internal::Rejected;

namespace {

// The S dim of a kept (not reduced) dim after dims nd are dropped.
int DimAfterDropping(absl::Span<const int> nd, int d) {
  int shift = 0;
  for (int r : nd) shift += r < d ? 1 : 0;
  return d - shift;
}

bool Reduced(absl::Span<const int> nd, int d) {
  return std::binary_search(nd.begin(), nd.end(), d);
}

}  // namespace

SpmdType ReduceRule(const char* op, const SpmdType& x, int rank, absl::Span<const int> nd,
                    bool keepdim, bool partial, bool linear,
                    absl::Span<const std::string> axis_names, std::optional<Rejection>& no) {
  SpmdType t = x;
  const bool all_dims = static_cast<int>(nd.size()) == rank;
  for (int i = 0; i < t.num_axes(); ++i) {
    const AxisType a = x[i];
    if (!linear && a.kind == AxisKind::kP) return NonlinearRule(op, x, axis_names, no);
    // Summing every element of a V value of unknown layout: the local share of the total.
    if (partial && all_dims && a.kind == AxisKind::kV && !a.is_sharded()) {
      t[i] = AxisType::P();
      continue;
    }
    if (!a.is_sharded()) continue;
    if (Reduced(nd, a.dim)) {
      if (!partial) {
        return Rejected(
            no, i,
            absl::StrCat("reduces dim ", static_cast<int>(a.dim), ", which is sharded (S",
                         static_cast<int>(a.dim),
                         "): a plain reduction would silently ignore the other shards"),
            linear ? "call sum_partial(x, dims) to get the pending sum (P), then all_reduce "
                     "or reduce_scatter it; or all_gather x first"
                   : "all_gather x over that axis first");
      }
      t[i] = AxisType::P();
    } else if (!keepdim) {
      t[i] = AxisType::Sharded(DimAfterDropping(nd, a.dim));
    }
  }
  return t;
}

SpmdType MaxRule(const char* op, const SpmdType& x, absl::Span<const int> nd, bool keepdim,
                 bool local, absl::Span<const std::string> axis_names,
                 std::optional<Rejection>& no) {
  SpmdType t = NonlinearRule(op, x, axis_names, no);
  if (no) return t;
  for (int i = 0; i < t.num_axes(); ++i) {
    if (!t[i].is_sharded()) continue;
    if (Reduced(nd, t[i].dim)) {
      if (!local) {
        return Rejected(no, i,
                        absl::StrCat("reduces dim ", static_cast<int>(t[i].dim),
                                     ", which is sharded: the max of one shard is not the max"),
                        "use local_max(x, dims) and then all_reduce(m, axis, To::kR, "
                        "ReduceKind::kMax)");
      }
      t[i] = AxisType::V();
    } else if (!keepdim) {
      t[i] = AxisType::Sharded(DimAfterDropping(nd, t[i].dim));
    }
  }
  return t;
}

}  // namespace shardmap
