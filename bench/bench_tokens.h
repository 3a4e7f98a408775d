// Pseudo-random token ids for the GPT benchmarks (gpt_bench, pipeline_bench): the same stream
// in every run, so rows and runs time the same work.
//
//   std::vector<int64_t> tokens = bench::RandomTokens(1 << 16, /*vocab=*/256);
#ifndef SHARDMAP_BENCH_BENCH_TOKENS_H_
#define SHARDMAP_BENCH_BENCH_TOKENS_H_

#include <cstdint>
#include <vector>

namespace shardmap::bench {

inline std::vector<int64_t> RandomTokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  uint64_t x = 7;  // a 64-bit LCG (Knuth's MMIX constants), high bits
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_BENCH_TOKENS_H_
