#include "models/data/rank_bpe.h"

#include <queue>

namespace shardmap {
namespace {

struct Part {
  uint32_t start, end;  // bytes of the piece
  int32_t prev, next;   // neighbouring parts (-1: none)
  bool dead;            // merged into its left neighbour
};

// A candidate merge of part `left` with the part that ended at `right_end` when it was queued.
struct Candidate {
  int32_t rank;
  uint32_t start;  // of `left`: orders equal ranks left to right
  int32_t left;
  uint32_t right_end;
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : start > o.start;
  }
};

}  // namespace

void RankBpe(absl::string_view piece, const absl::flat_hash_map<std::string, int32_t>& ranks,
             std::vector<int32_t>* out) {
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Part> parts(n);
  for (int32_t i = 0; i < n; ++i) {
    parts[i] = {static_cast<uint32_t>(i), static_cast<uint32_t>(i) + 1, i - 1,
                i + 1 < n ? i + 1 : -1, false};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto queue = [&](int32_t left) {
    if (left < 0 || parts[left].next < 0) return;
    const Part& l = parts[left];
    const uint32_t end = parts[l.next].end;
    auto it = ranks.find(piece.substr(l.start, end - l.start));
    if (it != ranks.end()) heap.push({it->second, l.start, left, end});
  };
  for (int32_t i = 0; i + 1 < n; ++i) queue(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Part& l = parts[c.left];
    // Stale: `left` was merged away, or its right neighbour is no longer the queued one (parts
    // only grow, so an equal end means the same neighbour).
    if (l.dead || l.next < 0 || parts[l.next].end != c.right_end) continue;
    Part& r = parts[l.next];
    r.dead = true;
    l.end = r.end;
    l.next = r.next;
    if (r.next >= 0) parts[r.next].prev = c.left;
    queue(l.prev);
    queue(c.left);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = parts[i].next) {
    out->push_back(ranks.find(piece.substr(parts[i].start, parts[i].end - parts[i].start))->second);
  }
}

}  // namespace shardmap
