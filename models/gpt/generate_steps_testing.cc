#include "models/gpt/generate_steps_testing.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace shardmap::generate_testing {

Steps GreedySteps(const Model& m, const std::vector<NamedTensor>& params,
                  const std::vector<int64_t>& prompt, SampleOptions o) {
  Steps out;
  o.step_logits = &out.logits;
  absl::StatusOr<std::vector<int64_t>> r = GenerateGpt(m, params, prompt, o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) out.tokens = *r;
  return out;
}

Steps GreedySteps(const Model& m, const std::vector<NamedTensor>& params,
                  const std::vector<int64_t>& prompt, int64_t tokens, KvCacheMode mode) {
  SampleOptions o{.tokens = tokens};
  o.kv_cache = mode;
  return GreedySteps(m, params, prompt, o);
}

double MaxRelDiff(const Steps& a, const Steps& b) {
  EXPECT_EQ(a.logits.size(), b.logits.size());
  double worst = 0;
  for (size_t s = 0; s < std::min(a.logits.size(), b.logits.size()); ++s) {
    EXPECT_EQ(a.logits[s].size(), b.logits[s].size());
    for (size_t v = 0; v < std::min(a.logits[s].size(), b.logits[s].size()); ++v) {
      worst = std::max(worst, std::abs(a.logits[s][v] - b.logits[s][v]) /
                                  std::max(1.0, std::abs(b.logits[s][v])));
    }
  }
  return worst;
}

}  // namespace shardmap::generate_testing
