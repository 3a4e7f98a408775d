// The two merge algorithms against each other on random merge tables and words (including
// tables real BPE files never have: merges whose inputs appear later, several merges making one
// token), and both against hand-worked cases of GPT-2's rule (lowest rank first, every
// occurrence left to right without overlap).
#include "models/data/bpe_merge.h"

#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Both(const BpeMergeTable& m, std::vector<int32_t> w) {
  std::vector<int32_t> h = w;
  MergeWordByRescan(m, &w);
  MergeWordByHeap(m, &h);
  EXPECT_EQ(w, h);
  return w;
}

TEST(BpeMergeTest, HandWorkedCases) {
  // a=0 b=1 c=2; aa=3 (rank 0), ab=4 (rank 1), "aa b"=5 (rank 2), "c c"=6 (rank 3)
  BpeMergeTable m;
  m[BpeMergeKey(0, 0)] = {0, 3};
  m[BpeMergeKey(0, 1)] = {1, 4};
  m[BpeMergeKey(3, 1)] = {2, 5};
  m[BpeMergeKey(2, 2)] = {3, 6};
  EXPECT_THAT(Both(m, {0, 0, 0}), ElementsAre(3, 0));        // no overlap, leftmost first
  EXPECT_THAT(Both(m, {0, 0, 0, 0}), ElementsAre(3, 3));
  EXPECT_THAT(Both(m, {0, 0, 0, 1}), ElementsAre(3, 4));     // aa before ab
  EXPECT_THAT(Both(m, {0, 0, 1}), ElementsAre(5));           // aa, then aa+b
  EXPECT_THAT(Both(m, {2, 2, 2, 0, 1}), ElementsAre(6, 2, 4));
  EXPECT_THAT(Both(m, {1}), ElementsAre(1));
  EXPECT_THAT(Both(m, {}), ElementsAre());
  EXPECT_THAT(Both(m, {1, 2, 1}), ElementsAre(1, 2, 1));     // nothing applies
}

TEST(BpeMergeTest, HeapEqualsRescanOnRandomTablesAndWords) {
  std::mt19937 rng(37);
  for (int table = 0; table < 200; ++table) {
    const int base = 2 + table % 4;
    BpeMergeTable m;
    int32_t next_id = base;
    const int merges = 1 + static_cast<int>(rng() % 12);
    std::vector<int32_t> made;
    for (int r = 0; r < merges; ++r) {
      const int32_t pool = next_id + (table % 3 == 0 ? 2 : 0);  // sometimes ids made later
      const int32_t a = static_cast<int32_t>(rng() % pool), b = static_cast<int32_t>(rng() % pool);
      const bool reuse = !made.empty() && rng() % 5 == 0;  // sometimes a token two merges make
      const int32_t out = reuse ? made[rng() % made.size()] : next_id++;
      if (out == a || out == b) continue;  // never in a BPE file: the merged bytes are longer
      if (m.emplace(BpeMergeKey(a, b), BpeMerge{r, out}).second && !reuse) made.push_back(out);
    }
    for (int word = 0; word < 50; ++word) {
      std::vector<int32_t> w(rng() % 150);
      for (int32_t& s : w) s = static_cast<int32_t>(rng() % base);
      std::vector<int32_t> h = w, r = w;
      MergeWordByRescan(m, &r);
      MergeWordByHeap(m, &h);
      ASSERT_EQ(r, h) << "table " << table << " word " << word;
    }
  }
}

// A megabyte without spaces (minified code, base64): the heap keeps it O(n log n).
TEST(BpeMergeTest, ALongWordMergesCompletely) {
  BpeMergeTable m;
  m[BpeMergeKey(0, 1)] = {0, 2};  // ab
  m[BpeMergeKey(2, 2)] = {1, 3};  // abab
  m[BpeMergeKey(3, 3)] = {2, 4};  // abababab
  std::vector<int32_t> w(1 << 20);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int32_t>(i % 2);
  MergeWord(m, &w);
  ASSERT_EQ(w.size(), size_t{1} << 17);
  for (int32_t s : w) ASSERT_EQ(s, 4);
}

}  // namespace
}  // namespace shardmap
