#include "shardmap/ops/attention_ops.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/ops/attention.h"

namespace shardmap {
namespace {

constexpr const char* kOp = "causal_attention";

// The q/k/v types must shard the batch and heads alike (rules/type_rules_attention.h).
void CheckShardedAlike(const Value& q, const Value& k, const Value& v) {
  if (std::optional<Rejection> no = AttentionShardedAlikeRule(q.type, k.type, v.type)) {
    internal::TypeFail(kOp, no->axis, no->rule, no->fix, {{"q", &q}, {"k", &k}, {"v", &v}});
  }
}

}  // namespace

Value causal_attention(const Value& q, const Value& k, const Value& v, double scale,
                       int64_t q_offset) {
  internal::CheckMesh(kOp, q);
  internal::CheckMesh(kOp, k);
  internal::CheckMesh(kOp, v);
  // The type rules index dims 1 and 3: other ranks fail in the kernel's shape checks below.
  const bool rank4 = q.rank() == 4 && k.rank() == 4 && v.rank() == 4;
  SpmdType t;
  if (RankContext::Get(kOp).checked() && rank4) {
    for (const Value* x : {&q, &k, &v}) {
      internal::NonlinearTypeOf(kOp, *x);
      internal::CheckDimNotSharded(
          kOp, *x, 1,
          "attention needs each device's whole sequences: all_gather the sequence dim first, or "
          "under context parallelism use RingCausalAttention (models/parallel/ring_attention.h) over the "
          "cp axis");
      internal::CheckDimNotSharded(kOp, *x, 3, "head_dim must be whole: all_gather it first");
    }
    CheckShardedAlike(q, k, v);
    // The join of R/I/V (and equal shardings): elementwise over equally shaped stand-ins.
    const Value qk = Value(q.tensor, internal::ElementwiseType(kOp, q, Value(q.tensor, k.type),
                                                                  q.shape(), false));
    t = internal::ElementwiseType(kOp, qk, Value(q.tensor, v.type), q.shape(), false);
  } else {
    t = internal::ErasedJoin(internal::ErasedJoin(q.type, k.type), v.type);
  }
  CausalAttentionResult r = CausalAttention(q.tensor, k.tensor, v.tensor, scale, q_offset);
  Value out(r.out, t);
  if (CurrentRecorder() != nullptr && (q.node >= 0 || k.node >= 0 || v.node >= 0)) {
    const Tensor qt = q.tensor, kt = k.tensor, vt = v.tensor, ot = r.out, lse = r.lse;
    const SpmdType qty = q.type, kty = k.type, vty = v.type, oty = t;
    internal::RecordOp(kOp, {&q, &k, &v}, out,
                       [=](const Value& g, uint32_t need, Value* d) {
                         CausalAttentionGrads gr = CausalAttentionBackward(
                             qt, kt, vt, ot, lse, g.tensor, scale, q_offset);
                         // Linear in g: the gradients take g's type joined with the output's.
                         const SpmdType gt = internal::ElementwiseType(
                             "causal_attention_backward", Value(ot, oty), g, g.shape(), true);
                         if (need & 1) d[0] = internal::AsCotangent(Value(gr.dq, gt), qty);
                         if (need & 2) d[1] = internal::AsCotangent(Value(gr.dk, gt), kty);
                         if (need & 4) d[2] = internal::AsCotangent(Value(gr.dv, gt), vty);
                       });
  }
  return out;
}

}  // namespace shardmap
