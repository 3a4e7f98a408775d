#include "shardmap/rules/type_rules_contraction.h"

#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "shardmap/internal/type_rule_cases.h"
#include "shardmap/rules/type_rules_elementwise.h"

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

std::string DimWord(AxisType t, std::string_view letters) {
  if (t.kind == AxisKind::kR) return "is replicated";
  return absl::StrCat("dim ", static_cast<int>(t.dim), " ('", std::string(1, letters[t.dim]),
                      "') is sharded");
}

// The rejection of a contraction whose operands are sharded over axis i on dims that do not
// match (different letters; or a contracted letter sharded in one operand only, the other
// replicated there). contracted: 'a' or 'b' when that operand's contracted dim is the sharded
// one, 0 when both shard free dims.
SpmdType MismatchedShards(AxisType x, std::string_view la, AxisType y, std::string_view lb,
                          char contracted, int i, absl::Span<const std::string> axis_names,
                          std::optional<Rejection>& no) {
  const std::string axis = NameOf(axis_names, i);
  if (x.kind == AxisKind::kR || y.kind == AxisKind::kR) {
    // One operand's contracted dim is sharded, the other's whole: the classic missing gather
    // (or a weight whose in_spec forgot the axis).
    const bool a_sharded = x.kind != AxisKind::kR;
    const AxisType s = a_sharded ? x : y;
    const std::string_view ls = a_sharded ? la : lb, lw = a_sharded ? lb : la;
    const char letter = ls[s.dim];
    const int whole_dim = static_cast<int>(lw.find(letter));
    const char* sharded = a_sharded ? "a" : "b";
    const char* whole = a_sharded ? "b" : "a";
    return internal::Rejected(
        no, i,
        absl::StrCat(sharded, "'s contracted dim ", static_cast<int>(s.dim), " ('",
                     std::string(1, letter), "') is sharded over '", axis, "' but ", whole,
                     "'s dim ", whole_dim, " is whole (R): each device would contract its "
                     "slice against the whole dim"),
        absl::StrCat("shard ", whole, "'s dim ", whole_dim, " over '", axis,
                     "' too (its in_spec; a row-parallel matmul then gives a partial sum), or "
                     "all_gather(", sharded, ", ", static_cast<int>(s.dim), ", \"", axis,
                     "\") first"));
  }
  std::string rule = absl::StrCat("a's ", DimWord(x, la), " and b's ", DimWord(y, lb),
                                  " over '", axis, "'");
  if (contracted != 0) {
    absl::StrAppend(&rule, "; ", std::string(1, contracted),
                    "'s sharded dim is contracted, so each device would sum over its slice "
                    "against a slice of another dim");
  } else {
    absl::StrAppend(&rule, ": each device would multiply its slice of one by its slice of the "
                           "other");
  }
  absl::StrAppend(&rule, ", a block whose layout is unknown (V) and that no collective repairs");
  std::string fix = absl::StrCat(
      "all_gather one operand over '", axis,
      "' first (sequence parallelism: the activations, along the sequence dim, before a "
      "column-parallel matmul; FSDP: the weight), or shard both contracted dims over '", axis,
      "' (row-parallel, a partial sum); a grouped reshape (GQA) must keep the sharded heads "
      "dim outermost ([kv, rep], not [rep, kv]). If per-device blocks are what the program "
      "means (ring attention, MoE dispatch), say so with as_varying(x, \"", axis,
      "\") on one operand");
  return internal::Rejected(no, i, rule, fix);
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
    // Both operands carry a known layout on this axis (S, or R with a contracted S) that does
    // not combine into a shard or a partial sum: rejected on any mesh size (docs/design.md 4.2,
    // "contractions of mismatched shards"). An operand of unknown layout (V: as_varying's opt-in,
    // or a V an earlier op made) gives V, whose origin the op records.
    if ((ca && cb && sa != sb) || (ca != cb && sa != '?' && sb != '?')) {
      return MismatchedShards(x, la, y, lb, ca ? 'a' : 'b', i, axis_names, no);
    }
    if (ca && cb) {
      t[i] = AxisType::P();  // row-parallel
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
    } else if (ra >= 0 && rb >= 0 && ra != rb) {
      return MismatchedShards(x, la, y, lb, 0, i, axis_names, no);
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
