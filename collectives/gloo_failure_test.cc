// Failure semantics of the Gloo backend: a dead or silent peer, mismatched calls and bad
// arguments end every rank's pending collective with an error naming the rank, never a hang.
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/gloo_communicator.h"
#include "collectives/gloo_threads.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

GlooOptions WithTimeout(absl::Duration t) {
  GlooOptions o;
  o.timeout = t;
  return o;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(GlooFailureTest, ADeadPeerFailsTheOthersAtOnceNamingIt) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> all = RunGlooThreadsEach(4, [](Communicator& c) -> absl::Status {
    // Rank 2 leaves: its communicator closes its connections, like a process that died.
    if (c.rank() == 2) return absl::InternalError("rank 2 gives up");
    std::vector<float> x(100000, 1.0f);
    return c.AllReduce(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
  }, WithTimeout(absl::Seconds(30)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));  // far below the 30 s timeout
  for (int r : {0, 1, 3}) {
    // Lost it directly (Unavailable), or heard it from a peer that did (Aborted).
    EXPECT_THAT(all[r].code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                absl::StatusCode::kAborted)) << all[r];
    EXPECT_THAT(Message(all[r]), AllOf(HasSubstr("AllReduce(f32, sum, count=100000)"),
                                       HasSubstr("lost rank 2"),
                                       HasSubstr(absl::StrCat("(rank ", r, ")"))));
  }
}

TEST(GlooFailureTest, ASilentPeerTimesOutNamingIt) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> all = RunGlooThreadsEach(3, [](Communicator& c) -> absl::Status {
    if (c.rank() == 1) {  // hung: alive, connections open, never calls
      std::this_thread::sleep_for(std::chrono::seconds(4));
      return absl::OkStatus();
    }
    double x = 1;
    return c.AllReduce(&x, &x, 1, DataType::kF64, ReduceOp::kMax);
  }, WithTimeout(absl::Seconds(1)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r : {0, 2}) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kDeadlineExceeded) << all[r];
    EXPECT_THAT(Message(all[r]), HasSubstr("timed out after 1s waiting for rank 1"));
  }
}

TEST(GlooFailureTest, MismatchedCallsFailOnEveryRankWithBothCalls) {
  std::vector<absl::Status> all = RunGlooThreadsEach(3, [](Communicator& c) -> absl::Status {
    std::vector<float> x(8, 1.0f);
    const size_t count = c.rank() == 2 ? 5 : 4;  // rank 2 disagrees on the count
    absl::Status s = c.AllReduce(x.data(), x.data(), count, DataType::kF32, ReduceOp::kSum);
    if (s.ok()) return s;
    // The world is poisoned: later calls are refused, naming the first failure.
    absl::Status later = c.Barrier();
    EXPECT_EQ(later.code(), absl::StatusCode::kAborted);
    EXPECT_THAT(Message(later), HasSubstr("refused"));
    return s;
  }, WithTimeout(absl::Seconds(30)));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(Message(all[r]),
                AllOf(HasSubstr("mismatched collectives"),
                      HasSubstr("rank 0 called AllReduce(f32, sum, count=4) #2"),
                      HasSubstr("rank 2 called AllReduce(f32, sum, count=5) #2")));
  }
}

// The all-reduce posts its data before the descriptors are checked, on slots derived from the
// whole call: ranks that disagree on the count (here small against large, buffers sized exactly)
// move no data between them, so no receive overflows (Gloo would abort the process); all fail.
TEST(GlooFailureTest, MismatchedAllReduceCountsMoveNoData) {
  std::vector<absl::Status> all = RunGlooThreadsEach(3, [](Communicator& c) -> absl::Status {
    const size_t count = c.rank() == 1 ? 300000 : 50000;
    std::vector<float> x(count, 1.0f);
    return c.AllReduce(x.data(), x.data(), count, DataType::kF32, ReduceOp::kSum);
  }, WithTimeout(absl::Seconds(30)));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(Message(all[r]),
                AllOf(HasSubstr("rank 0 called AllReduce(f32, sum, count=50000) #2"),
                      HasSubstr("rank 1 called AllReduce(f32, sum, count=300000) #2")));
  }
}

// The caller's CallTag travels in the call descriptor: calls that agree on what Gloo sees (op,
// dtype, count) but not on the caller's view (here the axes) fail on every rank with both tags.
std::string DescribeTag(const uint64_t* w) { return absl::StrCat("call over axes ", w[0]); }

TEST(GlooFailureTest, CallTagsThatDifferFailWithBothTags) {
  std::vector<absl::Status> all = RunGlooThreadsEach(3, [](Communicator& c) -> absl::Status {
    EXPECT_TRUE(c.ComparesCallTags());
    float x = 1.0f;
    CallTag same;
    same.words[0] = 7;
    same.describe = &DescribeTag;
    c.TagNextCall(same);
    if (absl::Status s = c.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum); !s.ok()) {
      return s;
    }
    // A tag applies to one call: the second Barrier is untagged on every rank.
    c.TagNextCall(same);
    if (absl::Status s = c.Barrier(); !s.ok()) return s;
    if (absl::Status s = c.Barrier(); !s.ok()) return s;
    EXPECT_EQ(x, 3.0f);
    CallTag tag;
    tag.words[0] = c.rank() == 1 ? 2 : 1;  // rank 1 names other axes
    tag.words[CallTag::kWords - 1] = 5;
    tag.describe = &DescribeTag;
    c.TagNextCall(tag);
    return c.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
  }, WithTimeout(absl::Seconds(30)));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(Message(all[r]),
                AllOf(HasSubstr("mismatched collectives"),
                      HasSubstr("rank 0 issued call over axes 1 [AllReduce(f32, sum, count=1) #"),
                      HasSubstr("rank 1 issued call over axes 2 [AllReduce(f32, sum, count=1) #")))
        << "rank " << r;
  }
}

TEST(GlooFailureTest, ASkippedCollectiveIsAMismatchNotAHang) {
  std::vector<absl::Status> all = RunGlooThreadsEach(2, [](Communicator& c) -> absl::Status {
    if (c.rank() == 1) {
      if (absl::Status s = c.Barrier(); !s.ok()) return s;
    }
    int32_t x = 1;
    return c.AllReduce(&x, &x, 1, DataType::kI32, ReduceOp::kSum);
  }, WithTimeout(absl::Seconds(30)));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(Message(all[r]), AllOf(HasSubstr("AllReduce(i32, sum, count=1)"),
                                       HasSubstr("Barrier()")));
  }
}

TEST(GlooFailureTest, SendRecvDisagreeingOnTheCountFailBoth) {
  std::vector<absl::Status> all = RunGlooThreadsEach(2, [](Communicator& c) -> absl::Status {
    std::vector<double> x(10, 1.0);
    if (c.rank() == 0) return c.Send(x.data(), 10, DataType::kF64, 1);
    return c.Recv(x.data(), 9, DataType::kF64, 0);
  }, WithTimeout(absl::Seconds(30)));
  EXPECT_EQ(all[1].code(), absl::StatusCode::kInvalidArgument) << all[1];
  EXPECT_THAT(Message(all[1]), HasSubstr("rank 0 sent f64 count=10 but this rank expects f64 count=9"));
  EXPECT_FALSE(all[0].ok());
}

// Each bad call fails on the rank that made it with a clear message, and its peers (which
// called correctly) fail soon after instead of waiting for the timeout.
TEST(GlooFailureTest, BadArgumentsAreReportedAndReleasePeers) {
  struct BadCall {
    const char* expect;
    std::function<absl::Status(Communicator&)> call;
  };
  float f[8] = {};
  const std::vector<BadCall> cases = {
      {"invalid DataType value 42",
       [&](Communicator& c) { return c.AllReduce(f, f, 4, static_cast<DataType>(42), ReduceOp::kSum); }},
      {"invalid ReduceOp value 9",
       [&](Communicator& c) { return c.AllReduce(f, f, 4, DataType::kF32, static_cast<ReduceOp>(9)); }},
      {"recv is null but 4 elements were requested",
       [&](Communicator& c) { return c.AllReduce(f, nullptr, 4, DataType::kF32, ReduceOp::kSum); }},
      {"root 5 is not a rank of this group of 2",
       [&](Communicator& c) { return c.Broadcast(f, 4, DataType::kF32, 5); }},
      {"counts has 3 entries but the group has 2 ranks",
       [&](Communicator& c) {
         const size_t counts[] = {1, 1, 1};
         return c.AllGatherV(f, f, counts, DataType::kF32);
       }},
      {"pair (0, 7) names a rank outside [0, 2)",
       [&](Communicator& c) {
         const std::pair<int, int> pairs[] = {{0, 7}};
         return c.Ppermute(f, f, 4, DataType::kF32, pairs);
       }},
      {"peer must be another rank of this group of 2",
       [&](Communicator& c) { return c.Send(f, 4, DataType::kF32, c.rank()); }},
  };
  for (const BadCall& bad : cases) {
    const absl::Time start = absl::Now();
    std::vector<absl::Status> all = RunGlooThreadsEach(2, [&](Communicator& c) -> absl::Status {
      if (c.rank() == 1) return bad.call(c);
      return c.AllReduce(f, f, 4, DataType::kF32, ReduceOp::kSum);
    }, WithTimeout(absl::Seconds(30)));
    EXPECT_EQ(all[1].code(), absl::StatusCode::kInvalidArgument) << all[1];
    EXPECT_THAT(Message(all[1]), AllOf(HasSubstr(bad.expect), HasSubstr("(rank 1)")));
    // Rank 0 learns of it from rank 1 and reports rank 1's own code and message.
    EXPECT_EQ(all[0].code(), absl::StatusCode::kInvalidArgument) << all[0];
    EXPECT_THAT(Message(all[0]), AllOf(HasSubstr("rank 1 failed and closed its connections"),
                                       HasSubstr(bad.expect)));
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << bad.expect;
  }
}

TEST(GlooFailureTest, AllToAllVCountsThatDisagreeAcrossRanksAreCaught) {
  std::vector<absl::Status> all = RunGlooThreadsEach(2, [](Communicator& c) -> absl::Status {
    float x[8] = {};
    // Rank 0 sends 2 elements to rank 1, but rank 1 expects 3.
    const size_t send[2] = {1, 2};
    const size_t recv_on_0[2] = {1, 1};
    const size_t send_1[2] = {1, 1};
    const size_t recv_on_1[2] = {3, 1};
    if (c.rank() == 0) return c.AllToAllV(x, send, x + 4, recv_on_0, DataType::kF32);
    return c.AllToAllV(x, send_1, x + 4, recv_on_1, DataType::kF32);
  }, WithTimeout(absl::Seconds(30)));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(Message(all[r]), HasSubstr("recv_counts[q] on rank p must equal send_counts[p]"));
  }
}

TEST(GlooFailureTest, FactoryRejectsBadOptions) {
  EXPECT_EQ(CreateGlooCommunicator(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int> port = internal::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  absl::StatusOr<std::unique_ptr<TcpStore>> store =
      TcpStore::Create({.port = *port, .rank = 0, .world_size = 1});
  ASSERT_TRUE(store.ok()) << store.status();
  std::shared_ptr<TcpStore> shared(std::move(*store));
  absl::Status s = CreateGlooCommunicator(shared, WithTimeout(absl::ZeroDuration())).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("options.timeout must be positive"));
  GlooOptions bad_host;
  bad_host.hostname = "no-such-host.invalid";
  s = CreateGlooCommunicator(shared, bad_host).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s), AllOf(HasSubstr("cannot open Gloo's TCP transport"),
                                HasSubstr("no-such-host.invalid")));
}

}  // namespace
}  // namespace shardmap::collectives
