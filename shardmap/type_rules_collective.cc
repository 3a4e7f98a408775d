#include "shardmap/type_rules_collective.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/substitute.h"
#include "shardmap/internal/type_rule_cases.h"

namespace shardmap {

using internal::InMask;

namespace {

constexpr const char* kAlreadySameDropAllReduce =
    "x is already the same on every device: drop the all_reduce";
constexpr const char* kConvertDirections =
    "convert supports I->R and R->P; use reinterpret for V->P and the collectives "
    "(all_reduce, all_gather) for the other directions";
constexpr const char* kAllToAllTakes = "takes shards of the concat dim (S$0 or V)";
constexpr const char* kAllToAllWrongDim =
    "takes shards of the concat dim (S$0 or V), but x is S$1";
constexpr const char* kAllToAllSizesFix =
    "resolve partial sums first; pass the dim x is sharded along as concat_dim";
constexpr const char* kResolvePartialFirst = "resolve the partial sum first (all_reduce)";
constexpr const char* kIToRFirst = "convert(x, axis, Convert::kIToR) first";

using K = CollectiveResultKind;
using C = Collective;

// Indexed by Collective; fix[] by AxisKind order R, I, V, P.
constexpr CollectiveRule kRules[] = {
    {"all_reduce(sum)",
     "takes a partial sum (P)",
     {"x is already the same on every device: drop the all_reduce (or "
      "convert(x, axis, Convert::kRToP) if a sum of n copies is really meant)",
      "x is already the same on every device: drop the all_reduce (or "
      "convert(x, axis, Convert::kRToP) if a sum of n copies is really meant)",
      "if each device's value is one addend of the sum you want (e.g. each device's share of a "
      "mean), say so with reinterpret(x, axis) (V->P); to average per-device values use "
      "ReduceKind::kMean. If x should already have been a partial sum, an earlier op mixed "
      "operands sharded over different axes: check the in_specs",
      nullptr},
     nullptr, nullptr, K::kRorI, "all_reduce", true,
     {C::kAllReduceSum, false, false}, {C::kConvertIToR, false, false}},
    {"all_reduce(mean/max/min)",
     "takes per-device values (V)",
     {kAlreadySameDropAllReduce, kAlreadySameDropAllReduce, nullptr,
      "use ReduceKind::kSum to resolve a partial sum"},
     nullptr, nullptr, K::kRorI, "all_reduce", true,
     {C::kAllReduceSum, false, false}, {C::kCount, false, false}},
    {"all_gather",
     "takes shards (S$0 or V)",
     {"x is already whole on every device: drop the all_gather",
      "x is already whole on every device: drop the all_gather", nullptr,
      "a partial sum is resolved with all_reduce, or with reduce_scatter(x, $0, axis) to get "
      "shards"},
     "gathers dim $0 but x is sharded along dim $1", "gather dim $1, or all_to_all to move the "
     "sharding", K::kGathered, "all_gather", true,
     {C::kReduceScatter, false, false}, {C::kCount, false, false}},
    {"reduce_scatter",
     "takes a partial sum (P)",
     {"to shard a replicated value, slice it locally with axis_index (its gradient is then P)",
      "to shard a replicated value, slice it locally with axis_index (its gradient is then P)",
      "reinterpret(x, axis) (V->P) first if the per-device values are addends of one sum",
      nullptr},
     nullptr, nullptr, K::kScattered, "reduce_scatter", true,
     {C::kAllGather, false, false}, {C::kCount, false, false}},
    {"all_to_all",
     kAllToAllTakes,
     {"pass concat_dim=$0 matching the dim x is sharded along",
      "pass concat_dim=$0 matching the dim x is sharded along", nullptr,
      "resolve the partial sum first (all_reduce or reduce_scatter)"},
     kAllToAllWrongDim, "pass concat_dim=$1 matching the dim x is sharded along", K::kSharded,
     "all_to_all", true,
     {C::kAllToAll, false, false}, {C::kCount, false, false}},
    {"all_to_all",
     kAllToAllTakes,
     {kAllToAllSizesFix, kAllToAllSizesFix, nullptr, kAllToAllSizesFix},
     kAllToAllWrongDim, kAllToAllSizesFix, K::kSharded, "all_to_all", true,
     {C::kAllToAllSizes, false, false}, {C::kCount, false, false}},
    {"ppermute",
     "takes R or V values",
     {nullptr, kIToRFirst, nullptr, kResolvePartialFirst},
     nullptr, nullptr, K::kV, "ppermute", true,
     {C::kPpermute, false, false}, {C::kCount, false, false}},
    {"broadcast",
     "takes R or V values",
     {nullptr, "x is already the same everywhere: drop the broadcast", nullptr,
      "resolve the partial sum with all_reduce instead"},
     nullptr, nullptr, K::kR, "broadcast", true,
     {C::kAllReduceSum, false, true}, {C::kCount, false, false}},
    {"convert(I->R)",
     "takes I",
     {kConvertDirections, nullptr, kConvertDirections, kConvertDirections},
     nullptr, nullptr, K::kR, "convert", false,
     {C::kAllReduceSum, true, false}, {C::kCount, false, false}},
    {"convert(R->P)",
     "takes R",
     {nullptr, kConvertDirections, kConvertDirections, kConvertDirections},
     nullptr, nullptr, K::kP, "convert", false,
     {C::kConvertRToP, false, false}, {C::kCount, false, false}},
    {"reinterpret(V->P)",
     "takes V",
     {"use convert(x, axis, Convert::kRToP) for a replicated value (it keeps one copy, not n)",
      "only per-device values can be reinterpreted as addends of a sum", nullptr,
      "only per-device values can be reinterpreted as addends of a sum"},
     nullptr, nullptr, K::kP, "reinterpret", false,
     {C::kCount, false, false}, {C::kCount, false, false}},
    {"vary(R->V)",
     "takes R",
     {nullptr, kIToRFirst, nullptr, kResolvePartialFirst},
     nullptr, nullptr, K::kKeepV, "vary", false,
     {C::kCount, false, false}, {C::kCount, false, false}},
};
static_assert(sizeof(kRules) / sizeof(kRules[0]) == static_cast<size_t>(Collective::kCount),
              "one rule per Collective");


// After gathering or scattering the axes of mask along dim, another axis that shards dim keeps
// S only when every axis of mask is more minor than it.
void FixOtherShards(SpmdType& t, AxisMask mask, int dim) {
  for (int j = 0; j < t.num_axes(); ++j) {
    if (InMask(mask, j) || !t[j].is_sharded() || t[j].dim != dim) continue;
    for (int i = 0; i < j; ++i) {
      if (InMask(mask, i)) t[j] = AxisType::V();
    }
  }
}

}  // namespace

const CollectiveRule& CollectiveRuleFor(Collective c) { return kRules[static_cast<int>(c)]; }

std::optional<Rejection> CheckCollective(const CollectiveRule& r, const SpmdType& x,
                                         AxisMask mask, int dim) {
  for (int i = 0; i < x.num_axes(); ++i) {
    if (!InMask(mask, i)) continue;
    const AxisType a = x[i];
    const int x_dim = a.is_sharded() ? a.dim : dim;
    const char* fix = r.fix[static_cast<int>(a.kind)];
    if (fix != nullptr) {
      return Rejection{i,
                       absl::StrCat(absl::Substitute(r.takes, dim, x_dim), ", but x is ",
                                    KindName(a.kind)),
                       absl::Substitute(fix, dim, x_dim)};
    }
    if (r.wrong_dim_rule != nullptr && a.is_sharded() && a.dim != dim) {
      return Rejection{i, absl::Substitute(r.wrong_dim_rule, dim, x_dim),
                       absl::Substitute(r.wrong_dim_fix, dim, x_dim)};
    }
  }
  return std::nullopt;
}

SpmdType CollectiveResult(const CollectiveRule& r, const SpmdType& x, AxisMask mask, int dim,
                          bool invariant) {
  SpmdType t = x;
  if (r.result == K::kGathered || r.result == K::kScattered) FixOtherShards(t, mask, dim);
  for (int i = 0; i < t.num_axes(); ++i) {
    if (!InMask(mask, i)) continue;
    switch (r.result) {
      case K::kRorI:
      case K::kGathered: t[i] = invariant ? AxisType::I() : AxisType::R(); break;
      case K::kScattered:
      case K::kSharded: t[i] = AxisType::Sharded(dim); break;
      case K::kR: t[i] = AxisType::R(); break;
      case K::kP: t[i] = AxisType::P(); break;
      case K::kV: t[i] = AxisType::V(); break;
      case K::kKeepV:
        if (t[i].kind != AxisKind::kV) t[i] = AxisType::V();
        break;
    }
  }
  return t;
}

SpmdType CotangentType(const SpmdType& derived, const SpmdType& primal) {
  SpmdType t = derived;
  for (int i = 0; i < t.num_axes() && i < primal.num_axes(); ++i) {
    const AxisKind p = primal[i].kind, d = t[i].kind;
    if (p == AxisKind::kR && d == AxisKind::kV) {
      t[i] = AxisType::P();
    } else if (p == AxisKind::kV && d != AxisKind::kP && !t[i].is_sharded()) {
      t[i] = primal[i];
    }
  }
  return t;
}

SpmdType CollectiveCotangentType(Collective c, const SpmdType& x, AxisMask mask, int check_dim,
                                 int result_dim, bool invariant) {
  const CollectiveRule& r = CollectiveRuleFor(c);
  const CollectiveTranspose& tr = invariant ? r.transpose_invariant : r.transpose;
  SpmdType g = Dual(CollectiveResult(r, x, mask, result_dim, invariant));
  if (tr.op != Collective::kCount) {
    g = CollectiveResult(CollectiveRuleFor(tr.op), g, mask, check_dim, tr.invariant);
  }
  if (tr.keeps_root) {
    for (int i = 0; i < g.num_axes(); ++i) {
      if (InMask(mask, i) && x[i].kind == AxisKind::kR) g[i] = AxisType::P();
    }
  }
  return CotangentType(g, x);
}

}  // namespace shardmap
