// Interval arithmetic for the overlap of two streams' busy times, as measured with CUDA events
// (the GPU bundle's NCCL overlap check, tests/gpu_nccl_overlap_check.cc): the communication
// stream's collectives against the compute stream's work, in milliseconds.
//
//   std::vector<Interval> comm = {{1.0, 3.0}, {5.0, 6.0}};
//   std::vector<Interval> compute = {{0.0, 2.0}, {2.5, 5.5}};
//   UnionLength(comm);                 // 3.0
//   OverlapLength(comm, compute);      // 1.0 + 0.5 + 0.5 = 2.0
//   SubtractIntervals(compute, comm);  // {0, 1}, {3, 5}
//
// Intervals may overlap each other, come in any order and be empty (end <= begin: ignored);
// a NaN bound makes the interval ignored too (a span whose events were never recorded).
#ifndef SHARDMAP_COLLECTIVES_STREAM_OVERLAP_H_
#define SHARDMAP_COLLECTIVES_STREAM_OVERLAP_H_

#include <vector>

namespace shardmap::collectives {

struct Interval {
  double begin = 0, end = 0;
};

// The disjoint, sorted union of the intervals (empty ones dropped).
std::vector<Interval> MergeIntervals(std::vector<Interval> v);
// The length of the union.
double UnionLength(const std::vector<Interval>& v);
// The length of (union of a) intersected with (union of b).
double OverlapLength(const std::vector<Interval>& a, const std::vector<Interval>& b);
// (union of a) minus (union of b), disjoint and sorted: e.g. the compute stream's span less the
// times it stood waiting for the communication stream.
std::vector<Interval> SubtractIntervals(const std::vector<Interval>& a,
                                        const std::vector<Interval>& b);

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_STREAM_OVERLAP_H_
