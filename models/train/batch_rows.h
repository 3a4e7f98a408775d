// A rank's rows of each step's global [batch, seq] token batch, on its device: the one program's
// microsteps (grad_accum consecutive groups of sequences) or the pipeline's microbatches, each
// split over the batch axes as layout.RowSpec says (under cp reordered so that each cp block
// holds its load-balanced chunks).
//
//   RankBatches batches(layout, plan, options.batch, ctx.rank(), ctx.device());
//   std::vector<Value> ids, targets;
//   batches.Microsteps(ids_g, targets_g, &ids, &targets);   // plan.accum of each
#ifndef SHARDMAP_MODELS_TRAIN_BATCH_ROWS_H_
#define SHARDMAP_MODELS_TRAIN_BATCH_ROWS_H_

#include <cstdint>
#include <vector>

#include "models/gpt/gpt_model.h"
#include "models/train/run_plan.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

// Rows [k*B/M, (k+1)*B/M) of a [B, T] batch, flattened.
Tensor MicrobatchRows(const Tensor& batch, int64_t k, int64_t m);

class RankBatches {
 public:
  RankBatches(const Model& layout, const RunPlan& plan, int64_t batch, int rank, Device dev);

  // The one program's microsteps as host tensors (this rank's rows) or as typed device values.
  void HostMicrosteps(const Tensor& ids_g, const Tensor& targets_g, std::vector<Tensor>* ids,
                      std::vector<Tensor>* targets) const;
  void Microsteps(const Tensor& ids_g, const Tensor& targets_g, std::vector<Value>* ids,
                  std::vector<Value>* targets) const;
  // The pipeline's microbatches: this rank's rows of each, on its device.
  void Microbatches(const Tensor& ids_g, const Tensor& targets_g, std::vector<Value>* ids,
                    std::vector<Value>* targets) const;

  const SpmdType& row_type() const { return row_type_; }

 private:
  Tensor Rows(const Tensor& t) const;

  const Model& layout_;
  const RunPlan& plan_;
  int64_t batch_;
  int rank_;
  Device dev_;
  PartitionSpec rows_spec_;
  SpmdType row_type_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_BATCH_ROWS_H_
