#include "models/gpt/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/model/recompute_block.h"
#include "models/parallel/ring_attention.h"
#include "shardmap/collective_ops.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Name, global shape (library layout), the dim split over tp (-1: none), GPT-2-layout rank;
// expert: dim 0 is the expert dim (split over the expert axes).
struct ParamShape {
  std::string name;
  Shape shape;
  int tp_dim;
  int gpt2_rank;
  bool expert = false;
};

std::vector<ParamShape> ParamShapes(const GptConfig& c) {
  const int64_t d = c.d_model;
  std::vector<ParamShape> v = {{"wte.weight", {c.vocab, d}, 0, 2},
                               {"wpe.weight", {c.seq, d}, -1, 2}};
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string h = absl::StrCat("h.", i, ".");
    v.push_back({h + "ln_1.weight", {d}, -1, 1});
    v.push_back({h + "ln_1.bias", {d}, -1, 1});
    v.push_back({h + "attn.c_attn.weight", {d, 3, d}, 2, 2});
    v.push_back({h + "attn.c_attn.bias", {3, d}, 1, 1});
    v.push_back({h + "attn.c_proj.weight", {d, d}, 0, 2});
    v.push_back({h + "attn.c_proj.bias", {d}, -1, 1});
    v.push_back({h + "ln_2.weight", {d}, -1, 1});
    v.push_back({h + "ln_2.bias", {d}, -1, 1});
    if (c.moe.on()) {
      const int64_t e = c.moe.experts;
      v.push_back({h + "mlp.router.weight", {d, e}, -1, 2});
      v.push_back({h + "mlp.experts.c_fc.weight", {e, d, 4 * d}, 2, 3, true});
      v.push_back({h + "mlp.experts.c_fc.bias", {e, 4 * d}, 1, 2, true});
      v.push_back({h + "mlp.experts.c_proj.weight", {e, 4 * d, d}, 1, 3, true});
      v.push_back({h + "mlp.experts.c_proj.bias", {e, d}, -1, 2, true});
      continue;
    }
    v.push_back({h + "mlp.c_fc.weight", {d, 4 * d}, 1, 2});
    v.push_back({h + "mlp.c_fc.bias", {4 * d}, 0, 1});
    v.push_back({h + "mlp.c_proj.weight", {4 * d, d}, 0, 2});
    v.push_back({h + "mlp.c_proj.bias", {d}, -1, 1});
  }
  v.push_back({"ln_f.weight", {d}, -1, 1});
  v.push_back({"ln_f.bias", {d}, -1, 1});
  return v;
}

// The forward unit that uses a parameter: wte, wpe the embedding; h.{i}. block i; ln_f the head.
ModelUnit UnitOf(const std::string& name) {
  if (name.rfind("h.", 0) == 0) {
    return {ModelUnit::kBlock, std::stoll(name.substr(2, name.find('.', 2) - 2))};
  }
  if (name.rfind("ln_f.", 0) == 0) return {ModelUnit::kHead, -1};
  return {ModelUnit::kEmbed, -1};
}

int AxisSize(const Mesh& mesh, const std::string& name) {
  int i = mesh.AxisIndex(name);
  return i < 0 ? 1 : mesh.axis_size(i);
}

// MoE checks and the expert axes: the named ones (default "ep" when the mesh has it), in mesh
// order, each a batch axis; an ep axis without experts is an error.
absl::Status ResolveExperts(const Mesh& mesh, const std::vector<std::string>& batch_axes,
                            MoeConfig* moe) {
  if (moe->experts < 0) return ValidateMoeConfig(*moe, 1);  // not a dense model: an error
  if (!moe->on()) {
    if (AxisSize(mesh, axis::kEp) > 1) {
      return Invalid(absl::StrCat("mesh ", mesh.ShortString(),
                                  " has an ep axis but the model has no experts: ep splits the "
                                  "experts of a MoE MLP; add --experts=N (a multiple of ep)"));
    }
    if (!moe->expert_axes.empty()) {
      return Invalid("expert axes given without experts; add --experts=N");
    }
    return absl::OkStatus();
  }
  std::vector<std::string> named = moe->expert_axes;
  if (named.empty() && mesh.AxisIndex(axis::kEp) >= 0) named = {axis::kEp};
  for (const std::string& a : named) {
    if (std::find(batch_axes.begin(), batch_axes.end(), a) == batch_axes.end()) {
      return Invalid(absl::StrCat(
          "expert axis '", a, "' is not a batch axis of mesh ", mesh.ShortString(),
          ": experts are split over axes that split the tokens (dp_replicate, dp_shard, dp, ep "
          "present in the mesh)"));
    }
    if (std::count(named.begin(), named.end(), a) > 1) {
      return Invalid(absl::StrCat("expert axis '", a, "' is given twice"));
    }
  }
  int64_t ways = 1;
  std::vector<std::string> ordered;
  for (const std::string& a : mesh.axis_names()) {
    if (std::find(named.begin(), named.end(), a) != named.end()) {
      ordered.push_back(a);
      ways *= AxisSize(mesh, a);
    }
  }
  moe->expert_axes = ordered;
  return ValidateMoeConfig(*moe, ways);
}

}  // namespace

absl::StatusOr<GptLayout> GptLayout::Create(const Mesh& mesh, const GptConfig& cfg, bool sp) {
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(mesh, sp);
  if (!dims.ok()) return dims.status();
  if (cfg.layers < 1 || cfg.d_model < 1 || cfg.heads < 1 || cfg.vocab < 1 || cfg.seq < 1) {
    return Invalid("GPT config: layers, d_model, heads, vocab and seq must be >= 1");
  }
  if (cfg.d_model % cfg.heads != 0) {
    return Invalid(absl::StrCat("GPT config: d_model ", cfg.d_model, " is not divisible by heads ",
                                cfg.heads));
  }
  GptLayout l;
  l.dims_ = *std::move(dims);
  l.cfg_ = cfg;
  const int tp = l.dims_.tp_ways();
  l.tp_.axis = l.dims_.tp_axis();
  l.tp_.sp = sp;
  if (cfg.heads % tp != 0) {
    return Invalid(absl::StrCat("heads ", cfg.heads, " are not divisible by tp=", tp,
                                ": attention heads are split over tp; pick tp dividing heads"));
  }
  if (cfg.vocab % tp != 0) {
    return Invalid(absl::StrCat("vocab ", cfg.vocab, " is not divisible by tp=", tp,
                                ": the embedding and lm_head are vocab-parallel; pad the vocab "
                                "to a multiple of tp"));
  }
  if (absl::Status s = ResolveExperts(mesh, l.batch_axes(), &l.cfg_.moe); !s.ok()) return s;
  const std::vector<std::string>& expert_axes = l.cfg_.moe.expert_axes;
  const std::string fsdp = l.fsdp_axis();
  const int cp = l.cp_ways();
  if (cfg.seq % (2 * cp) != 0) {
    return Invalid(absl::StrCat("seq ", cfg.seq, " is not divisible by 2*cp = ", 2 * cp,
                                ": context parallelism cuts each sequence into 2*cp chunks "
                                "(device i holds chunks i and 2cp-1-i); pick seq a multiple of ",
                                2 * cp, " or a smaller cp"));
  }
  if (cfg.moe.on() && cp > 1) {
    return Invalid(absl::StrCat("MoE with cp=", cp,
                                ": each sequence is one routing group, and context parallelism "
                                "splits sequences over devices; drop cp or --experts"));
  }
  const int shard = l.dims_.size(axis::kDpShard);
  for (const ParamShape& p : ParamShapes(cfg)) {
    ParamInfo info;
    info.name = p.name;
    info.global_shape = p.shape;
    info.decay = p.gpt2_rank >= 2;
    info.unit = UnitOf(p.name);
    info.tied_to_head = p.name == "wte.weight";  // the lm_head is wte (tied)
    std::vector<std::vector<std::string>> dims(p.shape.size());
    const int tp_dim = l.tp_.on() ? p.tp_dim : -1;
    if (tp_dim >= 0) dims[tp_dim] = {axis::kTp};
    const bool expert_split = p.expert && !expert_axes.empty();
    if (expert_split) dims[0] = expert_axes;
    const bool fsdp_free = std::find(dims[0].begin(), dims[0].end(), fsdp) == dims[0].end();
    if (!fsdp.empty() && fsdp_free) {
      // A dim dp_shard divides, else the first free one, padded (FSDP2's rule).
      std::vector<bool> free(p.shape.size());
      for (int d = 0; d < static_cast<int>(p.shape.size()); ++d) {
        free[d] = d != tp_dim && !(expert_split && d == 0);
      }
      ChooseFsdpDim(free, shard, &info);
      if (info.fsdp_dim >= 0) dims[info.fsdp_dim] = {fsdp};
    }
    info.spec = PartitionSpec(dims);
    if (absl::Status s = info.spec.Validate(mesh, StoredShape(info), p.name); !s.ok()) return s;
    l.params_.push_back(std::move(info));
  }
  const GptConfig& c = l.cfg_;
  l.shape_ = ModelShape{.layers = c.layers, .d_model = c.d_model, .heads = c.heads,
                        .kv_heads = c.heads, .vocab = c.vocab, .seq = c.seq,
                        .dtype = c.dtype, .compute = c.compute, .recompute = c.recompute,
                        .moe = c.moe};
  return l;
}

std::string GptLayout::Describe() const {
  return absl::StrCat("gpt2 ", cfg_.layers, " layers d ", cfg_.d_model, " heads ", cfg_.heads,
                      " vocab ", cfg_.vocab, " seq ", cfg_.seq);
}

std::vector<NamedTensor> GptLayout::Init(uint64_t seed) const { return InitGpt(cfg_, seed); }

Shape Gpt2Shape(const ParamInfo& p) {
  const Shape& s = p.global_shape;
  if (absl::EndsWith(p.name, "attn.c_attn.weight")) return {s[0], s[1] * s[2]};
  if (absl::EndsWith(p.name, "attn.c_attn.bias")) return {s[0] * s[1]};
  return s;
}

Shape GptLayout::CheckpointShape(const ParamInfo& p) const { return Gpt2Shape(p); }

double GptParameterCount(const GptConfig& c) {
  const double d = c.d_model, L = c.layers;
  // c_attn + attention c_proj (4d^2 + 4d), c_fc + mlp c_proj (8d^2 + 5d), two LayerNorms (4d).
  const double per_block_dense = 12 * d * d + 13 * d;
  double n = c.vocab * d + c.seq * d + 2 * d;
  if (c.moe.on()) {
    const double mlp = 8 * d * d + 5 * d;
    n += L * (per_block_dense - mlp + d * c.moe.experts + c.moe.experts * mlp);
  } else {
    n += L * per_block_dense;
  }
  return n;
}

double GptFlopsPerToken(const GptConfig& c) {
  const double d = c.d_model, L = c.layers;
  double n = GptParameterCount(c) - c.seq * d;  // wpe is a lookup, not a product
  if (c.moe.on()) {
    const double mlp = 8 * d * d + 5 * d;
    n -= L * c.moe.experts * mlp * (1.0 - static_cast<double>(c.moe.topk) / c.moe.experts);
  }
  return 6 * n + 12 * L * d * c.seq;
}

std::map<std::string, std::string> GptLayout::ShapeMetadata() const {
  std::map<std::string, std::string> m = GptConfigMetadata(cfg_);
  m["model"] = "gpt2";
  return m;
}

double GptLayout::FlopsPerToken() const { return GptFlopsPerToken(cfg_); }

std::vector<NamedTensor> InitGpt(const GptConfig& cfg, uint64_t seed) {
  std::vector<NamedTensor> out;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  uint64_t k = 0;
  for (const ParamShape& p : ParamShapes(cfg)) {
    ++k;
    auto ends_with = [&](const char* s) {
      std::string suffix(s);
      return p.name.size() >= suffix.size() &&
             p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    Tensor t;
    if (p.name.find("ln_") != std::string::npos) {
      t = Tensor::Full(p.shape, ends_with(".weight") ? 1.0 : 0.0, cfg.dtype);
    } else if (ends_with(".bias")) {
      t = Tensor::Zeros(p.shape, cfg.dtype);
    } else {
      double std = ends_with("c_proj.weight") ? proj_std : 0.02;
      t = RandomNormal(p.shape, seed * 1000003 + k, 0.0, std, cfg.dtype);
    }
    out.push_back({p.name, t});
  }
  return out;
}

namespace {

// What a rank's positions depend on: its rows (count from first), the sequence length and its
// context-parallel chunk.
struct PositionsKey {
  int device;
  int64_t count, first, seq, cp, cp_index, offset;
  auto operator<=>(const PositionsKey&) const = default;
};

std::vector<int64_t> PositionValues(const PositionsKey& k) {
  const int64_t local_seq = k.seq / k.cp;
  std::vector<int64_t> pos(k.count);
  for (int64_t r = 0; r < k.count; ++r) {
    pos[r] = k.cp > 1 ? LoadBalancedPosition((k.first + r) % local_seq, k.seq,
                                             static_cast<int>(k.cp), static_cast<int>(k.cp_index))
                      : k.offset + (k.first + r) % k.seq;
  }
  return pos;
}

// The positions of a rank's rows on its device. On a GPU each layout's positions are copied once
// per process and kept (keyed by the few numbers they depend on, every layout a process meets,
// shared by all rank threads): no host->device copy per step, and a step captured as a CUDA
// graph (models/train/cuda_graph_step.h) reads them at a fixed address (a copy inside a capture is
// refused, which would send the step back to eager).
Tensor PositionsOn(const PositionsKey& key, Device device) {
  if (!device.is_cuda()) {  // CPU, meta
    return Tensor::FromVector<int64_t>({key.count}, PositionValues(key)).To(device);
  }
  static std::mutex mu;
  static auto* kept = new std::map<PositionsKey, Tensor>;  // never destroyed (device memory)
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = kept->find(key); it != kept->end()) return it->second;
  }
  Tensor t = Tensor::FromVector<int64_t>({key.count}, PositionValues(key)).To(device);
  // Other rank threads read it on their own streams: wait until this stream has written it
  // (a read back waits for the stream; once per layout).
  (void)t.To(Device::Cpu());
  std::lock_guard<std::mutex> lock(mu);
  return kept->emplace(key, t).first->second;  // a racing thread's copy wins alike
}

}  // namespace

Value GptLayout::Embed(const ParamFn& use, const Value& ids, int64_t position_offset) const {
  const GptLayout& layout = *this;
  const GptConfig& c = layout.config();
  const TensorParallel tp = layout.tp();
  if (position_offset != 0 && layout.cp_ways() > 1) {
    OpFail("GptEmbed: a position offset (", position_offset, ") with cp=", layout.cp_ways(),
           ": context parallelism's chunks fix their own positions; generate without cp");
  }
  Value x = VocabParallelEmbedding{use("wte.weight"), tp}(ids);
  // Positions of this rank's rows (batch-major rows; under SP the tp chunk of them; under cp
  // each sequence's load-balanced chunks, seq/cp tokens).
  const int64_t rows = ids.dim(0);
  int64_t first = 0, count = rows;
  SpmdType pos_type(layout.mesh().num_axes());
  if (tp.on() && tp.sp) {
    const int n = layout.mesh().axis_size(layout.mesh().AxisIndex(tp.axis));
    count = rows / n;
    first = axis_index(tp.axis) * count;
    pos_type[layout.mesh().AxisIndex(tp.axis)] = AxisType::Sharded(0);
  }
  const int cp = layout.cp_ways();
  const int cp_index = layout.cp_axis().empty() ? 0 : axis_index(layout.cp_axis());
  if (!layout.cp_axis().empty()) {
    pos_type[layout.mesh().AxisIndex(layout.cp_axis())] = AxisType::Sharded(0);
  }
  const Device device = ids.tensor.device();
  const PositionsKey key{device.is_cuda() ? device.index : -1, count, first, c.seq, cp, cp_index,
                         position_offset};
  Value positions(PositionsOn(key, device), pos_type);
  return x + embedding(use("wpe.weight"), positions);
}

Value GptEmbed(const GptLayout& layout, const ParamFn& use, const Value& ids) {
  return layout.Embed(use, ids);
}

Value GptBlock(const GptLayout& layout, const ParamFn& use, int64_t i, const Value& x,
               TypeTrace* types, MoeAccum* moe_accum) {
  return ModelBlock(layout, use, i, x, types, moe_accum);
}

Value GptLayout::Block(const ParamFn& use, int64_t i, const Value& x, TypeTrace* types,
                       MoeAccum* moe_accum) const {
  const GptLayout& layout = *this;
  const GptConfig& c = layout.config();
  const bool selective = c.recompute == RecomputeMode::kSelective;
  const TensorParallel tp = layout.tp();
  const int64_t local_seq = c.seq / layout.cp_ways();
  std::string h = absl::StrCat("h.", i, ".");
  if (c.moe.on()) {  // pre-LN block with a MoE MLP (models/parallel/moe.h); one group per sequence
    if (moe_accum == nullptr) {
      OpFail("GptBlock ", i, ": a MoE model needs a MoeAccum for its load-balancing loss and "
             "drop counts");
    }
    CausalSelfAttention attn{use(h + "attn.c_attn.weight"), use(h + "attn.c_attn.bias"),
                             RowParallelLinear{use(h + "attn.c_proj.weight"),
                                               use(h + "attn.c_proj.bias"), tp},
                             c.head_dim(), local_seq, tp, types, layout.cp_axis()};
    attn.recompute_core = selective;
    Value y = x + attn(LayerNorm{use(h + "ln_1.weight"), use(h + "ln_1.bias")}(x));
    Value in = EnterTensorParallel(LayerNorm{use(h + "ln_2.weight"), use(h + "ln_2.bias")}(y),
                                   tp);
    MoeMlp moe{use(h + "mlp.router.weight"),       use(h + "mlp.experts.c_fc.weight"),
               use(h + "mlp.experts.c_fc.bias"),   use(h + "mlp.experts.c_proj.weight"),
               use(h + "mlp.experts.c_proj.bias"), c.moe,
               c.seq,                              moe_accum->total_groups,
               tp,                                 types};
    MoeOutput o = moe(in);
    moe_accum->aux = moe_accum->aux.defined() ? moe_accum->aux + o.aux : o.aux;
    moe_accum->stats.dropped += o.dropped;
    moe_accum->stats.dropped_tokens += o.dropped_tokens;
    moe_accum->stats.assignments += o.assignments;
    return y + o.y;
  }
  shardmap::Block block{LayerNorm{use(h + "ln_1.weight"), use(h + "ln_1.bias")},
              CausalSelfAttention{use(h + "attn.c_attn.weight"), use(h + "attn.c_attn.bias"),
                                  RowParallelLinear{use(h + "attn.c_proj.weight"),
                                                    use(h + "attn.c_proj.bias"), tp},
                                  c.head_dim(), local_seq, tp, nullptr, layout.cp_axis()},
              LayerNorm{use(h + "ln_2.weight"), use(h + "ln_2.bias")},
              Mlp{ColumnParallelLinear{use(h + "mlp.c_fc.weight"), use(h + "mlp.c_fc.bias"), tp},
                  RowParallelLinear{use(h + "mlp.c_proj.weight"), use(h + "mlp.c_proj.bias"),
                                    tp}},
              types};
  block.attn.recompute_core = selective;
  return block(x);
}

Value GptLayout::Logits(const ParamFn& use, const Value& x) const {
  Value h = EnterTensorParallel(LayerNorm{use("ln_f.weight"), use("ln_f.bias")}(x), tp_);
  return einsum("nd,vd->nv", h, use("wte.weight"));  // lm_head tied to wte: S1 on tp
}

Value GptHead(const GptLayout& layout, const ParamFn& use, const Value& x, const Value& targets,
              int64_t global_tokens) {
  return layout.Head(use, x, targets, global_tokens);
}

Value GptLayout::Head(const ParamFn& use, const Value& x, const Value& targets,
                      int64_t global_tokens) const {
  const GptLayout& layout = *this;
  const TensorParallel tp = layout.tp();
  Value logits = Logits(use, x);
  if (logits.dtype() != layout.config().dtype) {
    logits = cast(logits, layout.config().dtype);  // the loss in the master dtype (mixed)
  }
  Value per_row = VocabParallelCrossEntropy(logits, targets, tp);
  return sum_partial(per_row, {}) / static_cast<double>(global_tokens);
}

ParamFn GptParamUse(const GptLayout& layout, const std::vector<Value>& params) {
  return ParamUse(layout, params);
}

Value GptLoss(const GptLayout& layout, const std::vector<Value>& params, const Value& ids,
              const Value& targets, int64_t global_tokens, TypeTrace* block0_types,
              MoeStats* moe_stats) {
  return ModelLoss(layout, ParamUse(layout, params), ids, targets, global_tokens, block0_types,
                   moe_stats);
}

Value GptLossWith(const GptLayout& layout, const ParamFn& gathered, const Value& ids,
                  const Value& targets, int64_t global_tokens, TypeTrace* block0_types,
                  MoeStats* moe_stats) {
  return ModelLoss(layout, gathered, ids, targets, global_tokens, block0_types, moe_stats);
}

absl::Status CheckTokens(const GptConfig& c, const std::vector<int64_t>& tokens) {
  return CheckTokens(ModelShape{.vocab = c.vocab, .seq = c.seq}, tokens);
}

}  // namespace shardmap
