// Shared by the shape-only tests (gpt_shape_only_test, llama_shape_only_test): what one real
// training step measures on each rank, for a shape-only profile of that rank to match.
//
//   std::map<int, RankTruth> truth = shape_only_testing::RealStep(*layout, options);
//   EXPECT_EQ(profile.peak_bytes, truth.at(rank).peak);
#ifndef SHARDMAP_MODELS_TRAIN_SHAPE_ONLY_TRUTH_H_
#define SHARDMAP_MODELS_TRAIN_SHAPE_ONLY_TRUTH_H_

#include <cstdint>
#include <map>
#include <vector>

#include "models/model/model.h"
#include "models/train/trainer.h"
#include "shardmap/collective_recorder.h"

namespace shardmap::shape_only_testing {

// What one rank of a real run did in its step ("step" to "end" of TrainOptions::hooks.on_phase).
struct RankTruth {
  std::vector<CollectiveRecord> log;
  int64_t peak = 0;
  double flops = 0;
};

// A real one-step TrainGpt of model (Init seed 3, gpt_testing::Tokens) on CPU threads, each rank
// measured by its own recorder, tracker and counter (made on its thread, as a shape-only run
// makes them). A failed run is a test failure.
std::map<int, RankTruth> RealStep(const Model& model, TrainOptions o);

}  // namespace shardmap::shape_only_testing

#endif  // SHARDMAP_MODELS_TRAIN_SHAPE_ONLY_TRUTH_H_
