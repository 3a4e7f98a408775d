// The watchdog's abort against an owner that holds its lock: within the grace it aborts under the
// lock; past it, without the lock (an owner stuck in a call must not hang the watchdog); the
// teardown happens once whoever comes first, never twice.
#include "collectives/internal/completion_watchdog_abort.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

struct Resource {
  std::atomic<int> aborts{0};
};

// An owner thread that takes slot.mu and keeps it until released (a call stuck inside NCCL).
class StuckOwner {
 public:
  explicit StuckOwner(AbortableSlot<Resource*>& slot) : slot_(slot) {
    thread_ = std::thread([this] {
      std::lock_guard<std::timed_mutex> use(slot_.mu);
      std::unique_lock<std::mutex> l(mu_);
      holding_ = true;
      cv_.notify_all();
      cv_.wait(l, [this] { return release_; });
      saw_torn_down_ = slot_.torn_down();
    });
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return holding_; });
  }
  // Lets the call return; true if the owner then saw the slot torn down.
  bool Release() {
    {
      std::lock_guard<std::mutex> l(mu_);
      release_ = true;
    }
    cv_.notify_all();
    thread_.join();
    return saw_torn_down_;
  }

 private:
  AbortableSlot<Resource*>& slot_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = false, release_ = false, saw_torn_down_ = false;
  std::thread thread_;
};

TEST(CompletionWatchdogAbortTest, AFreeLockAbortsUnderItAndClearsTheHandle) {
  Resource r;
  AbortableSlot<Resource*> slot(&r);
  EXPECT_EQ(AbortWithGrace(slot, absl::Seconds(10), [](Resource* x) { ++x->aborts; }),
            AbortHow::kUnderLock);
  EXPECT_EQ(r.aborts, 1);
  EXPECT_EQ(slot.handle, nullptr);
  EXPECT_TRUE(slot.torn_down());
  EXPECT_EQ(AbortWithGrace(slot, absl::Seconds(10), [](Resource* x) { ++x->aborts; }),
            AbortHow::kAlreadyGone);
  EXPECT_EQ(r.aborts, 1);
}

// The owner keeps the lock: the abort goes ahead after the grace (it would hang forever with a
// plain lock), once; the owner, back from its call, finds the slot torn down and has nothing to
// tear down itself.
TEST(CompletionWatchdogAbortTest, AnOwnerStuckWithTheLockIsAbortedAfterTheGrace) {
  Resource r;
  AbortableSlot<Resource*> slot(&r);
  StuckOwner owner(slot);
  const absl::Duration grace = absl::Milliseconds(50);
  const absl::Time start = absl::Now();
  EXPECT_EQ(AbortWithGrace(slot, grace, [](Resource* x) { ++x->aborts; }),
            AbortHow::kWithoutLock);
  EXPECT_GE(absl::Now() - start, grace);
  EXPECT_EQ(r.aborts, 1);
  EXPECT_EQ(slot.handle, &r);  // the owner's field, not written without its lock
  EXPECT_TRUE(owner.Release());
  EXPECT_EQ(slot.TakeTeardown(), nullptr);  // the owner's destructor: nothing left to destroy
  EXPECT_EQ(r.aborts, 1);
}

// The owner tore the resource down first (its destructor's finalize): the watchdog does nothing.
TEST(CompletionWatchdogAbortTest, TheOwnersTeardownFirstLeavesNothingToAbort) {
  Resource r;
  AbortableSlot<Resource*> slot(&r);
  {
    std::lock_guard<std::timed_mutex> use(slot.mu);
    ASSERT_EQ(slot.TakeTeardown(), &r);
    slot.handle = nullptr;
  }
  EXPECT_EQ(AbortWithGrace(slot, absl::Seconds(10), [](Resource* x) { ++x->aborts; }),
            AbortHow::kAlreadyGone);
  EXPECT_EQ(r.aborts, 0);
}

// Many watchdogs (one per world sharing a communicator's slot, say) racing, some while the owner
// holds the lock: one abort in all.
TEST(CompletionWatchdogAbortTest, RacingAbortsTearDownOnce) {
  for (int round = 0; round < 20; ++round) {
    Resource r;
    AbortableSlot<Resource*> slot(&r);
    StuckOwner owner(slot);
    std::vector<std::thread> dogs;
    std::atomic<int> without_lock{0};
    for (int i = 0; i < 4; ++i) {
      dogs.emplace_back([&] {
        if (AbortWithGrace(slot, absl::Milliseconds(1), [](Resource* x) { ++x->aborts; }) ==
            AbortHow::kWithoutLock) {
          ++without_lock;
        }
      });
    }
    for (std::thread& t : dogs) t.join();
    EXPECT_TRUE(owner.Release());
    EXPECT_EQ(r.aborts, 1) << "round " << round;
    EXPECT_EQ(without_lock, 1) << "round " << round;
  }
}

}  // namespace
}  // namespace shardmap::collectives::internal
