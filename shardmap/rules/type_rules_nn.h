// The nn ops' type rules: normalisations over a dim (softmax, norms, cross_entropy's classes),
// embedding, take_along_last and cross_entropy.
//
//   EmbeddingRule({tp:S0} table, {tp:R} ids, 2, true, &vocab, no)   // {tp:P}, vocab = tp
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_NN_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_NN_H_

#include <optional>
#include <string>

#include "absl/types/span.h"
#include "shardmap/mesh.h"
#include "shardmap/spmd_type.h"
#include "shardmap/rules/type_rules_base.h"

namespace shardmap {

// A normalisation over dim d (softmax, norms, cross_entropy's classes) rejects an S(d) axis.
std::optional<Rejection> CheckDimNotSharded(const SpmdType& x, int d, const char* fix);

// embedding(table [rows, hidden], ids of rank ids_rank): a vocab-parallel table (S0) with R/I ids
// gives P (its axes are set in *vocab); S1 gives S(ids_rank); R/I tables take the ids' type. P
// operands are rejected even unchecked (checked=false skips the other checks).
SpmdType EmbeddingRule(const SpmdType& table, const SpmdType& ids, int ids_rank, bool checked,
                       AxisMask* vocab, std::optional<Rejection>& no);

// take_along_last(x of rank x_rank, idx): as EmbeddingRule, for x sharded along its last dim.
SpmdType TakeAlongLastRule(const SpmdType& x, int x_rank, const SpmdType& idx, bool checked,
                           AxisMask* vocab, std::optional<Rejection>& no);

// cross_entropy(logits, targets): logits as NonlinearRule, and the targets distributed like
// the logits' rows (R targets go with R, I or P-free logits).
SpmdType CrossEntropyRule(const SpmdType& logits, const SpmdType& targets,
                          absl::Span<const std::string> axis_names, std::optional<Rejection>& no);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_NN_H_
