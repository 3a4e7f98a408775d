#include "shardmap/rules/type_rules_nn.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "shardmap/internal/type_rule_cases.h"
#include "shardmap/rules/type_rules_elementwise.h"

namespace shardmap {

using internal::Rejected;

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
        // The types cannot tell a vocab-parallel table from an FSDP-sharded one used without
        // its gather (both S0); the ids' axis says which is likelier, and the fix names both.
        return Rejected(
            no, i,
            "the table's rows are sharded (S0) but the ids vary: each device would look its "
            "ids up in its slice of the table only",
            "if the table is FSDP-sharded over this axis (parameters stored in shards and "
            "gathered before use), all_gather(table, 0, axis) before the lookup; if it is "
            "vocab-parallel, all_gather the ids over that axis first (each device must look up "
            "the same ids in its shard)");
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

}  // namespace shardmap
