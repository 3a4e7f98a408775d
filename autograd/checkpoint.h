// checkpoint: activation recomputation on the tape (torch.utils.checkpoint, jax.checkpoint).
//
//   // per-device code, under a tape (value_and_grad, a trainer's step); w: a parameter leaf
//   Value y = checkpoint(
//       [w](const std::vector<Value>& in) { return gelu(in[0].matmul(w)).matmul(w, false, true); },
//       {x});
//   // The tape now holds ONE node ("checkpoint") for all of it, whose inputs are x and w.
//
// The forward runs fn without keeping its intermediates: fn's ops are recorded on a throw-away
// probe (each op's VJP closure, and with it what the op saved, is dropped at once), which learns
// every differentiable value fn reads from outside: the explicit inputs and values fn captured
// (e.g. parameters obtained through a callback, GptParamUse's FSDP all_gather of a shard). They
// become the node's inputs, so their cotangents flow out; only they stay referenced (by the
// node's closure). The node's VJP runs fn again on a fresh tape (its ops recorded, its collectives
// logged as backward and CollectiveRecord::recomputed, IsRecomputing() true) and backpropagates
// the node's cotangent through it. An all_gather fn issues on a captured shard is thus issued
// again in the backward, and its transpose (reduce_scatter) gives the shard's cotangent.
// Computation is deterministic (no RNG), so the recomputed values are the forward's bit for bit
// and the gradients equal those of the run without checkpoint bitwise, as long as each input's
// uses lie inside fn or outside it (a value used both inside and after fn gets its cotangents
// summed in another order).
//
// Several outputs: the multi-output form records one recompute node (inputs: the captured
// values; output: a scalar token) plus one node per differentiable output reading the token, so
// cotangents of any subset of the outputs reach one recomputation. An output fn returns
// unchanged from outside stays that value; a constant output (nothing differentiable behind it)
// stays a constant.
//
// Rules: fn must compute the same shapes, dtypes and SPMD types every time it runs (it runs once
// in the forward and once per backward pass that reaches it); values computed inside fn leave it
// only through its outputs; fn and what it captures must outlive the backward (capture by value);
// side effects (counters, traces) happen twice: guard them with IsRecomputing(). `name` is the
// tape's op name (a string literal: the tape keeps the pointer). Without a tape recorder on the
// thread (evaluation, no-grad scopes) checkpoint is just fn(inputs). Nesting works (an inner
// checkpoint inside fn is one node of the outer recomputation).
//
// Errors (OpError): fn reads more than kMaxCheckpointInputs differentiable values from outside
// (split it); on recompute, fn returns a different number of outputs, an output of another
// shape, dtype or SPMD type, a constant where the forward's was differentiable, or reads a value
// it did not read in the forward; more than kMaxCheckpointDepth nested recomputations.
#ifndef SHARDMAP_AUTOGRAD_CHECKPOINT_H_
#define SHARDMAP_AUTOGRAD_CHECKPOINT_H_

#include <functional>
#include <vector>

#include "shardmap/value.h"

namespace shardmap {

inline constexpr int kMaxCheckpointInputs = 32;  // a tape node's inputs
inline constexpr int kMaxCheckpointDepth = 126;  // nested checkpoints / recomputations

using CheckpointFn = std::function<std::vector<Value>(const std::vector<Value>& inputs)>;
using CheckpointFn1 = std::function<Value(const std::vector<Value>& inputs)>;

// Runs fn(inputs) keeping only its inputs for the backward (see above); returns its outputs.
std::vector<Value> checkpoint(CheckpointFn fn, std::vector<Value> inputs,
                              const char* name = "checkpoint");
// The one-output form: ONE tape node.
Value checkpoint(CheckpointFn1 fn, std::vector<Value> inputs, const char* name = "checkpoint");

// True while a checkpointed function runs again in the backward (on this thread).
bool IsRecomputing();

}  // namespace shardmap

#endif  // SHARDMAP_AUTOGRAD_CHECKPOINT_H_
