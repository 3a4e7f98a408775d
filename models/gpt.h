// GPT-2 (OpenAI / Hugging Face definition) as per-device code, its named parameter tree and a
// data-, fully-sharded-, hybrid-sharded-, tensor- and sequence-parallel training loop that runs
// inside one SPMD program for the whole run.
//
//   GptConfig cfg{.layers = 2, .d_model = 16, .heads = 4, .vocab = 32, .seq = 8};
//   absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp_shard=2,tp=2"), cfg,
//                                                        /*sp=*/true);
//   TrainOptions opt{.steps = 3, .batch = 4};
//   absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, /*seed=*/1), tokens, opt);
//   // r->losses[s]: the mean cross-entropy of step s; r->params: the trained global tensors.
//   cfg.compute = DType::kBF16;  // bf16 mixed precision: f32 master weights, bf16 compute
//
// Model: learned token (wte) and position (wpe) embeddings, pre-LN blocks (LayerNorm eps 1e-5
// with biases), causal attention with biases scaled by 1/sqrt(head_dim), tanh GELU MLP (4d),
// final LayerNorm, lm_head tied to wte, loss = mean cross-entropy over all tokens, no dropout.
//
// Parallelism comes from the parameters' PartitionSpecs, not from gradient code:
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
//                 (models/ring_attention.h); params R over cp, their gradients (P on cp) are
//                 all_reduced with the data-parallel ones; positions are global positions.
//   ep            expert parallelism (with GptConfig::moe, models/moe.h): a batch axis for the
//                 dense layers; the experts of each MoE MLP are split over it (or over the
//                 batch axes named in moe.expert_axes) and tokens reach them by all_to_all.
// Batch rows are split over the batch axes (dp_replicate, dp_shard, dp, ep, in mesh order), then
// over cp (LoadBalancedRows orders them); the mesh axes are ordered pp, dp_replicate, dp_shard,
// dp, ep, cp, tp whatever order the user wrote. A pp axis > 1 (pipeline stages) trains with
// TrainGptPipeline (models/gpt_pipeline.h); GptEmbed / GptBlock / GptHead are its stage pieces.
//
// Parameter layouts are GPT-2's except c_attn, held as [d, 3, d] / [3, d] (q|k|v split out so
// heads shard over tp); checkpoints reshape it to GPT-2's [d, 3d] / [3d].
#ifndef SHARDMAP_MODELS_GPT_H_
#define SHARDMAP_MODELS_GPT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt_layers.h"
#include "collectives/communicator.h"
#include "models/moe.h"
#include "models/optimizer.h"
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
  int64_t head_dim() const { return d_model / heads; }
  DType compute_dtype() const { return compute.value_or(dtype); }
};

// "dp=2,tp=2" -> a mesh with axes in the canonical order pp, dp_replicate, dp_shard, dp, ep, cp,
// tp.
// InvalidArgument for unknown axes, repeated axes, sizes < 1 or a malformed string.
absl::StatusOr<Mesh> ParseMesh(const std::string& text);

// One entry of the named parameter tree: the global layout and how it is split.
struct ParamInfo {
  std::string name;      // GPT-2 name, e.g. "h.0.attn.c_attn.weight"
  Shape global_shape;    // this library's layout (c_attn: [d, 3, d])
  PartitionSpec spec;    // over the mesh (tp and the FSDP axis)
  int fsdp_dim = -1;     // dim split over dp_shard (-1: replicated there)
  bool decay = false;    // AdamW weight decay (GPT-2 layout has >= 2 dims)
};

// The model's parameters on one mesh: names, specs, and the parallel layout.
class GptLayout {
 public:
  // Checks that the mesh divides heads, vocab, d_model, 4*d_model (tp) and the FSDP dims, and
  // 2*cp divides seq; sp needs tp; an ep axis needs experts, which the expert axes divide.
  // Errors name the quantity, the axis and the fix.
  static absl::StatusOr<GptLayout> Create(const Mesh& mesh, const GptConfig& cfg, bool sp);

  const Mesh& mesh() const { return mesh_; }
  const GptConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  int Find(const std::string& name) const;  // -1 when absent
  TensorParallel tp() const { return tp_; }
  const std::string& fsdp_axis() const { return fsdp_; }  // "" without dp_shard
  const std::vector<std::string>& batch_axes() const { return batch_axes_; }
  int batch_ways() const;  // product of the batch axes' sizes
  const std::string& cp_axis() const { return cp_; }  // "" without cp
  int cp_ways() const;                                 // 1 without cp
  const std::string& pp_axis() const { return pp_; }  // "" without pp
  int pp_ways() const;                                 // 1 without pp
  // Rows [rows, ...] of a batch: split over the batch axes, cp (and tp under SP).
  PartitionSpec RowSpec(bool with_sp) const;

 private:
  Mesh mesh_;
  GptConfig cfg_;
  TensorParallel tp_;
  std::string fsdp_;
  std::vector<std::string> batch_axes_;
  std::string cp_, pp_;
  std::vector<ParamInfo> params_;
};

// GPT-2 initialisation (global tensors in the library layout, named as GptLayout lists them):
// weights N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2*layers)), biases 0, LayerNorms 1 / 0.
std::vector<NamedTensor> InitGpt(const GptConfig& cfg, uint64_t seed);

// Per-device forward: the mean cross-entropy's local share (P on the batch axes, R on tp).
// params: the local shards in layout order (leaves of a tape, or plain values); ids/targets:
// this rank's rows (int64 [rows], R on tp; under cp in the LoadBalancedRows order).
// moe: with a MoE model, this rank's dropped (token, expert) assignments and all its
// assignments are added to it.
struct MoeStats {
  int64_t dropped = 0, dropped_tokens = 0, assignments = 0;
};
Value GptLoss(const GptLayout& layout, const std::vector<Value>& params, const Value& ids,
              const Value& targets, int64_t global_tokens, TypeTrace* block0_types = nullptr,
              MoeStats* moe = nullptr);

// The pieces of GptLoss (pipeline stages run them separately). use(name): the parameter at use
// (GptParamUse: the local shard, all_gathered under FSDP). GptEmbed: token + position
// embeddings of `ids` [rows]; GptBlock: block i; GptHead: ln_f, the tied lm_head (use("wte"))
// and the mean cross-entropy's local share.
using ParamFn = std::function<Value(const std::string&)>;
ParamFn GptParamUse(const GptLayout& layout, const std::vector<Value>& params);
Value GptEmbed(const GptLayout& layout, const ParamFn& use, const Value& ids);
// MoE blocks' side outputs, summed over blocks: the load-balancing loss (add it times
// moe.aux_loss_coef to the loss) and the drop counts; total_groups: sequences in the global batch
// (one routing group per sequence). GptBlock of a MoE model needs one.
struct MoeAccum {
  int64_t total_groups = 0;
  Value aux;
  MoeStats stats;
};
Value GptBlock(const GptLayout& layout, const ParamFn& use, int64_t i, const Value& x,
               TypeTrace* types = nullptr, MoeAccum* moe = nullptr);
Value GptHead(const GptLayout& layout, const ParamFn& use, const Value& x, const Value& targets,
              int64_t global_tokens);

struct StepInfo {
  int64_t step = 0;
  double loss = 0, grad_norm = 0;  // mean cross-entropy; global gradient norm before clipping
  double seconds = 0;              // rank 0's wall time of the step
  const std::vector<CollectiveRecord>* log = nullptr;  // rank 0's collectives of the step
  // MoE: (token, expert) assignments over capacity in the whole step (all layers, all ranks),
  // tokens that lost all their assignments (summed over layers), and all assignments; -1
  // without MoE.
  int64_t moe_dropped = -1, moe_assignments = -1, moe_dropped_tokens = -1;
};

// One span of a rank's timeline: a phase ("forward", "backward", "grad reduce", "optimizer"),
// a forward op (its time since the previous recorded op), a backward op (its VJP; category
// "backward op"), or a collective (bytes >= 0; category "collective" or "collective (backward)").
struct TraceEvent {
  std::string name, category;
  int rank = 0;
  double start_us = 0, duration_us = 0;
  int64_t bytes = -1;
};

struct TrainOptions {
  int64_t steps = 1;
  int64_t batch = 4;  // global sequences per step
  // Pipeline (TrainGptPipeline, pp > 1): microbatches per step and the schedule ("gpipe" or
  // "1f1b"); stage_layers: layers per stage (empty: as even as possible).
  int64_t microbatches = 1;
  std::string schedule = "1f1b";
  std::vector<int64_t> stage_layers;
  AdamWOptions adamw{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  double clip = 1.0;  // global-norm clipping (<= 0: off)
  // Called on rank 0 after each step.
  std::function<void(const StepInfo&)> on_step;
  bool trace = false;          // record TraceEvents of every rank (TrainResult::trace)
  TypeTrace* types = nullptr;  // rank 0's types inside block 0 during the first step
  // Checkpoints (gpt_checkpoint.h). init_path: parameters from a GPT-2 safetensors file (each
  // rank reads its blocks; `init` may then be empty). resume_path: parameters, AdamW moments and
  // the step count from a file written with save_path; training continues at that step.
  std::string init_path, resume_path, save_path;
  // Multi-process (e.g. Gloo, started by collectives/launch): run only this process's rank over
  // `comm` (its world, comm->size() == the mesh size) instead of RunSpmd's in-process ranks.
  // Every rank then reports its own view (the loss and norm are the same on every rank; log,
  // bytes and trace are this rank's, on_step runs on it), the parameters and moments are
  // all_gathered after the last step into TrainResult on every rank, and rank 0 alone writes
  // save_path. nullptr: in-process.
  collectives::Communicator* comm = nullptr;
};

// AdamW moments as global tensors, in layout order.
struct AdamState {
  std::vector<NamedTensor> exp_avg, exp_avg_sq;
};

struct TrainResult {
  std::vector<double> losses;          // per step
  std::vector<double> grad_norms;      // per step, before clipping
  std::vector<NamedTensor> params;     // trained, global (assembled)
  // "rank 0" below: the reporting rank (rank 0 in-process, this process's rank with comm).
  std::vector<CollectiveRecord> log;   // rank 0's collectives of the last step
  int64_t param_bytes_per_rank = 0;    // rank 0: parameters
  int64_t optimizer_bytes_per_rank = 0;  // rank 0: gradients + AdamW moments
  // Rank 0, first step: bytes of the tensors the taped forward ops produced (what the tape keeps
  // for the backward, at most), and the largest of them (the attention scores at long seq).
  int64_t activation_bytes_per_rank = 0;
  int64_t largest_activation_bytes = 0;
  // Rank 0, first step: the tape's peak of saved activation bytes (Tape::peak_saved_bytes).
  int64_t peak_activation_bytes_per_rank = 0;
  // Pipeline runs, last step, mean over ranks: the fraction of the step's timetable a rank
  // spent outside forwards and backwards (the measured bubble).
  double pipeline_bubble = 0;
  AdamState adam_state;                // trained moments, global
  std::vector<TraceEvent> trace;       // with options.trace: every rank's events
  int64_t steps_done = 0;              // the step count after the run (resumed step + steps)
  std::vector<int64_t> moe_dropped;    // MoE: dropped assignments per step (StepInfo's)
};

// Sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T + T + 1) of `tokens`, wrapping around
// (inputs the first T, targets the last T). Returns [B, T] ids and targets (int64).
void BatchAt(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
             Tensor* ids, Tensor* targets);

// The checks every trainer makes before its first step: at least seq+1 tokens, every id inside
// the vocabulary; and the initial parameters, one global tensor per layout parameter (in layout
// order) with the layout's shape and dtype. InvalidArgument naming the token or tensor.
absl::Status CheckTokens(const GptConfig& c, const std::vector<int64_t>& tokens);
absl::StatusOr<std::vector<Tensor>> MatchInitialParams(const GptLayout& layout,
                                                       const std::vector<NamedTensor>& init);

// For trainers (TrainGpt, TrainGptPipeline): index k of the 3 * params tensors a rank ends with
// (parameters, then exp_avg, then exp_avg_sq, each in layout order) -> the result's named tensor.
void AddFinalTensor(const GptLayout& layout, size_t k, Tensor global, TrainResult* result);
// --save: the result's parameters (and AdamW moments once a step ran) at result.steps_done.
absl::Status SaveTrainResult(const std::string& path, const GptLayout& layout,
                             const TrainResult& result);

// Trains inside one RunSpmd over layout.mesh(): each rank holds its shards of the parameters
// and AdamW state for the whole run. init: global tensors named as the layout.
absl::StatusOr<TrainResult> TrainGpt(const GptLayout& layout, const std::vector<NamedTensor>& init,
                                     const std::vector<int64_t>& tokens,
                                     const TrainOptions& options);

// Global-norm clipping coefficient of PyTorch's clip_grad_norm_: min(1, max / (norm + 1e-6)).
double ClipCoefficient(double norm, double max_norm);

// The squared global norm of typed gradients, the same on every rank: sharded parts summed over
// their axes, replicated parts counted once (one all_reduce over every axis).
double GlobalGradNormSquared(const std::vector<Value>& grads);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_H_
