// The cases of the backend conformance suite (backend_conformance.h). Each rank computes every
// rank's inputs itself (reference::Make is a function of rank and index), so the expected output
// of every call comes from the naive serial reference, never from another backend.
#include "collectives/conformance/backend_conformance.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/backend_registry.h"
#include "collectives/communicator.h"
#include "collectives/conformance/conformance_util.h"
#include "collectives/reference_reduce.h"

namespace shardmap::collectives::conformance {

std::string ConformanceTargetName(const ::testing::TestParamInfo<ConformanceTarget>& info) {
  std::string s = info.param.backend;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

using reference::kAllOps;
using reference::kAllTypes;
using reference::Make;
using reference::Reference;
using namespace conformance_util;  // Buf, ExpectSame, Find, SKIP_IF_UNAVAILABLE, ...

TEST_P(BackendConformanceTest, AllReduceEveryDtypeAndOpMatchesTheReference) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      for (DataType dt : kAllTypes) {
        for (ReduceOp op : kAllOps) {
          for (size_t count : {size_t{1}, size_t{7}, size_t{33}}) {
            const bool near_one = op == ReduceOp::kProd;
            std::vector<std::vector<char>> in;
            for (int r = 0; r < n; ++r) in.push_back(Make(dt, count, r, near_one));
            const std::vector<char> want = Reference(dt, in, 0, count, op);
            const bool in_place = count == 7;
            Buf send(t, c, in[c.rank()]);
            Buf recv(t, c, want.size());
            const std::string what = absl::StrCat(Case(n, "AllReduce", dt, count), " ",
                                                  ReduceOpName(op), in_place ? " in place" : "");
            Buf& out = in_place ? send : recv;
            absl::Status s = c.AllReduce(send.p(), out.p(), count, dt, op);
            if (!s.ok()) return s;
            if (b->moves_data) ExpectSame(t, dt, out.Get(), want, /*reduced=*/n > 1, what);
          }
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("AllReduce n=", n));
  }
}

TEST_P(BackendConformanceTest, AllGatherAndAllGatherVEveryDtype) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      for (DataType dt : kAllTypes) {
        const size_t es = DataTypeSize(dt);
        // Even: 5 each (in place: this rank's slice of recv). Uneven, zeros included.
        std::vector<size_t> even(n, 5), uneven(n);
        for (int r = 0; r < n; ++r) uneven[r] = (r * 3 + 1) % 4;
        for (const std::vector<size_t>* counts : {&even, &uneven}) {
          const size_t total = std::accumulate(counts->begin(), counts->end(), size_t{0});
          std::vector<char> want;
          for (int r = 0; r < n; ++r) {
            const std::vector<char> part = Make(dt, (*counts)[r], r, false);
            want.insert(want.end(), part.begin(), part.end());
          }
          const size_t offset = std::accumulate(counts->begin(), counts->begin() + me, size_t{0});
          Buf send(t, c, Make(dt, (*counts)[me], me, false));
          Buf recv(t, c, total * es);
          absl::Status s;
          if (counts == &even) {
            // In place: this rank's slice of recv holds its part already.
            std::vector<char> staged(total * es, 0);
            std::memcpy(staged.data() + offset * es, want.data() + offset * es, 5 * es);
            recv.Set(staged);
            s = c.AllGather(recv.at(offset * es), recv.p(), 5, dt);
          } else {
            s = c.AllGatherV(send.p(), recv.p(), *counts, dt);
          }
          if (!s.ok()) return s;
          if (b->moves_data) {
            ExpectSame(t, dt, recv.Get(), want, false,
                       Case(n, counts == &even ? "AllGather in place" : "AllGatherV", dt, total));
          }
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("AllGather n=", n));
  }
}

TEST_P(BackendConformanceTest, ReduceScatterAndReduceScatterVEveryDtypeAndOp) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      for (DataType dt : kAllTypes) {
        const size_t es = DataTypeSize(dt);
        std::vector<size_t> even(n, 3), uneven(n);
        for (int r = 0; r < n; ++r) uneven[r] = (r * 2 + 1) % 3;
        for (ReduceOp op : kAllOps) {
          for (const std::vector<size_t>* counts : {&even, &uneven}) {
            const size_t total = std::accumulate(counts->begin(), counts->end(), size_t{0});
            const size_t offset =
                std::accumulate(counts->begin(), counts->begin() + me, size_t{0});
            const bool near_one = op == ReduceOp::kProd;
            std::vector<std::vector<char>> in;
            for (int r = 0; r < n; ++r) in.push_back(Make(dt, total, r, near_one));
            const std::vector<char> want = Reference(dt, in, offset, (*counts)[me], op);
            Buf send(t, c, in[me]);
            Buf recv(t, c, (*counts)[me] * es);
            absl::Status s = counts == &even
                                 ? c.ReduceScatter(send.p(), recv.p(), 3, dt, op)
                                 : c.ReduceScatterV(send.p(), recv.p(), *counts, dt, op);
            if (!s.ok()) return s;
            if (b->moves_data) {
              ExpectSame(t, dt, recv.Get(), want, n > 1,
                         absl::StrCat(Case(n, counts == &even ? "ReduceScatter" : "ReduceScatterV",
                                           dt, total), " ", ReduceOpName(op)));
            }
          }
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("ReduceScatter n=", n));
  }
}

TEST_P(BackendConformanceTest, AllToAllAndAllToAllVEveryDtype) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  // Rank r sends Make(dt, k, r, offset 1000 j) to rank j, k = sends(r, j).
  auto sends = [](int r, int j, bool even) -> size_t { return even ? 3 : (r + 2 * j) % 3; };
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      for (DataType dt : kAllTypes) {
        for (bool even : {true, false}) {
          std::vector<size_t> send_counts(n), recv_counts(n);
          std::vector<char> in, want;
          for (int j = 0; j < n; ++j) {
            send_counts[j] = sends(me, j, even);
            recv_counts[j] = sends(j, me, even);
            const std::vector<char> out = Make(dt, send_counts[j], me, false, 1000 * j);
            in.insert(in.end(), out.begin(), out.end());
            const std::vector<char> got = Make(dt, recv_counts[j], j, false, 1000 * me);
            want.insert(want.end(), got.begin(), got.end());
          }
          Buf send(t, c, in);
          Buf recv(t, c, want.size());
          absl::Status s =
              even ? c.AllToAll(send.p(), recv.p(), 3, dt)
                   : c.AllToAllV(send.p(), send_counts, recv.p(), recv_counts, dt);
          if (!s.ok()) return s;
          if (b->moves_data) {
            ExpectSame(t, dt, recv.Get(), want, false,
                       Case(n, even ? "AllToAll" : "AllToAllV", dt, want.size()));
          }
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("AllToAll n=", n));
  }
}

TEST_P(BackendConformanceTest, BroadcastFromEveryRoot) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      for (DataType dt : kAllTypes) {
        for (int root = 0; root < n; ++root) {
          const std::vector<char> want = Make(dt, 9, root, false);
          Buf buf(t, c, c.rank() == root ? want : Make(dt, 9, c.rank() + 100, false));
          absl::Status s = c.Broadcast(buf.p(), 9, dt, root);
          if (!s.ok()) return s;
          if (b->moves_data) {
            ExpectSame(t, dt, buf.Get(), want, false,
                       absl::StrCat(Case(n, "Broadcast", dt, 9), " root=", root));
          }
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("Broadcast n=", n));
  }
}

TEST_P(BackendConformanceTest, SendRecvAroundARing) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  if (SizesFrom(t, 2).empty()) {
    GTEST_SKIP() << "needs a world of 2 ranks or more; " << t.backend << " runs sizes up to "
                 << t.world_sizes.back() << " here";
  }
  for (int n : SizesFrom(t, 2)) {
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
      for (DataType dt : kAllTypes) {
        Buf out(t, c, Make(dt, 11, me, false));
        Buf in(t, c, 11 * DataTypeSize(dt));
        // Even ranks send first, odd ranks receive first: a chain from rank 0, never a cycle.
        const bool even = me % 2 == 0;
        absl::Status s1 = even ? c.Send(out.p(), 11, dt, next) : c.Recv(in.p(), 11, dt, prev);
        if (!s1.ok()) return s1;
        absl::Status s2 = even ? c.Recv(in.p(), 11, dt, prev) : c.Send(out.p(), 11, dt, next);
        if (!s2.ok()) return s2;
        if (b->moves_data) {
          ExpectSame(t, dt, in.Get(), Make(dt, 11, prev, false), false,
                     absl::StrCat(Case(n, "Send/Recv", dt, 11), " rank ", me));
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("Send/Recv n=", n));
  }
}

TEST_P(BackendConformanceTest, PpermuteShiftAndPartialPermutation) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    std::vector<std::pair<int, int>> shift, partial;
    for (int r = 0; r < n; ++r) shift.push_back({r, (r + 1) % n});
    for (int r = 0; r + 1 < n; ++r) partial.push_back({r, r + 1});  // rank 0 gets nothing
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      for (DataType dt : kAllTypes) {
        for (bool full : {true, false}) {
          Buf send(t, c, Make(dt, 7, me, false));
          Buf recv(t, c, Make(dt, 7, me + 50, false));  // garbage to be overwritten
          absl::Status s = c.Ppermute(send.p(), recv.p(), 7, dt, full ? shift : partial);
          if (!s.ok()) return s;
          const bool zeros = !full && me == 0;
          const std::vector<char> want =
              zeros ? std::vector<char>(7 * DataTypeSize(dt), 0)
                    : Make(dt, 7, (me + n - 1) % n, false);
          if (b->moves_data) {
            ExpectSame(t, dt, recv.Get(), want, false,
                       absl::StrCat(Case(n, full ? "Ppermute shift" : "Ppermute partial", dt, 7),
                                    " rank ", me));
          }
        }
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("Ppermute n=", n));
  }
}

TEST_P(BackendConformanceTest, PpermuteStartHandlesWaitInAnyOrderAndOnlyOnce) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  NoteValuesNotCompared(*b);
  for (int n : t.world_sizes) {
    std::vector<std::pair<int, int>> by1, by2;
    for (int r = 0; r < n; ++r) {
      by1.push_back({r, (r + 1) % n});
      by2.push_back({r, (r + 2) % n});
    }
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      const DataType dt = DataType::kF32;
      Buf send1(t, c, Make(dt, 13, me, false)), send2(t, c, Make(dt, 13, me, false, 500));
      Buf recv1(t, c, 13 * 4), recv2(t, c, 13 * 4);
      absl::StatusOr<std::unique_ptr<PendingCollective>> h1 =
          c.PpermuteStart(send1.p(), recv1.p(), 13, dt, by1);
      if (!h1.ok()) return h1.status();
      absl::StatusOr<std::unique_ptr<PendingCollective>> h2 =
          c.PpermuteStart(send2.p(), recv2.p(), 13, dt, by2);
      if (!h2.ok()) return h2.status();
      absl::Status s = (*h2)->Wait();  // the later one first
      if (!s.ok()) return s;
      s = (*h1)->Wait();
      if (!s.ok()) return s;
      EXPECT_EQ((*h1)->Wait().code(), absl::StatusCode::kFailedPrecondition)
          << "a second Wait() must be refused (n=" << n << ")";
      if (b->moves_data) {
        ExpectSame(t, dt, recv1.Get(), Make(dt, 13, (me + n - 1) % n, false), false,
                   absl::StrCat("PpermuteStart by 1, n=", n));
        ExpectSame(t, dt, recv2.Get(), Make(dt, 13, ((me - 2) % n + n) % n, false, 500), false,
                   absl::StrCat("PpermuteStart by 2, n=", n));
      }
      return c.Barrier();  // the world still works after the handles
    }, {}), absl::StrCat("PpermuteStart n=", n));
  }
}

TEST_P(BackendConformanceTest, BarrierWaitsForEveryRank) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  for (int n : t.world_sizes) {
    std::atomic<int> arrived{0};
    ExpectAllOk(b->run_world(n, [&](Communicator& c) -> absl::Status {
      for (int round = 1; round <= 3; ++round) {
        if (c.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        arrived.fetch_add(1);
        absl::Status s = c.Barrier();
        if (!s.ok()) return s;
        // Ranks of a backend without peers run one after another: nothing to wait for.
        if (b->moves_data) {
          EXPECT_GE(arrived.load(), round * n) << "rank " << c.rank() << " left barrier " << round
                                               << " before every rank arrived (n=" << n << ")";
        }
        s = c.Barrier();  // nobody starts the next round before everyone checked
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }, {}), absl::StrCat("Barrier n=", n));
  }
}

}  // namespace shardmap::collectives::conformance
