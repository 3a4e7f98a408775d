#include "shardmap/rules/type_rules_layout.h"

#include <algorithm>

namespace shardmap {

int ReshapeDim(absl::Span<const int64_t> in, absl::Span<const int64_t> out, int d) {
  if (d < 0 || d >= static_cast<int>(in.size())) return -1;
  // Products of local dims: bounded by numel unless a dim is 0; on overflow there is no block.
  // d0: the first input dim with as many elements before it as d (only size-1 dims between).
  int64_t before = 1;
  int d0 = 0;
  for (int k = 0; k < d; ++k) {
    if (__builtin_mul_overflow(before, in[k], &before)) return -1;
    if (in[k] != 1) d0 = k + 1;
  }
  // The output dims with `before` elements before them: first..last (size-1 dims between).
  int64_t p = 1;
  int first = -1, last = -1;
  for (int e = 0; e < static_cast<int>(out.size()); ++e) {
    if (p == before) {
      if (first < 0) first = e;
      last = e;
    }
    if (__builtin_mul_overflow(p, out[e], &p) || (p > before && before != 0)) break;
  }
  if (first < 0) return -1;
  const int before_d = d - d0;  // size-1 dims before d in its block
  if (in[d] != 1) {
    // They keep their count: [1, h*hd] S1 -> [1, h, hd] is S1 (the heads), not S0 (the row).
    return std::min(first + before_d, last);
  }
  // d is itself a size-1 dim (one head per device): it stays a size-1 dim, the same one
  // counting from the first, or the last one left ([b,t,1,1,hd] S3 -> [b,t,1,hd] is S2).
  const int ones = last - first + (out[last] == 1 ? 1 : 0);
  return ones == 0 ? last : first + std::min(before_d, ones - 1);
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
