// A rank's training state: its held parameters (its stage's, each its local shard) on its
// device and their AdamW moments, from a checkpoint file or the initial global tensors; and the
// way back to global host tensors (for snapshots, multi-process results and --save).
//
//   absl::StatusOr<StateSource> source = OpenStateSource(layout, init, options);
//   ...inside the rank's program:
//   RankState state(layout, plan, *source, options.adamw, ctx.rank(), stage, ctx.device());
//   state.params;            // typed Values, in state.held order
//   state.opt.Step(...);     // AdamW
//   std::vector<Tensor> g = state.GatherGlobals();  // 3 * np global tensors (collectives)
#ifndef SHARDMAP_MODELS_TRAIN_RANK_STATE_H_
#define SHARDMAP_MODELS_TRAIN_RANK_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/components/checkpoint.h"
#include "models/components/optimizer.h"
#include "models/gpt/gpt_model.h"
#include "models/train/run_plan.h"
#include "models/train/train_options.h"
#include "shardmap/value.h"

namespace shardmap {

// Where every rank's state comes from: a checkpoint file (options.resume_path: parameters,
// moments and the step; options.init_path: parameters) or the initial global tensors.
struct StateSource {
  std::shared_ptr<SafetensorsFile> file;  // null: from `globals`
  std::vector<Tensor> globals;            // layout order
  bool resume = false;
  int64_t first_step = 0;  // the checkpoint's step when resuming
};

// Opens and checks the checkpoint file (its tensors against the layout, its step against
// options.steps) or matches `init` to the layout.
absl::StatusOr<StateSource> OpenStateSource(const Model& layout,
                                            const std::vector<NamedTensor>& init,
                                            const TrainOptions& options);

class RankState {
 public:
  // Reads this rank's shards (throws OpError on a bad file block, as ops do inside RunSpmd).
  RankState(const Model& layout, const RunPlan& plan, const StateSource& source,
            const AdamWOptions& adamw, int rank, int stage, Device dev);

  // Every parameter and AdamW moment as a global host tensor on every rank (index k as
  // AddFinalTensor's; moments undefined before the first step): all_gathers over each sharded
  // dim, then under a pipeline the owner stage's copy summed over pp (the others add zeros).
  std::vector<Tensor> GatherGlobals() const;
  // This rank's local tensors at index k as GatherGlobals' (undefined where it holds none).
  std::vector<Tensor> LocalTensors() const;
  // The bytes of this rank's parameters, and of its gradients plus moments.
  int64_t ParamBytes() const;
  int64_t OptimizerBytes(const std::vector<Value>& grads) const;

  std::vector<int> held;  // parameter indices of this rank's stage (layout order)
  std::vector<std::string> held_names;
  std::vector<Value> params;  // in `held` order
  AdamW opt;

 private:
  const Model& layout_;
  const RunPlan& plan_;
  bool resume_;
  int stage_;
  Device dev_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_RANK_STATE_H_
