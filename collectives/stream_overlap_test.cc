#include "collectives/stream_overlap.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

TEST(StreamOverlapTest, TheHeaderExample) {
  const std::vector<Interval> comm = {{1.0, 3.0}, {5.0, 6.0}};
  const std::vector<Interval> compute = {{0.0, 2.0}, {2.5, 5.5}};
  EXPECT_DOUBLE_EQ(UnionLength(comm), 3.0);
  EXPECT_DOUBLE_EQ(OverlapLength(comm, compute), 2.0);
  EXPECT_DOUBLE_EQ(OverlapLength(compute, comm), 2.0);
  const std::vector<Interval> left = SubtractIntervals(compute, comm);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_DOUBLE_EQ(left[0].begin, 0);
  EXPECT_DOUBLE_EQ(left[0].end, 1);
  EXPECT_DOUBLE_EQ(left[1].begin, 3);
  EXPECT_DOUBLE_EQ(left[1].end, 5);
  EXPECT_TRUE(SubtractIntervals({{1, 2}}, {{0, 3}}).empty());
  EXPECT_EQ(SubtractIntervals({{0, 10}}, {{2, 3}, {4, 5}}).size(), 3u);
}

TEST(StreamOverlapTest, MergesOverlappingTouchingAndUnsortedAndDropsEmptyOrNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Interval> m =
      MergeIntervals({{4, 5}, {0, 2}, {1, 3}, {3, 3.5}, {7, 7}, {9, 8}, {nan, 10}, {6, nan}});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_DOUBLE_EQ(m[0].begin, 0);
  EXPECT_DOUBLE_EQ(m[0].end, 3.5);
  EXPECT_DOUBLE_EQ(m[1].begin, 4);
  EXPECT_DOUBLE_EQ(m[1].end, 5);
  EXPECT_DOUBLE_EQ(UnionLength({}), 0);
  EXPECT_DOUBLE_EQ(OverlapLength({{0, 1}}, {}), 0);
  EXPECT_DOUBLE_EQ(OverlapLength({{0, 1}}, {{1, 2}}), 0);  // touching: no overlap
}

TEST(StreamOverlapTest, StartedCallsTheHeaderExample) {
  const StreamOverlap o = MeasureStartedCalls({{.ready = 0, .begin = 1, .end = 4, .joined = 3}});
  EXPECT_EQ(o.calls, 1);
  EXPECT_DOUBLE_EQ(o.comm, 3);
  EXPECT_DOUBLE_EQ(o.compute, 3);
  EXPECT_DOUBLE_EQ(o.overlap, 2);
}

// Gradient buckets: three all-reduces started during the backward (at 0, 2, 4), the backward
// ending at 6, then the three Wait()s in a row. The comm stream runs them one after another
// (1-3, 3-5, 5-9). Wait 1 joins at 6 (its call is over), wait 2 at 6 too; wait 3 at 6 finds its
// call running until 9: the compute stream stands still 6..9, which must not count as compute
// (nor as overlap): overlap is 1..6 = 5 of 8 ms of communication.
TEST(StreamOverlapTest, TheComputeStreamWaitingForACollectiveIsNotOverlap) {
  const StreamOverlap o = MeasureStartedCalls({{.ready = 0, .begin = 1, .end = 3, .joined = 6},
                                               {.ready = 2, .begin = 3, .end = 5, .joined = 6},
                                               {.ready = 4, .begin = 5, .end = 9, .joined = 6}});
  EXPECT_DOUBLE_EQ(o.comm, 8);
  EXPECT_DOUBLE_EQ(o.compute, 6);
  EXPECT_DOUBLE_EQ(o.overlap, 5);
  // FSDP's prefetch: B starts (1) before A's Wait() (3), which finds A running until 5; B's span
  // [ready, joined] = [1, 8] covers A's wait 3..5, during which the compute stream stood still.
  const StreamOverlap prefetch =
      MeasureStartedCalls({{.ready = 0, .begin = 0.5, .end = 5, .joined = 3},
                           {.ready = 1, .begin = 5, .end = 7, .joined = 8}});
  EXPECT_DOUBLE_EQ(prefetch.comm, 6.5);
  EXPECT_DOUBLE_EQ(prefetch.compute, 6);     // 0..3 and 5..8
  EXPECT_DOUBLE_EQ(prefetch.overlap, 4.5);   // 0.5..3 and 5..7, not 0.5..7
  // Waited at once after each start (the reference schedule's shape): nothing overlaps.
  const StreamOverlap serial = MeasureStartedCalls({{.ready = 0, .begin = 0, .end = 2, .joined = 0},
                                                    {.ready = 2, .begin = 2, .end = 3, .joined = 2}});
  EXPECT_DOUBLE_EQ(serial.comm, 3);
  EXPECT_DOUBLE_EQ(serial.compute, 0);
  EXPECT_DOUBLE_EQ(serial.overlap, 0);
  EXPECT_EQ(MeasureStartedCalls({}).calls, 0);
}

// Against a brute-force reference: the measure of the overlap on a fine grid of random integer
// intervals (exact there: every bound is a grid point).
TEST(StreamOverlapTest, MatchesAGridCountOnRandomIntervals) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pos(0, 97), len(0, 13), count(0, 7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Interval> a, b;
    for (int n = count(rng); n > 0; --n) { const int s = pos(rng); a.push_back({double(s), double(s + len(rng))}); }
    for (int n = count(rng); n > 0; --n) { const int s = pos(rng); b.push_back({double(s), double(s + len(rng))}); }
    int in_a = 0, in_both = 0, in_a_only = 0;
    for (int cell = 0; cell < 111; ++cell) {  // the unit cell [cell, cell + 1)
      auto covers = [cell](const std::vector<Interval>& v) {
        for (const Interval& i : v) if (i.begin <= cell && cell + 1 <= i.end) return true;
        return false;
      };
      in_a += covers(a);
      in_both += covers(a) && covers(b);
      in_a_only += covers(a) && !covers(b);
    }
    ASSERT_DOUBLE_EQ(UnionLength(SubtractIntervals(a, b)), in_a_only) << "trial " << trial;
    ASSERT_DOUBLE_EQ(UnionLength(a), in_a) << "trial " << trial;
    ASSERT_DOUBLE_EQ(OverlapLength(a, b), in_both) << "trial " << trial;
  }
}

}  // namespace
}  // namespace shardmap::collectives
