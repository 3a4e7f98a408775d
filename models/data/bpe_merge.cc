#include "models/data/bpe_merge.h"

#include <climits>
#include <queue>
#include <utility>

namespace shardmap {

void MergeWordByRescan(const BpeMergeTable& merges, std::vector<int32_t>* word) {
  std::vector<int32_t>& w = *word;
  while (w.size() > 1) {
    int32_t best = INT32_MAX, left = -1, right = -1, merged = -1;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = merges.find(BpeMergeKey(w[i], w[i + 1]));
      if (it != merges.end() && it->second.rank < best) {
        best = it->second.rank;
        left = w[i], right = w[i + 1], merged = it->second.merged;
      }
    }
    if (merged < 0) break;
    size_t o = 0;
    for (size_t i = 0; i < w.size(); ++o) {
      if (i + 1 < w.size() && w[i] == left && w[i + 1] == right) {
        w[o] = merged;
        i += 2;
      } else {
        w[o] = w[i++];
      }
    }
    w.resize(o);
  }
}

void MergeWordByHeap(const BpeMergeTable& merges, std::vector<int32_t>* word) {
  std::vector<int32_t>& w = *word;
  const int n = static_cast<int>(w.size());
  if (n < 2) return;
  // Symbols live at their first byte's index; next/prev link the live ones (-1: none).
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  std::vector<bool> alive(n, true);
  using Entry = std::pair<int32_t, int>;  // (rank, left symbol): lowest rank, then leftmost
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto rank_at = [&](int i) -> int32_t {
    if (i < 0 || next[i] < 0) return -1;
    auto it = merges.find(BpeMergeKey(w[i], w[next[i]]));
    return it == merges.end() ? -1 : it->second.rank;
  };
  for (int i = 0; i + 1 < n; ++i) {
    if (const int32_t r = rank_at(i); r >= 0) heap.push({r, i});
  }
  std::vector<int> touched;  // pairs made by this rank's merges: queued after all of them
  while (!heap.empty()) {
    const int32_t r = heap.top().first;
    touched.clear();
    // Every occurrence of this rank's pair, left to right; a stale entry (a side already merged
    // away or changed) no longer has rank r and is skipped.
    while (!heap.empty() && heap.top().first == r) {
      const int i = heap.top().second;
      heap.pop();
      if (!alive[i] || rank_at(i) != r) continue;
      const int j = next[i];
      w[i] = merges.find(BpeMergeKey(w[i], w[j]))->second.merged;
      alive[j] = false;
      next[i] = next[j];
      if (next[j] >= 0) prev[next[j]] = i;
      touched.push_back(i);
      if (prev[i] >= 0) touched.push_back(prev[i]);
    }
    for (int i : touched) {
      if (!alive[i]) continue;
      if (const int32_t nr = rank_at(i); nr >= 0) heap.push({nr, i});
    }
  }
  int o = 0;
  for (int i = 0; i >= 0; i = next[i]) w[o++] = w[i];
  w.resize(o);
}

void MergeWord(const BpeMergeTable& merges, std::vector<int32_t>* word) {
  if (word->size() <= 64) {
    MergeWordByRescan(merges, word);
  } else {
    MergeWordByHeap(merges, word);
  }
}

}  // namespace shardmap
