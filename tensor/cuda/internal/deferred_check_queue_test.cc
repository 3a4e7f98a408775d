// The deferred index checks' bookkeeping against a fake of the slots' copies (which slots have
// landed, their words): runs only landed checks, the earliest failure first, a full queue waits
// for its oldest check alone, and no throw leaves a slot taken.
#include "tensor/cuda/internal/deferred_check_queue.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/error.h"

namespace shardmap::cuda::internal {
namespace {

// The slots' copies: a slot lands when the test says so (or when waited for).
struct FakeCopies {
  std::set<int> landed;
  std::map<int, int64_t> word;  // what the slot's copy brings (-1: no bad index)
  std::vector<int> waited;
  DeferredCheckQueue::SlotOps Ops() {
    DeferredCheckQueue::SlotOps o;
    o.done = [this](int s) { return landed.count(s) > 0; };
    o.wait = [this](int s) {
      waited.push_back(s);
      landed.insert(s);
    };
    o.value = [this](int s) { return word.count(s) ? word[s] : int64_t{-1}; };
    return o;
  }
};

DeferredCheckQueue::Fail Throws(std::string op) {
  return [op](int64_t pos) { OpFail(op, ": bad id at position ", pos); };
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const OpError& e) {
    return std::string(e.status().message());
  }
  return "no error";
}

TEST(DeferredCheckQueueTest, RunsOnlyLandedChecksAndThrowsTheEarliestFailure) {
  FakeCopies copies;
  DeferredCheckQueue q(8, copies.Ops());
  std::vector<int> slots;
  for (int i = 0; i < 4; ++i) {
    slots.push_back(q.Acquire());
    q.Add(slots.back(), Throws("op" + std::to_string(i)));
  }
  copies.word[slots[1]] = 7;  // op1 and op3 are bad; op2 has not landed yet
  copies.word[slots[2]] = 5;
  copies.word[slots[3]] = 9;
  copies.landed = {slots[0], slots[1], slots[3]};
  EXPECT_EQ(ErrorOf([&] { q.RunFinished(); }), "op1: bad id at position 7");
  EXPECT_EQ(q.pending(), 1u);  // op2, still in flight, stays queued
  copies.landed.insert(slots[2]);
  EXPECT_EQ(ErrorOf([&] { q.RunFinished(); }), "op2: bad id at position 5");
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_EQ(ErrorOf([&] { q.RunFinished(); }), "no error");
}

TEST(DeferredCheckQueueTest, GoodChecksFreeTheirSlots) {
  FakeCopies copies;
  DeferredCheckQueue q(2, copies.Ops());
  for (int round = 0; round < 5; ++round) {
    const int a = q.Acquire();
    q.Add(a, Throws("a"));
    const int b = q.Acquire();
    q.Add(b, Throws("b"));
    copies.landed = {a, b};
    q.RunFinished();
    EXPECT_EQ(q.pending(), 0u);
  }
  EXPECT_TRUE(copies.waited.empty());  // never full: never waited
}

// Full: the oldest check is waited for (by its own slot: its stream may be gone), then every
// landed check runs; the slot it frees is handed out.
TEST(DeferredCheckQueueTest, AFullQueueWaitsForItsOldestCheckOnly) {
  FakeCopies copies;
  DeferredCheckQueue q(3, copies.Ops());
  std::vector<int> slots;
  for (int i = 0; i < 3; ++i) {
    slots.push_back(q.Acquire());
    q.Add(slots.back(), Throws("op" + std::to_string(i)));
  }
  const int next = q.Acquire();
  EXPECT_EQ(copies.waited, std::vector<int>{slots[0]});
  EXPECT_EQ(next, slots[0]);
  EXPECT_EQ(q.pending(), 2u);
}

// A bad check found by a full queue's wait is thrown from that Acquire (the op being queued
// then is not), and its slot is free: the next Acquire succeeds without another wait.
TEST(DeferredCheckQueueTest, AFailureFoundWhenFullLeavesTheQueueUsable) {
  FakeCopies copies;
  DeferredCheckQueue q(2, copies.Ops());
  const int a = q.Acquire();
  q.Add(a, Throws("embedding"));
  const int b = q.Acquire();
  q.Add(b, Throws("cross_entropy"));
  copies.word[a] = 3;
  EXPECT_EQ(ErrorOf([&] { (void)q.Acquire(); }), "embedding: bad id at position 3");
  EXPECT_EQ(q.pending(), 1u);
  const int c = q.Acquire();
  EXPECT_EQ(c, a);
  EXPECT_EQ(copies.waited.size(), 1u);
}

TEST(DeferredCheckQueueTest, ReleasedSlotsAreReused) {
  FakeCopies copies;
  DeferredCheckQueue q(1, copies.Ops());
  const int a = q.Acquire();
  q.Release(a);
  EXPECT_EQ(q.Acquire(), a);
  EXPECT_TRUE(copies.waited.empty());
}

// A CUDA error while asking a slot (done throws) leaves every check queued.
TEST(DeferredCheckQueueTest, AThrowingQueryLeavesTheChecksQueued) {
  FakeCopies copies;
  DeferredCheckQueue::SlotOps ops = copies.Ops();
  bool broken = true;
  ops.done = [&](int s) {
    if (broken) OpFail("cudaEventQuery: an illegal memory access");
    return copies.landed.count(s) > 0;
  };
  DeferredCheckQueue q(4, ops);
  const int a = q.Acquire();
  q.Add(a, Throws("gather"));
  copies.landed = {a};
  copies.word[a] = 1;
  EXPECT_EQ(ErrorOf([&] { q.RunFinished(); }), "cudaEventQuery: an illegal memory access");
  EXPECT_EQ(q.pending(), 1u);
  broken = false;
  EXPECT_EQ(ErrorOf([&] { q.RunFinished(); }), "gather: bad id at position 1");
}

TEST(DeferredCheckQueueTest, BadConfigurationIsAnError) {
  FakeCopies copies;
  EXPECT_NE(ErrorOf([&] { DeferredCheckQueue q(0, copies.Ops()); }).find("at least 1"),
            std::string::npos);
  DeferredCheckQueue::SlotOps missing = copies.Ops();
  missing.wait = nullptr;
  EXPECT_NE(ErrorOf([&] { DeferredCheckQueue q(2, missing); }).find("must all be given"),
            std::string::npos);
}

}  // namespace
}  // namespace shardmap::cuda::internal
