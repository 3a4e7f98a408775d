// Llama 3 (Hugging Face's LlamaForCausalLM) as per-device code on a mesh: the second
// implementation of the model contract (models/model/model.h), registered as "llama3"
// (llama_spec.cc).
//
//   LlamaConfig cfg{.layers = 2, .d_model = 32, .heads = 4, .kv_heads = 2, .ffn_dim = 96,
//                   .vocab = 64, .seq = 8};
//   absl::StatusOr<LlamaLayout> m = LlamaLayout::Create(*ParseMesh("dp_shard=2,tp=2"), cfg,
//                                                       /*sp=*/true);
//   std::vector<NamedTensor> init = m->Init(/*seed=*/1);
//   // per device: Value loss = ModelLoss(*m, ParamUse(*m, local_params), ids, targets, tokens);
//
// Model: token embedding (no positions), pre-norm blocks x + attn(rms(x)), then + mlp(rms(.)),
// RMSNorm (eps norm_eps, in the compute dtype), rotary embeddings on q and k (theta rope_theta,
// HF's rotate_half halves), grouped-query causal attention (query head h reads kv head
// h / (heads / kv_heads), as HF's repeat_kv), SwiGLU MLP down(silu(gate(x)) * up(x)), final
// RMSNorm, untied lm_head, mean cross-entropy. No biases, no dropout, no rope scaling.
//
// Parameters carry Hugging Face's names and nn.Linear's [out, in] layouts, so checkpoints are the
// parameters as they are. Parallelism (torchtitan's plan, models/parallel/parallel_dims.h):
//   tp   q/k/v and gate/up column-parallel (dim 0 of the weight), o and down row-parallel (dim 1),
//        embed_tokens and lm_head vocab-parallel (dim 0) with the vocab-parallel cross-entropy;
//        q heads and kv heads split over tp (tp must divide kv_heads);
//   sp   the norms run on rows S0 on tp between TP regions;
//   dp, dp_shard (FSDP: the first dim tp leaves whole that dp_shard divides), dp_replicate;
//   cp   ring attention over the load-balanced chunks; rotary positions are the chunks' global
//        positions (LoadBalancedPosition);
//   recompute  full (ModelBlock) or selective (the attention core under a checkpoint);
//   compute    mixed precision: parameters cast at use (ParamUse), the loss in dtype.
#ifndef SHARDMAP_MODELS_LLAMA_LLAMA_MODEL_H_
#define SHARDMAP_MODELS_LLAMA_LLAMA_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model/model.h"
#include "models/model/registry.h"
#include "models/parallel/layers.h"
#include "models/parallel/parallel_dims.h"
#include "models/parallel/recompute.h"
#include "shardmap/mesh.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

struct LlamaConfig {
  int64_t layers = 2;
  int64_t d_model = 32;
  int64_t heads = 4;
  int64_t kv_heads = 2;  // divides heads (grouped-query attention; == heads: multi-head)
  int64_t ffn_dim = 96;  // SwiGLU width (LlamaFfnDim gives Meta's rule)
  int64_t vocab = 64;
  int64_t seq = 8;
  double rope_theta = 500000;  // Llama 3 (Meta's params.json; HF config.json rope_theta)
  double norm_eps = 1e-5;      // Llama 3's rms_norm_eps
  DType dtype = DType::kF32;   // parameters, gradients, AdamW state, the loss
  std::optional<DType> compute;  // mixed precision's compute dtype (unset: dtype)
  RecomputeMode recompute = RecomputeMode::kNone;
  int64_t head_dim() const { return d_model / heads; }
  DType compute_dtype() const { return compute.value_or(dtype); }
};

// Meta's SwiGLU width rule (llama/model.py FeedForward; torchtitan's compute_ffn_hidden_dim):
// hidden = int(2 * 4d / 3); times ffn_dim_multiplier when given (int()); rounded up to
// multiple_of. 8B: (4096, 1024, 1.3) -> 14336; 70B: (8192, 4096, 1.3) -> 28672; 405B:
// (16384, 4096, 1.2) -> 53248.
int64_t LlamaFfnDim(int64_t d_model, int64_t multiple_of,
                    std::optional<double> ffn_dim_multiplier = std::nullopt);

// A named shape: "llama3_debug" (torchtitan's debugmodel), "llama3_8b", "llama3_70b",
// "llama3_405b". NotFound listing the names otherwise.
absl::StatusOr<LlamaConfig> LlamaPreset(const std::string& name);
std::vector<std::string> LlamaPresetNames();

// The config the command line names (models/model/registry.h): the preset, then the explicit
// shape flags over it. kv_heads / ffn_dim unset or 0: the preset's, or without a preset heads
// and LlamaFfnDim(d_model, 256); rope_theta / norm_eps unset or 0: the preset's (Llama 3's).
// InvalidArgument for what Llama 3 does not have (--experts), an unknown preset, a bad --dtype.
absl::StatusOr<LlamaConfig> LlamaConfigFromArgs(const ModelArgs& args);

class LlamaLayout : public Model {
 public:
  // Checks the config (sizes >= 1, heads divisible by kv_heads, d_model by heads, an even
  // head_dim for the rotary halves) and the mesh (tp divides kv_heads, ffn_dim and vocab; 2*cp
  // divides seq; no ep axis: Llama 3 has no experts). Errors name the quantity and the fix.
  static absl::StatusOr<LlamaLayout> Create(const Mesh& mesh, const LlamaConfig& cfg, bool sp);

  const LlamaConfig& config() const { return cfg_; }
  // Generation continues a context: the rotary positions of every block start at `offset`
  // (Embed takes the same offset and refuses another one). Not with cp.
  absl::StatusOr<LlamaLayout> WithPositionOffset(int64_t offset) const;
  int64_t position_offset() const { return position_offset_; }

  std::string name() const override { return "llama3"; }
  const ModelShape& shape() const override { return shape_; }
  const ParallelDims& dims() const override { return dims_; }
  TensorParallel tp() const override { return tp_; }
  const std::vector<ParamInfo>& params() const override { return params_; }
  std::unique_ptr<Model> WithRecompute(RecomputeMode mode) const override;
  std::string Describe() const override;
  std::vector<NamedTensor> Init(uint64_t seed) const override;
  Value Embed(const ParamFn& use, const Value& ids, int64_t position_offset = 0) const override;
  Value Block(const ParamFn& use, int64_t i, const Value& x, TypeTrace* types = nullptr,
              MoeAccum* moe = nullptr) const override;
  Value Head(const ParamFn& use, const Value& x, const Value& targets,
             int64_t global_tokens) const override;
  Value Logits(const ParamFn& use, const Value& x) const override;
  // KV-cache decoding (model.h; llama_decode.cc): the cache keeps kv_heads (this device's share
  // under tp), and the rotary positions continue from the cached length.
  absl::Status KvCacheSupport() const override { return absl::OkStatus(); }
  Value DecodeEmbed(const ParamFn& use, const Value& ids, int64_t position) const override;
  Value DecodeBlock(const ParamFn& use, int64_t i, const Value& x, KvCache& cache) const override;
  Value DecodeLogits(const ParamFn& use, const Value& x) const override;
  double FlopsPerToken() const override;
  // "model" = "llama3" and the config as "llama3.*" (layers, d_model, heads, kv_heads, ffn_dim,
  // vocab, seq, rope_theta, norm_eps, dtype, compute).
  std::map<std::string, std::string> ShapeMetadata() const override;

 private:
  ParallelDims dims_;
  LlamaConfig cfg_;
  ModelShape shape_;
  TensorParallel tp_;
  std::vector<ParamInfo> params_;
  int64_t position_offset_ = 0;
};

// Parameters (embedding lookup excluded, lm_head and norms included) and training FLOPs per token:
// 6N + 12 L H Q T (nanoGPT's / PaLM's counting; q, k, v at their real GQA sizes).
double LlamaMatmulParameterCount(const LlamaConfig& c);
double LlamaFlopsPerToken(const LlamaConfig& c);

// Initial tensors (global, params() order): Hugging Face's initializer_range N(0, 0.02) for the
// embedding and every linear, torchtitan's depth init for the output projections (o_proj,
// down_proj of layer l: N(0, 0.02 / sqrt(2 (l + 1)))), RMSNorm weights 1. Each parameter draws
// from its own seed (seed * 1000003 + its index), so any mesh starts from the same tensors.
std::vector<NamedTensor> InitLlama(const LlamaConfig& cfg, uint64_t seed);

// The rotary tables of `positions`: cos and sin [n, 1, head_dim] in `dtype`, computed in f64:
// inv_freq_i = theta^(-2i/head_dim), angle = pos * inv_freq_i, both halves the same (HF).
struct RopeTables {
  Tensor cos, sin;
};
RopeTables MakeRopeTables(const std::vector<int64_t>& positions, int64_t head_dim, double theta,
                          DType dtype);

// x * cos + rotate_half(x) * sin of x [n, heads, head_dim], rotate_half(x) = [-x2, x1] over the
// halves of the last dim (HF's apply_rotary_pos_emb), by the fused shardmap/rope_ops.h.
// cos/sin [n, 1, head_dim] typed as x's rows.
Value ApplyRope(const Value& x, const Value& cos, const Value& sin);

// The rotary position of row r of `rows` rows (batch-major sequences of local_seq = seq / cp
// tokens on this device): offset + r % seq, or under cp (cp > 1) the load-balanced chunk's
// global position.
std::vector<int64_t> RopePositions(int64_t rows, int64_t seq, int cp, int cp_index,
                                   int64_t offset);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_LLAMA_LLAMA_MODEL_H_
