// FSDP's parameters at use in the overlapped step (FSDP2's schedule): each unit's (the
// embeddings, each block, the final LayerNorm) shards are all-gathered in the compute dtype by
// one flat call (shardmap/flat_gather.h: FSDP2's flat buffer) on the communicator's
// started-call lane, `prefetch` units ahead of the one computing, in the
// forward and again in the backward; a block's gathered parameters are freed after its forward
// and gathered again just before its backward (reshard_after_forward), so at most prefetch + 1
// blocks are gathered at once; the reduce-scatter of each block's gradients starts as soon as
// they are final and overlaps the backward of the blocks before it (all_gather_start's
// transpose).
//
//   FsdpParams fsdp(layout, watched, {.prefetch = 1, .reshard_after_forward = true}, tape);
//   Value loss;
//   { ScopedRecorder r(&tape); loss = ModelLoss(layout, fsdp.Use(), ids, targets, tokens); }
//   tape.Backward(loss, seed, watched);   // regathers block by block (Tape::AtBackwardBelow)
//
// Why it is correct. The tape's closures keep the gathered tensors; a freed one keeps its
// shape and gets its bytes back (Tensor::RefillBuffer) from a trigger the tape runs before the
// VJPs of the block's first op (AtBackwardBelow at the slot where the block's forward began).
// The values are those of GptParamUse (gather, then cast: the same bits), the gradients those
// of all_gather's reduce-scatter in the parameter's dtype, so the step is bitwise the
// reference schedule's (models/train/gpt_overlap_test.cc). Not resharded: the embedding and
// head units (wte is used at both ends of the step) and the last block (its backward comes
// right after its forward), as torchtitan does. The flat calls move the per-parameter calls'
// bits (each element is summed in rank order wherever it sits in the buffer).
//
// Padding (ParamInfo::fsdp_pad: a dim dp_shard does not divide): the shards and the flat
// buffer hold the padded rows; each gathered parameter is trimmed to its global shape by a
// taped slice right after the wait (its VJP appends zero rows to the cotangent), and what is
// held, freed, refilled and counted in peak_gathered_bytes() is the trimmed tensor.
#ifndef SHARDMAP_MODELS_TRAIN_FSDP_PARAMS_H_
#define SHARDMAP_MODELS_TRAIN_FSDP_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "models/gpt/gpt_model.h"
#include "shardmap/flat_gather.h"
#include "shardmap/value.h"

namespace shardmap {

// FSDP's unit of a parameter is its forward unit (ParamInfo::unit.Index: 0 the embedding, 1 + i
// block i, layers + 1 the head).

struct FsdpSchedule {
  int prefetch = 1;                   // units gathered ahead of the one computing (>= 1)
  bool reshard_after_forward = true;  // free a block's gathered parameters after its forward
};

class FsdpParams {
 public:
  // params: this rank's shards in layout order, watched on `tape` (which must outlive the
  // backward pass; so must this object). recorder: what records on that tape in the forward
  // (the tape itself by default, or a TracingRecorder over it): the gathers are recorded there
  // even when the first use is inside a recomputed block (autograd/checkpoint.h), whose
  // forward records elsewhere; the block then takes them as captured inputs. Throws OpError
  // (a prefetch below 1).
  FsdpParams(const Model& layout, const std::vector<Value>& params, FsdpSchedule schedule,
             Tape& tape, TapeRecorder* recorder = nullptr);
  FsdpParams(const FsdpParams&) = delete;
  FsdpParams& operator=(const FsdpParams&) = delete;

  // The parameters at use (valid while this object lives).
  ParamFn Use();

  // The most bytes of gathered FSDP parameters alive at once (forward and backward so far).
  int64_t peak_gathered_bytes() const { return peak_bytes_; }

 private:
  struct Unit {
    std::vector<int> params;  // layout indices
    bool reshard = false;
    bool waited = false, released = false;
    PendingFlatGather pending;  // its FSDP parameters' one gather (forward or regather)
  };
  Value Get(int param);
  void Enter(int unit);
  void Start(int unit, bool taped);
  void Wait(int unit, bool refill);
  void Release(int unit);
  void Regather(int unit);  // the backward trigger of `unit`
  void PrefetchBelow(int unit);  // starts the regathers of the `prefetch` units below `unit`
  void Count(int64_t bytes);

  const Model& layout_;
  const std::vector<Value>& params_;
  FsdpSchedule schedule_;
  Tape& tape_;
  TapeRecorder* recorder_;
  std::vector<int> unit_of_;
  std::vector<Unit> units_;
  std::vector<Value> values_;  // per parameter: its value at use
  int current_ = -1;
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_FSDP_PARAMS_H_
