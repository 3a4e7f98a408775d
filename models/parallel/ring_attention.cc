#include "models/parallel/ring_attention.h"

#include <cstring>
#include <utility>
#include <vector>

#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

// The chunk (of 2cp) at load-balanced slot `slot` (0 or 1) of device `index`.
int64_t ChunkOf(int cp, int index, int slot) { return slot == 0 ? index : 2 * cp - 1 - index; }

void CheckChunks(const char* what, int64_t seq, int cp) {
  if (cp < 1 || seq % (2 * static_cast<int64_t>(cp)) != 0) {
    OpFail(what, ": seq ", seq, " is not divisible by 2*cp = ", 2 * static_cast<int64_t>(cp),
           " (context parallelism cuts each sequence into 2*cp chunks)");
  }
}

// The einsums of one head layout: q [b, q, h, hd] against k, v [b, k, h, hd] (one kv head per
// query head), or grouped q [b, q, g, r, hd] against k, v [b, k, g, hd] (kv head g serves its
// r query heads: no repeated copies of k and v). key_dim: the scores' key dim.
struct HeadLayout {
  const char* scores;  // q, k -> scores
  const char* values;  // p, v -> unnormalised output
  int key_dim;
};
constexpr HeadLayout kOneKvPerHead = {"bqhd,bkhd->bhqk", "bhqk,bkhd->bhqd", 3};
constexpr HeadLayout kGroupedKv = {"bqgrd,bkgd->bgrqk", "bgrqk,bkgd->bgrqd", 4};

// Online-softmax state of one query chunk (flash attention): running row max m (a constant for
// the autograd), sum l and unnormalised output acc; scores [b, h, q, k] (grouped [b, g, r, q,
// k]), values [b, k, h, hd] (grouped [b, k, g, hd]).
class OnlineSoftmax {
 public:
  explicit OnlineSoftmax(const HeadLayout& layout) : layout_(layout) {}

  void Add(const Value& scores, const Value& v) {
    const int kd = layout_.key_dim;
    Value m_new;
    {
      NoGradScope constant;  // the shift cancels in acc / l: no gradient flows through it
      Value m_block = max(scores, {kd}, /*keepdim=*/true);
      m_new = m_.defined() ? max(concat({m_, m_block}, kd), {kd}, true) : m_block;
    }
    m_new = Value(m_new.tensor, m_new.type);
    Value p = exp(scores - m_new);
    Value l = sum(p, {kd}, /*keepdim=*/true);
    Value o = einsum(layout_.values, p, v);
    if (m_.defined()) {
      Value alpha;
      {
        NoGradScope constant;
        alpha = exp(m_ - m_new);
      }
      alpha = Value(alpha.tensor, alpha.type);
      l = l_ * alpha + l;
      o = acc_ * alpha + o;
    }
    m_ = m_new;
    l_ = l;
    acc_ = o;
  }
  Value Output() const { return acc_ / l_; }  // [b, h, q, hd] (grouped [b, g, r, q, hd])

 private:
  HeadLayout layout_;
  Value m_, l_, acc_;
};

}  // namespace

int64_t LoadBalancedPosition(int64_t local, int64_t seq, int cp, int index) {
  CheckChunks("LoadBalancedPosition", seq, cp);
  const int64_t c = seq / (2 * cp);
  if (local < 0 || local >= 2 * c || index < 0 || index >= cp) {
    OpFail("LoadBalancedPosition: token ", local, " of device ", index, " is outside [0, ", 2 * c,
           ") x [0, ", cp, ")");
  }
  return ChunkOf(cp, index, static_cast<int>(local / c)) * c + local % c;
}

Tensor LoadBalancedRows(const Tensor& tokens, int batch_ways, int cp) {
  if (tokens.rank() != 2) OpFail("LoadBalancedRows: tokens ", tokens.ShapeString(), " are not 2-D");
  const int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  CheckChunks("LoadBalancedRows", seq, cp);
  if (batch_ways < 1 || batch % batch_ways != 0) {
    OpFail("LoadBalancedRows: batch ", batch, " is not divisible by ", batch_ways, " ways");
  }
  const int64_t per_way = batch / batch_ways, local = seq / cp;
  const size_t elem = DTypeSize(tokens.dtype());
  // Meta tokens (a meta rank's batch) give meta rows: the same bytes, nothing to move.
  Tensor out = Tensor::Empty({batch * seq}, tokens.dtype(),
                             tokens.is_meta() ? Device::Meta() : Device::Cpu());
  if (tokens.is_meta()) return out;
  const char* src = static_cast<const char*>(tokens.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  int64_t row = 0;
  for (int64_t w = 0; w < batch_ways; ++w) {
    for (int i = 0; i < cp; ++i) {
      for (int64_t b = w * per_way; b < (w + 1) * per_way; ++b) {
        for (int64_t t = 0; t < local; ++t, ++row) {
          const int64_t from = b * seq + LoadBalancedPosition(t, seq, cp, i);
          std::memcpy(dst + row * elem, src + from * elem, elem);
        }
      }
    }
  }
  return out;
}

Tensor ToLoadBalancedOrder(const Tensor& x, int dim, int cp, bool inverse) {
  if (dim < 0 || dim >= x.rank()) {
    OpFail("ToLoadBalancedOrder: dim ", dim, " out of range for ", x.ShapeString());
  }
  const int64_t seq = x.dim(dim);
  CheckChunks("ToLoadBalancedOrder", seq, cp);
  int64_t outer = 1, inner = DTypeSize(x.dtype());
  for (int d = 0; d < dim; ++d) outer *= x.dim(d);
  for (int d = dim + 1; d < x.rank(); ++d) inner *= x.dim(d);
  const int64_t local = seq / cp;
  Tensor out = Tensor::Empty(x.shape(), x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int i = 0; i < cp; ++i) {
      for (int64_t t = 0; t < local; ++t) {
        int64_t slot = i * local + t, pos = LoadBalancedPosition(t, seq, cp, i);
        if (inverse) std::swap(slot, pos);
        std::memcpy(dst + (o * seq + slot) * inner, src + (o * seq + pos) * inner, inner);
      }
    }
  }
  return out;
}

Value RingCausalAttention(const Value& q, const Value& k, const Value& v, const std::string& axis,
                          double scale) {
  if (q.rank() != 4 || k.rank() != 4 || v.shape() != k.shape() || k.dim(0) != q.dim(0) ||
      k.dim(1) != q.dim(1) || k.dim(3) != q.dim(3) || k.dim(2) < 1 || q.dim(2) % k.dim(2) != 0) {
    OpFail("RingCausalAttention: q ", q.tensor.ShapeString(), ", k ", k.tensor.ShapeString(),
           " and v ", v.tensor.ShapeString(), " must be q [b, t, heads, hd] and k, v [b, t, ",
           "kv_heads, hd] with kv_heads dividing heads");
  }
  const int64_t b = q.dim(0), t = q.dim(1), h = q.dim(2), hd = q.dim(3), g = k.dim(2);
  if (t % 2 != 0) {
    OpFail("RingCausalAttention: each device holds 2 chunks of every sequence, but t = ", t,
           " is odd (seq must be divisible by 2*cp)");
  }
  const int64_t c = t / 2, rep = h / g;
  int n = 1, i = 0;
  if (!axis.empty()) {
    const Mesh& mesh = RankContext::Get("RingCausalAttention").mesh();
    const int a = mesh.AxisIndex(axis);
    if (a < 0) OpFail("RingCausalAttention: the mesh ", mesh.ShortString(), " has no axis '", axis, "'");
    n = mesh.axis_size(a);
    i = axis_index(axis);
  }
  std::vector<std::pair<int, int>> ring;
  for (int j = 0; j < n; ++j) ring.push_back({j, (j + 1) % n});
  // K and V travel as one tensor [b, t, kv_heads, 2, hd]: one ppermute per step, the kv heads
  // as they are (not repeated to the query heads). The new dim goes after the heads, so a
  // head-sharded dim keeps its S (ReshapeDim keeps the size-1 dims before a shard).
  Value kv = concat({k.reshape({b, t, g, 1, hd}), v.reshape({b, t, g, 1, hd})}, 3);
  // q comes pre-scaled: scaling [b, q, h, hd] once is cheaper than every [b, h, q, k] block.
  // With grouped kv heads q is [b, t, g, rep, hd]: query head g * rep + r reads kv head g.
  const HeadLayout& layout = rep == 1 ? kOneKvPerHead : kGroupedKv;
  const Value qs = rep == 1 ? q * scale : (q * scale).reshape({b, t, g, rep, hd});
  const Value q0 = slice(qs, 1, 0, c), q1 = slice(qs, 1, c, c);
  auto scores = [&](const Value& qc, const Value& kc) { return einsum(layout.scores, qc, kc); };
  OnlineSoftmax early(layout), late(layout);  // query chunks i and 2n-1-i
  for (int step = 0; step < n; ++step) {
    if (step > 0) kv = ppermute(kv, axis, ring);
    const int src = (i - step + n) % n;
    const Value ks = slice(kv, 3, 0, 1).reshape({b, t, g, hd});
    const Value vs = slice(kv, 3, 1, 1).reshape({b, t, g, hd});
    const Value k0 = slice(ks, 1, 0, c), v0 = slice(vs, 1, 0, c);
    if (step == 0) {
      early.Add(causal_mask(scores(q0, k0)), v0);
      late.Add(causal_mask(scores(q1, ks), /*offset=*/c), vs);
    } else if (src < i) {
      early.Add(scores(q0, k0), v0);
      late.Add(scores(q1, k0), v0);
    } else {
      late.Add(scores(q1, ks), vs);
    }
  }
  // [b, h, t, hd] (grouped: [b, g, rep, t, hd], the heads g-major as in q) -> [b, t, h, hd].
  // Grouped, the heads merge after t (t > 1): no size-1 dim precedes g in its block, so a
  // head-sharded g keeps its S also at b = 1 and one kv head per device.
  const Value o = concat({early.Output(), late.Output()}, layout.key_dim - 1);
  if (rep == 1) return permute(o, {0, 2, 1, 3});
  return permute(o, {0, 3, 1, 2, 4}).reshape({b, t, h, hd});
}

}  // namespace shardmap
