#include "models/parallel/layers.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "autograd/checkpoint.h"
#include "models/parallel/ring_attention.h"
#include "shardmap/attention_ops.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/einsum.h"
#include "shardmap/ops/loss_ops.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"

namespace shardmap {

void NoteType(TypeTrace* types, const std::string& name, const Value& v) {
  if (types == nullptr) return;
  RankContext* ctx = RankContext::Current();
  if (ctx != nullptr && ctx->rank() != 0) return;
  types->emplace_back(name, v.ToString());
}

Value EnterTensorParallel(const Value& x, const TensorParallel& tp) {
  return tp.on() && tp.sp ? all_gather(x, 0, tp.axis) : x;
}

Value LeaveTensorParallel(const Value& yp, const TensorParallel& tp) {
  if (!tp.on()) return yp;
  return tp.sp ? reduce_scatter(yp, 0, tp.axis) : all_reduce(yp, tp.axis);
}

Value ColumnParallelLinear::operator()(const Value& x) const {
  return EnterTensorParallel(x, tp).matmul(weight) + bias;
}

Value RowParallelLinear::operator()(const Value& x) const {
  return LeaveTensorParallel(x.matmul(weight), tp) + bias;
}

Value LayerNorm::operator()(const Value& x) const { return layer_norm(x, weight, bias, eps); }

Value VocabParallelEmbedding::operator()(const Value& ids) const {
  return LeaveTensorParallel(embedding(weight, ids), tp);
}

Value VocabParallelCrossEntropy(const Value& logits, const Value& targets,
                                const TensorParallel& tp) {
  if (!tp.on()) return cross_entropy(logits, targets);
  return vocab_parallel_cross_entropy(logits, targets, tp.axis);
}

Value Mlp::operator()(const Value& x) const {
  Value h = c_fc(x);
  NoteType(types, "mlp: h = c_fc(x)  (column-parallel)", h);
  Value y = c_proj(gelu(h, GeluApprox::kTanh));
  NoteType(types, "mlp: y = c_proj(gelu(h))  (row-parallel, reduced)", y);
  return y;
}

AttentionPath ResolveAttentionPath(AttentionPath path, const Device& device, int64_t head_dim) {
  if (path != AttentionPath::kAuto) return path;
  static const AttentionPath env = [] {
    const char* e = std::getenv("SHARDMAP_ATTENTION");
    if (e == nullptr || *e == 0) return AttentionPath::kAuto;
    if (std::strcmp(e, "fused") == 0) return AttentionPath::kFused;
    if (std::strcmp(e, "materialised") == 0) return AttentionPath::kMaterialised;
    OpFail("SHARDMAP_ATTENTION=", e, ": expected fused or materialised");
  }();
  if (env != AttentionPath::kAuto) return env;
  // The CUDA kernel takes head_dim up to 128; larger heads keep the materialised path.
  return device.is_cuda() && head_dim <= 128 ? AttentionPath::kFused
                                             : AttentionPath::kMaterialised;
}

namespace {

// softmax(q k^T * scale, causal) v of q, k, v [b, t, 1, heads, hd] (slices of qkv), materialised
// (or round the cp ring): o [b * t, heads * hd].
Value AttentionCore(const Value& q_in, const Value& k, const Value& v, int64_t seq,
                    int64_t head_dim, const std::string& cp_axis, TypeTrace* types) {
  const int64_t b = q_in.dim(0), heads = q_in.dim(3), rows = b * seq, e = heads * head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (!cp_axis.empty()) {
    const Shape bthd = {b, seq, heads, head_dim};
    Value o = RingCausalAttention(q_in.reshape(bthd), k.reshape(bthd), v.reshape(bthd), cp_axis,
                                  scale);
    NoteType(types, "attn: o = RingCausalAttention(q, k, v) over cp", o);
    return o.reshape({rows, e});
  }
  // Scaling q ([n, e]) instead of the scores ([b, h, t, t]) is the same product, t/hd x cheaper.
  Value q = q_in * scale;
  Value p = causal_softmax(einsum("btchd,bschd->bhts", q, k));
  NoteType(types, "attn: p = softmax(einsum(\"btchd,bschd->bhts\", q, k))", p);
  Value o = einsum("bhts,bschd->bthd", p, v).reshape({rows, e});           // S1 on tp
  NoteType(types, "attn: o = einsum(\"bhts,bschd->bthd\", p, v)", o);
  return o;
}

}  // namespace

Value CausalSelfAttention::operator()(const Value& x) const {
  Value h = EnterTensorParallel(x, tp);
  NoteType(types, "attn: input rows (after all_gather under SP)", h);
  const int64_t rows = h.dim(0), e = c_attn_weight.dim(2), heads = e / head_dim;
  Value qkv = einsum("nd,dce->nce", h, c_attn_weight) + c_attn_bias;        // [n, 3, e]
  qkv = qkv.reshape({rows / seq, seq, 3, heads, head_dim});                 // [b, t, 3, h, hd]
  NoteType(types, "attn: qkv [b,t,3,heads,hd]", qkv);
  Value q = slice(qkv, 2, 0, 1), k = slice(qkv, 2, 1, 1), v = slice(qkv, 2, 2, 1);
  if (cp_axis.empty() &&
      ResolveAttentionPath(path, h.tensor.device(), head_dim) == AttentionPath::kFused) {
    const Shape bthd = {rows / seq, seq, heads, head_dim};
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    Value o = causal_attention(q.reshape(bthd), k.reshape(bthd), v.reshape(bthd), scale);
    NoteType(types, "attn: o = causal_attention(q, k, v)  (fused)", o);
    Value y = c_proj(o.reshape({rows, e}));
    NoteType(types, "attn: y = c_proj(o)  (row-parallel, reduced)", y);
    return y;
  }
  Value o;
  if (recompute_core) {
    // The trace notes once, in the forward (not again when the backward recomputes).
    o = checkpoint(
        [seq = seq, head_dim = head_dim, cp = cp_axis, types = types](
            const std::vector<Value>& in) {
          return AttentionCore(in[0], in[1], in[2], seq, head_dim, cp,
                               IsRecomputing() ? nullptr : types);
        },
        {q, k, v}, "recompute_attention");
  } else {
    o = AttentionCore(q, k, v, seq, head_dim, cp_axis, types);
  }
  Value y = c_proj(o);
  if (cp_axis.empty()) NoteType(types, "attn: y = c_proj(o)  (row-parallel, reduced)", y);
  return y;
}

Value Block::operator()(const Value& x) const {
  NoteType(types, "block input x", x);
  CausalSelfAttention a = attn;
  Mlp m = mlp;
  a.types = m.types = types;
  Value y = x + a(ln_1(x));
  NoteType(types, "x + attn(ln_1(x))", y);
  Value out = y + m(ln_2(y));
  NoteType(types, "block output", out);
  return out;
}

}  // namespace shardmap
