// Shared by the GPT tests (gpt_test, gpt_pipeline_test, gpt_moe_test, ...): the small f64 model, its
// data, three AdamW steps with active clipping, the single-device reference run, and the check
// that a run matches it (losses, gradient norms, parameters to 1e-9 relative).
//
//   const TrainResult& ref = gpt_testing::Reference();       // TrainGpt on one device, cached
//   gpt_testing::ExpectSameTraining(Train("dp=2", false), ref);
#ifndef SHARDMAP_MODELS_TRAIN_GPT_TEST_UTIL_H_
#define SHARDMAP_MODELS_TRAIN_GPT_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt.h"
#include "tensor/tensor.h"

namespace shardmap::gpt_testing {

GptConfig SmallConfig();  // 2 layers, d 12, 6 heads, vocab 24, seq 6, f64
std::vector<int64_t> Tokens(int64_t n, int64_t vocab);
TrainOptions ThreeSteps();  // batch 12, lr 1e-2, clip 0.5 (active)
// TrainGpt of SmallConfig (InitGpt seed 7) on `mesh`; failures are test failures.
TrainResult Train(const std::string& mesh, bool sp);
const TrainResult& Reference();  // Train("", false), computed once
// max |a - b| / max |b|.
double RelDiff(const Tensor& a, const Tensor& b);
// Three steps' losses, gradient norms and parameters equal the reference's to 1e-9 relative.
void ExpectSameTraining(const TrainResult& got, const TrainResult& ref);

// A parameterised test's mesh ("dp=2,tp=2") and sequence parallelism, and its test name
// ("dp_2_tp_2_sp").
struct Layout {
  std::string mesh;
  bool sp;
};
std::string LayoutName(const ::testing::TestParamInfo<Layout>& info);

}  // namespace shardmap::gpt_testing

#endif  // SHARDMAP_MODELS_TRAIN_GPT_TEST_UTIL_H_
