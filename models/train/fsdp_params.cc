#include "models/train/fsdp_params.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {

FsdpParams::FsdpParams(const Model& layout, const std::vector<Value>& params,
                       FsdpSchedule schedule, Tape& tape, TapeRecorder* recorder)
    : layout_(layout),
      params_(params),
      schedule_(schedule),
      tape_(tape),
      recorder_(recorder != nullptr ? recorder : &tape) {
  if (schedule.prefetch < 1) {
    OpFail("FsdpParams: the prefetch depth is ", schedule.prefetch,
           "; it must be at least 1 (the next unit's all-gather runs beside this one's compute)");
  }
  const int64_t layers = layout.shape().layers;
  units_.resize(layers + 2);
  values_.resize(params.size());
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const int u = layout.params()[i].unit.Index(layers);
    unit_of_.push_back(u);
    units_[u].params.push_back(static_cast<int>(i));
  }
  // Blocks but the last: the embeddings and head hold wte (used at both ends), and the last
  // block's backward follows its forward at once.
  for (int64_t l = 1; l < layers; ++l) units_[l].reshard = schedule.reshard_after_forward;
}

ParamFn FsdpParams::Use() {
  return [this](const std::string& name) { return Get(layout_.Find(name)); };
}

Value FsdpParams::Get(int param) {
  const int u = unit_of_[param];
  if (u > current_) Enter(u);
  return values_[param];
}

void FsdpParams::Count(int64_t bytes) {
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
}

void FsdpParams::Enter(int unit) {
  ScopedRecorder on_the_step(recorder_);  // not a recomputed block's recorder
  const int32_t slot = static_cast<int32_t>(tape_.size());
  Unit& u = units_[unit];
  // Backward: free this unit once its VJPs are done, then (at the same point) regather the one
  // before it, whose VJPs come next. Triggers at one slot run in the order added.
  if (u.reshard) tape_.AtBackwardBelow(slot, [this, unit] {
    if (!units_[unit].released) Release(unit);
  });
  if (current_ >= 0 && units_[current_].reshard) {
    Release(current_);  // its forward is over
    tape_.AtBackwardBelow(slot, [this, prev = current_] { Regather(prev); });
  } else if (current_ >= 0) {
    // A unit kept gathered (the last block): its backward prefetches the regathers below it,
    // as a resharded unit's Regather does, so the first regathered block does not wait.
    tape_.AtBackwardBelow(slot, [this, prev = current_] { PrefetchBelow(prev); });
  }
  if (!u.pending.pending()) Start(unit, /*taped=*/true);
  Wait(unit, /*refill=*/false);
  for (int v = unit + 1; v <= unit + schedule_.prefetch && v < static_cast<int>(units_.size());
       ++v) {
    if (!units_[v].waited && !units_[v].pending.pending()) Start(v, /*taped=*/true);
  }
  current_ = unit;
}

void FsdpParams::Start(int unit, bool taped) {
  Unit& u = units_[unit];
  std::vector<Value> shards;
  std::vector<int> dims;
  for (int p : u.params) {
    const ParamInfo& info = layout_.params()[p];
    if (info.fsdp_dim < 0) continue;
    shards.push_back(taped ? params_[p] : Value(params_[p].tensor, params_[p].type));
    dims.push_back(info.fsdp_dim);
  }
  if (shards.empty()) return;
  u.pending = all_gather_flat_start(shards, dims, layout_.fsdp_axis(),
                                    layout_.shape().compute_dtype());
}

void FsdpParams::Wait(int unit, bool refill) {
  const DType compute = layout_.shape().compute_dtype();
  Unit& u = units_[unit];
  std::vector<Value> gathered;
  if (u.pending.pending()) gathered = u.pending.Wait();
  size_t k = 0;
  for (int p : u.params) {
    if (layout_.params()[p].fsdp_dim < 0) {
      // As GptParamUse: cast at use (mixed precision).
      if (!refill) values_[p] = params_[p].dtype() == compute ? params_[p] : cast(params_[p], compute);
      continue;
    }
    // A padded parameter is trimmed to its global shape (taped in the forward: the slice's
    // VJP pads its gradient with zeros); what is held, and counted, is the trimmed tensor.
    const ParamInfo& info = layout_.params()[p];
    Value& g = gathered[k++];
    if (refill) {
      const Tensor held = TrimFsdpPad(g.tensor, info);
      Count(static_cast<int64_t>(held.nbytes()));
      // Held for the backward again: the tape's saved bytes count it (Release took it out).
      if (values_[p].node >= 0) tape_.NoteHeldBytes(static_cast<int64_t>(held.nbytes()));
      values_[p].tensor.RefillBuffer(held);
    } else {
      values_[p] = TrimFsdpPad(g, info);
      Count(static_cast<int64_t>(values_[p].tensor.nbytes()));
      // The padded gathered buffer dies here (the trim keeps a copy): not a held activation.
      if (info.fsdp_pad > 0 && g.node >= 0) {
        tape_.NoteHeldBytes(-static_cast<int64_t>(g.tensor.nbytes()));
      }
    }
  }
  u.waited = true;
  u.released = false;
}

void FsdpParams::Release(int unit) {
  Unit& u = units_[unit];
  for (int p : u.params) {
    if (layout_.params()[p].fsdp_dim < 0) continue;
    Count(-static_cast<int64_t>(values_[p].tensor.nbytes()));
    // The tape recorded the gather's output as saved; freed, it is no longer an activation.
    if (values_[p].node >= 0) tape_.NoteHeldBytes(-static_cast<int64_t>(values_[p].tensor.nbytes()));
    values_[p].tensor.ReleaseBuffer();
  }
  u.released = true;
}

void FsdpParams::Regather(int unit) {
  Unit& u = units_[unit];
  if (!u.pending.pending()) Start(unit, /*taped=*/false);
  Wait(unit, /*refill=*/true);
  PrefetchBelow(unit);
}

void FsdpParams::PrefetchBelow(int unit) {
  // Backward prefetch: the resharded blocks whose VJPs come next.
  for (int v = unit - 1; v >= unit - schedule_.prefetch && v >= 0; --v) {
    if (units_[v].reshard && units_[v].released && !units_[v].pending.pending()) {
      Start(v, /*taped=*/false);
    }
  }
}

}  // namespace shardmap
