// The chunk plan and entry search of the multi-tensor launches, replayed on the host: every
// element of every tensor is covered by exactly one (chunk, entry), empty tensors get no chunk.
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/reduce/multi_tensor_kernels.h"

namespace shardmap::cuda::kernels {
namespace {

TEST(MultiTensorPlanTest, EveryElementIsCoveredOnce) {
  const int64_t c = kMultiTensorChunk;
  const std::vector<std::vector<int64_t>> cases = {
      {1},         {c},          {c + 1},           {0, 5, 0},    {0, 0, 0},
      {3, c, 0, 2 * c + 7, 1, 0}, {5 * c - 1, 768, 2304, 0, 768}};
  for (const std::vector<int64_t>& sizes : cases) {
    std::vector<MultiTensorEntry> t(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) t[i].n = sizes[i];
    const int64_t chunks = PlanMultiTensorChunks(t);
    std::vector<int64_t> covered(sizes.size(), 0);
    for (int64_t k = 0; k < chunks; ++k) {
      const int e = FindEntry(t.data(), static_cast<int>(t.size()), k);
      ASSERT_GE(e, 0);
      ASSERT_LT(e, static_cast<int>(t.size()));
      ASSERT_GT(t[e].n, 0) << "chunk " << k << " went to an empty tensor";
      const int64_t begin = (k - t[e].chunk_begin) * c;
      ASSERT_GE(begin, 0);
      ASSERT_LT(begin, t[e].n) << "chunk " << k;
      covered[e] += std::min(t[e].n, begin + c) - begin;
    }
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(covered[i], sizes[i]) << "tensor " << i;
  }
}

TEST(MultiTensorPlanTest, BlocksAreCappedAndNeverZero) {
  EXPECT_EQ(MultiTensorBlocks(0), 1);
  EXPECT_EQ(MultiTensorBlocks(7), 7);
  EXPECT_EQ(MultiTensorBlocks(1 << 20), 4096);
}

}  // namespace
}  // namespace shardmap::cuda::kernels
