// TimedCommunicator forwards every call unchanged and counts calls, bytes and time per op,
// including on the sub-groups its Split makes (3 ranks: a non-power-of-two world).
#include "bench/timed_communicator.h"

#include <vector>

#include "collectives/in_process.h"
#include "gtest/gtest.h"

namespace shardmap::bench {
namespace {

using collectives::Communicator;
using collectives::DataType;
using collectives::ReduceOp;

TEST(TimedCommunicatorTest, ForwardsAndCountsPerOp) {
  constexpr int kRanks = 3;
  std::vector<CommStats> stats(kRanks);
  absl::Status s = collectives::RunInProcess(kRanks, [&](Communicator& comm) -> absl::Status {
    TimedCommunicator timed(&comm, &stats[comm.rank()]);
    EXPECT_EQ(timed.rank(), comm.rank());
    EXPECT_EQ(timed.size(), kRanks);
    std::vector<float> x(4, static_cast<float>(comm.rank() + 1));
    if (absl::Status st = timed.AllReduce(x.data(), x.data(), 4, DataType::kF32, ReduceOp::kSum);
        !st.ok()) {
      return st;
    }
    for (float v : x) EXPECT_EQ(v, 6.0f);  // 1 + 2 + 3
    std::vector<double> mine(2, comm.rank()), all(2 * kRanks);
    if (absl::Status st = timed.AllGather(mine.data(), all.data(), 2, DataType::kF64); !st.ok()) {
      return st;
    }
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(all[2 * r], r);
    std::vector<float> in(kRanks * 5, 1.0f), out(5);
    if (absl::Status st = timed.ReduceScatter(in.data(), out.data(), 5, DataType::kF32,
                                              ReduceOp::kSum);
        !st.ok()) {
      return st;
    }
    EXPECT_EQ(out[0], 3.0f);
    if (absl::Status st = timed.Barrier(); !st.ok()) return st;  // not counted
    // A sub-group (ranks {0, 2} and {1}) adds into the same stats.
    absl::StatusOr<std::unique_ptr<Communicator>> sub = timed.Split(comm.rank() % 2, comm.rank());
    if (!sub.ok()) return sub.status();
    float y = 1;
    return (*sub)->AllReduce(&y, &y, 1, DataType::kF32, ReduceOp::kSum);
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kRanks; ++r) {
    const CommStats& st = stats[r];
    ASSERT_EQ(st.by_op.count("all_reduce"), 1u);
    EXPECT_EQ(st.by_op.at("all_reduce").calls, 2);
    EXPECT_EQ(st.by_op.at("all_reduce").bytes, 4 * 4 + 4);
    EXPECT_EQ(st.by_op.at("all_gather").bytes, 2 * 8);              // its own block
    EXPECT_EQ(st.by_op.at("reduce_scatter").bytes, kRanks * 5 * 4);  // the whole input
    EXPECT_EQ(st.by_op.count("barrier"), 0u);
    EXPECT_EQ(st.Total().calls, 4);
    EXPECT_GE(st.Total().seconds, 0.0);
    EXPECT_GE(st.Total().seconds, st.by_op.at("all_gather").seconds);
  }
}

TEST(TimedCommunicatorTest, ForwardsStartedCallsAndTimesTheirStartsAndWaits) {
  constexpr int kRanks = 3;
  std::vector<CommStats> stats(kRanks);
  absl::Status s = collectives::RunInProcess(kRanks, [&](Communicator& comm) -> absl::Status {
    TimedCommunicator timed(&comm, &stats[comm.rank()]);
    EXPECT_EQ(timed.OverlapsStartedCalls(), comm.OverlapsStartedCalls());
    std::vector<float> x(5, static_cast<float>(comm.rank() + 1)), all(3 * kRanks);
    const std::vector<float> mine = x;  // the gather's input: x belongs to the all-reduce
    std::vector<float> in(kRanks * 2, 1.0f), out(2);
    auto a = timed.AllReduceStart(x.data(), x.data(), 5, DataType::kF32, ReduceOp::kSum);
    if (!a.ok()) return a.status();
    auto g = timed.AllGatherStart(mine.data(), all.data(), 3, DataType::kF32);
    if (!g.ok()) return g.status();
    auto r = timed.ReduceScatterStart(in.data(), out.data(), 2, DataType::kF32, ReduceOp::kSum);
    if (!r.ok()) return r.status();
    for (auto* h : {&*r, &*a}) {
      if (absl::Status st = (*h)->Wait(); !st.ok()) return st;
    }
    EXPECT_EQ(x[0], 6.0f);  // 1 + 2 + 3
    EXPECT_EQ(out[1], 3.0f);
    if (absl::Status st = (*g)->Wait(); !st.ok()) return st;
    for (int q = 0; q < kRanks; ++q) EXPECT_EQ(all[3 * q], q + 1.0f);  
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kRanks; ++r) {
    const CommStats& st = stats[r];
    EXPECT_EQ(st.by_op.at("all_reduce_start").bytes, 5 * 4);
    EXPECT_EQ(st.by_op.at("all_gather_start").bytes, 3 * 4);
    EXPECT_EQ(st.by_op.at("reduce_scatter_start").bytes, kRanks * 2 * 4);
    for (const char* op : {"all_reduce_wait", "all_gather_wait", "reduce_scatter_wait"}) {
      EXPECT_EQ(st.by_op.at(op).calls, 1) << op;
      EXPECT_EQ(st.by_op.at(op).bytes, 0) << op;
    }
  }
}

}  // namespace
}  // namespace shardmap::bench
