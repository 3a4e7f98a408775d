// tiktoken's merge step (private to tiktoken_tokenizer): the piece's bytes start as byte tokens;
// while some adjacent pair concatenates to a token, the pair whose concatenation has the lowest
// rank merges (the leftmost of equal ones). The result: the ranks of the final parts.
//
//   absl::flat_hash_map<std::string, int32_t> ranks = {{"a", 0}, {"b", 1}, {"ab", 2}};
//   std::vector<int32_t> out;
//   RankBpe("abab", ranks, &out);  // out == {2, 2}
//
// A heap of (rank, position) over a linked list of parts, with stale entries skipped: each step
// takes the same pair as tiktoken's rescan, in O(n log n) instead of O(n^2). Every byte of the
// piece must have a token (the caller checks the vocabulary once).
#ifndef SHARDMAP_MODELS_DATA_RANK_BPE_H_
#define SHARDMAP_MODELS_DATA_RANK_BPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace shardmap {

// Appends the ranks of `piece`'s tokens to `out`.
void RankBpe(absl::string_view piece, const absl::flat_hash_map<std::string, int32_t>& ranks,
             std::vector<int32_t>* out);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_RANK_BPE_H_
