// FSDP inside a pipeline stage (pp x dp_shard), as torchtitan runs FSDP2 under pipeline
// parallelism: each of the stage's FSDP units (the embeddings, each block, the final LayerNorm,
// the last stage's tied wte) is all-gathered once per step, the gathered parameters are kept
// across the stage's microbatches (reshard_after_forward off under PP: regathering per
// microbatch would multiply the traffic by the microbatches), the gradients accumulate unsharded
// over the microbatches, and each unit's gradients are reduce-scattered once, when they are
// final in its chunk's last backward; then its gathered parameters are dropped.
//
//   StageFsdp fsdp(layout, plan, stage, params, {.overlap = true, .prefetch = 1}, &buckets);
//   PipelineStage ps;
//   ps.forward = [&](int mb, int chunk, const Value& x, const std::vector<Value>& watched) {
//     std::vector<Value> all = ...;   // watched by layout index
//     return blocks(fsdp.Use(all), x);
//   };
//   if (fsdp.overlapped()) ps.on_final_grad = fsdp.FinalGradHook();
//   PipelineResult run = RunPipeline(tt, "pp", ps, fsdp.params());   // the gathered leaves
//   std::vector<Value> grads = fsdp.Finish(std::move(run.grads));  // shard grads (or buckets)
//
// The schedules. What RunPipeline watches (params()) are the gathered parameters, in the
// master dtype (the tape's leaves: their gradients are the unsharded sums over microbatches);
// a parameter FSDP does not shard (fsdp_dim < 0) is watched as it is. A padded parameter's leaf
// is the gathered tensor trimmed to its global shape (ParamInfo::fsdp_pad), and its gradient is
// padded with zeros again before the reduce-scatter, so the microbatches use no padded copies. Use() returns them cast
// to the compute dtype at use, as GptParamUse (a recomputed block takes them as captured
// inputs).
//   overlap: the units are gathered by one flat call each (shardmap/flat_gather.h) in the
//     compute dtype on the started-call lane, in the first microbatch's forward order (chunk 0's
//     units, then chunk 1's ...), `prefetch` units ahead of the one computing (the first ones
//     when this object is made, so a later stage's gathers run in its warm-up bubble); until
//     gathered, a leaf is a tensor without a buffer (Tensor::ReleaseBuffer) that the gather
//     refills. The hook (RunPipeline's on_final_grad) collects each unit's final gradients, starts
//     one flat reduce-scatter for the unit (reduce_scatter_flat_start) as soon as the last one
//     arrives, frees the unit's gathered parameters, and waits the previous unit's scatter,
//     handing its shard gradients on (to the gradient buckets, whose all-reduces over
//     dp_replicate / tp then start during the backward too). Finish waits the rest.
//   off (the reference): one blocking all_gather per parameter before the first microbatch,
//     one blocking reduce_scatter per parameter after the last backward (Finish).
// Both sum each gradient element over the microbatches in the same order on the tape, then over
// dp_shard in rank order (the flat calls move each parameter's bits): bitwise the same step
// (models/train/gpt_overlap_test.cc). They differ from the one-program FSDP reference (a
// reduce-scatter per microbatch, the shards added) in that order only: equal to 1e-9 in f64.
//
// Memory: the stage's gathered parameters are all alive from the end of the first microbatch's
// forward (unit by unit) to their last backward, in the master dtype (under bf16 compute the
// casts at use are the tape's activations, as for unsharded parameters); peak_gathered_bytes()
// is that total. A leaf's placeholder is allocated and released at once (one parameter's bytes
// for an instant, in the shape-only run as in the real one).
#ifndef SHARDMAP_MODELS_TRAIN_STAGE_FSDP_H_
#define SHARDMAP_MODELS_TRAIN_STAGE_FSDP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "models/gpt/gpt_model.h"
#include "models/train/grad_buckets.h"
#include "models/train/run_plan.h"
#include "shardmap/flat_gather.h"
#include "shardmap/value.h"

namespace shardmap {

class StageFsdp {
 public:
  struct Options {
    bool overlap = true;  // the flat, prefetched, overlapped schedule; false: the reference
    int prefetch = 1;     // units gathered ahead of the one computing (>= 1)
  };

  // params: this rank's held shards (RunPlan's stage_plan.owned[stage] order; must outlive this
  // object). buckets: where the shard gradients go (gradient k = held parameter k), or null:
  // Finish returns them. Throws OpError (no FSDP axis, a prefetch below 1).
  StageFsdp(const Model& layout, const RunPlan& plan, int stage,
            const std::vector<Value>& params, Options options, GradientBuckets* buckets);
  StageFsdp(const StageFsdp&) = delete;
  StageFsdp& operator=(const StageFsdp&) = delete;

  bool overlapped() const { return options_.overlap; }
  // What RunPipeline watches: per held parameter, its gathered value (or the shard itself).
  const std::vector<Value>& params() const { return leaves_; }
  // The parameters at use, given the chunk's watched leaves by layout index (gathers a unit
  // the first time one of its parameters is asked for; valid while this object lives).
  ParamFn Use(const std::vector<Value>& all);
  // For PipelineStage::on_final_grad (overlap only).
  std::function<void(int, const Value&)> FinalGradHook();
  // After RunPipeline: grads are its sums (overlap off; empty when on). Returns the shard
  // gradients (pending sums on the other P axes), or nothing when they went to the buckets.
  std::vector<Value> Finish(std::vector<Value> grads);

  // The most bytes of gathered parameters alive at once.
  int64_t peak_gathered_bytes() const { return peak_bytes_; }

 private:
  struct Unit {
    std::vector<int> ks;  // held indices of its FSDP-sharded parameters
    bool gathered = false, released = false;
    PendingFlatGather gather;
    std::vector<Value> grads;  // final gradients by position in ks (overlap)
    int final = 0;
  };
  void Order(const RunPlan& plan, int stage);
  void MakeLeaves();
  void Start(int u);
  void Ensure(int u);
  void Fill(int k, Tensor full);
  void OnFinal(int k, const Value& g);
  void Release(int u);
  void WaitScatters(size_t keep);
  void Hand(int k, const Value& g);
  void Count(int64_t bytes);
  Value Padded(int k, const Value& grad) const;  // a leaf's gradient padded to StoredShape

  const Model& layout_;
  const std::vector<Value>& params_;
  Options options_;
  GradientBuckets* buckets_;
  std::vector<int> held_;     // layout index of each held parameter
  std::vector<int> k_of_;     // per layout index: its held index, or -1
  std::vector<int> unit_of_;  // per held index: its unit (position in units_), or -1
  std::vector<Unit> units_;   // in gather order
  std::vector<Value> leaves_;
  std::deque<std::pair<int, PendingFlatScatter>> scatters_;  // started, not yet waited
  std::vector<Value> out_;  // shard gradients when there are no buckets
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_STAGE_FSDP_H_
