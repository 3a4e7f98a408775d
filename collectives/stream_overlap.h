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
//   MeasureStartedCalls({{.ready = 0, .begin = 1, .end = 4, .joined = 3}});
//   // comm 3 (1..4), compute 3 (0..3), overlap 2 (1..3)
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

// A started collective as its four events saw it (NCCL's timeline: StartedCallSpan): `ready`
// and `joined` on the compute stream at the start and at Wait() (before the compute stream
// waits for it), `begin` and `end` on the communication stream around the collective.
struct StartedCallTimes {
  double ready = 0, begin = 0, end = 0, joined = 0;
};
struct StreamOverlap {
  int calls = 0;
  double comm = 0;     // union of [begin, end]
  double compute = 0;  // union of [ready, joined] less the union of [joined, end] (waiting)
  double overlap = 0;  // their intersection
};
// The compute stream is taken as busy from a start to its Wait(), except where it stood waiting
// for some collective (after that call's joined, until its end): an upper bound, since gaps
// where the host had not enqueued work yet are not seen by events at the ends.
StreamOverlap MeasureStartedCalls(const std::vector<StartedCallTimes>& calls);

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_STREAM_OVERLAP_H_
