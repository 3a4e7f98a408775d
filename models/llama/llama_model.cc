#include "models/llama/llama_model.h"

#include <algorithm>
#include <cmath>
#include <compare>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "autograd/checkpoint.h"
#include "models/parallel/ring_attention.h"
#include "shardmap/attention_ops.h"
#include "shardmap/collective_ops.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/rope_ops.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Name, global shape ([out, in] for linears), the dim split over tp (-1: none).
struct ParamShape {
  std::string name;
  Shape shape;
  int tp_dim;
};

std::vector<ParamShape> ParamShapes(const LlamaConfig& c) {
  const int64_t d = c.d_model, hd = c.head_dim(), f = c.ffn_dim;
  std::vector<ParamShape> v = {{"model.embed_tokens.weight", {c.vocab, d}, 0}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    v.push_back({l + "input_layernorm.weight", {d}, -1});
    v.push_back({l + "self_attn.q_proj.weight", {c.heads * hd, d}, 0});
    v.push_back({l + "self_attn.k_proj.weight", {c.kv_heads * hd, d}, 0});
    v.push_back({l + "self_attn.v_proj.weight", {c.kv_heads * hd, d}, 0});
    v.push_back({l + "self_attn.o_proj.weight", {d, c.heads * hd}, 1});
    v.push_back({l + "post_attention_layernorm.weight", {d}, -1});
    v.push_back({l + "mlp.gate_proj.weight", {f, d}, 0});
    v.push_back({l + "mlp.up_proj.weight", {f, d}, 0});
    v.push_back({l + "mlp.down_proj.weight", {d, f}, 1});
  }
  v.push_back({"model.norm.weight", {d}, -1});
  v.push_back({"lm_head.weight", {c.vocab, d}, 0});
  return v;
}

ModelUnit UnitOf(const std::string& name) {
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) == 0) {
    const size_t start = layers.size();
    return {ModelUnit::kBlock, std::stoll(name.substr(start, name.find('.', start) - start))};
  }
  if (name == "model.embed_tokens.weight") return {ModelUnit::kEmbed, -1};
  return {ModelUnit::kHead, -1};  // model.norm, lm_head
}

absl::Status CheckConfig(const LlamaConfig& c) {
  if (c.layers < 1 || c.d_model < 1 || c.heads < 1 || c.kv_heads < 1 || c.ffn_dim < 1 ||
      c.vocab < 1 || c.seq < 1) {
    return Invalid(absl::StrCat("Llama config: layers, d_model, heads, kv_heads, ffn_dim, vocab "
                                "and seq must be >= 1 (got ", c.layers, ", ", c.d_model, ", ",
                                c.heads, ", ", c.kv_heads, ", ", c.ffn_dim, ", ", c.vocab, ", ",
                                c.seq, ")"));
  }
  if (c.d_model % c.heads != 0) {
    return Invalid(absl::StrCat("Llama config: d_model ", c.d_model,
                                " is not divisible by heads ", c.heads,
                                " (head_dim = d_model / heads)"));
  }
  if (c.heads % c.kv_heads != 0) {
    return Invalid(absl::StrCat("Llama config: heads ", c.heads, " are not divisible by kv_heads ",
                                c.kv_heads, ": each kv head serves heads/kv_heads query heads; "
                                "pick kv_heads dividing heads"));
  }
  if (c.head_dim() % 2 != 0) {
    return Invalid(absl::StrCat("Llama config: head_dim ", c.head_dim(),
                                " (d_model / heads) is odd: the rotary embedding rotates its two "
                                "halves; pick d_model / heads even"));
  }
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) {
    return Invalid(absl::StrCat("Llama config: rope_theta ", c.rope_theta,
                                " must be a finite number > 1 (Llama 3: 500000)"));
  }
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) {
    return Invalid(absl::StrCat("Llama config: norm_eps ", c.norm_eps,
                                " must be a finite number > 0 (Llama 3: 1e-5)"));
  }
  return absl::OkStatus();
}

absl::Status CheckMesh(const LlamaLayout& l, const Mesh& mesh) {
  const LlamaConfig& c = l.config();
  const int tp = l.dims().tp_ways();
  if (l.dims().size(axis::kEp) > 1) {
    return Invalid(absl::StrCat("mesh ", mesh.ShortString(), " has an ep axis: ep splits the "
                                "experts of a MoE MLP and Llama 3 has none; drop ep"));
  }
  if (c.kv_heads % tp != 0) {
    return Invalid(absl::StrCat(
        "kv_heads ", c.kv_heads, " are not divisible by tp=", tp,
        ": q and kv heads are split over tp. With tp > kv_heads Megatron replicates kv heads "
        "over tp; that is not implemented here. Pick tp dividing kv_heads"));
  }
  if (c.ffn_dim % tp != 0) {
    return Invalid(absl::StrCat("ffn_dim ", c.ffn_dim, " is not divisible by tp=", tp,
                                ": gate/up are column-parallel and down row-parallel; pick tp "
                                "dividing ffn_dim"));
  }
  if (c.vocab % tp != 0) {
    return Invalid(absl::StrCat("vocab ", c.vocab, " is not divisible by tp=", tp,
                                ": embed_tokens and lm_head are vocab-parallel; pad the vocab "
                                "to a multiple of tp"));
  }
  const int cp = l.cp_ways();
  if (c.seq % (2 * cp) != 0) {
    return Invalid(absl::StrCat("seq ", c.seq, " is not divisible by 2*cp = ", 2 * cp,
                                ": context parallelism cuts each sequence into 2*cp chunks; "
                                "pick seq a multiple of ", 2 * cp, " or a smaller cp"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t LlamaFfnDim(int64_t d_model, int64_t multiple_of,
                    std::optional<double> ffn_dim_multiplier) {
  int64_t hidden = 4 * d_model;
  hidden = static_cast<int64_t>(2.0 * static_cast<double>(hidden) / 3.0);
  if (ffn_dim_multiplier.has_value()) {
    hidden = static_cast<int64_t>(*ffn_dim_multiplier * static_cast<double>(hidden));
  }
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

namespace {

// torchtitan's llama3 flavours (torchtitan/models/llama3/__init__.py): dim, n_layers, n_heads,
// n_kv_heads, multiple_of, ffn_dim_multiplier, rope theta 500000. vocab: 128256 (Llama 3's
// tokenizer; torchtitan's debugmodel uses its 2048-token test tokenizer). seq: torchtitan's
// debug training seq_len 2048; Llama 3's 8192-token pretraining context for the others.
struct Preset {
  const char* name;
  int64_t d, layers, heads, kv_heads, multiple_of;
  std::optional<double> multiplier;
  int64_t vocab, seq;
};
const Preset kPresets[] = {
    {"llama3_debug", 256, 6, 16, 16, 256, std::nullopt, 2048, 2048},
    {"llama3_8b", 4096, 32, 32, 8, 1024, 1.3, 128256, 8192},
    {"llama3_70b", 8192, 80, 64, 8, 4096, 1.3, 128256, 8192},
    {"llama3_405b", 16384, 126, 128, 8, 4096, 1.2, 128256, 8192},
};

}  // namespace

std::vector<std::string> LlamaPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

absl::StatusOr<LlamaConfig> LlamaPreset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    LlamaConfig c;
    c.layers = p.layers;
    c.d_model = p.d;
    c.heads = p.heads;
    c.kv_heads = p.kv_heads;
    c.ffn_dim = LlamaFfnDim(p.d, p.multiple_of, p.multiplier);
    c.vocab = p.vocab;
    c.seq = p.seq;
    return c;
  }
  return absl::NotFoundError(absl::StrCat("no Llama preset '", name, "'; the presets are ",
                                          absl::StrJoin(LlamaPresetNames(), ", ")));
}

absl::StatusOr<LlamaConfig> LlamaConfigFromArgs(const ModelArgs& args) {
  if (args.moe.experts != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--experts=", args.moe.experts, ": Llama 3 (--model=llama3) is a dense model with a "
        "SwiGLU MLP in every block; it has no mixture of experts. Drop --experts (or use "
        "--model=gpt2 for MoE)"));
  }
  LlamaConfig cfg;  // the library's small test shape, unless a preset names one
  if (!args.preset.empty()) {
    absl::StatusOr<LlamaConfig> p = LlamaPreset(args.preset);
    if (!p.ok()) return p.status();
    cfg = *p;
  }
  cfg.layers = args.layers.value_or(cfg.layers);
  cfg.d_model = args.d_model.value_or(cfg.d_model);
  cfg.heads = args.heads.value_or(cfg.heads);
  // train's flags (models/run/train_flags.cc): kv_heads / ffn_dim unset or 0 take the preset's,
  // else (no preset) heads (multi-head) and Meta's rule from d_model (multiple_of 256, the
  // debugmodel's). rope_theta / norm_eps unset or 0 keep the preset's (Llama 3's).
  const bool preset = !args.preset.empty();
  auto given = [](const auto& v) { return v.has_value() && *v != 0; };
  if (given(args.kv_heads)) {
    cfg.kv_heads = *args.kv_heads;
  } else if (!preset) {
    cfg.kv_heads = cfg.heads;
  }
  if (given(args.ffn_dim)) {
    cfg.ffn_dim = *args.ffn_dim;
  } else if (!preset) {
    cfg.ffn_dim = LlamaFfnDim(cfg.d_model, 256);
  }
  cfg.vocab = args.vocab.value_or(cfg.vocab);
  cfg.seq = args.seq.value_or(cfg.seq);
  if (given(args.rope_theta)) cfg.rope_theta = *args.rope_theta;
  if (given(args.norm_eps)) cfg.norm_eps = *args.norm_eps;
  ModelShape precision;
  if (absl::Status s = ParsePrecision(args.dtype, &precision); !s.ok()) return s;
  cfg.dtype = precision.dtype;
  cfg.compute = precision.compute;
  cfg.recompute = args.recompute;
  return cfg;
}

absl::StatusOr<LlamaLayout> LlamaLayout::Create(const Mesh& mesh, const LlamaConfig& cfg,
                                                bool sp) {
  if (absl::Status s = CheckConfig(cfg); !s.ok()) return s;
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(mesh, sp);
  if (!dims.ok()) return dims.status();
  LlamaLayout l;
  l.dims_ = *std::move(dims);
  l.cfg_ = cfg;
  l.tp_.axis = l.dims_.tp_axis();
  l.tp_.sp = sp;
  if (absl::Status s = CheckMesh(l, mesh); !s.ok()) return s;
  const std::string fsdp = l.fsdp_axis();
  const int shard = l.dims_.size(axis::kDpShard);
  for (const ParamShape& p : ParamShapes(cfg)) {
    ParamInfo info;
    info.name = p.name;
    info.global_shape = p.shape;
    info.decay = p.shape.size() >= 2;
    info.unit = UnitOf(p.name);
    std::vector<std::vector<std::string>> dims(p.shape.size());
    const int tp_dim = l.tp_.on() ? p.tp_dim : -1;
    if (tp_dim >= 0) dims[tp_dim] = {axis::kTp};
    if (!fsdp.empty()) {
      // A dim dp_shard divides, else the first free one, padded (FSDP2's rule).
      std::vector<bool> free(p.shape.size());
      for (int d = 0; d < static_cast<int>(p.shape.size()); ++d) free[d] = d != tp_dim;
      ChooseFsdpDim(free, shard, &info);
      if (info.fsdp_dim >= 0) dims[info.fsdp_dim] = {fsdp};
    }
    info.spec = PartitionSpec(dims);
    if (absl::Status s = info.spec.Validate(mesh, StoredShape(info), p.name); !s.ok()) return s;
    l.params_.push_back(std::move(info));
  }
  l.shape_ = ModelShape{.layers = cfg.layers, .d_model = cfg.d_model, .heads = cfg.heads,
                        .kv_heads = cfg.kv_heads, .vocab = cfg.vocab, .seq = cfg.seq,
                        .dtype = cfg.dtype, .compute = cfg.compute, .recompute = cfg.recompute};
  return l;
}

absl::StatusOr<LlamaLayout> LlamaLayout::WithPositionOffset(int64_t offset) const {
  if (offset < 0) return Invalid(absl::StrCat("position offset ", offset, " is negative"));
  if (offset != 0 && cp_ways() > 1) {
    return Invalid(absl::StrCat("a position offset (", offset, ") with cp=", cp_ways(),
                                ": context parallelism's chunks fix their own positions; "
                                "generate without cp"));
  }
  LlamaLayout l = *this;
  l.position_offset_ = offset;
  return l;
}

std::unique_ptr<Model> LlamaLayout::WithRecompute(RecomputeMode mode) const {
  auto l = std::make_unique<LlamaLayout>(*this);
  l->cfg_.recompute = mode;
  l->shape_.recompute = mode;
  return l;
}

std::map<std::string, std::string> LlamaLayout::ShapeMetadata() const {
  std::map<std::string, std::string> m = {
      {"model", "llama3"},
      {"llama3.layers", absl::StrCat(cfg_.layers)},
      {"llama3.d_model", absl::StrCat(cfg_.d_model)},
      {"llama3.heads", absl::StrCat(cfg_.heads)},
      {"llama3.kv_heads", absl::StrCat(cfg_.kv_heads)},
      {"llama3.ffn_dim", absl::StrCat(cfg_.ffn_dim)},
      {"llama3.vocab", absl::StrCat(cfg_.vocab)},
      {"llama3.seq", absl::StrCat(cfg_.seq)},
      {"llama3.rope_theta", absl::StrFormat("%.17g", cfg_.rope_theta)},
      {"llama3.norm_eps", absl::StrFormat("%.17g", cfg_.norm_eps)},
      {"llama3.dtype", DTypeName(cfg_.dtype)},
  };
  if (cfg_.compute.has_value()) m["llama3.compute"] = DTypeName(*cfg_.compute);
  return m;
}

std::string LlamaLayout::Describe() const {
  return absl::StrCat("llama3 ", cfg_.layers, " layers d ", cfg_.d_model, " heads ", cfg_.heads,
                      "/", cfg_.kv_heads, " kv ffn ", cfg_.ffn_dim, " vocab ", cfg_.vocab,
                      " seq ", cfg_.seq);
}

double LlamaMatmulParameterCount(const LlamaConfig& c) {
  const double d = c.d_model, hd = static_cast<double>(c.head_dim());
  const double attn = d * c.heads * hd + 2 * d * c.kv_heads * hd + c.heads * hd * d;
  const double block = attn + 3 * d * c.ffn_dim + 2 * d;  // + two RMSNorm weights
  return c.layers * block + d + static_cast<double>(c.vocab) * d;  // + final norm, lm_head
}

double LlamaFlopsPerToken(const LlamaConfig& c) {
  return 6 * LlamaMatmulParameterCount(c) +
         12.0 * c.layers * c.heads * static_cast<double>(c.head_dim()) * c.seq;
}

double LlamaLayout::FlopsPerToken() const { return LlamaFlopsPerToken(cfg_); }

std::vector<NamedTensor> InitLlama(const LlamaConfig& cfg, uint64_t seed) {
  std::vector<NamedTensor> out;
  uint64_t k = 0;
  for (const ParamShape& p : ParamShapes(cfg)) {
    ++k;
    Tensor t;
    if (p.shape.size() == 1) {
      t = Tensor::Ones(p.shape, cfg.dtype);  // RMSNorm weights
    } else {
      double std = 0.02;
      const ModelUnit u = UnitOf(p.name);
      const bool output_proj = p.name.find("o_proj") != std::string::npos ||
                               p.name.find("down_proj") != std::string::npos;
      if (output_proj) std = 0.02 / std::sqrt(2.0 * static_cast<double>(u.block + 1));
      t = RandomNormal(p.shape, seed * 1000003 + k, 0.0, std, cfg.dtype);
    }
    out.push_back({p.name, t});
  }
  return out;
}

std::vector<NamedTensor> LlamaLayout::Init(uint64_t seed) const { return InitLlama(cfg_, seed); }

// ---- Rotary embedding ----------------------------------------------------------------------

std::vector<int64_t> RopePositions(int64_t rows, int64_t seq, int cp, int cp_index,
                                   int64_t offset) {
  const int64_t local_seq = seq / cp;
  std::vector<int64_t> pos(rows);
  for (int64_t r = 0; r < rows; ++r) {
    pos[r] = cp > 1 ? LoadBalancedPosition(r % local_seq, seq, cp, cp_index)
                    : offset + r % seq;
  }
  return pos;
}

RopeTables MakeRopeTables(const std::vector<int64_t>& positions, int64_t head_dim, double theta,
                          DType dtype) {
  const int64_t n = static_cast<int64_t>(positions.size()), half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(head_dim));
  }
  std::vector<double> c(n * head_dim), s(n * head_dim);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(positions[r]) * inv_freq[i];
      const double ca = std::cos(a), sa = std::sin(a);
      c[r * head_dim + i] = c[r * head_dim + half + i] = ca;
      s[r * head_dim + i] = s[r * head_dim + half + i] = sa;
    }
  }
  return {Tensor::FromVector<double>({n, 1, head_dim}, c, dtype),
          Tensor::FromVector<double>({n, 1, head_dim}, s, dtype)};
}

Value ApplyRope(const Value& x, const Value& cos, const Value& sin) {
  return rope(x, cos, sin);  // fused (shardmap/rope_ops.h): one pass, the VJP the inverse rotation
}

namespace {

// softmax(q k^T / sqrt(hd), causal) v with grouped kv heads: q [b, t, H, hd], k, v [b, t, KV,
// hd] -> [b * t, H * hd]. Materialised per kv group (no copies of k and v), fused (the kernel
// takes the kv heads as they are), or round the cp ring (k and v travel as kv heads; the ring
// groups the query heads).
Value GqaCore(const Value& q, const Value& k, const Value& v, const std::string& cp_axis,
              AttentionPath path, TypeTrace* types) {
  const int64_t b = q.dim(0), t = q.dim(1), heads = q.dim(2), hd = q.dim(3), kv = k.dim(2);
  const int64_t rep = heads / kv, rows = b * t;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  if (!cp_axis.empty()) {
    Value o = RingCausalAttention(q, k, v, cp_axis, scale);
    NoteType(types, "attn: o = RingCausalAttention(q, k, v) over cp  (grouped kv heads)", o);
    return o.reshape({rows, heads * hd});
  }
  if (ResolveAttentionPath(path, q.tensor.device(), hd) == AttentionPath::kFused) {
    // The fused kernel reads kv head h / rep for query head h: no repeated copies of k and v.
    Value o = causal_attention(q, k, v, scale);
    NoteType(types, "attn: o = causal_attention(q, k, v)  (fused, grouped kv heads)", o);
    return o.reshape({rows, heads * hd});
  }
  Value qg = (q * scale).reshape({b, t, kv, rep, hd});
  Value p = causal_softmax(einsum("btgrd,bsgd->bgrts", qg, k));
  NoteType(types, "attn: p = softmax(einsum(\"btgrd,bsgd->bgrts\", q, k))  (grouped)", p);
  Value o = einsum("bgrts,bsgd->btgrd", p, v).reshape({rows, heads * hd});
  NoteType(types, "attn: o = einsum(\"bgrts,bsgd->btgrd\", p, v)", o);
  return o;
}

// What a device's rotary tables depend on.
struct RopeKey {
  int64_t rows, seq;
  int cp, cp_index;
  int64_t offset, head_dim;
  double theta;
  DType dtype;
  auto operator<=>(const RopeKey&) const = default;
};

// The tables of a key, computed once per process (every block of every step reads the same
// ones; the trig is ~1% of a CPU step otherwise). Host tensors, shared by the rank threads;
// at most kMaxKept keys are kept (a new shape past that starts the cache afresh).
RopeTables CachedRopeTables(const RopeKey& k) {
  constexpr size_t kMaxKept = 64;
  static std::mutex mu;
  static auto* kept = new std::map<RopeKey, RopeTables>;  // never destroyed (rank threads)
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = kept->find(k); it != kept->end()) return it->second;
  }
  RopeTables t = MakeRopeTables(RopePositions(k.rows, k.seq, k.cp, k.cp_index, k.offset),
                                k.head_dim, k.theta, k.dtype);
  std::lock_guard<std::mutex> lock(mu);
  if (kept->size() >= kMaxKept) kept->clear();
  return kept->emplace(k, t).first->second;
}

// x @ w^T for an nn.Linear weight w [out, in].
Value Linear(const Value& x, const Value& w) { return matmul(x, w, false, true); }

}  // namespace

Value LlamaLayout::Embed(const ParamFn& use, const Value& ids, int64_t position_offset) const {
  if (position_offset != position_offset_) {
    OpFail("llama3 Embed: position offset ", position_offset, " but the layout's is ",
           position_offset_, ": rotary positions are applied in every block; build the layout "
           "with WithPositionOffset(", position_offset, ")");
  }
  return VocabParallelEmbedding{use("model.embed_tokens.weight"), tp_}(ids);
}

Value LlamaLayout::Block(const ParamFn& use, int64_t i, const Value& x, TypeTrace* types,
                         MoeAccum* /*moe: dense*/) const {
  const std::string l = absl::StrCat("model.layers.", i, ".");
  const int64_t hd = cfg_.head_dim();
  NoteType(types, "block input x", x);
  // Attention: the norm on x's rows (S0 on tp under SP), then the TP region.
  Value h = EnterTensorParallel(rms_norm(x, use(l + "input_layernorm.weight"), cfg_.norm_eps),
                                tp_);
  const int64_t rows = h.dim(0), local_seq = cfg_.seq / cp_ways(), b = rows / local_seq;
  Value q = Linear(h, use(l + "self_attn.q_proj.weight"));
  Value k = Linear(h, use(l + "self_attn.k_proj.weight"));
  Value v = Linear(h, use(l + "self_attn.v_proj.weight"));
  const int64_t heads = q.dim(1) / hd, kv = k.dim(1) / hd;  // this device's (split over tp)
  // Rotary tables of this device's rows: typed like the rows (S0 on cp; R elsewhere).
  const int cp = cp_ways();
  const std::string cpa = cp_axis();
  const RopeTables tables =
      CachedRopeTables(RopeKey{rows, cfg_.seq, cp, cpa.empty() ? 0 : axis_index(cpa),
                               position_offset_, hd, cfg_.rope_theta, h.dtype()});
  SpmdType table_type(mesh().num_axes());
  if (!cpa.empty()) table_type[mesh().AxisIndex(cpa)] = AxisType::Sharded(0);
  const Device device = h.tensor.device();
  const Value cos(tables.cos.To(device), table_type), sin(tables.sin.To(device), table_type);
  q = ApplyRope(q.reshape({rows, heads, hd}), cos, sin).reshape({b, local_seq, heads, hd});
  k = ApplyRope(k.reshape({rows, kv, hd}), cos, sin).reshape({b, local_seq, kv, hd});
  v = v.reshape({b, local_seq, kv, hd});
  NoteType(types, "attn: q after rope [b,t,heads,hd]", q);
  Value o;
  if (cfg_.recompute == RecomputeMode::kSelective) {
    o = checkpoint(
        [cpa, types](const std::vector<Value>& in) {
          return GqaCore(in[0], in[1], in[2], cpa, AttentionPath::kAuto,
                         IsRecomputing() ? nullptr : types);
        },
        {q, k, v}, "recompute_attention");
  } else {
    o = GqaCore(q, k, v, cpa, AttentionPath::kAuto, types);
  }
  Value y = x + LeaveTensorParallel(Linear(o, use(l + "self_attn.o_proj.weight")), tp_);
  NoteType(types, "x + attn(rms(x))", y);
  // SwiGLU MLP.
  Value m = EnterTensorParallel(
      rms_norm(y, use(l + "post_attention_layernorm.weight"), cfg_.norm_eps), tp_);
  Value gate = Linear(m, use(l + "mlp.gate_proj.weight"));
  Value up = Linear(m, use(l + "mlp.up_proj.weight"));
  NoteType(types, "mlp: gate (column-parallel)", gate);
  Value out = y + LeaveTensorParallel(Linear(silu(gate) * up, use(l + "mlp.down_proj.weight")),
                                      tp_);
  NoteType(types, "block output", out);
  return out;
}

Value LlamaLayout::Logits(const ParamFn& use, const Value& x) const {
  Value h = EnterTensorParallel(rms_norm(x, use("model.norm.weight"), cfg_.norm_eps), tp_);
  return Linear(h, use("lm_head.weight"));  // [rows, vocab] S1 on tp
}

Value LlamaLayout::Head(const ParamFn& use, const Value& x, const Value& targets,
                        int64_t global_tokens) const {
  Value logits = Logits(use, x);
  if (logits.dtype() != cfg_.dtype) logits = cast(logits, cfg_.dtype);  // the loss in dtype
  Value per_row = VocabParallelCrossEntropy(logits, targets, tp_);
  return sum_partial(per_row, {}) / static_cast<double>(global_tokens);
}

}  // namespace shardmap
