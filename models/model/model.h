// The model contract: everything the stack above shard_map needs from a model, and nothing more.
// The trainer, its pipeline strategy, FSDP units, recomputation, the gradient buckets,
// checkpoints, the sampler, shape-only profiling, MFU and the planner take a `const Model&`; a
// model is a class implementing it plus one registration (models/model/registry.h), as a
// torchtitan TrainSpec is. GPT-2 (models/gpt/gpt_model.h) and Llama 3 (models/llama/) are the
// two implementations.
//
//   std::unique_ptr<Model> m = *CreateModel("llama3", ModelArgs{.preset = "llama3_debug"},
//                                           *ParseMesh("dp_shard=2,tp=2"), /*sp=*/true);
//   std::vector<NamedTensor> init = m->Init(/*seed=*/1);      // global tensors, params() order
//   absl::StatusOr<TrainResult> r = Train(*m, init, tokens, options);   // models/train/trainer.h
//
// What a model provides:
//   shape()        the sizes every layer of the stack reads (layers, d_model, vocab, seq, dtypes,
//                  recomputation, MoE), plus the model's own config behind it;
//   params()       the parameter table: name, global shape, PartitionSpec on the mesh, the FSDP
//                  dim, AdamW decay, and the unit that uses it (embedding, block i, head) so that
//                  pipeline stages, FSDP units and recomputation can cut the model;
//   Init           global initial tensors, the same on any mesh;
//   Embed / Block / Head   the per-device forward in units (GptLoss is Embed, Blocks, Head);
//   Logits         the head without the loss, for generation;
//   KvCacheSupport / DecodeEmbed / DecodeBlock / DecodeLogits  optional: generation with a KV
//                  cache (kv_cache.h); without them the sampler recomputes the whole window;
//   FlopsPerToken  training FLOPs per token (forward + backward), for MFU and the planner;
//   CheckpointName / CheckpointShape  the names and shapes in checkpoints (Hugging Face's).
#ifndef SHARDMAP_MODELS_MODEL_MODEL_H_
#define SHARDMAP_MODELS_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/components/optimizer.h"
#include "models/model/kv_cache.h"
#include "models/parallel/layers.h"
#include "models/parallel/moe.h"
#include "models/parallel/parallel_dims.h"
#include "models/parallel/recompute.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

// The sizes every part of the stack reads. A model's own config (heads, kv_heads, ffn_dim, ...)
// stays in the model; these are the ones the trainer, the pipeline and the planner need.
struct ModelShape {
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;     // attention (query) heads
  int64_t kv_heads = 0;  // key/value heads (grouped-query attention; = heads without it)
  int64_t vocab = 0;
  int64_t seq = 0;  // tokens per training sequence (positions a model can embed)
  DType dtype = DType::kF32;    // parameters (master weights), gradients, AdamW state, the loss
  std::optional<DType> compute;  // mixed precision's compute dtype (unset: dtype)
  RecomputeMode recompute = RecomputeMode::kNone;
  MoeConfig moe;  // experts == 0: dense (the only choice for models without MoE)
  DType compute_dtype() const { return compute.value_or(dtype); }
  int64_t head_dim() const { return d_model / heads; }
};

// Which forward unit uses a parameter: the embedding, block `block`, or the head. Pipeline
// stages, FSDP units and recomputation cut the model at units.
struct ModelUnit {
  enum Kind { kEmbed, kBlock, kHead };
  Kind kind = kEmbed;
  int64_t block = -1;  // kBlock: the block index
  // The FSDP unit / order of use: embedding 0, block i -> 1 + i, head layers + 1.
  int Index(int64_t layers) const {
    return kind == kEmbed ? 0 : kind == kBlock ? static_cast<int>(1 + block)
                                               : static_cast<int>(layers + 1);
  }
};

// One entry of the parameter table: the global layout and how it is split.
struct ParamInfo {
  std::string name;      // the model's name, e.g. "h.0.attn.c_attn.weight"
  Shape global_shape;    // this library's layout (may differ from the checkpoint's)
  PartitionSpec spec;    // over the mesh (tp and the FSDP axis)
  int fsdp_dim = -1;     // dim split over dp_shard (-1: replicated there)
  // FSDP2's padding: zero rows appended to fsdp_dim so that dp_shard divides it (0 when it
  // does). Ranks store and the collectives move the padded tensor (StoredShape); a parameter at
  // use, a checkpoint and a TrainResult are global_shape (TrimFsdpPad). The padding stays zero:
  // its gradient is zero (the trim's VJP), so AdamW never moves it.
  int64_t fsdp_pad = 0;
  bool decay = false;    // AdamW weight decay (tensors of 2 or more dims in the model's layout)
  ModelUnit unit;        // the unit that uses it
  // An embedding-unit parameter the head uses too (GPT-2's tied wte): a pipeline's last stage
  // holds a copy, and the two copies' gradients are exchanged and summed.
  bool tied_to_head = false;
};

// FSDP padding (ParamInfo::fsdp_pad). The shape ranks shard: global_shape, fsdp_dim padded.
Shape StoredShape(const ParamInfo& p);
// Sets p->fsdp_dim / fsdp_pad over `shard` ranks among the dims `free` marks (not split by tp or
// the experts): the first free dim that `shard` divides (no padding), else the free dim whose
// padding to the next multiple of `shard` adds the fewest elements (FSDP2 always pads dim 0;
// [3, 1024] on 128 ranks pads 1024 x 3 -> 1024 x 128 there, 3 x 0 here). No free dim: unsharded.
void ChooseFsdpDim(const std::vector<bool>& free, int shard, ParamInfo* p);
// A tensor with fsdp_dim whole (a global parameter, or its tp shard) padded with zeros on
// fsdp_dim, and back (the identity without padding); other dims are left as they are. Throws
// OpError when fsdp_dim is not the expected size.
Tensor PadForFsdp(const Tensor& global, const ParamInfo& p);
Tensor TrimFsdpPad(const Tensor& stored, const ParamInfo& p);
// The taped trim of a gathered parameter (a slice: its VJP pads the gradient with zeros).
Value TrimFsdpPad(const Value& gathered, const ParamInfo& p);
// This rank's stored shard of a global parameter (padded, then split by p.spec).
Tensor ParamShard(const Tensor& global, const ParamInfo& p, const Mesh& mesh, int rank);

// A parameter at its use: the local shard, all_gathered under FSDP, cast to the compute dtype.
using ParamFn = std::function<Value(const std::string&)>;

// MoE blocks' side outputs. Dense models leave them untouched.
struct MoeStats {
  int64_t dropped = 0, dropped_tokens = 0, assignments = 0;
};
struct MoeAccum {
  int64_t total_groups = 0;  // sequences in the global batch (one routing group per sequence)
  Value aux;                 // summed load-balancing loss (times moe.aux_loss_coef in the loss)
  MoeStats stats;
};

class Model {
 public:
  virtual ~Model() = default;

  // The registered name ("gpt2", "llama3").
  virtual std::string name() const = 0;
  virtual const ModelShape& shape() const = 0;
  virtual const ParallelDims& dims() const = 0;
  virtual TensorParallel tp() const = 0;
  virtual const std::vector<ParamInfo>& params() const = 0;
  // This model with shape().recompute = mode (nothing else changes).
  virtual std::unique_ptr<Model> WithRecompute(RecomputeMode mode) const = 0;
  // A one-line description of the config, for run summaries ("llama3 8 layers d 64 heads 4/2
  // kv ffn 192 vocab 256 seq 32").
  virtual std::string Describe() const = 0;

  // Global initial tensors in params() order and layout, the same for any mesh.
  virtual std::vector<NamedTensor> Init(uint64_t seed) const = 0;

  // The per-device forward in units. ids: this rank's rows (int64 [rows], R on tp; under cp in
  // the LoadBalancedRows order; under SP Embed returns this rank's tp chunk of the rows).
  // position_offset: added to every position (generation continues a context; 0 in training).
  virtual Value Embed(const ParamFn& use, const Value& ids, int64_t position_offset = 0) const = 0;
  // Block i. types: rank 0's intermediate types (may be null); moe: a MoE model's accumulator.
  virtual Value Block(const ParamFn& use, int64_t i, const Value& x, TypeTrace* types = nullptr,
                      MoeAccum* moe = nullptr) const = 0;
  // The head and the mean cross-entropy's local share over global_tokens (P on the batch axes).
  virtual Value Head(const ParamFn& use, const Value& x, const Value& targets,
                     int64_t global_tokens) const = 0;
  // The head's logits [rows, vocab] (vocab-parallel: S1 on tp), for generation.
  virtual Value Logits(const ParamFn& use, const Value& x) const = 0;

  // Generation with a KV cache (optional). The rows are the next n tokens of one sequence, at
  // positions [cache.length(), + n), whole on every device: R on every axis but tp, which splits
  // the heads (and kv heads) as in training; never sequence-parallel, and no ring attention
  // under cp (each device attends over its own cache). KvCacheSupport: OK, or why this model
  // cannot decode with a cache (the default: it implements no Decode*); the sampler then
  // recomputes the whole window each token. DecodeBlock appends its keys and values to layer
  // i of the cache; DecodeLogits returns [n, vocab] S1 on tp. The defaults throw OpError.
  virtual absl::Status KvCacheSupport() const;
  virtual Value DecodeEmbed(const ParamFn& use, const Value& ids, int64_t position) const;
  virtual Value DecodeBlock(const ParamFn& use, int64_t i, const Value& x, KvCache& cache) const;
  virtual Value DecodeLogits(const ParamFn& use, const Value& x) const;

  // Training FLOPs per token (forward + backward, matmuls and attention; no recomputation), for
  // MFU (nanoGPT's / PaLM's 6N + 12 L H Q T counting) and the planner.
  virtual double FlopsPerToken() const = 0;

  // Checkpoints: the name and shape a parameter is saved under (e.g. Hugging Face's). The saved
  // tensor is the parameter reshaped (the same elements in the same order), so a rank reads its
  // block of the file directly. The defaults are the parameter's own.
  virtual std::string CheckpointName(const ParamInfo& p) const { return p.name; }
  virtual Shape CheckpointShape(const ParamInfo& p) const { return p.global_shape; }
  // The model's name ("model") and shape as checkpoint metadata, so that a checkpoint says what
  // it holds and --resume can rebuild the model from it.
  virtual std::map<std::string, std::string> ShapeMetadata() const = 0;

  // Derived (non-virtual) helpers.
  const Mesh& mesh() const { return dims().mesh(); }
  int Find(const std::string& name) const;  // -1 when absent
  std::string fsdp_axis() const { return dims().fsdp_axis(); }
  const std::vector<std::string>& batch_axes() const { return dims().batch_axes(); }
  int batch_ways() const { return dims().batch_ways(); }
  std::string cp_axis() const { return dims().cp_axis(); }
  int cp_ways() const { return dims().cp_ways(); }
  std::string pp_axis() const { return dims().pp_axis(); }
  int pp_ways() const { return dims().pp_ways(); }
  // Rows [rows, ...] of a batch: split over the batch axes, cp (and tp under SP).
  PartitionSpec RowSpec(bool with_sp) const;
};

// The loss of the whole forward with the parameters at use given by `use`: Embed, Blocks, Head
// (plus a MoE model's load-balancing loss). moe: this rank's drop counts are added to it.
Value ModelLoss(const Model& model, const ParamFn& use, const Value& ids, const Value& targets,
                int64_t global_tokens, TypeTrace* block0_types = nullptr,
                MoeStats* moe = nullptr);

// One cached decoding step (KvCacheSupport must be OK): ids [n] (R) continue the cached
// positions; returns the logits [1, vocab] of the last of them (S1 on tp) and advances the cache.
Value DecodeStep(const Model& model, const ParamFn& use, const Value& ids, KvCache& cache);

// [n, heads * hd] <-> [n, heads, hd] keeping a tp shard on the heads dim for any n (the split
// is a plain reshape; merging one row's single local head moves the heads dim first:
// shardmap/rules/type_rules_layout.h).
Value DecodeSplitHeads(const Value& x, int64_t head_dim);
Value DecodeMergeHeads(const Value& x);

// Causal attention of q [n, H, hd] at positions [L - n, L) over every cached position, k, v
// [L, KV, hd] (KV dividing H: grouped-query attention reads the cached kv heads directly, no
// copies): the fused causal_attention with q_offset L - n. Returns [n, H * hd].
Value CachedAttention(const Value& q, const Value& k, const Value& v);

// A parameter at use: FSDP shards all_gathered over the FSDP axis (the transpose reduce-scatters
// the gradient), cast to the compute dtype. It holds its own copy of `params` (a recomputed block
// calls it in the backward) and refers to `model`, which must outlive it.
ParamFn ParamUse(const Model& model, const std::vector<Value>& params);

// `gathered` with the parameters the head shares with the embedding (tied_to_head) gathered now,
// once, first (ModelLoss and generation use it: a tied embedding is all_gathered once under
// FSDP, not once per use).
ParamFn GatherTiedOnce(const Model& model, const ParamFn& gathered);

// The checks every trainer makes before its first step: at least seq+1 tokens, every id inside
// the vocabulary; and the initial parameters, one global tensor per parameter (in params()
// order) with its shape and dtype. InvalidArgument naming the token or tensor.
absl::Status CheckTokens(const ModelShape& s, const std::vector<int64_t>& tokens);
absl::StatusOr<std::vector<Tensor>> MatchInitialParams(const Model& model,
                                                       const std::vector<NamedTensor>& init);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_MODEL_MODEL_H_
