// Correctness of the Gloo backend against naive serial references: every op and dtype, world
// sizes 1-4 (each rank a thread with its own Gloo context over loopback), odd counts and 0, in
// place and out of place; results must be bitwise the reference on every rank.
#include "collectives/gloo_communicator.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/gloo_threads.h"
#include "collectives/in_process.h"
#include "collectives/reference_reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using reference::kAllOps;
using reference::kAllTypes;
using reference::Make;
using reference::Reference;

// 0, odd, and above the one-round all-reduce threshold (32 KiB) even for 2-byte types.
constexpr size_t kCounts[] = {0, 1, 7, 33, 20011};

GlooOptions Quick() {
  GlooOptions o;
  o.timeout = absl::Seconds(30);
  return o;
}

std::string Case(int n, const char* op, DataType dt, size_t count, bool in_place) {
  return absl::StrCat(op, " n=", n, " ", DataTypeName(dt), " count=", count,
                      in_place ? " in place" : "");
}

// Runs `fn` on n Gloo ranks (threads) and expects every rank to succeed.
void ExpectOk(int n, const std::function<absl::Status(Communicator&)>& fn) {
  std::vector<absl::Status> all = RunGlooThreadsEach(n, fn, Quick());
  for (int r = 0; r < n; ++r) EXPECT_TRUE(all[r].ok()) << "rank " << r << ": " << all[r];
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldTest, AllReduceEveryDtypeOpAndCount) {
  const int n = GetParam();
  ExpectOk(n, [&](Communicator& c) -> absl::Status {
    EXPECT_EQ(c.size(), n);
    for (DataType dt : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        for (size_t count : kCounts) {
          for (bool in_place : {false, true}) {
            const bool prod = op == ReduceOp::kProd;
            std::vector<std::vector<char>> in(n);
            for (int r = 0; r < n; ++r) in[r] = Make(dt, count, r, prod);
            const std::vector<char> want = Reference(dt, in, 0, count, op);
            std::vector<char> out = in[c.rank()];
            const void* send = in_place ? out.data() : in[c.rank()].data();
            if (!in_place) std::fill(out.begin(), out.end(), 0x55);
            absl::Status s = c.AllReduce(send, out.data(), count, dt, op);
            if (!s.ok()) return s;
            EXPECT_TRUE(out == want) << Case(n, ReduceOpName(op), dt, count, in_place);
          }
        }
      }
    }
    return absl::OkStatus();
  });
}

TEST_P(GlooWorldTest, GatherScatterAndAllToAllMatchReferences) {
  const int n = GetParam();
  ExpectOk(n, [&](Communicator& c) -> absl::Status {
    const int me = c.rank();
    for (DataType dt : kAllTypes) {
      const size_t esz = DataTypeSize(dt);
      for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{4099}}) {
        std::vector<std::vector<char>> full(n);  // each rank's n*count elements
        for (int r = 0; r < n; ++r) full[r] = Make(dt, n * count, r, false);
        for (bool in_place : {false, true}) {
          // AllGather: recv = concat of every rank's first `count` elements.
          std::vector<char> want;
          for (int r = 0; r < n; ++r) want.insert(want.end(), full[r].begin(), full[r].begin() + count * esz);
          std::vector<char> out(n * count * esz, 0x55);
          const char* send = full[me].data();
          if (in_place && count > 0) {
            std::memcpy(out.data() + me * count * esz, send, count * esz);
            send = out.data() + me * count * esz;
          }
          if (absl::Status s = c.AllGather(send, out.data(), count, dt); !s.ok()) return s;
          EXPECT_TRUE(out == want) << Case(n, "AllGather", dt, count, in_place);

          // ReduceScatter (sum): rank r gets chunk r reduced over ranks.
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
            const std::vector<char> rs_want = Reference(dt, full, me * count, count, op);
            std::vector<char> src = full[me];
            std::vector<char> rs(count * esz, 0x55);
            void* recv = in_place ? src.data() + me * count * esz : rs.data();
            if (absl::Status s = c.ReduceScatter(src.data(), recv, count, dt, op); !s.ok()) return s;
            std::vector<char> got(static_cast<char*>(recv), static_cast<char*>(recv) + count * esz);
            EXPECT_TRUE(got == rs_want) << Case(n, "ReduceScatter", dt, count, in_place);
          }

          // AllToAll: chunk j of rank i lands as chunk i of rank j.
          std::vector<char> a2a_want;
          for (int r = 0; r < n; ++r) {
            a2a_want.insert(a2a_want.end(), full[r].begin() + me * count * esz,
                            full[r].begin() + (me + 1) * count * esz);
          }
          std::vector<char> a2a = full[me];
          std::vector<char> a2a_out(n * count * esz, 0x55);
          void* a2a_recv = in_place ? a2a.data() : a2a_out.data();
          if (absl::Status s = c.AllToAll(a2a.data(), a2a_recv, count, dt); !s.ok()) return s;
          std::vector<char> got(static_cast<char*>(a2a_recv),
                                static_cast<char*>(a2a_recv) + n * count * esz);
          EXPECT_TRUE(got == a2a_want) << Case(n, "AllToAll", dt, count, in_place);
        }
      }
    }
    return absl::OkStatus();
  });
}

TEST_P(GlooWorldTest, UnevenVariantsMatchReferences) {
  const int n = GetParam();
  ExpectOk(n, [&](Communicator& c) -> absl::Status {
    const int me = c.rank();
    for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kI64}) {
      const size_t esz = DataTypeSize(dt);
      std::vector<size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = (r * 5 + 3) % 7;  // includes 0 for some n
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      std::vector<size_t> off(n + 1, 0);
      for (int r = 0; r < n; ++r) off[r + 1] = off[r] + counts[r];
      std::vector<std::vector<char>> full(n);
      for (int r = 0; r < n; ++r) full[r] = Make(dt, total, r, false);

      std::vector<char> ag_want;
      for (int r = 0; r < n; ++r) {
        ag_want.insert(ag_want.end(), full[r].begin(), full[r].begin() + counts[r] * esz);
      }
      std::vector<char> ag(total * esz, 0x55);
      if (absl::Status s = c.AllGatherV(full[me].data(), ag.data(), counts, dt); !s.ok()) return s;
      EXPECT_TRUE(ag == ag_want) << Case(n, "AllGatherV", dt, total, false);

      std::vector<char> rs(counts[me] * esz, 0x55);
      if (absl::Status s = c.ReduceScatterV(full[me].data(), rs.data(), counts, dt, ReduceOp::kSum);
          !s.ok()) {
        return s;
      }
      EXPECT_TRUE(rs == Reference(dt, full, off[me], counts[me], ReduceOp::kSum))
          << Case(n, "ReduceScatterV", dt, total, false);

      // AllToAllV: rank i sends (i + j) % 3 + j elements to rank j, starting at element 10*j.
      auto amount = [](int i, int j) { return static_cast<size_t>((i + j) % 3 + j); };
      std::vector<size_t> sc(n), rc(n), soff(n + 1, 0), roff(n + 1, 0);
      for (int j = 0; j < n; ++j) {
        sc[j] = amount(me, j);
        rc[j] = amount(j, me);
        soff[j + 1] = soff[j] + sc[j];
        roff[j + 1] = roff[j] + rc[j];
      }
      std::vector<char> want;
      for (int i = 0; i < n; ++i) {
        size_t start = 0;
        for (int j = 0; j < me; ++j) start += amount(i, j);
        const std::vector<char> src = Make(dt, 64, i, false);
        want.insert(want.end(), src.begin() + start * esz, src.begin() + (start + rc[i]) * esz);
      }
      const std::vector<char> src = Make(dt, 64, me, false);
      std::vector<char> got(roff[n] * esz, 0x55);
      if (absl::Status s = c.AllToAllV(src.data(), sc, got.data(), rc, dt); !s.ok()) return s;
      EXPECT_TRUE(got == want) << Case(n, "AllToAllV", dt, roff[n], false);
    }
    return absl::OkStatus();
  });
}

TEST_P(GlooWorldTest, BroadcastPpermuteSendRecvBarrier) {
  const int n = GetParam();
  ExpectOk(n, [&](Communicator& c) -> absl::Status {
    const int me = c.rank();
    for (DataType dt : kAllTypes) {
      const size_t esz = DataTypeSize(dt);
      for (size_t count : {size_t{0}, size_t{3}, size_t{10007}}) {
        for (int root = 0; root < n; ++root) {
          std::vector<char> buf = Make(dt, count, me, false);
          if (absl::Status s = c.Broadcast(buf.data(), count, dt, root); !s.ok()) return s;
          EXPECT_TRUE(buf == Make(dt, count, root, false)) << Case(n, "Broadcast", dt, count, false);
        }
        // Ppermute: a shift by one, rank 0 left out as a destination (gets zeros) when n > 1.
        std::vector<std::pair<int, int>> pairs;
        for (int s = 0; s + 1 < n; ++s) pairs.push_back({s, s + 1});
        if (n == 1) pairs.push_back({0, 0});
        for (bool in_place : {false, true}) {
          std::vector<char> in = Make(dt, count, me, false);
          std::vector<char> out(count * esz, 0x55);
          void* recv = in_place ? in.data() : out.data();
          if (absl::Status s = c.Ppermute(in.data(), recv, count, dt, pairs); !s.ok()) return s;
          std::vector<char> want = n == 1 ? Make(dt, count, 0, false)
                                   : me == 0 ? std::vector<char>(count * esz, 0)
                                             : Make(dt, count, me - 1, false);
          std::vector<char> got(static_cast<char*>(recv), static_cast<char*>(recv) + count * esz);
          EXPECT_TRUE(got == want) << Case(n, "Ppermute", dt, count, in_place);
        }
        // Send/Recv around a ring: even ranks send first, odd ranks receive first.
        if (n > 1) {
          const int next = (me + 1) % n, prev = (me + n - 1) % n;
          std::vector<char> mine = Make(dt, count, me, false);
          std::vector<char> got(count * esz, 0x55);
          auto send = [&] { return c.Send(mine.data(), count, dt, next); };
          auto recv = [&] { return c.Recv(got.data(), count, dt, prev); };
          if (me % 2 == 0) {
            if (absl::Status s = send(); !s.ok()) return s;
            if (absl::Status s = recv(); !s.ok()) return s;
          } else {
            if (absl::Status s = recv(); !s.ok()) return s;
            if (absl::Status s = send(); !s.ok()) return s;
          }
          EXPECT_TRUE(got == Make(dt, count, prev, false)) << Case(n, "Send/Recv", dt, count, false);
        }
      }
    }
    return c.Barrier();
  });
}

TEST_P(GlooWorldTest, SplitGroupsReduceWithinThemselves) {
  const int n = GetParam();
  ExpectOk(n, [&](Communicator& c) -> absl::Status {
    const int me = c.rank();
    // Colors by parity, keys reversing the order; rank 3 (if any) opts out.
    const int color = me == 3 ? -1 : me % 2;
    absl::StatusOr<std::unique_ptr<Communicator>> sub = c.Split(color, -me);
    if (!sub.ok()) return sub.status();
    if (color < 0) {
      EXPECT_EQ(*sub, nullptr);
    } else {
      std::vector<int> members;
      for (int r = n - 1; r >= 0; --r) {
        if (r != 3 && r % 2 == color) members.push_back(r);
      }
      EXPECT_EQ((*sub)->size(), static_cast<int>(members.size()));
      EXPECT_EQ(members[(*sub)->rank()], me);
      int64_t x = int64_t{1} << me, sum = 0;
      for (int r : members) sum += int64_t{1} << r;
      if (absl::Status s = (*sub)->AllReduce(&x, &x, 1, DataType::kI64, ReduceOp::kSum); !s.ok()) {
        return s;
      }
      EXPECT_EQ(x, sum);
      std::vector<int64_t> ranks((*sub)->size());
      const int64_t mine = me;
      if (absl::Status s = (*sub)->AllGather(&mine, ranks.data(), 1, DataType::kI64); !s.ok()) {
        return s;
      }
      EXPECT_EQ(ranks, std::vector<int64_t>(members.begin(), members.end()));
      // A split of the split, then the parent again.
      absl::StatusOr<std::unique_ptr<Communicator>> single = (*sub)->Split((*sub)->rank(), 0);
      if (!single.ok()) return single.status();
      EXPECT_EQ((*single)->size(), 1);
      if (absl::Status s = (*single)->Barrier(); !s.ok()) return s;
    }
    int32_t one = 1;
    if (absl::Status s = c.AllReduce(&one, &one, 1, DataType::kI32, ReduceOp::kSum); !s.ok()) {
      return s;
    }
    EXPECT_EQ(one, n);
    return absl::OkStatus();
  });
}

// Floats whose sums round differently in a different order (signs and exponents spread over
// 2^-20..2^20, so f32/f64 sums are inexact); integers as in the reference inputs.
std::vector<char> OrderSensitive(DataType dt, size_t count, int r) {
  if (dt != DataType::kF32 && dt != DataType::kF64) return Make(dt, count, r, false);
  std::vector<char> b(count * DataTypeSize(dt));
  for (size_t i = 0; i < count; ++i) {
    const double frac = 1.0 + static_cast<double>((i * 2654435761u + r * 40503u) % 997) / 997.0;
    const double v = std::ldexp(frac, static_cast<int>((i * 7 + 13 * r) % 41) - 20) *
                     ((i + r) % 3 == 0 ? -1.0 : 1.0);
    if (dt == DataType::kF32) {
      const float f = static_cast<float>(v);
      std::memcpy(b.data() + 4 * i, &f, 4);
    } else {
      std::memcpy(b.data() + 8 * i, &v, 8);
    }
  }
  return b;
}

// The Gloo all-reduce gives the in-process backend's bits: worlds 3 and 5, counts below n,
// at and just above the one-round threshold (32 KiB) and large and odd, every dtype (bf16/f16
// accumulate in f32), sum/avg/max/min, in place and not.
TEST(GlooAllReduceTest, BitwiseEqualToTheInProcessBackend) {
  struct Call {
    size_t count;
    DataType dt;
    ReduceOp op;
    bool in_place;
    std::vector<std::vector<char>> in, local, gloo;
  };
  for (int n : {3, 5}) {
    std::vector<Call> cases;
    for (size_t count : {size_t{2}, size_t{8192}, size_t{8193}, size_t{100003}}) {
      for (DataType dt : kAllTypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
          Call k{count, dt, op, (count + static_cast<size_t>(op)) % 2 == 0};
          for (int r = 0; r < n; ++r) k.in.push_back(OrderSensitive(dt, count, r));
          k.local.resize(n);
          k.gloo.resize(n);
          cases.push_back(std::move(k));
        }
      }
    }
    auto run = [&](bool gloo, Communicator& c) -> absl::Status {
      const int r = c.rank();
      for (Call& k : cases) {
        std::vector<char>& out = (gloo ? k.gloo : k.local)[r];
        out = k.in[r];
        const void* send = k.in_place ? out.data() : k.in[r].data();
        if (!k.in_place) std::fill(out.begin(), out.end(), 0x55);
        if (absl::Status s = c.AllReduce(send, out.data(), k.count, k.dt, k.op); !s.ok()) return s;
      }
      return absl::OkStatus();
    };
    ASSERT_TRUE(RunInProcess(n, [&](Communicator& c) { return run(false, c); }).ok());
    ExpectOk(n, [&](Communicator& c) { return run(true, c); });
    for (const Call& k : cases) {
      const std::string what = Case(n, ReduceOpName(k.op), k.dt, k.count, k.in_place);
      // Not trivially equal: the in-process result is the reference.
      ASSERT_TRUE(k.local[0] == Reference(k.dt, k.in, 0, k.count, k.op)) << what;
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(k.gloo[r] == k.local[r]) << "rank " << r << " " << what;
      }
    }
  }
}

// Many calls in a row: the slots of consecutive calls (hashes of their descriptors) never mix
// their data up, small and large alternating.
TEST(GlooAllReduceTest, ConsecutiveCallsKeepTheirData) {
  const int n = 3;
  ExpectOk(n, [&](Communicator& c) -> absl::Status {
    for (int i = 0; i < 40; ++i) {
      const size_t count = i % 2 == 0 ? 9 + i : 20000 + i;
      std::vector<int64_t> x(count), want(count);
      for (size_t j = 0; j < count; ++j) {
        x[j] = static_cast<int64_t>(j) * (c.rank() + 1) + i;
        want[j] = static_cast<int64_t>(j) * 6 + 3 * i;  // ranks 1+2+3, i from each
      }
      if (absl::Status s = c.AllReduce(x.data(), x.data(), count, DataType::kI64, ReduceOp::kSum);
          !s.ok()) {
        return s;
      }
      EXPECT_EQ(x, want) << "call " << i;
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooWorldTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("n", info.param); });

}  // namespace
}  // namespace shardmap::collectives
