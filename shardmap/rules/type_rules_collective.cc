#include "shardmap/rules/type_rules_collective.h"

#include <iterator>
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

using T = TransposeLocal;

// One constant per Collective, each naming its key; kRules below lists them in the enum's
// order (checked there). fix[] by AxisKind order R, I, V, P.
constexpr CollectiveRule kAllReduceSumRule = {
    .op = C::kAllReduceSum,
    .name = "all_reduce(sum)",
    .takes = "takes a partial sum (P)",
    .fix = {"x is already the same on every device: drop the all_reduce (or "
            "convert(x, axis, Convert::kRToP) if a sum of n copies is really meant)",
            "x is already the same on every device: drop the all_reduce (or "
            "convert(x, axis, Convert::kRToP) if a sum of n copies is really meant)",
            "if each device's value is one addend of the sum you want (e.g. each device's "
            "share of a mean), say so with reinterpret(x, axis) (V->P); to average per-device "
            "values use ReduceKind::kMean. If x should already have been a partial sum, an "
            "earlier op mixed operands sharded over different axes: check the in_specs",
            nullptr},
    .result = K::kRorI,
    .api = "all_reduce",
    .communicates = true,
    .transpose = {.op = C::kAllReduceSum},
    .transpose_invariant = {.op = C::kConvertIToR},
};

constexpr CollectiveRule kAllReduceMeanMaxMinRule = {
    .op = C::kAllReduceMeanMaxMin,
    .name = "all_reduce(mean/max/min)",
    .takes = "takes per-device values (V)",
    .fix = {kAlreadySameDropAllReduce, kAlreadySameDropAllReduce, nullptr,
            "use ReduceKind::kSum to resolve a partial sum"},
    .result = K::kRorI,
    .api = "all_reduce",
    .communicates = true,
    .transpose = {.op = C::kAllReduceSum, .then = T::kSpread},
    .transpose_invariant = {.then = T::kSpread},
};

constexpr CollectiveRule kAllGatherRule = {
    .op = C::kAllGather,
    .name = "all_gather",
    .takes = "takes shards (S$0 or V)",
    .fix = {"x is already whole on every device: drop the all_gather",
            "x is already whole on every device: drop the all_gather", nullptr,
            "a partial sum is resolved with all_reduce, or with reduce_scatter(x, $0, axis) to "
            "get shards"},
    .wrong_dim_rule = "gathers dim $0 but x is sharded along dim $1",
    .wrong_dim_fix = "gather dim $1, or all_to_all to move the sharding",
    .result = K::kGathered,
    .api = "all_gather",
    .communicates = true,
    .transpose = {.op = C::kReduceScatter},
    .transpose_invariant = {.then = T::kLocalChunk},
};

constexpr CollectiveRule kReduceScatterRule = {
    .op = C::kReduceScatter,
    .name = "reduce_scatter",
    .takes = "takes a partial sum (P)",
    .fix = {"to shard a replicated value, slice it locally with axis_index (its gradient is "
            "then P)",
            "to shard a replicated value, slice it locally with axis_index (its gradient is "
            "then P)",
            "reinterpret(x, axis) (V->P) first if the per-device values are addends of one sum. "
            "If x should already have been a partial sum, an earlier op mixed operands "
            "sharded over different axes: check the in_specs",
            nullptr},
    .result = K::kScattered,
    .api = "reduce_scatter",
    .communicates = true,
    .transpose = {.op = C::kAllGather},
};

constexpr CollectiveRule kAllToAllRule = {
    .op = C::kAllToAll,
    .name = "all_to_all",
    .takes = kAllToAllTakes,
    .fix = {"pass concat_dim=$0 matching the dim x is sharded along",
            "pass concat_dim=$0 matching the dim x is sharded along", nullptr,
            "resolve the partial sum first (all_reduce or reduce_scatter)"},
    .wrong_dim_rule = kAllToAllWrongDim,
    .wrong_dim_fix = "pass concat_dim=$1 matching the dim x is sharded along",
    .result = K::kSharded,
    .api = "all_to_all",
    .communicates = true,
    .transpose = {.op = C::kAllToAll},
};

constexpr CollectiveRule kAllToAllSizesRule = {
    .op = C::kAllToAllSizes,
    .name = "all_to_all",
    .takes = kAllToAllTakes,
    .fix = {kAllToAllSizesFix, kAllToAllSizesFix, nullptr, kAllToAllSizesFix},
    .wrong_dim_rule = kAllToAllWrongDim,
    .wrong_dim_fix = kAllToAllSizesFix,
    .result = K::kSharded,
    .api = "all_to_all",
    .communicates = true,
    .transpose = {.op = C::kAllToAllSizes},
};

constexpr CollectiveRule kPpermuteRule = {
    .op = C::kPpermute,
    .name = "ppermute",
    .takes = "takes R or V values",
    .fix = {nullptr, kIToRFirst, nullptr, kResolvePartialFirst},
    .result = K::kV,
    .api = "ppermute",
    .communicates = true,
    .transpose = {.op = C::kPpermute},
};

constexpr CollectiveRule kBroadcastRule = {
    .op = C::kBroadcast,
    .name = "broadcast",
    .takes = "takes R or V values",
    .fix = {nullptr, "x is already the same everywhere: drop the broadcast", nullptr,
            "resolve the partial sum with all_reduce instead"},
    .result = K::kR,
    .api = "broadcast",
    .communicates = true,
    .transpose = {.op = C::kAllReduceSum, .then = T::kKeepOnRoot},
};

constexpr CollectiveRule kConvertIToRRule = {
    .op = C::kConvertIToR,
    .name = "convert(I->R)",
    .takes = "takes I",
    .fix = {kConvertDirections, nullptr, kConvertDirections, kConvertDirections},
    .result = K::kR,
    .api = "convert",
    .communicates = false,
    .transpose = {.op = C::kAllReduceSum, .invariant = true},
};

constexpr CollectiveRule kConvertRToPRule = {
    .op = C::kConvertRToP,
    .name = "convert(R->P)",
    .takes = "takes R",
    .fix = {nullptr, kConvertDirections, kConvertDirections, kConvertDirections},
    .result = K::kP,
    .api = "convert",
    .communicates = false,
    .transpose = {.op = C::kConvertRToP},
};

constexpr CollectiveRule kReinterpretRule = {
    .op = C::kReinterpret,
    .name = "reinterpret(V->P)",
    .takes = "takes V",
    .fix = {"use convert(x, axis, Convert::kRToP) for a replicated value (it keeps one copy, "
            "not n)",
            "only per-device values can be reinterpreted as addends of a sum", nullptr,
            "only per-device values can be reinterpreted as addends of a sum"},
    .result = K::kP,
    .api = "reinterpret",
    .communicates = false,
    .transpose = {},
};

constexpr CollectiveRule kVaryRule = {
    .op = C::kVary,
    .name = "vary(R->V)",
    .takes = "takes R",
    .fix = {nullptr, kIToRFirst, nullptr, kResolvePartialFirst},
    .result = K::kKeepV,
    .api = "vary",
    .communicates = false,
    .transpose = {},
};

constexpr CollectiveRule kRules[] = {
    kAllReduceSumRule,
    kAllReduceMeanMaxMinRule,
    kAllGatherRule,
    kReduceScatterRule,
    kAllToAllRule,
    kAllToAllSizesRule,
    kPpermuteRule,
    kBroadcastRule,
    kConvertIToRRule,
    kConvertRToPRule,
    kReinterpretRule,
    kVaryRule,
};

// Row i is Collective i: a row added, dropped or moved out of place fails to compile.
constexpr bool EveryCollectiveHasItsRow() {
  if (std::size(kRules) != static_cast<size_t>(C::kCount)) return false;
  for (size_t i = 0; i < std::size(kRules); ++i) {
    if (kRules[i].op != static_cast<C>(i)) return false;
  }
  return true;
}
static_assert(EveryCollectiveHasItsRow(),
              "kRules: one row per Collective, in the enum's order, each naming its key");

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

const CollectiveTranspose& TransposeOf(Collective c, bool invariant) {
  const CollectiveRule& r = CollectiveRuleFor(c);
  return invariant ? r.transpose_invariant : r.transpose;
}

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
  const CollectiveTranspose& tr = TransposeOf(c, invariant);
  SpmdType g = Dual(CollectiveResult(r, x, mask, result_dim, invariant));
  if (tr.op != Collective::kCount) {
    g = CollectiveResult(CollectiveRuleFor(tr.op), g, mask, check_dim, tr.invariant);
  }
  if (tr.then == TransposeLocal::kKeepOnRoot) {
    for (int i = 0; i < g.num_axes(); ++i) {
      if (InMask(mask, i) && x[i].kind == AxisKind::kR) g[i] = AxisType::P();
    }
  }
  return CotangentType(g, x);
}

}  // namespace shardmap
