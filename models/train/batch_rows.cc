#include "models/train/batch_rows.h"

#include "models/parallel/ring_attention.h"
#include "shardmap/sharding.h"

namespace shardmap {

Tensor MicrobatchRows(const Tensor& batch, int64_t k, int64_t m) {
  const int64_t per = batch.dim(0) / m, seq = batch.dim(1);
  if (batch.dtype() == DType::kI64 && !batch.is_meta() && !batch.is_cuda()) {
    // The rows are contiguous: one bulk copy (the same values as element by element).
    return batch.SliceRows(k * per, per).Reshape({per * seq}).Clone();
  }
  // A meta batch's rows are meta (a meta rank's global batch, RankTrainer): the bytes of the
  // copy above, no values.
  if (batch.is_meta()) return Tensor::Empty({per * seq}, DType::kI64, Device::Meta());
  std::vector<int64_t> v(per * seq);
  for (int64_t i = 0; i < per * seq; ++i) v[i] = static_cast<int64_t>(batch.at(k * per * seq + i));
  return Tensor::FromVector<int64_t>({per * seq}, v);
}

namespace {

// Host rows onto the rank's device. Rows already on a meta rank's device (its batch is meta) are
// copied all the same: the same allocations, in the same order, as the upload of host rows.
Tensor Upload(const Tensor& rows, Device dev) {
  return rows.device() == dev && dev.is_meta() ? rows.Clone() : rows.To(dev);
}

}  // namespace

RankBatches::RankBatches(const Model& layout, const RunPlan& plan, int64_t batch, int rank,
                         Device dev)
    : layout_(layout),
      plan_(plan),
      batch_(batch),
      rank_(rank),
      dev_(dev),
      rows_spec_(layout.RowSpec(false)),
      row_type_(plan.RowType(layout)) {}

Tensor RankBatches::Rows(const Tensor& t) const {
  return layout_.cp_axis().empty()
             ? t.Reshape({NumElements(t.shape())})
             : LoadBalancedRows(t, layout_.batch_ways(), layout_.cp_ways());
}

void RankBatches::HostMicrosteps(const Tensor& ids_g, const Tensor& targets_g,
                                 std::vector<Tensor>* ids, std::vector<Tensor>* targets) const {
  const int64_t accum = plan_.accum, seq = layout_.shape().seq;
  const Mesh& mesh = layout_.mesh();
  for (int64_t j = 0; j < accum; ++j) {
    const Tensor i =
        accum > 1 ? MicrobatchRows(ids_g, j, accum).Reshape({batch_ / accum, seq}) : ids_g;
    const Tensor t =
        accum > 1 ? MicrobatchRows(targets_g, j, accum).Reshape({batch_ / accum, seq}) : targets_g;
    ids->push_back(ShardOf(Rows(i), mesh, rows_spec_, rank_));
    targets->push_back(ShardOf(Rows(t), mesh, rows_spec_, rank_));
  }
}

void RankBatches::Microsteps(const Tensor& ids_g, const Tensor& targets_g,
                             std::vector<Value>* ids, std::vector<Value>* targets) const {
  std::vector<Tensor> host_ids, host_targets;
  HostMicrosteps(ids_g, targets_g, &host_ids, &host_targets);
  for (size_t j = 0; j < host_ids.size(); ++j) {
    ids->emplace_back(Upload(host_ids[j], dev_), row_type_);
    targets->emplace_back(Upload(host_targets[j], dev_), row_type_);
  }
}

void RankBatches::Microbatches(const Tensor& ids_g, const Tensor& targets_g,
                               std::vector<Value>* ids, std::vector<Value>* targets) const {
  const int64_t m = plan_.microbatches;
  const Mesh& mesh = layout_.mesh();
  for (int64_t k = 0; k < m; ++k) {
    ids->emplace_back(Upload(ShardOf(MicrobatchRows(ids_g, k, m), mesh, rows_spec_, rank_), dev_),
                      row_type_);
    targets->emplace_back(
        Upload(ShardOf(MicrobatchRows(targets_g, k, m), mesh, rows_spec_, rank_), dev_),
        row_type_);
  }
}

}  // namespace shardmap
