#include "collectives/stream_overlap.h"

#include <algorithm>
#include <cmath>

namespace shardmap::collectives {

std::vector<Interval> MergeIntervals(std::vector<Interval> v) {
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](const Interval& i) {
                           return std::isnan(i.begin) || std::isnan(i.end) || !(i.end > i.begin);
                         }),
          v.end());
  std::sort(v.begin(), v.end(),
            [](const Interval& x, const Interval& y) { return x.begin < y.begin; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, i.end);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double UnionLength(const std::vector<Interval>& v) {
  double sum = 0;
  for (const Interval& i : MergeIntervals(v)) sum += i.end - i.begin;
  return sum;
}

double OverlapLength(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  const std::vector<Interval> x = MergeIntervals(a), y = MergeIntervals(b);
  double sum = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {  // both disjoint and sorted: one sweep
    const double lo = std::max(x[i].begin, y[j].begin), hi = std::min(x[i].end, y[j].end);
    if (hi > lo) sum += hi - lo;
    if (x[i].end < y[j].end) ++i; else ++j;
  }
  return sum;
}

std::vector<Interval> SubtractIntervals(const std::vector<Interval>& a,
                                        const std::vector<Interval>& b) {
  const std::vector<Interval> y = MergeIntervals(b);
  std::vector<Interval> out;
  for (Interval x : MergeIntervals(a)) {
    for (const Interval& cut : y) {  // y is sorted: cut x from the left as we go
      if (cut.end <= x.begin) continue;
      if (cut.begin >= x.end) break;
      if (cut.begin > x.begin) out.push_back({x.begin, cut.begin});
      x.begin = cut.end;
      if (x.begin >= x.end) break;
    }
    if (x.end > x.begin) out.push_back(x);
  }
  return out;
}

StreamOverlap MeasureStartedCalls(const std::vector<StartedCallTimes>& calls) {
  std::vector<Interval> comm, compute, blocked;
  for (const StartedCallTimes& c : calls) {
    comm.push_back({c.begin, c.end});
    compute.push_back({c.ready, c.joined});
    blocked.push_back({c.joined, c.end});  // empty when the collective ended first
  }
  const std::vector<Interval> busy = SubtractIntervals(compute, blocked);
  return StreamOverlap{static_cast<int>(calls.size()), UnionLength(comm), UnionLength(busy),
                       OverlapLength(comm, busy)};
}

}  // namespace shardmap::collectives
