// The conformance cases of the started calls (AllReduceStart, AllGatherStart, ReduceScatterStart;
// communicator.h): several in flight, interleaved with blocking calls on the same communicator,
// waited in an order that differs per rank, every dtype and reduce op, odd counts, world sizes
// 1, 2, 3, 5; each result against the naive reference and bitwise against the blocking call on
// the same inputs (bitwise backends). Error paths: a second Wait(), mismatched started calls
// (count, tag), a failing rank.
#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/backend_registry.h"
#include "collectives/communicator.h"
#include "collectives/conformance/backend_conformance.h"
#include "collectives/conformance/conformance_util.h"
#include "collectives/reference_reduce.h"
#include "gmock/gmock.h"

namespace shardmap::collectives::conformance {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using reference::kAllOps;
using reference::kAllTypes;
using reference::Make;
using reference::Reference;
using namespace conformance_util;  // NOLINT

using Handle = std::unique_ptr<PendingCollective>;

// Waits for `hs` in an order that depends on the rank (a rotation, reversed on odd ranks).
absl::Status WaitAllInRankOrder(std::vector<Handle>& hs, int rank) {
  const size_t k = hs.size();
  for (size_t i = 0; i < k; ++i) {
    size_t j = (i + rank) % k;
    if (rank % 2 == 1) j = k - 1 - j;
    if (absl::Status s = hs[j]->Wait(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Appends the started call's handle, or returns its failure.
absl::Status Keep(absl::StatusOr<Handle> h, std::vector<Handle>& hs) {
  if (!h.ok()) return h.status();
  hs.push_back(*std::move(h));
  return absl::OkStatus();
}

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    absl::Status _s = (expr);          \
    if (!_s.ok()) return _s;           \
  } while (0)

// Backends whose Wait() does not wait on the host (GPU streams) surface a mismatch or a peer's
// failure at a later blocking call, not at Wait(): the error cases below need a host wait.
#define SKIP_IF_WAIT_IS_NOT_A_HOST_WAIT(b)                                                       \
  do {                                                                                           \
    if ((b)->memory == BackendMemory::kDevice) {                                                 \
      GTEST_SKIP() << (b)->name << ": Wait() orders the caller's stream and returns (no host "    \
                   << "wait), so a started call's failure surfaces at the next host wait";       \
    }                                                                                            \
    if (!(b)->moves_data) {                                                                      \
      GTEST_SKIP() << (b)->name << " has no peers: no other rank to disagree with or to fail";   \
    }                                                                                            \
  } while (0)

// One dtype: an all-reduce (in place, count 13), an all-gather (5 each) and a reduce-scatter (3
// each, max) started together with a blocking all-reduce between them, then the same blocking.
absl::Status ThreeInFlight(const ConformanceTarget& t, const Backend& b, Communicator& c,
                           DataType dt) {
  const int n = c.size(), me = c.rank();
  const size_t es = DataTypeSize(dt);
  std::vector<std::vector<char>> ar_in, rs_in;
  std::vector<char> ag_want;
  for (int r = 0; r < n; ++r) {
    ar_in.push_back(Make(dt, 13, r, false));
    rs_in.push_back(Make(dt, 3 * n, r, false, 40));
    const std::vector<char> part = Make(dt, 5, r, false, 90);
    ag_want.insert(ag_want.end(), part.begin(), part.end());
  }
  const std::vector<char> ar_want = Reference(dt, ar_in, 0, 13, ReduceOp::kSum);
  const std::vector<char> rs_want = Reference(dt, rs_in, 3 * me, 3, ReduceOp::kMax);
  Buf ar(t, c, ar_in[me]), ag_send(t, c, Make(dt, 5, me, false, 90)), ag(t, c, 5 * n * es);
  Buf rs_send(t, c, rs_in[me]), rs(t, c, 3 * es), one(t, c, Make(DataType::kI64, 1, 0, false));
  std::vector<Handle> hs;
  RETURN_IF_ERROR(Keep(c.AllReduceStart(ar.p(), ar.p(), 13, dt, ReduceOp::kSum), hs));
  RETURN_IF_ERROR(Keep(c.AllGatherStart(ag_send.p(), ag.p(), 5, dt), hs));
  RETURN_IF_ERROR(c.AllReduce(one.p(), one.p(), 1, DataType::kI64, ReduceOp::kSum));  // blocking
  RETURN_IF_ERROR(Keep(c.ReduceScatterStart(rs_send.p(), rs.p(), 3, dt, ReduceOp::kMax), hs));
  RETURN_IF_ERROR(WaitAllInRankOrder(hs, me));
  if (!b.moves_data) return absl::OkStatus();
  const std::string what = absl::StrCat(" started, n=", n, " ", DataTypeName(dt), " rank ", me);
  ExpectSame(t, dt, ar.Get(), ar_want, n > 1, "AllReduceStart in place" + what);
  ExpectSame(t, dt, ag.Get(), ag_want, false, "AllGatherStart" + what);
  ExpectSame(t, dt, rs.Get(), rs_want, n > 1, "ReduceScatterStart max" + what);
  if (!t.bitwise_reductions) return absl::OkStatus();
  // The blocking calls on the same inputs give the same bits.
  Buf ar2(t, c, ar_in[me]), rs2(t, c, 3 * es);
  RETURN_IF_ERROR(c.AllReduce(ar2.p(), ar2.p(), 13, dt, ReduceOp::kSum));
  RETURN_IF_ERROR(c.ReduceScatter(rs_send.p(), rs2.p(), 3, dt, ReduceOp::kMax));
  EXPECT_EQ(ar.Get(), ar2.Get()) << "AllReduceStart vs AllReduce" << what;
  EXPECT_EQ(rs.Get(), rs2.Get()) << "ReduceScatterStart vs ReduceScatter" << what;
  return absl::OkStatus();
}

// Every reduce op in flight at once (odd count 7), waited in rank-dependent order.
absl::Status EveryOpInFlight(const ConformanceTarget& t, const Backend& b, Communicator& c,
                             DataType dt) {
  const int n = c.size(), me = c.rank();
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<std::vector<char>> wants;
  std::vector<Handle> hs;
  for (ReduceOp op : kAllOps) {
    const bool near_one = op == ReduceOp::kProd;
    std::vector<std::vector<char>> in;
    for (int r = 0; r < n; ++r) in.push_back(Make(dt, 7, r, near_one));
    wants.push_back(Reference(dt, in, 0, 7, op));
    bufs.push_back(std::make_unique<Buf>(t, c, in[me]));
    RETURN_IF_ERROR(Keep(c.AllReduceStart(bufs.back()->p(), bufs.back()->p(), 7, dt, op), hs));
  }
  RETURN_IF_ERROR(WaitAllInRankOrder(hs, me));
  if (!b.moves_data) return absl::OkStatus();
  for (size_t i = 0; i < bufs.size(); ++i) {
    ExpectSame(t, dt, bufs[i]->Get(), wants[i], n > 1,
               absl::StrCat("AllReduceStart ", ReduceOpName(kAllOps[i]), " n=", n, " ",
                            DataTypeName(dt), " rank ", me));
  }
  return absl::OkStatus();
}

}  // namespace

TEST_P(BackendConformanceTest, StartedCallsMatchTheReferenceAndTheBlockingBits) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      for (DataType dt : kAllTypes) {
        RETURN_IF_ERROR(ThreeInFlight(t, *b, c, dt));
        RETURN_IF_ERROR(EveryOpInFlight(t, *b, c, dt));
      }
      return c.Barrier();  // blocking calls still work after the started ones
    }, {}), absl::StrCat("started calls n=", n));
  }
}

TEST_P(BackendConformanceTest, StartedCallsRefuseASecondWait) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      // Separate buffers: each belongs to its call until Wait().
      Buf x(t, c, Make(DataType::kF32, 3, c.rank(), false)), y(t, c, n * 4);
      Buf z(t, c, Make(DataType::kF32, n, c.rank(), false)), w(t, c, 4);
      Buf v(t, c, Make(DataType::kF32, 1, c.rank(), false));
      std::vector<Handle> hs;
      RETURN_IF_ERROR(Keep(c.AllReduceStart(x.p(), x.p(), 3, DataType::kF32, ReduceOp::kSum), hs));
      RETURN_IF_ERROR(Keep(c.AllGatherStart(v.p(), y.p(), 1, DataType::kF32), hs));
      RETURN_IF_ERROR(Keep(c.ReduceScatterStart(z.p(), w.p(), 1, DataType::kF32,
                                                ReduceOp::kSum), hs));
      for (Handle& h : hs) {
        RETURN_IF_ERROR(h->Wait());
        const absl::Status again = h->Wait();
        EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition)
            << "a second Wait() must be refused (n=" << n << "): " << again;
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("started calls' Wait twice n=", n));
  }
}

TEST_P(BackendConformanceTest, MismatchedStartedCallsFailOnEveryRank) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  SKIP_IF_WAIT_IS_NOT_A_HOST_WAIT(b);
  static auto describe = [](const uint64_t* w) { return absl::StrCat("call site #", w[0]); };
  for (int n : SizesFrom(t, 2)) {
    for (bool by_tag : {false, true}) {
      WorldOptions o;
      o.timeout = absl::Seconds(30);
      const absl::Time start = absl::Now();
      bool tags_compared = true;
      std::vector<absl::Status> all = b->run_world(n, [&](Communicator& c) -> absl::Status {
        const bool last = c.rank() == n - 1;
        if (by_tag) {
          if (!c.ComparesCallTags()) {
            tags_compared = false;
            return absl::InvalidArgumentError("tags not compared: nothing to check");
          }
          CallTag tag;
          tag.words[0] = last ? 12 : 11;
          tag.describe = +describe;
          c.TagNextCall(tag);
        }
        std::vector<char> host(64, 0);
        Buf x(t, c, host);
        auto h = c.AllReduceStart(x.p(), x.p(), !by_tag && last ? 5 : 4, DataType::kF32,
                                  ReduceOp::kSum);
        if (!h.ok()) return h.status();
        return (*h)->Wait();
      }, o);
      EXPECT_LT(absl::Now() - start, absl::Seconds(25)) << "n=" << n;
      if (!tags_compared) continue;
      ASSERT_EQ(all.size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument)
            << (by_tag ? "tags" : "counts") << " n=" << n << " rank " << r << ": " << all[r];
        EXPECT_THAT(std::string(all[r].message()),
                    by_tag ? AllOf(HasSubstr("call site #11"), HasSubstr("call site #12"))
                           : AllOf(HasSubstr("count=4"), HasSubstr("count=5")))
            << "n=" << n << " rank " << r;
      }
    }
  }
}

TEST_P(BackendConformanceTest, AFailingRankFailsItsPeersStartedCalls) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  SKIP_IF_WAIT_IS_NOT_A_HOST_WAIT(b);
  for (int n : SizesFrom(t, 2)) {
    const int failed = n - 1;
    WorldOptions o;
    o.timeout = absl::Seconds(60);  // far beyond the bound below: the failure must be seen
    const absl::Time start = absl::Now();
    std::vector<absl::Status> all = b->run_world(n, [&](Communicator& c) -> absl::Status {
      Buf x(t, c, Make(DataType::kI64, 1, 1, false));
      auto first = c.AllReduceStart(x.p(), x.p(), 1, DataType::kI64, ReduceOp::kSum);
      if (!first.ok()) return first.status();
      RETURN_IF_ERROR((*first)->Wait());
      if (c.rank() == failed) return absl::UnavailableError("conformance: lane on fire");
      for (int i = 0; i < 1000; ++i) {  // until the failure reaches this rank
        Buf y(t, c, Make(DataType::kF32, 1000, c.rank(), false));
        auto h1 = c.AllReduceStart(y.p(), y.p(), 500, DataType::kF32, ReduceOp::kSum);
        if (!h1.ok()) return h1.status();
        auto h2 = c.AllGatherStart(y.at(2000), y.at(2000 + 4 * c.rank()), 1, DataType::kF32);
        const absl::Status w1 = (*h1)->Wait();
        const absl::Status w2 = h2.ok() ? (*h2)->Wait() : h2.status();
        if (!w1.ok()) return w1;
        if (!w2.ok()) return w2;
      }
      return absl::InternalError("the peers of a failed rank kept succeeding");
    }, o);
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "n=" << n << ": failure seen too late";
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    EXPECT_EQ(all[failed].code(), absl::StatusCode::kUnavailable) << all[failed];
    for (int r = 0; r < failed; ++r) {
      EXPECT_FALSE(all[r].ok()) << "n=" << n << " rank " << r;
      EXPECT_THAT(std::string(all[r].message()), HasSubstr(absl::StrCat("rank ", failed)))
          << "n=" << n << " rank " << r << ": the error must name the failed rank";
      if (t.peers_get_failed_status) {
        EXPECT_EQ(all[r].code(), absl::StatusCode::kUnavailable) << all[r];
        EXPECT_THAT(std::string(all[r].message()), HasSubstr("lane on fire")) << all[r];
      }
    }
  }
}

}  // namespace shardmap::collectives::conformance
