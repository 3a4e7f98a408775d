#include "models/gpt.h"

#include <memory>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "models/gpt_checkpoint.h"
#include "models/gpt_trace.h"
#include "models/ring_attention.h"
#include "shardmap/collective_ops.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

constexpr const char* kAxisOrder[] = {"pp", "dp_replicate", "dp_shard", "dp", "ep", "cp", "tp"};

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

int AxisSize(const Mesh& mesh, const std::string& name) {
  int i = mesh.AxisIndex(name);
  return i < 0 ? 1 : mesh.axis_size(i);
}

// MoE checks and the expert axes: the named ones (default "ep" when the mesh has it), in mesh
// order, each a batch axis; an ep axis without experts is an error.
absl::Status ResolveExperts(const Mesh& mesh, const std::vector<std::string>& batch_axes,
                            MoeConfig* moe) {
  if (!moe->on()) {
    if (mesh.AxisIndex("ep") >= 0 && AxisSize(mesh, "ep") > 1) {
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
  if (named.empty() && mesh.AxisIndex("ep") >= 0) named = {"ep"};
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

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Forwards every recorded op to the tape and, when tracing, notes it as a span since the
// previous recorded op (ops that record nothing are folded into the next one); an op that
// issued a collective is named with its axes and bytes.
class TracingRecorder : public TapeRecorder {
 public:
  TracingRecorder(Tape* tape, std::vector<TraceEvent>* events, int rank, double start_us)
      : tape_(tape), events_(events), rank_(rank), last_(start_us) {
    RankContext& ctx = RankContext::Get("TrainGpt");
    ctx_ = &ctx;
    logged_ = ctx.collective_log().size();
  }
  void Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
              VjpFn vjp) override {
    tape_->Record(op, inputs, out, std::move(vjp));
    const int64_t bytes = static_cast<int64_t>(out.tensor.nbytes());
    activation_bytes_ += bytes;
    largest_activation_ = std::max(largest_activation_, bytes);
    if (events_ != nullptr) {
      const double now = NowUs();
      const auto& log = ctx_->collective_log();
      if (log.size() > logged_) {
        const CollectiveRecord& r = log.back();
        events_->push_back({absl::StrCat(r.op, "(", ctx_->mesh().MaskToString(r.axes), ")"),
                            "collective", rank_, last_, now - last_, r.bytes});
      } else {
        events_->push_back({op, "op", rank_, last_, now - last_, -1});
      }
      last_ = now;
    }
    logged_ = ctx_->collective_log().size();
  }
  // Log entries seen so far (those after it were issued outside the forward).
  size_t logged() const { return logged_; }
  // Bytes of the recorded ops' outputs (the activations the tape keeps), and the largest one.
  int64_t activation_bytes() const { return activation_bytes_; }
  int64_t largest_activation() const { return largest_activation_; }

 private:
  Tape* tape_;
  std::vector<TraceEvent>* events_;
  int rank_;
  double last_;
  RankContext* ctx_;
  size_t logged_ = 0;
  int64_t activation_bytes_ = 0, largest_activation_ = 0;
};

}  // namespace

absl::StatusOr<Mesh> ParseMesh(const std::string& text) {
  std::map<std::string, int> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(part, '=');
    int n = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &n)) {
      return Invalid(absl::StrCat("--mesh: '", part, "' is not axis=size (e.g. \"dp=2,tp=2\")"));
    }
    bool known = false;
    for (const char* a : kAxisOrder) known |= kv[0] == a;
    if (!known) {
      return Invalid(absl::StrCat("--mesh: unknown axis '", kv[0],
                                  "'; the axes are pp, dp, dp_replicate, dp_shard, ep, cp and tp"));
    }
    if (n < 1) return Invalid(absl::StrCat("--mesh: axis '", kv[0], "' has size ", n, " (< 1)"));
    if (!sizes.emplace(kv[0], n).second) {
      return Invalid(absl::StrCat("--mesh: axis '", kv[0], "' is given twice"));
    }
  }
  std::vector<std::pair<std::string, int>> axes;
  for (const char* a : kAxisOrder) {
    if (sizes.count(a)) axes.emplace_back(a, sizes[a]);
  }
  return Mesh::Create(axes);
}

absl::StatusOr<GptLayout> GptLayout::Create(const Mesh& mesh, const GptConfig& cfg, bool sp) {
  for (const std::string& name : mesh.axis_names()) {
    bool known = false;
    for (const char* a : kAxisOrder) known |= name == a;
    if (!known) {
      return Invalid(absl::StrCat("GPT mesh ", mesh.ShortString(), ": unknown axis '", name,
                                  "'; use pp, dp, dp_replicate, dp_shard, ep, cp, tp (ParseMesh)"));
    }
  }
  for (size_t i = 1; i < mesh.axis_names().size(); ++i) {
    if (mesh.axis_names()[i - 1] == "tp") {
      return Invalid(absl::StrCat("GPT mesh ", mesh.ShortString(),
                                  ": tp must be the last axis (ParseMesh orders them)"));
    }
  }
  if (cfg.layers < 1 || cfg.d_model < 1 || cfg.heads < 1 || cfg.vocab < 1 || cfg.seq < 1) {
    return Invalid("GPT config: layers, d_model, heads, vocab and seq must be >= 1");
  }
  if (cfg.d_model % cfg.heads != 0) {
    return Invalid(absl::StrCat("GPT config: d_model ", cfg.d_model, " is not divisible by heads ",
                                cfg.heads));
  }
  GptLayout l;
  l.mesh_ = mesh;
  l.cfg_ = cfg;
  const int tp = AxisSize(mesh, "tp");
  if (mesh.AxisIndex("tp") >= 0) l.tp_.axis = "tp";
  l.tp_.sp = sp;
  if (sp && !l.tp_.on()) {
    return Invalid("--sp (sequence parallelism) needs a tp axis in the mesh (e.g. dp=2,tp=2)");
  }
  if (cfg.heads % tp != 0) {
    return Invalid(absl::StrCat("heads ", cfg.heads, " are not divisible by tp=", tp,
                                ": attention heads are split over tp; pick tp dividing heads"));
  }
  if (cfg.vocab % tp != 0) {
    return Invalid(absl::StrCat("vocab ", cfg.vocab, " is not divisible by tp=", tp,
                                ": the embedding and lm_head are vocab-parallel; pad the vocab "
                                "to a multiple of tp"));
  }
  for (const char* a : {"dp_replicate", "dp_shard", "dp", "ep"}) {
    if (mesh.AxisIndex(a) >= 0) l.batch_axes_.push_back(a);
  }
  if (absl::Status s = ResolveExperts(mesh, l.batch_axes_, &l.cfg_.moe); !s.ok()) return s;
  const std::vector<std::string>& expert_axes = l.cfg_.moe.expert_axes;
  if (mesh.AxisIndex("dp_shard") >= 0) l.fsdp_ = "dp_shard";
  if (mesh.AxisIndex("cp") >= 0) l.cp_ = "cp";
  if (mesh.AxisIndex("pp") >= 0) {
    if (mesh.AxisIndex("pp") != 0) {
      return Invalid(absl::StrCat("GPT mesh ", mesh.ShortString(),
                                  ": pp must be the first axis (ParseMesh orders them)"));
    }
    l.pp_ = "pp";
    if (!l.cp_.empty() && AxisSize(mesh, "pp") > 1) {
      return Invalid(absl::StrCat("GPT mesh ", mesh.ShortString(),
                                  ": pipeline (pp) with context parallelism (cp) is not "
                                  "supported; drop one of them"));
    }
  }
  const int cp = AxisSize(mesh, "cp");
  if (cfg.seq % (2 * cp) != 0) {
    return Invalid(absl::StrCat("seq ", cfg.seq, " is not divisible by 2*cp = ", 2 * cp,
                                ": context parallelism cuts each sequence into 2*cp chunks "
                                "(device i holds chunks i and 2cp-1-i); pick seq a multiple of ",
                                2 * cp, " or a smaller cp"));
  }
  if (cfg.moe.on() && AxisSize(mesh, "cp") > 1) {
    return Invalid(absl::StrCat("MoE with cp=", AxisSize(mesh, "cp"),
                                ": each sequence is one routing group, and context parallelism "
                                "splits sequences over devices; drop cp or --experts"));
  }
  const int shard = AxisSize(mesh, "dp_shard");
  for (const ParamShape& p : ParamShapes(cfg)) {
    ParamInfo info;
    info.name = p.name;
    info.global_shape = p.shape;
    info.decay = p.gpt2_rank >= 2;
    std::vector<std::vector<std::string>> dims(p.shape.size());
    const int tp_dim = l.tp_.on() ? p.tp_dim : -1;
    if (tp_dim >= 0) dims[tp_dim] = {"tp"};
    const bool expert_split = p.expert && !expert_axes.empty();
    if (expert_split) dims[0] = expert_axes;
    const bool fsdp_free = std::find(dims[0].begin(), dims[0].end(), l.fsdp_) == dims[0].end();
    if (!l.fsdp_.empty() && fsdp_free) {
      for (int d = 0; d < static_cast<int>(p.shape.size()); ++d) {
        if (d != tp_dim && !(expert_split && d == 0) && p.shape[d] % shard == 0) {
          info.fsdp_dim = d;
          dims[d] = {l.fsdp_};
          break;
        }
      }
    }
    info.spec = PartitionSpec(dims);
    if (absl::Status s = info.spec.Validate(mesh, p.shape, p.name); !s.ok()) return s;
    l.params_.push_back(std::move(info));
  }
  return l;
}

int GptLayout::Find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int GptLayout::batch_ways() const {
  int n = 1;
  for (const std::string& a : batch_axes_) n *= AxisSize(mesh_, a);
  return n;
}

int GptLayout::cp_ways() const { return AxisSize(mesh_, "cp"); }

int GptLayout::pp_ways() const { return AxisSize(mesh_, "pp"); }

PartitionSpec GptLayout::RowSpec(bool with_sp) const {
  std::vector<std::string> axes = batch_axes_;
  if (!cp_.empty()) axes.push_back(cp_);
  if (with_sp && tp_.on() && tp_.sp) axes.push_back(tp_.axis);
  return PartitionSpec({axes});
}

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

Value GptEmbed(const GptLayout& layout, const ParamFn& use, const Value& ids) {
  const GptConfig& c = layout.config();
  const TensorParallel tp = layout.tp();
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
  const int64_t local_seq = c.seq / cp;
  std::vector<int64_t> pos(count);
  for (int64_t r = 0; r < count; ++r) {
    pos[r] = cp > 1 ? LoadBalancedPosition((first + r) % local_seq, c.seq, cp, cp_index)
                    : (first + r) % c.seq;
  }
  Value positions(Tensor::FromVector<int64_t>({count}, pos), pos_type);
  return x + embedding(use("wpe.weight"), positions);
}

Value GptBlock(const GptLayout& layout, const ParamFn& use, int64_t i, const Value& x,
               TypeTrace* types, MoeAccum* moe_accum) {
  const GptConfig& c = layout.config();
  const TensorParallel tp = layout.tp();
  const int64_t local_seq = c.seq / layout.cp_ways();
  std::string h = absl::StrCat("h.", i, ".");
  if (c.moe.on()) {  // pre-LN block with a MoE MLP (models/moe.h); one group per sequence
    if (moe_accum == nullptr) {
      OpFail("GptBlock ", i, ": a MoE model needs a MoeAccum for its load-balancing loss and "
             "drop counts");
    }
    CausalSelfAttention attn{use(h + "attn.c_attn.weight"), use(h + "attn.c_attn.bias"),
                             RowParallelLinear{use(h + "attn.c_proj.weight"),
                                               use(h + "attn.c_proj.bias"), tp},
                             c.head_dim(), local_seq, tp, types, layout.cp_axis()};
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
  Block block{LayerNorm{use(h + "ln_1.weight"), use(h + "ln_1.bias")},
              CausalSelfAttention{use(h + "attn.c_attn.weight"), use(h + "attn.c_attn.bias"),
                                  RowParallelLinear{use(h + "attn.c_proj.weight"),
                                                    use(h + "attn.c_proj.bias"), tp},
                                  c.head_dim(), local_seq, tp, nullptr, layout.cp_axis()},
              LayerNorm{use(h + "ln_2.weight"), use(h + "ln_2.bias")},
              Mlp{ColumnParallelLinear{use(h + "mlp.c_fc.weight"), use(h + "mlp.c_fc.bias"), tp},
                  RowParallelLinear{use(h + "mlp.c_proj.weight"), use(h + "mlp.c_proj.bias"),
                                    tp}},
              types};
  return block(x);
}

Value GptHead(const GptLayout& layout, const ParamFn& use, const Value& x, const Value& targets,
              int64_t global_tokens) {
  const TensorParallel tp = layout.tp();
  Value h = EnterTensorParallel(LayerNorm{use("ln_f.weight"), use("ln_f.bias")}(x), tp);
  Value logits = einsum("nd,vd->nv", h, use("wte.weight"));  // lm_head tied to wte: S1 on tp
  if (logits.dtype() != layout.config().dtype) {
    logits = cast(logits, layout.config().dtype);  // the loss in the master dtype (mixed)
  }
  Value per_row = VocabParallelCrossEntropy(logits, targets, tp);
  return sum_partial(per_row, {}) / static_cast<double>(global_tokens);
}

ParamFn GptParamUse(const GptLayout& layout, const std::vector<Value>& params) {
  // A parameter at use: FSDP shards are all_gathered (the transpose reduce-scatters the grad).
  return [&layout, &params](const std::string& name) {
    int i = layout.Find(name);
    const ParamInfo& info = layout.params()[i];
    Value p = info.fsdp_dim >= 0 ? all_gather(params[i], info.fsdp_dim, layout.fsdp_axis())
                                 : params[i];
    // Mixed precision: cast to the compute dtype at use (the cast's VJP returns the gradient in
    // the master dtype).
    const DType compute = layout.config().compute_dtype();
    return p.dtype() == compute ? p : cast(p, compute);
  };
}

Value GptLoss(const GptLayout& layout, const std::vector<Value>& params, const Value& ids,
              const Value& targets, int64_t global_tokens, TypeTrace* block0_types,
              MoeStats* moe_stats) {
  // wte is used twice (embedding and lm_head): gathered once under FSDP.
  const ParamFn gathered = GptParamUse(layout, params);
  const Value wte = gathered("wte.weight");
  const ParamFn use = [&](const std::string& name) {
    return name == "wte.weight" ? wte : gathered(name);
  };
  Value x = GptEmbed(layout, use, ids);
  MoeAccum moe{global_tokens / layout.config().seq, Value(), MoeStats()};
  for (int64_t i = 0; i < layout.config().layers; ++i) {
    x = GptBlock(layout, use, i, x, i == 0 ? block0_types : nullptr, &moe);
  }
  if (moe_stats != nullptr) {
    moe_stats->dropped += moe.stats.dropped;
    moe_stats->dropped_tokens += moe.stats.dropped_tokens;
    moe_stats->assignments += moe.stats.assignments;
  }
  Value loss = GptHead(layout, use, x, targets, global_tokens);
  if (!moe.aux.defined()) return loss;
  const Value aux = moe.aux.dtype() == loss.dtype() ? moe.aux : cast(moe.aux, loss.dtype());
  return loss + aux * layout.config().moe.aux_loss_coef;
}

void BatchAt(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
             Tensor* ids, Tensor* targets) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> in(batch * seq), out(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = ((step * batch + b) * seq) % n;
    for (int64_t t = 0; t < seq; ++t) {
      in[b * seq + t] = tokens[(start + t) % n];
      out[b * seq + t] = tokens[(start + t + 1) % n];
    }
  }
  *ids = Tensor::FromVector<int64_t>({batch, seq}, in);
  *targets = Tensor::FromVector<int64_t>({batch, seq}, out);
}

double ClipCoefficient(double norm, double max_norm) {
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double GlobalGradNormSquared(const std::vector<Value>& grads) {
  RankContext& ctx = RankContext::Get("GlobalGradNormSquared");
  const Mesh& mesh = ctx.mesh();
  NoGradScope no_tape;
  Value total;
  for (const Value& g : grads) {
    Value s = sum_partial(g * g, {});  // P where g is sharded
    std::vector<std::string> replicated;
    for (int i = 0; i < mesh.num_axes(); ++i) {
      if (s.type[i].kind == AxisKind::kR) replicated.push_back(mesh.axis_names()[i]);
    }
    // Replicated parts count once: keep the value on index 0 of those axes (R -> P).
    if (!replicated.empty()) s = convert(s, Axes(replicated), Convert::kRToP);
    total = total.defined() ? total + s : s;
  }
  if (mesh.num_axes() == 0) return total.item();
  return all_reduce(total, Axes(mesh.axis_names())).item();
}

absl::Status CheckTokens(const GptConfig& c, const std::vector<int64_t>& tokens) {
  if (static_cast<int64_t>(tokens.size()) < c.seq + 1) {
    return Invalid(absl::StrCat("the data has ", tokens.size(), " tokens; a sample needs seq+1 = ",
                                c.seq + 1));
  }
  for (int64_t t : tokens) {
    if (t < 0 || t >= c.vocab) {
      return Invalid(absl::StrCat("token id ", t, " is outside the vocabulary [0, ", c.vocab,
                                  "); raise --vocab"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> MatchInitialParams(const GptLayout& layout,
                                                       const std::vector<NamedTensor>& init) {
  const GptConfig& c = layout.config();
  std::vector<Tensor> globals;
  for (const ParamInfo& p : layout.params()) {
    const NamedTensor* found = nullptr;
    for (const NamedTensor& t : init) {
      if (t.name == p.name) found = &t;
    }
    if (found == nullptr) return Invalid(absl::StrCat("initial parameters lack '", p.name, "'"));
    if (found->tensor.shape() != p.global_shape || found->tensor.dtype() != c.dtype) {
      return Invalid(absl::StrCat("initial parameter '", p.name, "' is ",
                                  found->tensor.ShapeString(), " but the model needs ",
                                  DTypeName(c.dtype), ShapeToString(p.global_shape)));
    }
    globals.push_back(found->tensor);
  }
  return globals;
}

absl::StatusOr<TrainResult> TrainGpt(const GptLayout& layout, const std::vector<NamedTensor>& init,
                                     const std::vector<int64_t>& tokens,
                                     const TrainOptions& options) {
  const GptConfig& c = layout.config();
  const Mesh& mesh = layout.mesh();
  const int ways = layout.batch_ways();
  if (layout.pp_ways() > 1) {
    return Invalid(absl::StrCat("mesh ", mesh.ShortString(), " has pp=", layout.pp_ways(),
                                ": pipeline parallelism trains with TrainGptPipeline "
                                "(models/gpt_pipeline.h)"));
  }
  if (options.microbatches != 1) {
    return Invalid(absl::StrCat("microbatches ", options.microbatches,
                                ": microbatches are a pipeline (pp > 1) setting"));
  }
  if (options.batch < 1 || options.batch % ways != 0) {
    return Invalid(absl::StrCat("batch ", options.batch, " is not divisible by the ", ways,
                                " data-parallel ways of mesh ", mesh.ShortString()));
  }
  if (layout.tp().sp) {
    const int tp = AxisSize(mesh, "tp");
    const int64_t rank_tokens = options.batch / ways * c.seq / layout.cp_ways();
    if (rank_tokens % tp != 0) {
      return Invalid(absl::StrCat("sequence parallelism splits each rank's ", rank_tokens,
                                  " tokens over tp=", tp,
                                  ": make batch/dp * seq/cp divisible by tp"));
    }
  }
  if (absl::Status s = CheckTokens(c, tokens); !s.ok()) return s;
  // Checkpoint files are checked before the first step; ranks read their blocks later.
  const std::string& file_path = !options.resume_path.empty() ? options.resume_path
                                                                : options.init_path;
  std::unique_ptr<SafetensorsFile> file;
  int64_t first_step = 0;
  if (!file_path.empty()) {
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(file_path);
    if (!f.ok()) return f.status();
    const bool resume = !options.resume_path.empty();
    if (absl::Status s = CheckGptCheckpoint(*f, layout, resume); !s.ok()) return s;
    if (resume && !absl::SimpleAtoi(f->metadata().at("step"), &first_step)) {
      return Invalid(absl::StrCat("checkpoint '", file_path, "': step '",
                                  f->metadata().at("step"), "' is not a number"));
    }
    file = std::make_unique<SafetensorsFile>(*std::move(f));
  }
  std::vector<Tensor> globals;
  if (file == nullptr) {
    absl::StatusOr<std::vector<Tensor>> matched = MatchInitialParams(layout, init);
    if (!matched.ok()) return matched.status();
    globals = *std::move(matched);
  }

  const int64_t global_tokens = options.batch * c.seq;
  const PartitionSpec rows_spec = layout.RowSpec(false);
  // Per rank: parameters, then exp_avg, then exp_avg_sq (layout order each).
  std::vector<std::vector<Tensor>> final_locals(mesh.size());
  TrainResult result;
  std::mutex mu;  // std::mutex: ThreadSanitizer sees it (Debian's absl is not instrumented)
  // The rank that reports (losses, bytes, log, on_step): rank 0, or this process's rank.
  const int reporter = options.comm != nullptr ? options.comm->rank() : 0;
  auto body = [&](RankContext& ctx) {
    const int rank = ctx.rank();
    std::vector<Value> params;
    AdamWOptions adam = options.adamw;
    auto read = [&](const std::string& tensor, const ParamInfo& p) {
      absl::StatusOr<Tensor> t = ReadGptShard(*file, tensor, p, mesh, rank, c.dtype);
      if (!t.ok()) throw OpError(t.status());
      return *t;
    };
    for (size_t i = 0; i < layout.params().size(); ++i) {
      const ParamInfo& p = layout.params()[i];
      Tensor local = file != nullptr ? read(p.name, p) : ShardOf(globals[i], mesh, p.spec, rank);
      params.emplace_back(local, p.spec.InputType(mesh));
      if (!p.decay) adam.no_decay.insert(p.name);
    }
    AdamW opt(adam);
    Tape tape;
    std::vector<TraceEvent> events;
    BackwardTracer backward_tracer(&events);  // a span per VJP and per backward collective
    if (options.trace) tape.set_backward_observer(&backward_tracer);
    if (!options.resume_path.empty()) {
      for (const ParamInfo& p : layout.params()) {
        opt.SetState(p.name, read("optimizer.exp_avg." + p.name, p),
                     read("optimizer.exp_avg_sq." + p.name, p));
      }
      opt.set_steps(first_step);
    }
    for (int64_t step = first_step; step < first_step + options.steps; ++step) {
      ctx.ClearCollectiveLog();
      Tensor ids_g, targets_g;
      BatchAt(tokens, step, options.batch, c.seq, &ids_g, &targets_g);
      SpmdType row_type = rows_spec.InputType(mesh);
      // Under cp the rows are reordered so that each cp block holds its load-balanced chunks.
      auto rows_of = [&](const Tensor& t) {
        return layout.cp_axis().empty() ? t.Reshape({global_tokens})
                                        : LoadBalancedRows(t, ways, layout.cp_ways());
      };
      Value ids(ShardOf(rows_of(ids_g), mesh, rows_spec, rank), row_type);
      Value targets(ShardOf(rows_of(targets_g), mesh, rows_spec, rank), row_type);
      const double t0 = NowUs();
      TracingRecorder rec(&tape, options.trace ? &events : nullptr, rank, t0);
      std::vector<Value> watched;
      for (const Value& p : params) watched.push_back(tape.Watch(p));
      Value loss;
      MoeStats moe;
      {
        ScopedRecorder scope(&rec);
        loss = GptLoss(layout, watched, ids, targets, global_tokens,
                       step == first_step ? options.types : nullptr, &moe);
      }
      const double t1 = NowUs();
      std::vector<Value> grad_values = tape.Backward(loss, LossSeed(loss), watched);
      const int64_t peak_saved = tape.peak_saved_bytes();
      tape.Clear();  // drop the saved activations now
      loss.node = -1;
      const double t2 = NowUs();
      // One all_reduce per gradient over the axes where it is a pending sum (P): dp for
      // replicated parameters, dp_replicate under HSDP, tp for tp-replicated ones.
      for (Value& g : grad_values) {
        std::vector<std::string> axes;
        for (int i = 0; i < mesh.num_axes(); ++i) {
          if (g.type[i].kind == AxisKind::kP) axes.push_back(mesh.axis_names()[i]);
        }
        if (!axes.empty()) g = all_reduce(g, Axes(axes));
      }
      // The loss for printing: its P axes summed (one scalar all_reduce).
      std::vector<std::string> partial;
      for (int i = 0; i < mesh.num_axes(); ++i) {
        if (loss.type[i].kind == AxisKind::kP) partial.push_back(mesh.axis_names()[i]);
      }
      if (!partial.empty()) loss = all_reduce(loss, Axes(partial));
      // MoE drops: each rank's counts summed over the batch axes (tp ranks route the same tokens).
      int64_t moe_dropped = -1, moe_assignments = -1, moe_dropped_tokens = -1;
      if (c.moe.on()) {
        moe_dropped = moe.dropped;
        moe_assignments = moe.assignments;
        moe_dropped_tokens = moe.dropped_tokens;
        if (!layout.batch_axes().empty()) {
          const Axes batch(layout.batch_axes());
          SpmdType vt(mesh.num_axes());
          for (const std::string& a : layout.batch_axes()) vt[mesh.AxisIndex(a)] = AxisType::V();
          Value counts(Tensor::FromVector<double>({3}, {static_cast<double>(moe.dropped),
                                                        static_cast<double>(moe.assignments),
                                                        static_cast<double>(moe.dropped_tokens)}),
                       vt);
          std::vector<double> sum = all_reduce(reinterpret(counts, batch), batch)
                                        .tensor.ToVector<double>();
          moe_dropped = static_cast<int64_t>(sum[0]);
          moe_assignments = static_cast<int64_t>(sum[1]);
          moe_dropped_tokens = static_cast<int64_t>(sum[2]);
        }
      }
      const double norm = std::sqrt(GlobalGradNormSquared(grad_values));
      const double coef = options.clip > 0 ? ClipCoefficient(norm, options.clip) : 1.0;
      std::vector<NamedTensor> local, grads;
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = layout.params()[i].name;
        local.push_back({name, params[i].tensor});
        grads.push_back({name, coef < 1.0 ? MulScalar(grad_values[i].tensor, coef)
                                          : grad_values[i].tensor});
      }
      const double t3 = NowUs();
      if (absl::Status s = opt.Step(local, grads); !s.ok()) throw OpError(s);
      for (size_t i = 0; i < params.size(); ++i) params[i].tensor = local[i].tensor;
      const double t4 = NowUs();
      if (options.trace) {
        const char* names[] = {"forward", "backward", "grad reduce + clip", "optimizer"};
        const double ts[] = {t0, t1, t2, t3, t4};
        for (int k = 0; k < 4; ++k) {
          events.push_back({names[k], "phase", rank, ts[k], ts[k + 1] - ts[k], -1});
        }
        // Collectives after the backward pass (gradient and norm reductions); the backward
        // ones are spans of backward_tracer.
        for (size_t k = rec.logged(); k < ctx.collective_log().size(); ++k) {
          const CollectiveRecord& r = ctx.collective_log()[k];
          if (r.backward) continue;
          events.push_back({absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")"),
                            "collective", rank, t2, 0, r.bytes});
        }
      }
      if (rank == reporter) {
        if (step == first_step) {
          result.activation_bytes_per_rank = rec.activation_bytes();
          result.peak_activation_bytes_per_rank = peak_saved;
          result.largest_activation_bytes = rec.largest_activation();
        }
        result.losses.push_back(loss.item());
        result.grad_norms.push_back(norm);
        if (c.moe.on()) result.moe_dropped.push_back(moe_dropped);
        if (options.on_step) {
          options.on_step(StepInfo{step, loss.item(), norm, (t4 - t0) * 1e-6,
                                   &ctx.collective_log(), moe_dropped, moe_assignments,
                                   moe_dropped_tokens});
        }
        if (step + 1 == first_step + options.steps) {
          result.log = ctx.collective_log();
          for (size_t i = 0; i < params.size(); ++i) {
            const std::string& name = layout.params()[i].name;
            result.param_bytes_per_rank += params[i].tensor.nbytes();
            result.optimizer_bytes_per_rank += grad_values[i].tensor.nbytes() +
                                               opt.exp_avg(name).nbytes() +
                                               opt.exp_avg_sq(name).nbytes();
          }
        }
      }
    }
    std::vector<Tensor> mine;
    for (const Value& p : params) mine.push_back(p.tensor);
    if (options.trace) {
      std::lock_guard<std::mutex> lock(mu);
      result.trace.insert(result.trace.end(), events.begin(), events.end());
    }
    for (const ParamInfo& p : layout.params()) mine.push_back(opt.exp_avg(p.name));
    for (const ParamInfo& p : layout.params()) mine.push_back(opt.exp_avg_sq(p.name));
    if (options.comm != nullptr) {
      // One process per rank: the global tensors come from all_gathers over each sharded dim.
      for (size_t k = 0; k < mine.size(); ++k) {
        if (!mine[k].defined()) continue;  // no moments without a step
        const PartitionSpec& spec = layout.params()[k % params.size()].spec;
        Value v(mine[k], spec.InputType(mesh));
        for (int d = 0; d < spec.size(); ++d) {
          if (!spec.dim_axes(d).empty()) v = all_gather(v, d, Axes(spec.dim_axes(d)));
        }
        mine[k] = v.tensor;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    final_locals[rank] = std::move(mine);
  };
  absl::Status status = options.comm != nullptr ? RunOnCommunicator(*options.comm, mesh, body)
                                                : RunSpmd(mesh, body);
  if (!status.ok()) return status;
  const size_t np = layout.params().size();
  if (options.comm != nullptr) {
    std::vector<Tensor>& g = final_locals[reporter];  // already global
    for (size_t k = 0; k < g.size() && g[k].defined(); ++k) {
      AddFinalTensor(layout, k, g[k], &result);
    }
  }
  for (size_t k = 0; options.comm == nullptr && k < 3 * np; ++k) {
    const ParamInfo& p = layout.params()[k % np];
    std::vector<Tensor> locals;
    for (int r = 0; r < mesh.size(); ++r) locals.push_back(final_locals[r][k]);
    if (!locals[0].defined()) continue;  // no moments without a step
    absl::StatusOr<Tensor> g = Assemble(mesh, p.spec, locals, p.spec.InputType(mesh));
    if (!g.ok()) return g.status();
    AddFinalTensor(layout, k, *g, &result);
  }
  result.steps_done = first_step + options.steps;
  if (!options.save_path.empty() && reporter == 0) {
    if (absl::Status s = SaveTrainResult(options.save_path, layout, result); !s.ok()) return s;
  }
  return result;
}

void AddFinalTensor(const GptLayout& layout, size_t k, Tensor global, TrainResult* result) {
  const size_t np = layout.params().size();
  std::vector<NamedTensor>& dst = k < np       ? result->params
                                  : k < 2 * np ? result->adam_state.exp_avg
                                               : result->adam_state.exp_avg_sq;
  dst.push_back({layout.params()[k % np].name, std::move(global)});
}

absl::Status SaveTrainResult(const std::string& path, const GptLayout& layout,
                             const TrainResult& result) {
  const bool has_moments = result.adam_state.exp_avg.size() == layout.params().size();
  return SaveGpt(path, layout, result.params, has_moments ? &result.adam_state : nullptr,
                 result.steps_done);
}

}  // namespace shardmap
