#include "shardmap/type_rules.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/substitute.h"

namespace shardmap {
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
     kAllToAllWrongDim, "pass concat_dim=$1 matching the dim x is sharded along", K::kSharded, "all_to_all", true,
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

bool InMask(AxisMask mask, int i) { return (mask & (1u << i)) != 0; }

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

const char* KindName(AxisKind k) {
  switch (k) {
    case AxisKind::kR: return "R";
    case AxisKind::kI: return "I";
    case AxisKind::kV: return "V";
    case AxisKind::kP: return "P";
  }
  return "?";
}

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

// ---------------------------------------------------------------------------------------------
// The typed ops' rules.

namespace {

std::string NameOf(absl::Span<const std::string> names, int axis) {
  return axis < static_cast<int>(names.size()) ? names[axis] : absl::StrCat("a", axis);
}

const char* KindWord(AxisKind k) {
  switch (k) {
    case AxisKind::kR: return "replicated (R)";
    case AxisKind::kI: return "invariant (I)";
    case AxisKind::kV: return "varying (V)";
    case AxisKind::kP: return "partial (P)";
  }
  return "?";
}

SpmdType Rejected(std::optional<Rejection>& no, int axis, std::string rule, std::string fix) {
  no = Rejection{axis, std::move(rule), std::move(fix)};
  return SpmdType();
}

SpmdType JoinedShape(const SpmdType& a, const SpmdType& b) {
  SpmdType t(a.num_axes());
  t.set_mesh_id(a.mesh_id() != 0 ? a.mesh_id() : b.mesh_id());
  return t;
}

constexpr const char* kIMeetsOther =
    "an invariant (I) value mixes with nothing else, but here it meets a ";
constexpr const char* kIFix = "convert the I operand with convert(x, axis, I->R) first";

// The cases products (mul, div, matmul) and sums share: an invariant (I) meets only I. Returns
// whether it decided axis i (t[i] set, or `no`).
[[gnu::noinline]] bool InvariantCaseSlow(AxisKind kx, AxisKind ky, int i, SpmdType& t,
                                         std::optional<Rejection>& no) {
  if (kx != ky) {
    no = Rejection{i, absl::StrCat(kIMeetsOther, KindWord(kx == AxisKind::kI ? ky : kx), " value"),
                   kIFix};
  } else {
    t[i] = AxisType::I();
  }
  return true;
}

// A product with a partial sum (P) operand: P*R = P; P*P and P*V are rejected (p_times_v_fix).
// Returns whether it decided axis i.
[[gnu::noinline]] bool PartialProductCaseSlow(AxisKind kx, AxisKind ky, int i,
                                              const char* p_times_v_fix, SpmdType& t,
                                              std::optional<Rejection>& no) {
  if (kx == AxisKind::kP && ky == AxisKind::kP) {
    no = Rejection{
        i, "multiplies two partial sums (P*P): (sum_i a_i)(sum_j b_j) is not sum_i a_i b_i",
        "all_reduce one operand first"};
  } else if (kx == AxisKind::kV || ky == AxisKind::kV) {
    no = Rejection{i, "multiplies a partial sum (P) by a varying (V) value", p_times_v_fix};
  } else {
    t[i] = AxisType::P();
  }
  return true;
}

// The fast tests inline (the rules run on every typed op); the cases out of line.
inline bool InvariantCase(AxisKind kx, AxisKind ky, int i, SpmdType& t,
                          std::optional<Rejection>& no) {
  if (kx != AxisKind::kI && ky != AxisKind::kI) return false;
  return InvariantCaseSlow(kx, ky, i, t, no);
}
inline bool PartialProductCase(AxisKind kx, AxisKind ky, int i, const char* p_times_v_fix,
                               SpmdType& t, std::optional<Rejection>& no) {
  if (kx != AxisKind::kP && ky != AxisKind::kP) return false;
  return PartialProductCaseSlow(kx, ky, i, p_times_v_fix, t, no);
}

}  // namespace

int ReshapeDim(absl::Span<const int64_t> in, absl::Span<const int64_t> out, int d) {
  if (d < 0 || d >= static_cast<int>(in.size())) return -1;
  // Products of local dims: bounded by numel unless a dim is 0; on overflow there is no block.
  int64_t before = 1;
  for (int k = 0; k < d; ++k) {
    if (__builtin_mul_overflow(before, in[k], &before)) return -1;
  }
  int64_t p = 1;
  for (int e = 0; e < static_cast<int>(out.size()); ++e) {
    if (p == before) return e;
    if (__builtin_mul_overflow(p, out[e], &p) || (p > before && before != 0)) return -1;
  }
  return -1;
}

bool SameShardBlocks(absl::Span<const int64_t> shape, int d, int e) {
  const int r = static_cast<int>(shape.size());
  if (d < 0 || e < 0 || d >= r || e >= r) return false;
  for (int k = std::min(d, e); k < std::max(d, e); ++k) {
    if (shape[k] != 1) return false;
  }
  return true;
}

SpmdType ReshapeRule(const SpmdType& x, absl::Span<const int64_t> in,
                     absl::Span<const int64_t> out) {
  SpmdType t = x;
  for (int i = 0; i < t.num_axes(); ++i) {
    if (t[i].is_sharded()) {
      const int e = ReshapeDim(in, out, t[i].dim);
      t[i] = e >= 0 ? AxisType::Sharded(e) : AxisType::V();
    }
  }
  return t;
}

int BroadcastDim(absl::Span<const int64_t> in, int d, absl::Span<const int64_t> out) {
  if (d < 0) return -1;
  int off = static_cast<int>(out.size()) - static_cast<int>(in.size());
  if (in[d] == 1 && out[d + off] != 1) return -1;
  return d + off;
}

SpmdType internal::ElementwiseRuleFull(const char* op, const SpmdType& a,
                                       absl::Span<const int64_t> a_shape, const SpmdType& b,
                                       absl::Span<const int64_t> b_shape,
                                       absl::Span<const int64_t> out, bool multilinear,
                                       bool divide, std::optional<Rejection>& no) {
  SpmdType t = JoinedShape(a, b);
  for (int i = 0; i < t.num_axes(); ++i) {
    AxisType x = a[i], y = b[i];
    AxisKind kx = x.kind, ky = y.kind;
    if (InvariantCase(kx, ky, i, t, no)) {
      if (no) return SpmdType();
      continue;
    }
    if (divide && ky == AxisKind::kP) {
      return Rejected(no, i,
                      "the divisor is a partial sum (P); division is nonlinear in the divisor",
                      "all_reduce the divisor first");
    }
    if (kx == AxisKind::kP || ky == AxisKind::kP) {
      if (!multilinear) {
        if (kx != ky) {
          // Only an R operand added to a P one is the classic bias bug; a V one, or a
          // subtraction (say a forgotten all_reduce before `y - target`), is named as such.
          const AxisKind other = kx == AxisKind::kP ? ky : kx;
          const bool bias = std::string(op) == "add" && other == AxisKind::kR;
          const char* p_name = kx == AxisKind::kP ? "a" : "b";
          return Rejected(
              no, i,
              absl::StrCat("combines operand ", p_name, ", a partial sum (P), with a ",
                           KindWord(other),
                           " value: the sum over devices would count the non-P operand once "
                           "per device",
                           bias ? " (the 'bias added before the all-reduce' bug)" : ""),
              absl::StrCat("all_reduce (or reduce_scatter) operand ", p_name,
                           " first: it is still a pending sum, e.g. a row-parallel matmul's "
                           "output",
                           bias ? ", or add the bias after the reduction" : ""));
        }
        t[i] = AxisType::P();
        continue;
      }
      PartialProductCase(kx, ky, i, "all_reduce the P operand first", t, no);
      if (no) return SpmdType();
      continue;
    }
    if (kx == AxisKind::kR && ky == AxisKind::kR) {
      t[i] = AxisType::R();
      continue;
    }
    // At least one V, the other V or R (promoted).
    int dx = kx == AxisKind::kV ? BroadcastDim(a_shape, x.dim, out) : -2;
    int dy = ky == AxisKind::kV ? BroadcastDim(b_shape, y.dim, out) : -2;
    int d;
    if (dx == -2) {
      d = dy;
    } else if (dy == -2) {
      d = dx;
    } else {
      d = dx == dy ? dx : -1;
    }
    t[i] = d >= 0 ? AxisType::Sharded(d) : AxisType::V();
  }
  return t;
}

SpmdType NonlinearRule(const char* op, const SpmdType& x, absl::Span<const std::string> axis_names,
                       std::optional<Rejection>& no) {
  for (int i = 0; i < x.num_axes(); ++i) {
    if (x[i].kind == AxisKind::kP) {
      return Rejected(no, i,
                      absl::StrCat(op, " is nonlinear, so it cannot take a partial sum (P): "
                                       "f(sum x_i) != sum f(x_i)"),
                      absl::StrCat("all_reduce(x, \"", NameOf(axis_names, i),
                                   "\") (or reduce_scatter) before ", op));
    }
  }
  return x;
}

SpmdType internal::MatmulRuleFull(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank,
                                  bool ta, bool tb, absl::Span<const std::string> axis_names,
                                  std::optional<Rejection>& no) {
  const int a_contract = ta ? a_rank - 2 : a_rank - 1, a_free = ta ? a_rank - 1 : a_rank - 2;
  const int b_contract = tb ? b_rank - 1 : b_rank - 2, b_free = tb ? b_rank - 2 : b_rank - 1;
  const int out_rank = a_rank;
  const bool batched = b_rank > 2;
  SpmdType t = JoinedShape(a, b);
  for (int i = 0; i < t.num_axes(); ++i) {
    AxisType x = a[i], y = b[i];
    AxisKind kx = x.kind, ky = y.kind;
    if (InvariantCase(kx, ky, i, t, no)) {
      if (no) return SpmdType();
      continue;
    }
    if (PartialProductCase(
            kx, ky, i,
            "all_reduce the P operand first (or reduce_scatter it to S and keep both V)", t,
            no)) {
      if (no) return SpmdType();
      continue;
    }
    if (kx == AxisKind::kR && ky == AxisKind::kR) {
      t[i] = AxisType::R();
      continue;
    }
    // Map each operand's S dim to its role: an output dim, -3 contracting, -1 unknown.
    auto role_a = [&](int d) -> int {
      if (d < 0) return -1;
      if (d == a_contract) return -3;
      if (d == a_free) return out_rank - 2;
      return d;  // batch/leading dim
    };
    auto role_b = [&](int d) -> int {
      if (d < 0) return -1;
      if (d == b_contract) return -3;
      if (d == b_free) return out_rank - 1;
      return batched ? d : -1;
    };
    int ra = kx == AxisKind::kV ? role_a(x.dim) : -2;
    int rb = ky == AxisKind::kV ? role_b(y.dim) : -2;
    if ((ra == -3) != (rb == -3)) {
      // One operand's contracted dim is sharded over this axis. If the other's is sharded over
      // an axis this one's is not, the local blocks pair rows and columns of different slices:
      // no collective after the matmul can repair that (reinterpreting the result as a sum
      // would hide it). An axis that shards both contracted dims (dp in dp x tp sequence
      // parallelism, where one operand's tp layout is unknown) pairs matching blocks.
      const SpmdType& self = ra == -3 ? a : b;
      const SpmdType& other = ra == -3 ? b : a;
      const int self_contract = ra == -3 ? a_contract : b_contract;
      const int other_contract = ra == -3 ? b_contract : a_contract;
      for (int j = 0; j < t.num_axes(); ++j) {
        if (j == i || !other[j].is_sharded() || other[j].dim != other_contract) continue;
        if (self[j].is_sharded() && self[j].dim == self_contract) continue;
        return Rejected(
            no, i,
            absl::StrCat("contracts ", ra == -3 ? "a" : "b", "'s dim sharded over '",
                         NameOf(axis_names, i), "' with ", ra == -3 ? "b" : "a",
                         "'s dim sharded over '", NameOf(axis_names, j),
                         "': each device would pair slices that do not match"),
            absl::StrCat("shard both contracted dims over the same axis (e.g. both over '",
                         NameOf(axis_names, i),
                         "': a row-parallel matmul, whose result is a partial sum), or "
                         "all_gather one operand first; check the in_specs"));
      }
    }
    if (ra == -3 && rb == -3) {
      t[i] = AxisType::P();  // row-parallel: contracting a dim both operands shard
    } else if (ra == -3 || rb == -3) {
      t[i] = AxisType::V();
    } else if (ra == -2) {
      t[i] = rb >= 0 ? AxisType::Sharded(rb) : AxisType::V();
    } else if (rb == -2) {
      t[i] = ra >= 0 ? AxisType::Sharded(ra) : AxisType::V();
    } else {
      t[i] = (ra >= 0 && ra == rb) ? AxisType::Sharded(ra) : AxisType::V();
    }
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Reductions, the nn ops and the layout ops.

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

std::optional<Rejection> CheckDimNotSharded(const SpmdType& x, int d, const char* fix) {
  for (int i = 0; i < x.num_axes(); ++i) {
    if (x[i].is_sharded() && x[i].dim == d) {
      return Rejection{i,
                       absl::StrCat("normalises over dim ", d, ", which is sharded (S", d,
                                    "): each device would only see its shard"),
                       fix};
    }
  }
  return std::nullopt;
}

SpmdType EmbeddingRule(const SpmdType& table, const SpmdType& ids, int ids_rank, bool checked,
                       AxisMask* vocab, std::optional<Rejection>& no) {
  SpmdType t(table.num_axes());
  t.set_mesh_id(table.mesh_id());
  *vocab = 0;
  for (int i = 0; i < t.num_axes(); ++i) {
    const AxisType a = table[i], b = ids[i];
    if (a.kind == AxisKind::kP || b.kind == AxisKind::kP) {
      return Rejected(no, i, "the table or the ids are a partial sum (P)",
                      "all_reduce them first");
    }
    if (a.is_sharded() && a.dim == 0) {
      if (b.kind != AxisKind::kR && b.kind != AxisKind::kI && checked) {
        return Rejected(no, i,
                        "the table is vocab-parallel (S0) but the ids vary: each device must "
                        "look up the same ids in its shard",
                        "all_gather the ids over that axis first");
      }
      *vocab |= 1u << i;
      t[i] = AxisType::P();
    } else if (a.kind == AxisKind::kR || a.kind == AxisKind::kI) {
      if (a.kind == AxisKind::kI && b.kind != AxisKind::kI && checked) {
        return Rejected(no, i, "an invariant (I) table mixes with nothing else",
                        "convert(table, axis, I->R) first");
      }
      t[i] = a.kind == AxisKind::kI ? AxisType::I() : b;
    } else if (a.is_sharded() && a.dim == 1) {
      if (b.kind == AxisKind::kV && checked) {
        return Rejected(no, i, "a hidden-sharded table with varying ids",
                        "all_gather the ids first");
      }
      t[i] = AxisType::Sharded(ids_rank);
    } else {
      t[i] = AxisType::V();
    }
  }
  return t;
}

SpmdType TakeAlongLastRule(const SpmdType& x, int x_rank, const SpmdType& idx, bool checked,
                           AxisMask* vocab, std::optional<Rejection>& no) {
  const int last = x_rank - 1;
  SpmdType t(x.num_axes());
  t.set_mesh_id(x.mesh_id());
  *vocab = 0;
  for (int i = 0; i < t.num_axes(); ++i) {
    const AxisType a = x[i], b = idx[i];
    if (a.is_sharded() && a.dim == last) {
      if (checked && b.kind != AxisKind::kR && b.kind != AxisKind::kI) {
        return Rejected(no, i,
                        "x is sharded along its last dim (vocab-parallel) but the indices vary",
                        "all_gather the indices over that axis first");
      }
      *vocab |= 1u << i;
      t[i] = AxisType::P();
      continue;
    }
    if (checked && a.kind == AxisKind::kP) {
      return Rejected(no, i, "x is a partial sum (P)", "all_reduce x first");
    }
    if (a.kind == AxisKind::kI || b.kind == AxisKind::kI) {
      if (checked && a.kind != b.kind && b.kind != AxisKind::kR) {
        return Rejected(no, i, "an invariant (I) value mixes with nothing else",
                        "convert(x, axis, I->R) first");
      }
      t[i] = a.kind == AxisKind::kI ? AxisType::I() : AxisType::V();
    } else if (a.kind == AxisKind::kV || b.kind == AxisKind::kV) {
      const int da = a.kind == AxisKind::kV ? a.dim : -2, db = b.kind == AxisKind::kV ? b.dim : -2;
      const int dd = da == -2 ? db : (db == -2 ? da : (da == db ? da : -1));
      t[i] = dd >= 0 ? AxisType::Sharded(dd) : AxisType::V();
    } else {
      t[i] = AxisType::R();
    }
  }
  return t;
}

SpmdType CrossEntropyRule(const SpmdType& logits, const SpmdType& targets,
                          absl::Span<const std::string> axis_names,
                          std::optional<Rejection>& no) {
  SpmdType t = NonlinearRule("cross_entropy", logits, axis_names, no);
  if (no) return t;
  for (int i = 0; i < t.num_axes(); ++i) {
    const AxisType a = logits[i], b = targets[i];
    bool ok = a.kind == b.kind || (b.kind == AxisKind::kR && a.kind != AxisKind::kV);
    if (a.is_sharded() && b.is_sharded()) ok = a.dim == b.dim;
    if (!ok) {
      return Rejected(no, i, "logits and targets are distributed differently",
                      "shard the targets' rows like the logits' rows");
    }
  }
  return t;
}

SpmdType PermuteRule(const SpmdType& x, absl::Span<const int> perm, int rank) {
  SpmdType t = x;
  for (int i = 0; i < t.num_axes(); ++i) {
    if (!t[i].is_sharded()) continue;
    for (int k = 0; k < static_cast<int>(perm.size()); ++k) {
      const int p = perm[k] < 0 ? perm[k] + rank : perm[k];
      if (p == t[i].dim) {
        t[i] = AxisType::Sharded(k);
        break;
      }
    }
  }
  return t;
}

SpmdType SliceRule(const SpmdType& x, int dim) {
  SpmdType t = x;
  for (int i = 0; i < t.num_axes(); ++i) {
    if (t[i].is_sharded() && t[i].dim == dim) t[i] = AxisType::V();
  }
  return t;
}

SpmdType BroadcastRule(const SpmdType& x, absl::Span<const int64_t> in,
                       absl::Span<const int64_t> out) {
  SpmdType t = x;
  for (int i = 0; i < t.num_axes(); ++i) {
    if (t[i].is_sharded()) {
      const int d = BroadcastDim(in, t[i].dim, out);
      t[i] = d >= 0 ? AxisType::Sharded(d) : AxisType::V();
    }
  }
  return t;
}

}  // namespace shardmap
