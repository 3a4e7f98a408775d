// Typed routing ops for mixture-of-experts layers, with VJPs (kernels in tensor/ops/routing.h).
//
//   TopKValues t = top_k(probs, 2);               // probs f32[n,e]{dp:S0}: values f32[n,2]{dp:S0},
//                                             // indices i64[n,2]{dp:S0} (no gradient)
//   Value b  = gather_rows(x, slots);         // b[i] = x[slots[i]] (0 where slots[i] = -1)
//   Value y  = scatter_add_rows(b, slots, n); // y[slots[i]] += b[i]; the transpose of gather_rows
//
// Rules (per axis):
//   top_k: a nonlinear op over the last dim: P is an error, the last dim must be whole (not
//     S(last)); values and indices keep x's type. Its VJP scatters the values' cotangent to the
//     picked entries.
//   gather_rows / scatter_add_rows: linear in x, indexed by per-device integer rows. x P with
//     R/I rows stays P (a pending sum gathered row by row is still a pending sum); x P with
//     varying rows is an error (each device would pick other rows of its addend). R/I x with R/I
//     rows keeps x's kind; anything varying (V, or S(d) on any dim: the rows are local
//     positions, so no global dim survives) gives V. I mixes only with I or R rows. Rows P is an
//     error. Each VJP is the other op, typed as the dual of x (a V cotangent of an R x becomes P:
//     the sum over devices is the gradient).
#ifndef SHARDMAP_SHARDMAP_OPS_ROUTING_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_ROUTING_OPS_H_

#include <cstdint>

#include "shardmap/value.h"

namespace shardmap {

struct TopKValues {
  Value values;   // x's dtype, last dim k, differentiable
  Value indices;  // i64, same shape, not differentiated
};
TopKValues top_k(const Value& x, int64_t k);

// x [rows..., d] (leading dims flattened), rows i32/i64 [m] -> [m, d].
Value gather_rows(const Value& x, const Value& rows);
// x [m..., d] with m rows, rows [m] -> [n, d].
Value scatter_add_rows(const Value& x, const Value& rows, int64_t n);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_ROUTING_OPS_H_
