// Llama 3's KV-cache decoding (the Decode* hooks of models/model/model.h): the training block's
// pieces on rows that are whole on every device (tp splits q heads and kv heads; no SP, no ring
// attention), rotary positions continuing from the cached length, the cache holding kv heads.
#include "absl/strings/str_cat.h"
#include "models/llama/llama_model.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

TensorParallel NoSp(TensorParallel tp) {
  tp.sp = false;
  return tp;
}

Value Linear(const Value& x, const Value& w) { return matmul(x, w, false, true); }

}  // namespace

Value LlamaLayout::DecodeEmbed(const ParamFn& use, const Value& ids, int64_t position) const {
  if (position < 0 || position + ids.dim(0) > cfg_.seq) {
    OpFail("llama3 DecodeEmbed: positions [", position, ", ", position + ids.dim(0),
           ") outside the model's seq ", cfg_.seq);
  }
  return VocabParallelEmbedding{use("model.embed_tokens.weight"), NoSp(tp_)}(ids);
}

Value LlamaLayout::DecodeBlock(const ParamFn& use, int64_t i, const Value& x,
                               KvCache& cache) const {
  const TensorParallel tp = NoSp(tp_);
  const std::string l = absl::StrCat("model.layers.", i, ".");
  const int64_t hd = cfg_.head_dim();
  Value h = EnterTensorParallel(rms_norm(x, use(l + "input_layernorm.weight"), cfg_.norm_eps),
                                tp);
  const int64_t n = h.dim(0);
  Value q = Linear(h, use(l + "self_attn.q_proj.weight"));
  Value k = Linear(h, use(l + "self_attn.k_proj.weight"));
  Value v = Linear(h, use(l + "self_attn.v_proj.weight"));
  std::vector<int64_t> positions(n);
  for (int64_t r = 0; r < n; ++r) positions[r] = cache.length() + r;
  const RopeTables t = MakeRopeTables(positions, hd, cfg_.rope_theta, h.dtype());
  const Device device = h.tensor.device();
  const Value cos = Value::Replicated(t.cos.To(device)), sin = Value::Replicated(t.sin.To(device));
  q = ApplyRope(DecodeSplitHeads(q, hd), cos, sin);
  k = ApplyRope(DecodeSplitHeads(k, hd), cos, sin);
  const auto [kc, vc] = cache.Append(i, k, DecodeSplitHeads(v, hd));  // kv heads, not heads
  Value y = x + LeaveTensorParallel(
                    Linear(CachedAttention(q, kc, vc), use(l + "self_attn.o_proj.weight")), tp);
  Value m = EnterTensorParallel(
      rms_norm(y, use(l + "post_attention_layernorm.weight"), cfg_.norm_eps), tp);
  Value gate = Linear(m, use(l + "mlp.gate_proj.weight"));
  Value up = Linear(m, use(l + "mlp.up_proj.weight"));
  return y + LeaveTensorParallel(Linear(silu(gate) * up, use(l + "mlp.down_proj.weight")), tp);
}

Value LlamaLayout::DecodeLogits(const ParamFn& use, const Value& x) const {
  Value h = EnterTensorParallel(rms_norm(x, use("model.norm.weight"), cfg_.norm_eps), NoSp(tp_));
  return Linear(h, use("lm_head.weight"));  // [n, vocab] S1 on tp
}

}  // namespace shardmap
