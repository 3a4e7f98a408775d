#include "models/train/evaluate.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/gpt_test_util.h"
#include "models/train/trainer.h"

namespace shardmap {
namespace {

using gpt_testing::SmallConfig;
using gpt_testing::ThreeSteps;
using gpt_testing::Tokens;
using ::testing::HasSubstr;

// The trainer's validation loss after its last step (two batches), and the parameters then.
struct Trained {
  double val = 0;
  std::vector<NamedTensor> params;
};

Trained TrainWithEval(const std::vector<int64_t>& val_tokens) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), SmallConfig(), false);
  EXPECT_TRUE(layout.ok()) << layout.status();
  TrainOptions o = ThreeSteps();
  o.eval.tokens = val_tokens;
  o.eval.every = 3;
  o.eval.steps = 2;
  Trained t;
  o.hooks.on_step = [&](const StepInfo& s) { t.val = s.val_loss; };
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(SmallConfig(), 7), Tokens(400, 24), o);
  EXPECT_TRUE(r.ok()) << r.status();
  t.params = r->params;
  return t;
}

// EvaluateGpt of the trained parameters equals the trainer's own evaluation on every mesh
// (pipelines, context and sequence parallelism, FSDP), from the tensors and from a file.
TEST(EvaluateGptTest, EqualsTheTrainersEvaluationOnEveryMesh) {
  const std::vector<int64_t> val_tokens = Tokens(500, 24);
  const Trained t = TrainWithEval(val_tokens);
  ASSERT_TRUE(std::isfinite(t.val));
  for (auto [mesh, sp] : std::vector<std::pair<std::string, bool>>{
           {"", false}, {"dp=2,tp=2", true}, {"dp_shard=3", false}, {"cp=3", false},
           {"pp=2,dp=2", false}, {"pp=2,tp=2", true}}) {
    SCOPED_TRACE(mesh);
    absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), SmallConfig(), sp);
    ASSERT_TRUE(layout.ok()) << layout.status();
    TrainOptions o = ThreeSteps();
    if (mesh.rfind("pp", 0) == 0) o.pipeline.microbatches = 2;
    absl::StatusOr<double> loss = EvaluateGpt(*layout, val_tokens, 2, o, t.params);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, t.val, 1e-9 * t.val);
  }
  absl::StatusOr<GptLayout> one = GptLayout::Create(Mesh(), SmallConfig(), false);
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/eval.safetensors";
  ASSERT_TRUE(SaveGptWithConfig(path, *one, t.params, nullptr, 3).ok());
  absl::StatusOr<GptLayout> tp = GptLayout::Create(*ParseMesh("tp=2"), SmallConfig(), false);
  TrainOptions o = ThreeSteps();
  o.checkpoint.init_path = path;
  absl::StatusOr<double> from_file = EvaluateGpt(*tp, val_tokens, 2, o);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_NEAR(*from_file, t.val, 1e-9 * t.val);
  // One batch is another number (the mean is over the batches asked for).
  absl::StatusOr<double> first = EvaluateGpt(*tp, val_tokens, 1, o);
  ASSERT_TRUE(first.ok());
  EXPECT_NE(*first, *from_file);
}

TEST(EvaluateGptTest, BadInputIsRefused) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), SmallConfig(), false);
  const std::vector<NamedTensor> init = InitGpt(SmallConfig(), 7);
  TrainOptions o = ThreeSteps();
  EXPECT_THAT(EvaluateGpt(*layout, Tokens(500, 24), 0, o, init).status().message(),
              HasSubstr("eval_steps 0 must be >= 1"));
  EXPECT_FALSE(EvaluateGpt(*layout, {1, 2}, 1, o, init).ok());
  o.checkpoint.init_path = "/nonexistent/x.safetensors";
  EXPECT_THAT(EvaluateGpt(*layout, Tokens(500, 24), 1, o).status().message(),
              HasSubstr("/nonexistent/x.safetensors"));
  o = ThreeSteps();
  o.batch = 5;  // not divisible by dp=2
  absl::StatusOr<GptLayout> dp = GptLayout::Create(*ParseMesh("dp=2"), SmallConfig(), false);
  EXPECT_FALSE(EvaluateGpt(*dp, Tokens(500, 24), 1, o, init).ok());
}

}  // namespace
}  // namespace shardmap
