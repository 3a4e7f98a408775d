// SimulatedLinkCommunicator: the modelled times against hand-computed ones, calls that last at
// least their modelled time, started calls that overlap the caller's work (timing checks are
// lower bounds and very loose upper bounds: this machine is shared and noisy; the figures are
// in bench/collectives_bench.cc), results and errors of the inner backend unchanged.
#include "collectives/simulated_link.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/in_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using collectives::CallTag;
using collectives::Communicator;
using collectives::DataType;
using collectives::ReduceOp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(SimulatedLinkTest, ModelledSecondsFollowTheRingFormulas) {
  const SimulatedLink link{.ring = {.alpha_s = 1e-3, .busbw = 1e6}};
  // S = 1 MB on 4 ranks: 2 (t-1)/t S/B = 1.5 s for an all-reduce, half of it for the others.
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "all_reduce", 4, 1e6), 1e-3 + 1.5);
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "all_gather", 4, 1e6), 1e-3 + 0.75);
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "reduce_scatter", 4, 1e6), 1e-3 + 0.75);
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "all_reduce", 3, 3e6), 1e-3 + 4.0);  // 2 * 2/3 * 3
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "broadcast", 5, 2e6), 1e-3 + 2.0);
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "ppermute", 2, 5e5), 1e-3 + 0.5);
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "barrier", 3, 0), 1e-3);
  EXPECT_DOUBLE_EQ(ModelledSeconds(link, "all_reduce", 1, 1e9), 0);  // one rank: no link
}

TEST(SimulatedLinkTest, ABadLinkIsRefusedByEveryCall) {
  absl::Status s = collectives::RunInProcess(2, [](Communicator& c) -> absl::Status {
    for (const SimulatedLink& bad : {SimulatedLink{.ring = {.alpha_s = 0, .busbw = 0}},
                                     SimulatedLink{.ring = {.alpha_s = -1, .busbw = 1e9}}}) {
      SimulatedLinkCommunicator slow(&c, bad);
      float x = 1;
      EXPECT_EQ(slow.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum).code(),
                absl::StatusCode::kInvalidArgument);
      auto h = slow.AllReduceStart(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
      EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    }
    EXPECT_THAT(std::string(SimulatedLinkCommunicator::Check(
                                {.ring = {.alpha_s = 0, .busbw = -2}}).message()),
                HasSubstr("busbw must be a positive number of bytes/s"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(SimulatedLinkTest, ABlockingCallLastsAtLeastItsModelledTimeAndGivesTheInnerResult) {
  // 3 ranks, 30000 f32 = 120 kB on 1 MB/s: 2 * 2/3 * 0.12 = 0.16 s, + 20 ms.
  const SimulatedLink link{.ring = {.alpha_s = 0.02, .busbw = 1e6}};
  const double modelled = ModelledSeconds(link, "all_reduce", 3, 120000);
  absl::Status s = collectives::RunInProcess(3, [&](Communicator& c) -> absl::Status {
    SimulatedLinkCommunicator slow(&c, link);
    std::vector<float> x(30000), want(30000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / (c.rank() + 2 + i % 5);
    want = x;
    if (absl::Status st = c.AllReduce(want.data(), want.data(), want.size(), DataType::kF32,
                                      ReduceOp::kSum); !st.ok()) return st;
    const Clock::time_point t0 = Clock::now();
    if (absl::Status st = slow.AllReduce(x.data(), x.data(), x.size(), DataType::kF32,
                                         ReduceOp::kSum); !st.ok()) return st;
    const double took = Since(t0);
    EXPECT_GE(took, modelled * 0.999) << "rank " << c.rank();
    EXPECT_EQ(0, std::memcmp(x.data(), want.data(), x.size() * 4));
    const LinkStats st = slow.stats();
    EXPECT_EQ(st.calls, 1);
    EXPECT_DOUBLE_EQ(st.modelled_seconds, modelled);
    EXPECT_GT(st.slept_seconds, 0.5 * modelled) << "the wait must be a sleep";
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(SimulatedLinkTest, StartedCallsOverlapTheCallersWork) {
  // Two started all-reduces of 0.25 s each (FIFO on one link: 0.5 s) beside 0.5 s of the
  // caller's "compute" (a sleep): about max(0.5, 0.5) overlapped, 1.0 s in sequence.
  const SimulatedLink link{.ring = {.alpha_s = 0.25, .busbw = 1e12}};
  const double each = ModelledSeconds(link, "all_reduce", 3, 8);
  ASSERT_NEAR(each, 0.25, 1e-6);
  std::vector<double> took(3);
  absl::Status s = collectives::RunInProcess(3, [&](Communicator& c) -> absl::Status {
    SimulatedLinkCommunicator slow(&c, link);
    EXPECT_TRUE(slow.OverlapsStartedCalls());
    {  // opens the lane (a Split of the inner communicator, not modelled)
      double w = 1;
      auto h = slow.AllReduceStart(&w, &w, 1, DataType::kF64, ReduceOp::kSum);
      if (!h.ok()) return h.status();
      if (absl::Status st = (*h)->Wait(); !st.ok()) return st;
    }
    double a = c.rank(), b = 10.0 * c.rank();
    const Clock::time_point t0 = Clock::now();
    auto h1 = slow.AllReduceStart(&a, &a, 1, DataType::kF64, ReduceOp::kSum);
    if (!h1.ok()) return h1.status();
    auto h2 = slow.AllReduceStart(&b, &b, 1, DataType::kF64, ReduceOp::kMax);
    if (!h2.ok()) return h2.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the caller's compute
    if (absl::Status st = (*h2)->Wait(); !st.ok()) return st;
    if (absl::Status st = (*h1)->Wait(); !st.ok()) return st;
    took[c.rank()] = Since(t0);
    EXPECT_EQ(a, 0 + 1 + 2);
    EXPECT_EQ(b, 20);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_GE(took[r], 2 * each * 0.999) << "rank " << r << ": the link is FIFO";
    EXPECT_LT(took[r], 0.85) << "rank " << r << ": 1.0 s would be no overlap at all";
  }
}

TEST(SimulatedLinkTest, StartedPpermutesAndReduceScattersGiveTheInnerResults) {
  const SimulatedLink link{.ring = {.alpha_s = 1e-3, .busbw = 1e9}};
  for (int n : {2, 3, 5}) {
    absl::Status s = collectives::RunInProcess(n, [&](Communicator& c) -> absl::Status {
      SimulatedLinkCommunicator slow(&c, link);
      std::vector<std::pair<int, int>> ring;
      for (int r = 0; r < n; ++r) ring.push_back({r, (r + 1) % n});
      double mine = 100.0 + c.rank(), got = -1;
      std::vector<double> in(3 * n), out(3, -1), gathered(5 * n, -1), part(5);
      for (size_t i = 0; i < in.size(); ++i) in[i] = c.rank() + 0.5 * i;
      for (int i = 0; i < 5; ++i) part[i] = 10.0 * c.rank() + i;
      auto p = slow.PpermuteStart(&mine, &got, 1, DataType::kF64, ring);
      if (!p.ok()) return p.status();
      auto r = slow.ReduceScatterStart(in.data(), out.data(), 3, DataType::kF64, ReduceOp::kSum);
      if (!r.ok()) return r.status();
      auto g = slow.AllGatherStart(part.data(), gathered.data(), 5, DataType::kF64);
      if (!g.ok()) return g.status();
      for (auto* h : {&*g, &*p, &*r}) {
        if (absl::Status st = (*h)->Wait(); !st.ok()) return st;
      }
      EXPECT_EQ(got, 100.0 + (c.rank() + n - 1) % n);
      for (int i = 0; i < 3; ++i) {  // sum over ranks q of q + 0.5 (3 rank + i)
        EXPECT_EQ(out[i], n * (n - 1) / 2.0 + n * 0.5 * (3 * c.rank() + i)) << i;
      }
      for (int q = 0; q < n; ++q) EXPECT_EQ(gathered[5 * q + 4], 10.0 * q + 4);
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << "n=" << n << ": " << s;
  }
}

TEST(SimulatedLinkTest, SplitWrapsTheChildrenAndTagsReachTheirCalls) {
  static auto describe = [](const uint64_t* w) { return absl::StrCat("site #", w[0]); };
  const SimulatedLink link{.ring = {.alpha_s = 0.05, .busbw = 1e12}};
  std::vector<absl::Status> started(3), blocking(3);
  absl::Status s = collectives::RunInProcess(3, [&](Communicator& c) -> absl::Status {
    SimulatedLinkCommunicator slow(&c, link);
    auto sub = slow.Split(c.rank() == 0 ? 0 : 1, c.rank());  // {0}, {1, 2}
    if (!sub.ok()) return sub.status();
    EXPECT_THAT((*sub)->name(), HasSubstr("simulated link"));
    float x = 1;
    const Clock::time_point t0 = Clock::now();
    if (absl::Status st = (*sub)->AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
        !st.ok()) return st;
    EXPECT_EQ(x, c.rank() == 0 ? 1 : 2);
    if (c.rank() != 0) {
      EXPECT_GE(Since(t0), 0.05 * 0.999);
    }
    EXPECT_EQ(slow.stats().calls, 1);  // the child adds into the parent's stats
    // A tag differs on rank 2: the inner in-process backend compares it, started or blocking.
    CallTag tag;
    tag.words[0] = c.rank() == 2 ? 2 : 1;
    tag.describe = +describe;
    slow.TagNextCall(tag);
    auto h = slow.AllReduceStart(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
    started[c.rank()] = h.ok() ? (*h)->Wait() : h.status();
    return started[c.rank()];
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(started[r].code(), absl::StatusCode::kInvalidArgument) << started[r];
    EXPECT_THAT(std::string(started[r].message()), AllOf(HasSubstr("site #1"), HasSubstr("site #2")));
  }
  s = collectives::RunInProcess(2, [&](Communicator& c) -> absl::Status {
    SimulatedLinkCommunicator slow(&c, link);
    CallTag tag;
    tag.words[0] = 5 + c.rank();
    tag.describe = +describe;
    slow.TagNextCall(tag);
    float x = 1;
    return blocking[c.rank()] = slow.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(blocking[0].message()), AllOf(HasSubstr("site #5"), HasSubstr("site #6")));
}

}  // namespace
}  // namespace shardmap::collectives
