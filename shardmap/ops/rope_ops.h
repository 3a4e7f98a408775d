// Typed rotary position embedding (Hugging Face's apply_rotary_pos_emb) as one op with its VJP:
//
//   // x [n, heads, hd] (rows, heads S1 on tp, say); cos, sin [n, 1, hd] constants typed as the
//   // rows (both halves equal, as HF builds them from cat(freqs, freqs))
//   Value y = rope(x, cos, sin);   // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
//
// One pass over x instead of the slices, concat, negation, two products and a sum of the
// composed form. The rotation is linear in x: its type is x's joined with cos's as a product
// (a P x stays P); head_dim (the last dim) must be whole. The VJP is the inverse rotation,
// rope(g, cos, -sin) (each pair (i, i + hd/2) rotates by an angle; its transpose by minus it).
// cos and sin get no gradient. f32 and f64 on the CPU run the fused loop; other dtypes and
// devices the composed ops (same numbers up to rounding).
#ifndef SHARDMAP_SHARDMAP_OPS_ROPE_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_ROPE_OPS_H_

#include "shardmap/value.h"

namespace shardmap {

// Throws OpError on bad shapes (x not [n, heads, hd] with hd even; cos/sin not [n, 1, hd]).
Value rope(const Value& x, const Value& cos, const Value& sin);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_ROPE_OPS_H_
