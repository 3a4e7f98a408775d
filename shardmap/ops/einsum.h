// A typed einsum over Values: the result's SPMD type follows from the index letters.
//
//   // q, k: [b, t, h, d] with heads split over tp (S2 on tp), batch split over dp (S0 on dp)
//   Value s = einsum("bthd,bshd->bhts", q, k);   // {dp:S0, tp:S1}: b and h keep their shards
//   Value o = einsum("bhts,bshd->bthd", p, v);   // {dp:S0, tp:S2}
//   Value y = einsum("ti,io->to", a, w);         // a S1 and w S0 on tp: i is contracted -> P
//   Value t = einsum("ij->ji", x);               // one operand: permute (and sums, below)
//
// Spec: one or two operands, an explicit "->" output, one letter per dim, no letter repeated
// inside one operand or the output (no diagonals). A letter of one operand that appears neither
// in the other operand nor in the output is summed first (sum_partial: P where it is sharded).
//
// Type rule: the one contraction rule matmul shares (type_rules_contraction.h; matmul is
// "...mk,kn->...mn"), per mesh axis (checked when the context's TypeCheck is kOn):
//   * I only with I; P only with R (P*R = P); P*P and P*V are errors.
//   * The sharded letter stays S on the axis in the output when the output keeps it; a letter
//     contracted (in both operands, not in the output) that both shard gives P.
//   * A contracted letter sharded in one operand only, operands that shard different letters and
//     a V of unknown layout give V (each device's product of its blocks). On a real mesh a letter
//     sharded in one operand and whole in the other has different local sizes: the error names
//     the letter, both operands and the fix (shard it the same way in both).
//   * A contracted letter sharded over one axis in a and another in b is an error (the devices
//     would pair slices that do not match).
// Its VJP is einsums: d a = einsum("<out>,<b>-><a>", g, b), d b = einsum("<out>,<a>-><b>", g, a).
// Shape errors (letter sizes that differ, wrong letter counts) name the spec and the letter.
#ifndef SHARDMAP_SHARDMAP_OPS_EINSUM_H_
#define SHARDMAP_SHARDMAP_OPS_EINSUM_H_

#include <cstdint>
#include <map>
#include <string>

#include "shardmap/value.h"

namespace shardmap {

Value einsum(const std::string& spec, const Value& a);
Value einsum(const std::string& spec, const Value& a, const Value& b);

namespace internal {

// How a two-operand einsum goes onto one batched GEMM [batch, m, k] x [batch, k, n]: the letter
// groups in the chosen orders, whether each operand goes in transposed (ta, tb), whether the
// output comes as (ab)^T (swap), and the elements permute copies move (0: none). Exposed so
// tests can check which contractions need no copy.
struct EinsumGemmPlan {
  std::string batch, m, n, k;
  bool ta = false, tb = false, swap = false;
  int64_t copied = 0;
};
EinsumGemmPlan PlanEinsumGemm(const std::string& la, const std::string& lb,
                              const std::string& out, const std::map<char, int64_t>& size);

}  // namespace internal

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_EINSUM_H_
