#include "models/train/gpt_test_util.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace shardmap::gpt_testing {

GptConfig SmallConfig() {
  GptConfig c;
  c.layers = 2;
  c.d_model = 12;
  c.heads = 6;
  c.vocab = 24;
  c.seq = 6;
  c.dtype = DType::kF64;
  return c;
}

std::vector<int64_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  // A learnable stream: a repeating phrase of 9 tokens with a rarely changing second half.
  for (int64_t i = 0; i < n; ++i) t[i] = ((i % 9) * 5 + (i / 45) % 3) % vocab;
  return t;
}

TrainOptions ThreeSteps() {
  TrainOptions o;
  o.steps = 3;
  o.batch = 12;
  // lr large enough that the parameters move visibly; clip small enough that it is active.
  o.optimizer.adamw.lr = 1e-2;
  o.optimizer.adamw.weight_decay = 0.1;
  o.optimizer.clip = 0.5;
  return o;
}

TrainResult Train(const std::string& mesh, bool sp) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, SmallConfig(), sp);
  EXPECT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<TrainResult> r =
      TrainGpt(*layout, InitGpt(SmallConfig(), 7), Tokens(500, SmallConfig().vocab), ThreeSteps());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

const TrainResult& Reference() {
  static const TrainResult* ref = new TrainResult(Train("", false));
  return *ref;
}

double RelDiff(const Tensor& a, const Tensor& b) {
  double scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(b.at(i)));
  return ::shardmap::testing::MaxAbsDiff(a, b) / std::max(scale, 1e-30);
}

// Three steps' losses, gradient norms and parameters equal the reference's to 1e-9 relative.
void ExpectSameTraining(const TrainResult& got, const TrainResult& ref) {
  ASSERT_EQ(got.losses.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-9 * std::fabs(ref.losses[s])) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], 1e-9 * ref.grad_norms[s]) << "step " << s;
  }
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    EXPECT_EQ(got.params[i].name, ref.params[i].name);
    EXPECT_LE(RelDiff(got.params[i].tensor, ref.params[i].tensor), 1e-9) << ref.params[i].name;
  }
}


std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  std::string n = info.param.mesh + (info.param.sp ? "_sp" : "");
  for (char& c : n) {
    if (c == '=' || c == ',') c = '_';
  }
  return n;
}

}  // namespace shardmap::gpt_testing
