#include "models/components/lr_schedule.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

// nanoGPT train.py's get_lr, transcribed line by line (cosine only), as the reference.
double NanoGptGetLr(int64_t it, double learning_rate, double min_lr, int64_t warmup_iters,
                    int64_t lr_decay_iters) {
  if (it < warmup_iters) {
    return learning_rate * static_cast<double>(it + 1) / static_cast<double>(warmup_iters + 1);
  }
  if (it > lr_decay_iters) return min_lr;
  const double decay_ratio = static_cast<double>(it - warmup_iters) /
                             static_cast<double>(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * decay_ratio));
  return min_lr + coeff * (learning_rate - min_lr);
}

TEST(LrScheduleTest, CosineMatchesNanoGptAtEveryStep) {
  for (auto [warmup, decay] : {std::pair<int64_t, int64_t>{10, 100}, {0, 37}, {1, 2}, {7, 8}}) {
    LrSchedule s{.max_lr = 6e-4, .min_lr = 6e-5, .warmup_steps = warmup,
                 .decay_steps = decay, .kind = "cosine"};
    ASSERT_TRUE(s.Validate().ok());
    for (int64_t t = 0; t <= decay + 20; ++t) {
      EXPECT_NEAR(s.At(t), NanoGptGetLr(t, 6e-4, 6e-5, warmup, decay), 1e-15)
          << "step " << t << " warmup " << warmup << " decay " << decay;
    }
  }
}

TEST(LrScheduleTest, CosineEdges) {
  LrSchedule s{.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .decay_steps = 12,
               .kind = "cosine"};
  EXPECT_DOUBLE_EQ(s.At(0), 1.0 / 5);   // first warmup step is not zero
  EXPECT_DOUBLE_EQ(s.At(3), 4.0 / 5);   // last warmup step
  EXPECT_DOUBLE_EQ(s.At(4), 1.0);       // decay starts at max_lr
  EXPECT_NEAR(s.At(8), 0.55, 1e-15);    // half way: the mean of max and min
  EXPECT_DOUBLE_EQ(s.At(12), 0.1);      // decay end reaches min_lr
  EXPECT_DOUBLE_EQ(s.At(13), 0.1);      // and stays there
  EXPECT_DOUBLE_EQ(s.At(1000000), 0.1);
  EXPECT_DOUBLE_EQ(s.At(-3), s.At(0));  // negative steps as step 0
  for (int64_t t = 4; t < 12; ++t) EXPECT_GT(s.At(t), s.At(t + 1)) << t;  // monotone decay
}

TEST(LrScheduleTest, LinearAndConstant) {
  LrSchedule lin{.max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 2, .decay_steps = 6,
                 .kind = "linear"};
  ASSERT_TRUE(lin.Validate().ok());
  const double want[] = {2.0 / 3, 4.0 / 3, 2.0, 1.5, 1.0, 0.5, 0.0, 0.0};
  for (int t = 0; t < 8; ++t) EXPECT_NEAR(lin.At(t), want[t], 1e-15) << t;

  LrSchedule flat{.max_lr = 3e-4};
  ASSERT_TRUE(flat.Validate().ok());
  for (int t : {0, 1, 1000}) EXPECT_DOUBLE_EQ(flat.At(t), 3e-4);
  LrSchedule warm{.max_lr = 1.0, .warmup_steps = 3};
  ASSERT_TRUE(warm.Validate().ok());
  EXPECT_DOUBLE_EQ(warm.At(0), 0.25);
  EXPECT_DOUBLE_EQ(warm.At(2), 0.75);
  EXPECT_DOUBLE_EQ(warm.At(3), 1.0);
  EXPECT_DOUBLE_EQ(warm.At(300), 1.0);
}

TEST(LrScheduleTest, WarmupEqualToDecayEndsAtMaxThenMin) {
  LrSchedule s{.max_lr = 1.0, .min_lr = 0.5, .warmup_steps = 3, .decay_steps = 3,
               .kind = "cosine"};
  ASSERT_TRUE(s.Validate().ok());
  EXPECT_DOUBLE_EQ(s.At(2), 0.75);
  EXPECT_DOUBLE_EQ(s.At(3), 1.0);
  EXPECT_DOUBLE_EQ(s.At(4), 0.5);
}

void ExpectInvalid(const LrSchedule& s, const std::string& needle) {
  absl::Status st = s.Validate();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(LrScheduleTest, ValidateRejectsImpossibleSchedules) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  ExpectInvalid({.kind = "exp"}, "unknown kind 'exp'");
  ExpectInvalid({.max_lr = nan}, "max_lr nan");
  ExpectInvalid({.max_lr = inf}, "max_lr inf");
  ExpectInvalid({.max_lr = -1}, "max_lr -1");
  ExpectInvalid({.max_lr = 0}, "max_lr 0");
  ExpectInvalid({.min_lr = nan}, "min_lr nan");
  ExpectInvalid({.min_lr = -1e-5}, "min_lr -1e-05");
  ExpectInvalid({.max_lr = 1e-4, .min_lr = 1e-3, .decay_steps = 5, .kind = "cosine"},
                "above max_lr");
  ExpectInvalid({.warmup_steps = -1}, "warmup_steps -1");
  ExpectInvalid({.decay_steps = -2}, "decay_steps -2");
  ExpectInvalid({.warmup_steps = 10, .decay_steps = 5, .kind = "linear"},
                "warmup_steps 10 is past decay_steps 5");
  // constant ignores min_lr and decay_steps
  EXPECT_TRUE((LrSchedule{.max_lr = 1e-4, .min_lr = 1e-3, .warmup_steps = 10}).Validate().ok());
}

}  // namespace
}  // namespace shardmap
