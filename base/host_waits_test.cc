#include "base/host_waits.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap::base {
namespace {

TEST(HostWaitsTest, CountsByKindAndDifferencesOfSnapshots) {
  const HostWaitCounts before = HostWaitSnapshot();
  CountHostWait(HostWait::kNcclBlockingCall);
  CountHostWait(HostWait::kNcclBlockingCall);
  CountHostWait(HostWait::kDeviceToHostRead);
  const HostWaitCounts d = HostWaitSnapshot() - before;
  EXPECT_EQ(d[HostWait::kNcclBlockingCall], 2);
  EXPECT_EQ(d[HostWait::kDeviceToHostRead], 1);
  EXPECT_EQ(d[HostWait::kStreamSync], 0);
  EXPECT_EQ(d.total(), 3);
  EXPECT_EQ(d.ToString(), "nccl_blocking_call=2 d2h_read=1");
  EXPECT_EQ((HostWaitSnapshot() - HostWaitSnapshot()).ToString(), "none");
}

TEST(HostWaitsTest, EveryKindHasItsOwnName) {
  std::vector<std::string> names;
  for (int k = 0; k < kHostWaitKinds; ++k) {
    names.push_back(HostWaitName(static_cast<HostWait>(k)));
    EXPECT_NE(names.back(), "unknown");
    for (int j = 0; j < k; ++j) EXPECT_NE(names[j], names[k]);
  }
  EXPECT_STREQ(HostWaitName(static_cast<HostWait>(200)), "unknown");
}

TEST(HostWaitsTest, AnInvalidKindIsNotCounted) {
  const HostWaitCounts before = HostWaitSnapshot();
  CountHostWait(static_cast<HostWait>(kHostWaitKinds));
  EXPECT_EQ((HostWaitSnapshot() - before).total(), 0);
}

// Threads count into the process's total and each into its own; 3 threads, odd counts.
TEST(HostWaitsTest, ThreadsAddUpAndKeepTheirOwn) {
  const HostWaitCounts before = HostWaitSnapshot();
  const HostWaitCounts mine_before = HostWaitSnapshotThisThread();
  std::vector<HostWaitCounts> per_thread(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([t, &per_thread] {
      for (int i = 0; i < 1000 * (t + 1) + 7; ++i) CountHostWait(HostWait::kEventSync);
      CountHostWait(HostWait::kStreamSync);
      per_thread[t] = HostWaitSnapshotThisThread();
    });
  }
  for (std::thread& t : threads) t.join();
  const HostWaitCounts d = HostWaitSnapshot() - before;
  EXPECT_EQ(d[HostWait::kEventSync], 1007 + 2007 + 3007);
  EXPECT_EQ(d[HostWait::kStreamSync], 3);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(per_thread[t][HostWait::kEventSync], 1000 * (t + 1) + 7);
    EXPECT_EQ(per_thread[t][HostWait::kStreamSync], 1);
  }
  EXPECT_EQ((HostWaitSnapshotThisThread() - mine_before).total(), 0);
}

}  // namespace
}  // namespace shardmap::base
