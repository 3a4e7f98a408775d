// GPT-2 (OpenAI / Hugging Face definition) as per-device code and its named parameter tree on a
// mesh (GptLayout: every parameter's PartitionSpec from the mesh's ParallelDims). The trainer is
// models/train/trainer.h; models/gpt.h includes both.
//
//   GptConfig cfg{.layers = 2, .d_model = 16, .heads = 4, .vocab = 32, .seq = 8};
//   absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp_shard=2,tp=2"), cfg,
//                                                        /*sp=*/true);
//   std::vector<NamedTensor> init = InitGpt(cfg, /*seed=*/1);   // global tensors
//   // inside RunSpmd: Value loss = GptLoss(*layout, local_params, ids, targets, tokens);
//
// Model: learned token (wte) and position (wpe) embeddings, pre-LN blocks (LayerNorm eps 1e-5
// with biases), causal attention with biases scaled by 1/sqrt(head_dim), tanh GELU MLP (4d),
// final LayerNorm, lm_head tied to wte, loss = mean cross-entropy over all tokens, no dropout.
//
// Parallelism comes from the parameters' PartitionSpecs, not from gradient code (what each axis
// shards: models/parallel/parallel_dims.h):
//   dp            params R over dp; each gradient (P on dp) is all_reduced once.
//   dp_shard      (FSDP / ZeRO-3) params S over dp_shard (the first dim tp leaves whole that
//                 dp_shard divides; else replicated there), all_gathered at use; the transpose
//                 reduce-scatters the gradient; AdamW updates the local shard only.
//   dp_replicate  (with dp_shard: HSDP) like dp.
//   tp            Megatron: c_attn/c_fc column-parallel, c_proj row-parallel, wte vocab-parallel
//                 (also the lm_head), vocab-parallel cross-entropy; heads split over tp.
//   sp            activations S0 on tp between TP regions.
//   cp            context parallelism: each sequence is cut into 2*cp chunks and device i holds
//                 chunks i and 2cp-1-i (load-balanced causal work); attention is ring attention
//                 (models/parallel/ring_attention.h); params R over cp, their gradients (P on cp) are
//                 all_reduced with the data-parallel ones; positions are global positions.
//   ep            expert parallelism (with GptConfig::moe, models/parallel/moe.h): a batch axis for the
//                 dense layers; the experts of each MoE MLP are split over it (or over the
//                 batch axes named in moe.expert_axes) and tokens reach them by all_to_all.
//   pp            pipeline stages (the trainer's pipeline strategy); GptEmbed / GptBlock /
//                 GptHead are its stage pieces.
// Batch rows are split over the batch axes (dp_replicate, dp_shard, dp, ep, in mesh order), then
// over cp (LoadBalancedRows orders them).
//
// Parameter layouts are GPT-2's except c_attn, held as [d, 3, d] / [3, d] (q|k|v split out so
// heads shard over tp); checkpoints reshape it to GPT-2's [d, 3d] / [3d].
#ifndef SHARDMAP_MODELS_GPT_GPT_MODEL_H_
#define SHARDMAP_MODELS_GPT_GPT_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/batch_order.h"
#include "models/parallel/layers.h"
#include "models/parallel/moe.h"
#include "models/components/optimizer.h"
#include "models/model/model.h"
#include "models/parallel/parallel_dims.h"
#include "models/parallel/recompute.h"
#include "shardmap/context.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

struct GptConfig {
  int64_t layers = 2;
  int64_t d_model = 16;
  int64_t heads = 4;
  int64_t vocab = 32;
  int64_t seq = 8;
  DType dtype = DType::kF32;  // parameters (master weights), gradients, AdamW state, the loss
  // Mixed precision: the dtype of the computation (e.g. kBF16 with dtype kF32). Each parameter
  // is cast to it at its use inside the per-device step (after an FSDP all_gather, so gradients
  // are reduce-scattered / all_reduced in `dtype`); activations, the tensor-parallel collectives
  // and ring attention run in it; the logits are cast back to `dtype` before the cross-entropy.
  // Unset: `dtype` (no casts).
  std::optional<DType> compute;
  // Mixture of experts in place of every block's MLP (moe.experts > 0): parameters
  // h.{i}.mlp.router.weight [d, E] and h.{i}.mlp.experts.{c_fc,c_proj}.{weight,bias}
  // ([E, d, 4d], [E, 4d], [E, 4d, d], [E, d]); each sequence is one routing group; the loss adds
  // aux_loss_coef * the layers' load-balancing losses. expert_axes empty: "ep" when the mesh has
  // it; they must be batch axes (dp_replicate, dp_shard, dp, ep). Not with cp > 1.
  MoeConfig moe;
  // Activation recomputation (models/parallel/recompute.h; models/gpt/gpt_recompute.h): full
  // keeps only each block's input and recomputes the block in the backward, selective only the
  // attention core. Same numbers bitwise; less activation memory, more FLOPs.
  RecomputeMode recompute = RecomputeMode::kNone;
  int64_t head_dim() const { return d_model / heads; }
  DType compute_dtype() const { return compute.value_or(dtype); }
};

// The model's parameters on one mesh: names, specs, and the parallel layout.
class GptLayout : public Model {
 public:
  // Checks that the mesh divides heads, vocab, d_model, 4*d_model (tp) and the FSDP dims, and
  // 2*cp divides seq; sp needs tp; an ep axis needs experts, which the expert axes divide.
  // Errors name the quantity, the axis and the fix.
  static absl::StatusOr<GptLayout> Create(const Mesh& mesh, const GptConfig& cfg, bool sp);

  const GptConfig& config() const { return cfg_; }
  // This layout with config().recompute = mode (nothing else depends on it).
  GptLayout WithRecomputeMode(RecomputeMode mode) const {
    GptLayout l = *this;
    l.cfg_.recompute = mode;
    l.shape_.recompute = mode;
    return l;
  }

  // The model contract (models/model/model.h).
  std::string name() const override { return "gpt2"; }
  const ModelShape& shape() const override { return shape_; }
  const ParallelDims& dims() const override { return dims_; }
  TensorParallel tp() const override { return tp_; }
  const std::vector<ParamInfo>& params() const override { return params_; }
  std::unique_ptr<Model> WithRecompute(RecomputeMode mode) const override {
    return std::make_unique<GptLayout>(WithRecomputeMode(mode));
  }
  std::string Describe() const override;
  std::vector<NamedTensor> Init(uint64_t seed) const override;
  Value Embed(const ParamFn& use, const Value& ids, int64_t position_offset = 0) const override;
  Value Block(const ParamFn& use, int64_t i, const Value& x, TypeTrace* types = nullptr,
              MoeAccum* moe = nullptr) const override;
  Value Head(const ParamFn& use, const Value& x, const Value& targets,
             int64_t global_tokens) const override;
  Value Logits(const ParamFn& use, const Value& x) const override;
  // KV-cache decoding (model.h; gpt_decode.cc): dense models on any mesh without pp.
  absl::Status KvCacheSupport() const override;
  Value DecodeEmbed(const ParamFn& use, const Value& ids, int64_t position) const override;
  Value DecodeBlock(const ParamFn& use, int64_t i, const Value& x, KvCache& cache) const override;
  Value DecodeLogits(const ParamFn& use, const Value& x) const override;
  double FlopsPerToken() const override;
  // Checkpoints hold GPT-2's names and layouts: c_attn as [d, 3d] / [3d] (Gpt2Shape).
  Shape CheckpointShape(const ParamInfo& p) const override;
  // GptConfigMetadata (the "gpt.*" keys) and "model": "gpt2".
  std::map<std::string, std::string> ShapeMetadata() const override;

 private:
  ParallelDims dims_;
  GptConfig cfg_;
  ModelShape shape_;
  TensorParallel tp_;
  std::vector<ParamInfo> params_;
};

// GPT-2's shape of a parameter (c_attn flattened back to [d, 3d] / [3d]).
Shape Gpt2Shape(const ParamInfo& p);

// The configuration as checkpoint metadata strings: "gpt.layers", "gpt.d_model", "gpt.heads",
// "gpt.vocab", "gpt.seq", "gpt.dtype" (and "gpt.compute" when mixed), "gpt.moe.*"; add {"step", N}
// for a training state. GptConfigFromMetadata reads them back (expert_axes included), validated;
// its errors name the key and say to give the shape flags.
std::map<std::string, std::string> GptConfigMetadata(const GptConfig& config);
absl::StatusOr<GptConfig> GptConfigFromMetadata(const std::map<std::string, std::string>& m);

// GPT-2's parameter count and training FLOPs per token (nanoGPT's estimate_mfu: 6N + 12 L d seq,
// N without wpe, a lookup; MoE counts the experts a token visits).
double GptParameterCount(const GptConfig& c);
double GptFlopsPerToken(const GptConfig& c);

// GPT-2 initialisation (global tensors in the library layout, named as GptLayout lists them):
// weights N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2*layers)), biases 0, LayerNorms 1 / 0.
std::vector<NamedTensor> InitGpt(const GptConfig& cfg, uint64_t seed);

// Per-device forward: the mean cross-entropy's local share (P on the batch axes, R on tp).
// params: the local shards in layout order (leaves of a tape, or plain values); ids/targets:
// this rank's rows (int64 [rows], R on tp; under cp in the LoadBalancedRows order).
// moe: with a MoE model, this rank's dropped (token, expert) assignments and all its
// assignments are added to it.
Value GptLoss(const GptLayout& layout, const std::vector<Value>& params, const Value& ids,
              const Value& targets, int64_t global_tokens, TypeTrace* block0_types = nullptr,
              MoeStats* moe = nullptr);

// The pieces of GptLoss (pipeline stages run them separately). use(name): the parameter at use
// (GptParamUse: the local shard, all_gathered under FSDP). Under config().recompute == kFull,
// GptBlock keeps a copy of `use` (and the layout's address) for the backward, where the block
// runs again: `use` must not refer to the caller's locals (GptParamUse's does not). GptEmbed: token + position
// embeddings of `ids` [rows]; GptBlock: block i; GptHead: ln_f, the tied lm_head (use("wte"))
// and the mean cross-entropy's local share.
ParamFn GptParamUse(const GptLayout& layout, const std::vector<Value>& params);
Value GptEmbed(const GptLayout& layout, const ParamFn& use, const Value& ids);
Value GptBlock(const GptLayout& layout, const ParamFn& use, int64_t i, const Value& x,
               TypeTrace* types = nullptr, MoeAccum* moe = nullptr);
Value GptHead(const GptLayout& layout, const ParamFn& use, const Value& x, const Value& targets,
              int64_t global_tokens);
// GptLoss with the parameters at use given by `gathered` (GptLoss passes GptParamUse; the
// overlapped FSDP step passes its prefetching gatherer, models/train/fsdp_params.h). wte is
// asked for once, first.
Value GptLossWith(const GptLayout& layout, const ParamFn& gathered, const Value& ids,
                  const Value& targets, int64_t global_tokens, TypeTrace* block0_types = nullptr,
                  MoeStats* moe = nullptr);

// BatchAt (a step's sequential batch) is declared in models/data/batch_order.h, included above.

// The checks every trainer makes before its first step: at least seq+1 tokens, every id inside
// the vocabulary; and the initial parameters, one global tensor per layout parameter (in layout
// order) with the layout's shape and dtype. InvalidArgument naming the token or tensor.
absl::Status CheckTokens(const GptConfig& c, const std::vector<int64_t>& tokens);


}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_GPT_MODEL_H_
