#include "models/train/shape_only_truth.h"

#include <functional>
#include <mutex>
#include <string>

#include "gtest/gtest.h"
#include "models/train/gpt_test_util.h"
#include "shardmap/spmd_runner.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"

namespace shardmap::shape_only_testing {

std::map<int, RankTruth> RealStep(const Model& model, TrainOptions o) {
  struct Probes {
    CollectiveRecorder* rec;
    MemoryTracker* mem;
    OpCounter* ops;
    size_t ops_at_step = 0;
  };
  std::mutex mu;
  std::map<int, Probes> probes;
  std::map<int, RankTruth> truth;
  o.hooks.spmd_runner = [&](const Mesh& mesh, const std::function<void(RankContext&)>& body) {
    return RunSpmd(mesh, [&](RankContext& ctx) {
      MemoryTracker mem;
      OpCounter ops;
      CollectiveRecorder rec;
      {
        std::lock_guard<std::mutex> lock(mu);
        probes[ctx.rank()] = Probes{&rec, &mem, &ops};
      }
      body(ctx);
    });
  };
  o.hooks.on_phase = [&](const char* phase) {
    const int rank = RankContext::Current()->rank();
    std::lock_guard<std::mutex> lock(mu);
    Probes& p = probes[rank];
    if (std::string(phase) == "step") {
      p.rec->Clear();
      p.ops_at_step = p.ops->ops().size();
    } else if (std::string(phase) == "end") {
      RankTruth& t = truth[rank];
      t.log = p.rec->records(rank);
      t.peak = p.mem->peak_bytes();
      for (size_t i = p.ops_at_step; i < p.ops->ops().size(); ++i) t.flops += p.ops->ops()[i].flops;
    }
  };
  absl::StatusOr<TrainResult> r =
      TrainGpt(model, model.Init(3), gpt_testing::Tokens(4000, model.shape().vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return truth;
}

}  // namespace shardmap::shape_only_testing
