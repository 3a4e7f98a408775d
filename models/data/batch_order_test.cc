#include "models/data/batch_order.h"

#include <cstdint>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

std::vector<int64_t> Counting(int64_t n) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i;  // token i is i: a sample shows where it starts
  return t;
}

TEST(BatchOrderTest, SequentialIsBatchAtWrappingAround) {
  const std::vector<int64_t> tokens = Counting(23);
  Tensor ids, targets;
  BatchOf(tokens, /*step=*/2, /*batch=*/3, /*seq=*/4, BatchOrder{}, &ids, &targets);
  // Sample b of step 2 starts at (2*3+b)*4 mod 23: 24 -> 1, 28 -> 5, 32 -> 9.
  EXPECT_EQ(ids.ToVector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(targets.ToVector<int64_t>(),
            (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
}

// Each sample is the tokens at its start, its targets the next ones, with every start inside
// [0, N-T-1] (no wrap); the starts of step s are row s of the whole counter-based draw, so a
// step's batch does not depend on the steps before it (exact resume).
TEST(BatchOrderTest, RandomSamplesAreContiguousAndAStepIsItsRowOfTheWholeDraw) {
  const int64_t n = 101, batch = 5, seq = 7, steps = 9;
  const std::vector<int64_t> tokens = Counting(n);
  const BatchOrder order{.random = true, .seed = 42};
  std::vector<std::vector<int64_t>> rows;
  for (int64_t s = 0; s < steps; ++s) {
    rows.push_back(RandomBatchStarts(n, s, batch, seq, order.seed));
    Tensor ids, targets;
    BatchOf(tokens, s, batch, seq, order, &ids, &targets);
    const std::vector<int64_t> in = ids.ToVector<int64_t>(), out = targets.ToVector<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t start = rows.back()[b];
      ASSERT_GE(start, 0);
      ASSERT_LE(start, n - seq - 1);
      for (int64_t t = 0; t < seq; ++t) {
        EXPECT_EQ(in[b * seq + t], start + t);
        EXPECT_EQ(out[b * seq + t], start + t + 1);
      }
    }
  }
  // Row s of one draw of the whole [steps, batch] table, seeded as BatchOf's order.
  const std::vector<int64_t> again = RandomBatchStarts(n, 4, batch, seq, order.seed);
  EXPECT_EQ(again, rows[4]);
  std::set<int64_t> distinct;
  for (const auto& r : rows) distinct.insert(r.begin(), r.end());
  EXPECT_GT(distinct.size(), 30u);  // 45 draws from 94 values: not a constant or a short cycle
  EXPECT_NE(RandomBatchStarts(n, 4, batch, seq, 43), rows[4]);  // the seed matters
}

// Every offset can be drawn (the last one included) and the draw is roughly uniform: 20000
// starts over 10 values, each within 15% of 2000.
TEST(BatchOrderTest, RandomStartsCoverTheRangeUniformly) {
  const int64_t n = 14, seq = 4;  // starts in [0, 9]
  std::vector<int> count(n, 0);
  for (int64_t s = 0; s < 1000; ++s) {
    for (int64_t start : RandomBatchStarts(n, s, 20, seq, 7)) ++count.at(start);
  }
  for (int64_t v = 0; v <= n - seq - 1; ++v) {
    EXPECT_NEAR(count[v], 2000, 300) << "start " << v;
  }
  for (int64_t v = n - seq; v < n; ++v) EXPECT_EQ(count[v], 0) << "start " << v;
}

TEST(BatchOrderTest, ParseNamesTheChoices) {
  absl::StatusOr<BatchOrder> r = ParseBatchOrder("random", 3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->random);
  EXPECT_EQ(r->seed, 3u);
  EXPECT_FALSE(ParseBatchOrder("sequential", 3)->random);
  EXPECT_THAT(ParseBatchOrder("shuffled", 3).status().message(),
              HasSubstr("--data_order shuffled: use random"));
}

// BatchAt copies whole runs of tokens: the same values as reading them one at a time with the
// wrap at N, also when a sample wraps more than once (seq > N) and at later steps.
TEST(BatchOrderTest, BatchAtEqualsTheElementwiseReference) {
  for (int64_t n : {1, 5, 23, 64}) {
    const std::vector<int64_t> tokens = Counting(n);
    for (int64_t step : {0, 1, 7}) {
      const int64_t batch = 3, seq = 11;
      Tensor ids, targets;
      BatchAt(tokens, step, batch, seq, &ids, &targets);
      std::vector<int64_t> in(batch * seq), out(batch * seq);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t start = ((step * batch + b) * seq) % n;
        for (int64_t t = 0; t < seq; ++t) {
          in[b * seq + t] = tokens[(start + t) % n];
          out[b * seq + t] = tokens[(start + t + 1) % n];
        }
      }
      EXPECT_EQ(ids.ToVector<int64_t>(), in) << n << " " << step;
      EXPECT_EQ(targets.ToVector<int64_t>(), out) << n << " " << step;
      EXPECT_EQ(ids.ShapeString(), "i64[3,11]");
    }
  }
}

}  // namespace
}  // namespace shardmap
