// GPT-2's KV-cache decoding (the Decode* hooks of models/model/model.h): the training block's
// pieces on rows that are whole on every device (tp splits the heads; no SP, no ring attention).
#include "absl/strings/str_cat.h"
#include "models/gpt/gpt_model.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

// Decoding rows are whole on every device: tensor parallelism without its sequence split.
TensorParallel NoSp(TensorParallel tp) {
  tp.sp = false;
  return tp;
}

}  // namespace

absl::Status GptLayout::KvCacheSupport() const {
  if (cfg_.moe.on()) {
    return absl::UnimplementedError(
        "a mixture-of-experts GPT decodes without a KV cache: its expert capacity is set per "
        "sequence of seq tokens, so one token at a time would route differently");
  }
  return absl::OkStatus();
}

Value GptLayout::DecodeEmbed(const ParamFn& use, const Value& ids, int64_t position) const {
  const int64_t n = ids.dim(0);
  if (position < 0 || position + n > cfg_.seq) {
    OpFail("GPT DecodeEmbed: positions [", position, ", ", position + n, ") outside the ",
           cfg_.seq, " positions wpe embeds");
  }
  std::vector<int64_t> pos(n);
  for (int64_t r = 0; r < n; ++r) pos[r] = position + r;
  const Value positions = Value::Replicated(
      Tensor::FromVector<int64_t>({n}, pos).To(ids.tensor.device()));
  return VocabParallelEmbedding{use("wte.weight"), NoSp(tp_)}(ids) +
         embedding(use("wpe.weight"), positions);
}

Value GptLayout::DecodeBlock(const ParamFn& use, int64_t i, const Value& x,
                             KvCache& cache) const {
  const TensorParallel tp = NoSp(tp_);
  const std::string h = absl::StrCat("h.", i, ".");
  const int64_t hd = cfg_.head_dim();
  Value a = EnterTensorParallel(LayerNorm{use(h + "ln_1.weight"), use(h + "ln_1.bias")}(x), tp);
  const Value w = use(h + "attn.c_attn.weight");  // [d, 3, e] (e: this device's heads * hd)
  const Value bias = use(h + "attn.c_attn.bias");  // [3, e]
  const int64_t d = w.dim(0), e = w.dim(2);
  // q, k, v [n, e] each (the training block's qkv einsum, one third at a time), then heads.
  auto project = [&](int64_t part) {
    return DecodeSplitHeads(matmul(a, slice(w, 1, part, 1).reshape({d, e})) +
                                slice(bias, 0, part, 1).reshape({e}),
                            hd);
  };
  Value q = project(0), k = project(1), v = project(2);
  const auto [kc, vc] = cache.Append(i, k, v);
  Value y = x + RowParallelLinear{use(h + "attn.c_proj.weight"), use(h + "attn.c_proj.bias"),
                                  tp}(CachedAttention(q, kc, vc));
  Mlp mlp{ColumnParallelLinear{use(h + "mlp.c_fc.weight"), use(h + "mlp.c_fc.bias"), tp},
          RowParallelLinear{use(h + "mlp.c_proj.weight"), use(h + "mlp.c_proj.bias"), tp}};
  return y + mlp(LayerNorm{use(h + "ln_2.weight"), use(h + "ln_2.bias")}(y));
}

Value GptLayout::DecodeLogits(const ParamFn& use, const Value& x) const {
  Value h = EnterTensorParallel(LayerNorm{use("ln_f.weight"), use("ln_f.bias")}(x), NoSp(tp_));
  return einsum("nd,vd->nv", h, use("wte.weight"));  // tied lm_head: S1 on tp
}

}  // namespace shardmap
