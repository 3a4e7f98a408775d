#include "collectives/internal/rank_threads.h"

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

// Tasks of one Run wait for each other, so they must run at once on distinct threads.
TEST(RankThreads, RunsAllTasksConcurrentlyOnDistinctThreads) {
  RankThreads pool;
  for (int n : {1, 3, 7}) {
    std::atomic<int> arrived{0};
    std::vector<std::thread::id> ids(n);
    ASSERT_TRUE(pool.Run(n, [&](int r) {
      ids[r] = std::this_thread::get_id();
      arrived.fetch_add(1);
      while (arrived.load() < n) std::this_thread::yield();  // a barrier: deadlocks if serial
    }).ok());
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), static_cast<size_t>(n));
    EXPECT_EQ(pool.idle(), n);  // the largest Run so far made n threads, all parked again
  }
}

TEST(RankThreads, ReusesParkedThreads) {
  RankThreads pool;
  std::vector<std::thread::id> first(4), second(4);
  ASSERT_TRUE(pool.Run(4, [&](int r) { first[r] = std::this_thread::get_id(); }).ok());
  EXPECT_EQ(pool.idle(), 4);
  pool.FailThreadCreationAfterForTesting(0);  // no new thread may be made now
  ASSERT_TRUE(pool.Run(4, [&](int r) { second[r] = std::this_thread::get_id(); }).ok());
  EXPECT_EQ(std::set<std::thread::id>(first.begin(), first.end()),
            std::set<std::thread::id>(second.begin(), second.end()));
}

// A thread that cannot be created fails the whole Run before any task starts: no rank is left
// waiting for a peer that never ran, and the threads already secured go back to the pool.
TEST(RankThreads, ThreadCreationFailureRunsNothing) {
  RankThreads pool;
  pool.FailThreadCreationAfterForTesting(2);
  std::atomic<int> ran{0};
  absl::Status s = pool.Run(5, [&](int) { ran.fetch_add(1); });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("starting 5 ranks"));
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(pool.idle(), 2);
  pool.FailThreadCreationAfterForTesting(-1);
  EXPECT_TRUE(pool.Run(5, [&](int) { ran.fetch_add(1); }).ok());
  EXPECT_EQ(ran.load(), 5);
}

TEST(RankThreads, RejectsNonPositiveCounts) {
  RankThreads pool;
  EXPECT_EQ(pool.Run(0, [](int) {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardmap::collectives::internal
