// CompletionWatchdog with fake items (no GPU): an item is done when its flag is set, fails when
// its error is set, and counts its destruction, so every path of a pass is driven by the test.
#include "collectives/internal/completion_watchdog.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

using ::testing::HasSubstr;

// What the test controls about one item (shared with the item the watchdog holds).
struct FakeWork {
  std::atomic<bool> done{false};
  std::atomic<bool> query_fails{false};
  std::mutex mu;
  absl::Status error;  // guarded by mu: non-OK fails the item at the next pass
  std::atomic<int> is_done_calls{0};
};

struct FakeItem {
  std::shared_ptr<FakeWork> work;
  std::shared_ptr<std::atomic<int>> destroyed;  // counts destroyed items that held work
  int id = 0;
  FakeItem(std::shared_ptr<FakeWork> w, std::shared_ptr<std::atomic<int>> d, int i)
      : work(std::move(w)), destroyed(std::move(d)), id(i) {}
  FakeItem(FakeItem&& o) noexcept = default;
  FakeItem& operator=(FakeItem&& o) noexcept = default;
  ~FakeItem() {
    if (work != nullptr && destroyed != nullptr) ++*destroyed;
  }
};

struct Failure {
  int id;
  absl::Status why;
};

// A watchdog over FakeItems that records its failures.
class Harness {
 public:
  explicit Harness(absl::Duration interval = absl::Milliseconds(2))
      : dog_(MakeCallbacks(), WatchdogOptions{interval, nullptr}) {}

  CompletionWatchdog<FakeItem>& dog() { return dog_; }
  std::shared_ptr<std::atomic<int>> destroyed() const { return destroyed_; }

  std::shared_ptr<FakeWork> Watch(int id, absl::Duration timeout = absl::Hours(1)) {
    auto w = std::make_shared<FakeWork>();
    EXPECT_TRUE(dog_.Watch(FakeItem(w, destroyed_, id), absl::Now() + timeout,
                           absl::StrCat("fake call ", id)).ok());
    return w;
  }

  std::vector<Failure> failures() {
    std::lock_guard<std::mutex> l(mu_);
    return failures_;
  }

  // Waits (up to 10 s) until `pred` holds.
  template <typename Pred>
  static bool Eventually(Pred pred) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (absl::Now() < end) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return pred();
  }

 private:
  CompletionWatchdog<FakeItem>::Callbacks MakeCallbacks() {
    CompletionWatchdog<FakeItem>::Callbacks cb;
    cb.is_done = [](FakeItem& it) -> absl::StatusOr<bool> {
      ++it.work->is_done_calls;
      if (it.work->query_fails) return absl::InternalError("the query failed");
      return it.work->done.load();
    };
    cb.poll_error = [](FakeItem& it, absl::Duration) {
      std::lock_guard<std::mutex> l(it.work->mu);
      return it.work->error;
    };
    cb.on_failure = [this](FakeItem& it, const absl::Status& why) {
      std::lock_guard<std::mutex> l(mu_);
      failures_.push_back({it.id, why});
    };
    return cb;
  }

  std::shared_ptr<std::atomic<int>> destroyed_ = std::make_shared<std::atomic<int>>(0);
  std::mutex mu_;
  std::vector<Failure> failures_;  // guarded by mu_
  CompletionWatchdog<FakeItem> dog_;  // last: its thread calls the callbacks above
};

TEST(CompletionWatchdogTest, DoneItemsAreDroppedWithoutAFailure) {
  Harness h;
  auto a = h.Watch(1), b = h.Watch(2);
  EXPECT_EQ(h.dog().pending(), 2u);
  a->done = true;
  ASSERT_TRUE(Harness::Eventually([&] { return h.dog().pending() == 1; }));
  b->done = true;
  ASSERT_TRUE(Harness::Eventually([&] { return h.dog().pending() == 0; }));
  EXPECT_EQ(h.destroyed()->load(), 2) << "a dropped item was not destroyed";
  EXPECT_TRUE(h.failures().empty());
}

TEST(CompletionWatchdogTest, AnItemPastItsDeadlineFailsOnceWithDeadlineExceeded) {
  Harness h;
  auto late = h.Watch(7, absl::Milliseconds(30));
  auto fine = h.Watch(8, absl::Hours(1));
  ASSERT_TRUE(Harness::Eventually([&] { return !h.failures().empty(); }));
  absl::SleepFor(absl::Milliseconds(30));  // more passes: still reported once
  std::vector<Failure> f = h.failures();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, 7);
  EXPECT_EQ(f[0].why.code(), absl::StatusCode::kDeadlineExceeded) << f[0].why;
  EXPECT_THAT(std::string(f[0].why.message()), HasSubstr("fake call 7: not done after"));
  EXPECT_EQ(h.dog().pending(), 1u);  // the other one is still watched
  fine->done = true;
  ASSERT_TRUE(Harness::Eventually([&] { return h.dog().pending() == 0; }));
  EXPECT_EQ(h.failures().size(), 1u);
}

TEST(CompletionWatchdogTest, AnAsynchronousErrorFailsTheItemBeforeItsDeadline) {
  Harness h;
  auto w = h.Watch(3, absl::Hours(1));
  {
    std::lock_guard<std::mutex> l(w->mu);
    w->error = absl::UnavailableError("remote peer closed the connection");
  }
  ASSERT_TRUE(Harness::Eventually([&] { return !h.failures().empty(); }));
  std::vector<Failure> f = h.failures();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, 3);
  EXPECT_EQ(f[0].why, absl::UnavailableError("remote peer closed the connection"));
  EXPECT_EQ(h.dog().pending(), 0u);
}

// The error is looked at before completion: a call that completed on a communicator that
// reports an error (its result may be garbage) fails.
TEST(CompletionWatchdogTest, AnErrorWinsOverCompletion) {
  Harness h(absl::InfiniteDuration());  // only Sweep() passes
  auto w = h.Watch(4);
  w->done = true;
  {
    std::lock_guard<std::mutex> l(w->mu);
    w->error = absl::InternalError("asynchronous NCCL error");
  }
  EXPECT_EQ(h.dog().Sweep(), absl::InternalError("asynchronous NCCL error"));
  ASSERT_EQ(h.failures().size(), 1u);
}

TEST(CompletionWatchdogTest, AFailedQueryFailsTheItem) {
  Harness h(absl::InfiniteDuration());
  auto w = h.Watch(5);
  w->query_fails = true;
  absl::Status s = h.dog().Sweep();
  EXPECT_EQ(s, absl::InternalError("the query failed"));
  ASSERT_EQ(h.failures().size(), 1u);
  EXPECT_EQ(h.failures()[0].id, 5);
  EXPECT_TRUE(h.dog().Sweep().ok()) << "a failure was reported twice";
}

// Sweep() is the caller's pass: it finds what happened without waiting for the thread.
TEST(CompletionWatchdogTest, SweepPassesOnTheCallersThread) {
  Harness h(absl::InfiniteDuration());
  auto a = h.Watch(1), b = h.Watch(2, absl::ZeroDuration());
  a->done = true;
  const absl::Status s = h.dog().Sweep();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(h.dog().pending(), 0u);
  ASSERT_EQ(h.failures().size(), 1u);
  EXPECT_EQ(h.failures()[0].id, 2);
  EXPECT_TRUE(h.dog().Sweep().ok());
}

// Shutdown with items pending returns at once: they are destroyed, without callbacks, and the
// watchdog refuses new ones.
TEST(CompletionWatchdogTest, StopWithPendingItemsNeitherHangsNorCallsBack) {
  auto h = std::make_unique<Harness>();
  std::vector<std::shared_ptr<FakeWork>> works;
  for (int i = 0; i < 5; ++i) works.push_back(h->Watch(i, absl::Hours(1)));
  auto destroyed = h->destroyed();
  const absl::Time t0 = absl::Now();
  h->dog().Stop();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(destroyed->load(), 5);
  EXPECT_TRUE(h->failures().empty());
  EXPECT_EQ(h->dog().pending(), 0u);
  auto w = std::make_shared<FakeWork>();
  const absl::Status refused =
      h->dog().Watch(FakeItem(w, destroyed, 9), absl::Now() + absl::Hours(1), "late call");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("late call"));
  EXPECT_EQ(destroyed->load(), 6) << "the refused item was not destroyed";
  h.reset();  // the destructor stops again: idempotent
  EXPECT_EQ(destroyed->load(), 6);
}

TEST(CompletionWatchdogTest, DestroyingAWatchdogWithPendingItemsReturns) {
  std::shared_ptr<std::atomic<int>> destroyed;
  {
    Harness h;
    for (int i = 0; i < 3; ++i) h.Watch(i, absl::Hours(1));
    destroyed = h.destroyed();
  }
  EXPECT_EQ(destroyed->load(), 3);
}

// Several threads watch many items; some fail, the rest complete in any order. Each failing
// one is reported exactly once, every item is destroyed, nothing stays pending.
TEST(CompletionWatchdogTest, ManyItemsFromSeveralThreads) {
  Harness h(absl::Microseconds(200));
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, t] {
      std::vector<std::shared_ptr<FakeWork>> mine;
      for (int i = 0; i < kPerThread; ++i) {
        const int id = t * kPerThread + i;
        mine.push_back(h.Watch(id));
        if (i >= 3) {  // complete (or fail) an earlier one: out of order with the watching
          FakeWork& w = *mine[i - 3 + (i % 3)];
          if (id % 7 == 0) {
            std::lock_guard<std::mutex> l(w.mu);
            if (w.error.ok() && !w.done) w.error = absl::AbortedError("failed");
          } else if (!w.done) {
            w.done = true;
          }
        }
      }
      for (auto& w : mine) {
        std::lock_guard<std::mutex> l(w->mu);
        if (w->error.ok()) w->done = true;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(Harness::Eventually([&] { return h.dog().pending() == 0; }))
      << h.dog().pending() << " still pending";
  std::vector<Failure> f = h.failures();
  std::vector<int> seen(kThreads * kPerThread, 0);
  for (const Failure& x : f) {
    EXPECT_EQ(x.why, absl::AbortedError("failed"));
    ++seen[x.id];
  }
  for (int id = 0; id < kThreads * kPerThread; ++id) ASSERT_LE(seen[id], 1) << id;
  EXPECT_GT(f.size(), 0u);
  EXPECT_EQ(h.destroyed()->load(), kThreads * kPerThread);
}

// No busy spin: with an item pending the thread passes about once per interval; with nothing
// pending it does not pass at all.
TEST(CompletionWatchdogTest, TheThreadSleepsBetweenPassesAndWhenIdle) {
  Harness h(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(h.dog().thread_passes(), 0) << "passes with nothing to watch";
  auto w = h.Watch(1);
  absl::SleepFor(absl::Milliseconds(200));
  const int calls = w->is_done_calls.load();
  EXPECT_GE(calls, 2);
  EXPECT_LE(calls, 200 / 20 + 5) << "the thread spins instead of sleeping";
  w->done = true;
  ASSERT_TRUE(Harness::Eventually([&] { return h.dog().pending() == 0; }));
  const int64_t passes = h.dog().thread_passes();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_LE(h.dog().thread_passes(), passes + 1) << "passes after the last item left";
}

// on_failure runs outside the watchdog's locks: it may watch a new item (as an NCCL abort path
// that enqueues nothing, or a test's fake, would) without a deadlock.
TEST(CompletionWatchdogTest, AFailureCallbackMayWatchAgain) {
  std::atomic<int> failures{0};
  auto destroyed = std::make_shared<std::atomic<int>>(0);
  CompletionWatchdog<FakeItem>* self = nullptr;
  CompletionWatchdog<FakeItem>::Callbacks cb;
  cb.is_done = [](FakeItem& it) -> absl::StatusOr<bool> { return it.work->done.load(); };
  cb.on_failure = [&](FakeItem& it, const absl::Status&) {
    if (failures++ == 0) {
      auto w = std::make_shared<FakeWork>();
      w->done = true;
      EXPECT_TRUE(self->Watch(FakeItem(w, destroyed, 2), absl::Now() + absl::Hours(1), "x").ok());
    }
  };
  CompletionWatchdog<FakeItem> dog(std::move(cb), WatchdogOptions{absl::Milliseconds(1), nullptr});
  self = &dog;
  ASSERT_TRUE(dog.Watch(FakeItem(std::make_shared<FakeWork>(), destroyed, 1), absl::Now(), "y")
                  .ok());
  ASSERT_TRUE(Harness::Eventually([&] { return failures == 1 && dog.pending() == 0; }));
  EXPECT_EQ(destroyed->load(), 2);
}

TEST(CompletionWatchdogTest, TheThreadStartHookRunsOnceOnTheThread) {
  std::atomic<int> runs{0};
  std::thread::id where;
  std::mutex mu;
  CompletionWatchdog<FakeItem>::Callbacks cb;
  cb.is_done = [](FakeItem&) -> absl::StatusOr<bool> { return true; };
  cb.on_failure = [](FakeItem&, const absl::Status&) {};
  WatchdogOptions o;
  o.on_thread_start = [&] {
    std::lock_guard<std::mutex> l(mu);
    where = std::this_thread::get_id();
    ++runs;
  };
  {
    CompletionWatchdog<FakeItem> dog(std::move(cb), o);
    ASSERT_TRUE(Harness::Eventually([&] { return runs == 1; }));
  }
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(runs, 1);
  EXPECT_NE(where, std::this_thread::get_id());
}

}  // namespace
}  // namespace shardmap::collectives::internal
