#include "models/train/memory_bound.h"

#include <string>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

GptConfig Tiny() {
  GptConfig c;
  c.layers = 1;
  c.d_model = 16;
  c.heads = 4;
  c.vocab = 256;
  c.seq = 8;
  c.dtype = DType::kF64;
  return c;
}

// The bound by hand: parameters N = 12 d^2 + 13 d + V d + T d + 2 d = 7536 for one layer of
// d 16, V 256, T 8, in 4 f64 copies (weights, gradients, 2 moments); tokens x (2 V + L d) x 8.
TEST(MemoryBoundTest, MatchesTheHandCount) {
  const GptConfig c = Tiny();
  const double state = (12 * 16 * 16 + 13 * 16 + 256 * 16 + 8 * 16 + 2 * 16) * 8.0 * 4;
  const double act = 1000000.0 * 8 * (2 * 256 + 1 * 16) * 8;
  EXPECT_NEAR(MinStepBytes(c, {.batch = 1000000}, 1), state + act, 1e-9 * (state + act));
  // Two processes share it; grad_accum 4 holds a quarter of the tokens at a time.
  EXPECT_NEAR(MinStepBytes(c, {.batch = 1000000}, 2), (state + act) / 2, 1e-9 * (state + act));
  EXPECT_NEAR(MinStepBytes(c, {.batch = 1000000, .grad_accum = 4}, 1), state + act / 4,
              1e-9 * (state + act));
}

TEST(MemoryBoundTest, RefusesWithTheFigures) {
  const GptConfig c = Tiny();
  EXPECT_TRUE(CheckStepFitsMemory(c, {.batch = 4}, 1, 1 << 30, "--max_memory").ok());
  absl::Status s = CheckStepFitsMemory(c, {.batch = 1000000}, 1, 8.0 * (1 << 30), "--max_memory");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--batch 1000000 (seq 8, vocab 256, 1 layers of d_model 16, f64) "
                             "needs at least 31.5 GiB per process"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("more than --max_memory (8 GiB)"), std::string::npos) << s;
}

TEST(MemoryBoundTest, ParsesLimits) {
  EXPECT_DOUBLE_EQ(*ParseMemoryLimit("8GiB"), 8.0 * 1073741824);
  EXPECT_DOUBLE_EQ(*ParseMemoryLimit("512mib"), 512.0 * 1048576);
  EXPECT_DOUBLE_EQ(*ParseMemoryLimit("2.5G"), 2.5e9);
  EXPECT_DOUBLE_EQ(*ParseMemoryLimit("1000"), 1000);
  EXPECT_DOUBLE_EQ(*ParseMemoryLimit(""), HostMemoryBytes());
  EXPECT_GT(HostMemoryBytes(), 0);
  for (const char* bad : {"x", "-1GiB", "0", "nan", "8TB"}) {
    absl::StatusOr<double> v = ParseMemoryLimit(bad);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace shardmap
