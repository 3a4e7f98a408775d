// The merge step of byte-level BPE (private to bpe_tokenizer): GPT-2's encoder.py semantics,
// i.e. while some adjacent pair has a merge, the lowest-ranked one merges at every occurrence,
// left to right (non-overlapping), then the next. A merged token is never one of its own two
// sides (true of every BPE file: its bytes are longer).
//
//   BpeMergeTable merges;  // (left id, right id) -> {rank, merged id}
//   merges[BpeMergeKey(a, b)] = {0, ab};
//   std::vector<int32_t> word = {a, b, c};
//   MergeWord(merges, &word);  // {ab, c}
//
// Two algorithms with the same result: a rescan per merge (fast for words of a few bytes,
// quadratic in the length) and a priority queue (O(n log n)) for long pieces, so a megabyte
// without spaces (minified code, base64) takes milliseconds, not hours.
#ifndef SHARDMAP_MODELS_DATA_BPE_MERGE_H_
#define SHARDMAP_MODELS_DATA_BPE_MERGE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace shardmap {

struct BpeMerge {
  int32_t rank, merged;
};
using BpeMergeTable = absl::flat_hash_map<uint64_t, BpeMerge>;

inline uint64_t BpeMergeKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Rescans the word for the best pair after each merge.
void MergeWordByRescan(const BpeMergeTable& merges, std::vector<int32_t>* word);
// A heap of (rank, position) over a linked list of symbols.
void MergeWordByHeap(const BpeMergeTable& merges, std::vector<int32_t>* word);
// The rescan for words up to 64 symbols, the heap beyond.
void MergeWord(const BpeMergeTable& merges, std::vector<int32_t>* word);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_BPE_MERGE_H_
