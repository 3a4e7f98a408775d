// RankBpe (a heap) against tiktoken's rescan written out plainly here, on random pieces over a
// small alphabet with random vocabularies (many merges apply, equal pairs compete), and on a
// megabyte-long piece that a rescan would take hours on.
#include "models/data/rank_bpe.h"

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

using Ranks = absl::flat_hash_map<std::string, int32_t>;

// tiktoken's byte_pair_merge: rescan for the lowest-ranked pair (leftmost of equals), merge it.
std::vector<int32_t> Rescan(const std::string& piece, const Ranks& ranks) {
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  for (;;) {
    int best = -1;
    int32_t best_rank = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && (best < 0 || it->second < best_rank)) {
        best = static_cast<int>(i);
        best_rank = it->second;
      }
    }
    if (best < 0) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + best + 1);
  }
  std::vector<int32_t> out;
  for (const std::string& p : parts) out.push_back(ranks.at(p));
  return out;
}

TEST(RankBpeTest, ExampleOfTheHeader) {
  const Ranks ranks = {{"a", 0}, {"b", 1}, {"ab", 2}};
  std::vector<int32_t> out;
  RankBpe("abab", ranks, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 2}));
}

TEST(RankBpeTest, LowestRankFirstThenLeftmost) {
  // "abc": "bc" (rank 3) beats "ab" (rank 4), so "abc" is reached as a + bc only if allowed.
  const Ranks ranks = {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"ab", 4}, {"aa", 5}, {"aaa", 6}};
  std::vector<int32_t> out;
  RankBpe("abc", ranks, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 3}));
  out.clear();
  RankBpe("aaaa", ranks, &out);  // aa|aa, not a|aa|a; then aaaa is no token
  EXPECT_EQ(out, (std::vector<int32_t>{5, 5}));
  out.clear();
  RankBpe("aaa", ranks, &out);  // aa|a, then aaa
  EXPECT_EQ(out, (std::vector<int32_t>{6}));
}

TEST(RankBpeTest, AgreesWithTheRescanOnRandomVocabularies) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    Ranks ranks;
    int32_t next = 0;
    for (char c = 'a'; c <= 'd'; ++c) ranks[std::string(1, c)] = next++;
    std::vector<std::string> tokens = {"a", "b", "c", "d"};
    // Tokens built from two existing ones, as a trained vocabulary is (ranks in a shuffled
    // order so that longer tokens are not always later).
    std::vector<std::string> made;
    for (int k = 0; k < 40; ++k) {
      const std::string t = tokens[rng() % tokens.size()] + tokens[rng() % tokens.size()];
      if (t.size() <= 8 && !ranks.contains(t)) {
        ranks[t] = 0;
        tokens.push_back(t);
        made.push_back(t);
      }
    }
    std::shuffle(made.begin(), made.end(), rng);
    for (const std::string& t : made) ranks[t] = next++;
    for (int k = 0; k < 20; ++k) {
      std::string piece(1 + rng() % 40, 'a');
      for (char& c : piece) c = static_cast<char>('a' + rng() % 4);
      std::vector<int32_t> out;
      RankBpe(piece, ranks, &out);
      ASSERT_EQ(out, Rescan(piece, ranks)) << "trial " << trial << " piece " << piece;
    }
  }
}

TEST(RankBpeTest, AMegabytePieceTakesSeconds) {
  Ranks ranks;
  for (int b = 0; b < 256; ++b) ranks[std::string(1, static_cast<char>(b))] = b;
  ranks["ab"] = 256;
  ranks["abab"] = 257;
  std::string piece;
  for (int i = 0; i < (1 << 19); ++i) piece += "ab";
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> out;
  RankBpe(piece, ranks, &out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(out, std::vector<int32_t>(1 << 18, 257));
  EXPECT_LT(s, 10.0);  // a rescan would take hours; the heap takes well under a second
}

}  // namespace
}  // namespace shardmap
