#include "shardmap/type_rules_contraction.h"

#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "shardmap/internal/type_rule_cases.h"
#include "shardmap/type_rules_elementwise.h"

namespace shardmap {

using internal::InvariantCase;
using internal::JoinedShape;
using internal::NameOf;
using internal::PartialProductCase;
using internal::Rejected;

namespace {

// The letter an operand shards on an axis: 0 when it does not (R), '?' when its layout is
// unknown (V).
char ShardedLetter(AxisType t, std::string_view letters) {
  if (t.kind != AxisKind::kV) return 0;
  return t.dim >= 0 && t.dim < static_cast<int>(letters.size()) ? letters[t.dim] : '?';
}

bool Contracted(char s, std::string_view out) {
  return s != 0 && s != '?' && out.find(s) == std::string_view::npos;
}

}  // namespace

SpmdType ContractionRule(const SpmdType& a, std::string_view la, const SpmdType& b,
                         std::string_view lb, std::string_view out,
                         absl::Span<const std::string> axis_names, std::optional<Rejection>& no) {
  SpmdType t = JoinedShape(a, b);
  for (int i = 0; i < t.num_axes(); ++i) {
    const AxisType x = a[i], y = b[i];
    const AxisKind kx = x.kind, ky = y.kind;
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
    const char sa = ShardedLetter(x, la), sb = ShardedLetter(y, lb);
    const bool ca = Contracted(sa, out), cb = Contracted(sb, out);
    if (ca != cb) {
      // One operand's contracted letter is sharded over this axis. If the other shards that
      // letter over an axis this one does not, the local blocks pair rows and columns of
      // different slices: no collective after the contraction can repair that (reinterpreting
      // the result as a sum would hide it). An axis that shards the letter in both (dp in dp x tp
      // sequence parallelism, where one operand's tp layout is unknown) pairs matching blocks.
      const SpmdType& self = ca ? a : b;
      const SpmdType& other = ca ? b : a;
      const std::string_view lself = ca ? la : lb, lother = ca ? lb : la;
      const char s = ca ? sa : sb;
      for (int j = 0; j < t.num_axes(); ++j) {
        if (j == i || ShardedLetter(other[j], lother) != s) continue;
        if (ShardedLetter(self[j], lself) == s) continue;
        return Rejected(
            no, i,
            absl::StrCat("contracts ", ca ? "a" : "b", "'s dim sharded over '",
                         NameOf(axis_names, i), "' with ", ca ? "b" : "a",
                         "'s dim sharded over '", NameOf(axis_names, j),
                         "': each device would pair slices that do not match"),
            absl::StrCat("shard both contracted dims over the same axis (e.g. both over '",
                         NameOf(axis_names, i),
                         "': a row-parallel matmul, whose result is a partial sum), or "
                         "all_gather one operand first; check the in_specs"));
      }
    }
    if (ca && cb) {
      t[i] = sa == sb ? AxisType::P() : AxisType::V();  // row-parallel: P
      continue;
    }
    if (ca || cb) {
      t[i] = AxisType::V();
      continue;
    }
    // The output dim each operand's shard lands on: -2 none (R), -1 unknown.
    auto role = [&](char s) -> int {
      if (s == 0) return -2;
      if (s == '?') return -1;
      return static_cast<int>(out.find(s));
    };
    const int ra = role(sa), rb = role(sb);
    if (ra == -2) {
      t[i] = rb >= 0 ? AxisType::Sharded(rb) : AxisType::V();
    } else if (rb == -2) {
      t[i] = ra >= 0 ? AxisType::Sharded(ra) : AxisType::V();
    } else {
      t[i] = ra >= 0 && ra == rb ? AxisType::Sharded(ra) : AxisType::V();
    }
  }
  return t;
}

namespace internal {

MatmulLetters MatmulAsContraction(int a_rank, int b_rank, bool ta, bool tb) {
  // Batch letters from "abcdefghij" (never m, k or n).
  MatmulLetters l;
  const std::string batch = std::string("abcdefghij").substr(0, a_rank - 2);
  l.a = batch + (ta ? "km" : "mk");
  l.b = (b_rank > 2 ? batch.substr(0, b_rank - 2) : std::string()) + (tb ? "nk" : "kn");
  l.out = batch + "mn";
  return l;
}

SpmdType MatmulRuleFull(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank, bool ta,
                        bool tb, absl::Span<const std::string> axis_names,
                        std::optional<Rejection>& no) {
  if (a_rank < 2 || b_rank < 2 || a_rank > 12 || b_rank > a_rank) {
    return ErasedJoin(a, b);  // not a matmul: the kernel reports the ranks
  }
  const MatmulLetters l = MatmulAsContraction(a_rank, b_rank, ta, tb);
  return ContractionRule(a, l.a, b, l.b, l.out, axis_names, no);
}

}  // namespace internal

}  // namespace shardmap
