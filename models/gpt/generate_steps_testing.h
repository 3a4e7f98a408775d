// Shared by the generation tests (gpt_generate_test, llama_generate_test,
// llama_generate_gpu_test): one greedy generation's tokens and per-step logits, and how far two
// generations' logits differ.
//
//   const Steps want = GreedySteps(one_device, params, prompt, 6, KvCacheMode::kOff);
//   EXPECT_LT(MaxRelDiff(GreedySteps(tp2, params, prompt, 6, KvCacheMode::kOn), want), 1e-12);
#ifndef SHARDMAP_MODELS_GPT_GENERATE_STEPS_TESTING_H_
#define SHARDMAP_MODELS_GPT_GENERATE_STEPS_TESTING_H_

#include <cstdint>
#include <vector>

#include "models/gpt/gpt_generate.h"
#include "models/model/model.h"

namespace shardmap::generate_testing {

// Each step's logits and the greedy tokens of one generation.
struct Steps {
  std::vector<int64_t> tokens;
  std::vector<std::vector<double>> logits;
};

// GenerateGpt with o (its step_logits set here); a failure is a test failure (no tokens).
Steps GreedySteps(const Model& m, const std::vector<NamedTensor>& params,
                  const std::vector<int64_t>& prompt, SampleOptions o);
// The same with SampleOptions{.tokens = tokens, .kv_cache = mode}'s other fields at defaults.
Steps GreedySteps(const Model& m, const std::vector<NamedTensor>& params,
                  const std::vector<int64_t>& prompt, int64_t tokens, KvCacheMode mode);

// max |a - b| / max(1, |b|) over every step's logits; a different step count or vocabulary is
// a test failure.
double MaxRelDiff(const Steps& a, const Steps& b);

}  // namespace shardmap::generate_testing

#endif  // SHARDMAP_MODELS_GPT_GENERATE_STEPS_TESTING_H_
