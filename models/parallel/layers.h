// Transformer layers as per-device code over typed Values: each is a small struct of parameters
// (local shards) plus a call operator. Activations are 2-D [rows, d]: rows are the flattened
// (batch, position) tokens, split over the batch axes (S0 on dp) and, with sequence parallelism,
// also over tp (S0 on (dp..., tp), tp last in mesh order).
//
//   TensorParallel tp{"tp", /*sp=*/true};
//   ColumnParallelLinear fc{w1, b1, tp};          // w1 [d, h] S1 on tp, b1 [h] S0 on tp
//   RowParallelLinear proj{w2, b2, tp};           // w2 [h, d] S0 on tp, b2 [d] R
//   Value h = fc(x);                              // SP: all_gather(x, 0, tp) first; h S1 on tp
//   Value y = proj(gelu(h));                      // P on tp -> reduce_scatter (SP) / all_reduce
//
// With tp.axis empty every layer is the plain single-device computation (no collective), so the
// same code is the unsharded reference of the tests.
#ifndef SHARDMAP_MODELS_PARALLEL_LAYERS_H_
#define SHARDMAP_MODELS_PARALLEL_LAYERS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardmap/value.h"

namespace shardmap {

struct TensorParallel {
  std::string axis;  // "" = no tensor parallelism
  bool sp = false;   // sequence parallel: activations S0 on `axis` between TP regions
  bool on() const { return !axis.empty(); }
};

// (name, "f32[8,16]{dp:S0,tp:S1}") of intermediate values, recorded by rank 0 when a layer's
// `types` pointer is set (for printing what each device holds).
using TypeTrace = std::vector<std::pair<std::string, std::string>>;
void NoteType(TypeTrace* types, const std::string& name, const Value& v);

// Entering a TP region: SP activations are all_gathered over tp (S0 -> R on tp); otherwise x.
Value EnterTensorParallel(const Value& x, const TensorParallel& tp);
// Leaving it: a P on tp is reduce_scattered over rows (SP) or all_reduced.
Value LeaveTensorParallel(const Value& yp, const TensorParallel& tp);

// y = x @ weight + bias; weight [in, out] S1 on tp, bias [out] S0 on tp: y is S1 on tp.
struct ColumnParallelLinear {
  Value weight, bias;
  TensorParallel tp;
  Value operator()(const Value& x) const;
};

// y = reduce(x @ weight) + bias; x S1 and weight [in, out] S0 on tp (a partial sum), bias R.
struct RowParallelLinear {
  Value weight, bias;
  TensorParallel tp;
  Value operator()(const Value& x) const;
};

struct LayerNorm {
  Value weight, bias;
  double eps = 1e-5;
  Value operator()(const Value& x) const;
};

// Token embedding with the vocabulary split over tp (weight [vocab, d] S0 on tp): ids [rows]
// R on tp; the P lookup is all_reduced (or reduce_scattered over rows under SP).
struct VocabParallelEmbedding {
  Value weight;
  TensorParallel tp;
  Value operator()(const Value& ids) const;
};

// Per-row cross-entropy of logits [rows, vocab] that are S1 on tp (vocab-parallel, Megatron):
// max (no gradient: the loss does not depend on the shift), sum of exps and the picked logit
// are all_reduced over tp. targets [rows] R on tp. Returns [rows], R on tp. It is
// shardmap/loss_ops.h's vocab_parallel_cross_entropy over tp.axis (cross_entropy when tp is off).
Value VocabParallelCrossEntropy(const Value& logits, const Value& targets,
                                const TensorParallel& tp);

// GPT-2 MLP: c_proj(gelu_tanh(c_fc(x))).
struct Mlp {
  ColumnParallelLinear c_fc;
  RowParallelLinear c_proj;
  TypeTrace* types = nullptr;
  Value operator()(const Value& x) const;
};

// How CausalSelfAttention computes softmax(q k^T / sqrt(hd), causal) v.
enum class AttentionPath {
  // Fused on GPU tensors (shardmap/attention_ops.h: no [b, h, t, t] scores in memory; head_dim
  // <= 128), materialised on the CPU, where the einsum path is faster than the fused f64
  // reference (//bench:attention_bench). SHARDMAP_ATTENTION=materialised|fused in the
  // environment overrides this choice for every layer left at kAuto (benchmarks, A/B checks).
  kAuto,
  kFused,         // causal_attention (the CPU runs its f64 reference kernel)
  kMaterialised,  // einsum scores, causal_softmax, einsum (any device)
};

// The path kAuto picks for activations on `device` (after the environment override).
AttentionPath ResolveAttentionPath(AttentionPath path, const Device& device, int64_t head_dim);

// Causal multi-head self-attention with heads split over tp. c_attn_weight [d, 3, heads*hd]
// (the Conv1D [d, 3d] weight viewed with q|k|v split out) S2 on tp, c_attn_bias [3, heads*hd]
// S1 on tp; c_proj row-parallel. Scale 1/sqrt(head_dim); `path` says whether the scores are
// materialised (einsums + causal_softmax) or fused (causal_attention).
struct CausalSelfAttention {
  Value c_attn_weight, c_attn_bias;
  RowParallelLinear c_proj;
  int64_t head_dim = 0;
  int64_t seq = 0;  // tokens per sequence on this device (rows are batch-major; seq/cp with cp)
  TensorParallel tp;
  TypeTrace* types = nullptr;
  // Context parallelism (models/parallel/ring_attention.h): the rows hold this device's load-balanced
  // chunks of each sequence and the keys come round the ring over this axis. "" = off.
  std::string cp_axis;
  AttentionPath path = AttentionPath::kAuto;  // ignored under cp (ring attention)
  // Selective recomputation (models/parallel/recompute.h): the core (q * scale, scores, causal
  // softmax, the product with v; the ring attention under cp) runs under autograd's checkpoint,
  // so its [b, heads, t, t] tensors are recomputed in the backward instead of kept. Bitwise the
  // same gradients. No effect on the fused path (its kernel keeps no scores).
  bool recompute_core = false;
  Value operator()(const Value& x) const;
};

// Pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
struct Block {
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  Mlp mlp;
  TypeTrace* types = nullptr;  // also passed on to attn and mlp
  Value operator()(const Value& x) const;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_LAYERS_H_
