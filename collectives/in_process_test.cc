// Correctness of the in-process backend against naive serial references, across rank counts
// (including non-powers of two), odd sizes, all dtypes and reductions; results must be bitwise
// identical on every rank.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "collectives/internal/half.h"
#include "collectives/reference_reduce.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using reference::kAllOps;
using reference::kAllTypes;
using reference::Make;
using reference::Reference;

InProcessOptions Fast() {
  InProcessOptions o;
  o.timeout = absl::Seconds(20);
  return o;
}

void CheckAllReduce(int n, size_t count, DataType dt, ReduceOp op, bool in_place) {
  const bool near_one = op == ReduceOp::kProd;
  std::vector<std::vector<char>> in(n), out(n);
  for (int r = 0; r < n; ++r) in[r] = Make(dt, count, r, near_one);
  const std::vector<char> ref = Reference(dt, in, 0, count, op);
  absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
    const int r = c.rank();
    if (in_place) {
      out[r] = in[r];
      return c.AllReduce(out[r].data(), out[r].data(), count, dt, op);
    }
    out[r].assign(in[r].size(), 0x55);
    return c.AllReduce(in[r].data(), out[r].data(), count, dt, op);
  }, Fast());
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(out[r], ref) << "rank " << r << " n=" << n << " count=" << count << " "
                           << DataTypeName(dt) << " " << ReduceOpName(op)
                           << (in_place ? " in place" : "");
  }
}

TEST(InProcessAllReduceTest, SweepRanksDtypesOpsAndOddCounts) {
  for (int n : {1, 2, 3, 5, 8, 13, 16}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{61}, size_t{1000}}) {
      for (DataType dt : kAllTypes) {
        for (ReduceOp op : kAllOps) CheckAllReduce(n, count, dt, op, /*in_place=*/count == 61);
      }
    }
  }
}

TEST(InProcessAllReduceTest, LargeCountsForAFewRankCounts) {
  CheckAllReduce(3, (1 << 18) + 3, DataType::kF32, ReduceOp::kSum, false);
  CheckAllReduce(8, (1 << 17) + 13, DataType::kBF16, ReduceOp::kSum, true);
  CheckAllReduce(6, 100003, DataType::kF64, ReduceOp::kMax, false);
}

// Host all-reduces whose buffers (all ranks, in and out) exceed 16 MiB stream reduced chunks
// straight into every rank's output: odd counts (a short last chunk and slice), every dtype
// (bf16/f16 accumulate in f32), several ops, in place, world sizes 2 to 5.
TEST(InProcessAllReduceTest, StreamedLargeAllReducesMatchTheReference) {
  CheckAllReduce(3, (1 << 20) + 13, DataType::kF32, ReduceOp::kSum, false);
  CheckAllReduce(3, (1 << 20) + 13, DataType::kF32, ReduceOp::kAvg, true);
  CheckAllReduce(5, (1 << 20) + 7, DataType::kBF16, ReduceOp::kSum, true);
  CheckAllReduce(5, (1 << 20) + 7, DataType::kF16, ReduceOp::kMax, false);
  CheckAllReduce(2, (1 << 20) + 3, DataType::kF64, ReduceOp::kMin, false);
  CheckAllReduce(4, (1 << 19) + 5, DataType::kI64, ReduceOp::kSum, true);
  CheckAllReduce(3, (3 << 19) + 1, DataType::kI32, ReduceOp::kProd, false);
}

TEST(InProcessAllReduceTest, RepeatedCallsStayBitwiseDeterministic) {
  const int n = 7;
  const size_t count = 4099;
  std::vector<std::vector<char>> in(n);
  for (int r = 0; r < n; ++r) in[r] = Make(DataType::kF32, count, r, false);
  const std::vector<char> ref = Reference(DataType::kF32, in, 0, count, ReduceOp::kSum);
  std::vector<int> bad(n, 0);
  absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
    std::vector<char> out(in[0].size());
    for (int it = 0; it < 50; ++it) {
      absl::Status st = c.AllReduce(in[c.rank()].data(), out.data(), count, DataType::kF32,
                                    ReduceOp::kSum);
      if (!st.ok()) return st;
      if (out != ref) ++bad[c.rank()];
    }
    return absl::OkStatus();
  }, Fast());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(bad, std::vector<int>(n, 0));
}

TEST(InProcessAllGatherTest, EvenAndUnevenAndInPlace) {
  for (int n : {1, 2, 3, 4, 7, 16}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{33}}) {
      for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kI64}) {
        const size_t esz = DataTypeSize(dt);
        std::vector<std::vector<char>> in(n), out(n), outv(n), inplace(n);
        std::vector<size_t> counts(n);
        for (int r = 0; r < n; ++r) counts[r] = (count * (r + 1) + r) % 11;  // uneven, some 0
        std::vector<std::vector<char>> inv(n);
        std::vector<char> ref, refv;
        for (int r = 0; r < n; ++r) {
          in[r] = Make(dt, count, r, false);
          inv[r] = Make(dt, counts[r], r, false, 3);
          ref.insert(ref.end(), in[r].begin(), in[r].end());
          refv.insert(refv.end(), inv[r].begin(), inv[r].end());
        }
        absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
          const int r = c.rank();
          out[r].assign(ref.size(), 0);
          absl::Status st = c.AllGather(in[r].data(), out[r].data(), count, dt);
          if (!st.ok()) return st;
          inplace[r].assign(ref.size(), 0);
          if (!in[r].empty()) {
            std::memcpy(inplace[r].data() + r * count * esz, in[r].data(), in[r].size());
          }
          st = c.AllGather(inplace[r].data() + r * count * esz, inplace[r].data(), count, dt);
          if (!st.ok()) return st;
          outv[r].assign(refv.size(), 0);
          return c.AllGatherV(inv[r].data(), outv[r].data(), counts, dt);
        }, Fast());
        ASSERT_TRUE(s.ok()) << s;
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(out[r], ref) << "n=" << n << " r=" << r;
          ASSERT_EQ(inplace[r], ref) << "n=" << n << " r=" << r;
          ASSERT_EQ(outv[r], refv) << "n=" << n << " r=" << r;
        }
      }
    }
  }
}

TEST(InProcessReduceScatterTest, EvenAndUnevenAndInPlace) {
  for (int n : {1, 2, 3, 5, 8, 11}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{17}}) {
      for (DataType dt : kAllTypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
          const size_t esz = DataTypeSize(dt);
          std::vector<size_t> counts(n);
          for (int r = 0; r < n; ++r) counts[r] = (count + 2 * r) % 7;
          const size_t totalv = std::accumulate(counts.begin(), counts.end(), size_t{0});
          std::vector<std::vector<char>> in(n), inv(n), out(n), outv(n), inplace(n);
          for (int r = 0; r < n; ++r) {
            in[r] = Make(dt, count * n, r, false);
            inv[r] = Make(dt, totalv, r, false, 5);
          }
          const std::vector<char> full = Reference(dt, in, 0, count * n, op);
          const std::vector<char> fullv = Reference(dt, inv, 0, totalv, op);
          absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
            const int r = c.rank();
            out[r].assign(count * esz, 0);
            absl::Status st = c.ReduceScatter(in[r].data(), out[r].data(), count, dt, op);
            if (!st.ok()) return st;
            inplace[r] = in[r];
            st = c.ReduceScatter(inplace[r].data(), inplace[r].data() + r * count * esz, count,
                                 dt, op);
            if (!st.ok()) return st;
            outv[r].assign(counts[r] * esz, 0);
            return c.ReduceScatterV(inv[r].data(), outv[r].data(), counts, dt, op);
          }, Fast());
          ASSERT_TRUE(s.ok()) << s;
          size_t off = 0;
          for (int r = 0; r < n; ++r) {
            std::vector<char> want(full.begin() + r * count * esz,
                                   full.begin() + (r + 1) * count * esz);
            ASSERT_EQ(out[r], want) << "n=" << n << " r=" << r << " " << DataTypeName(dt);
            ASSERT_TRUE(std::equal(want.begin(), want.end(),
                                   inplace[r].begin() + r * count * esz));
            std::vector<char> wantv(fullv.begin() + off * esz,
                                    fullv.begin() + (off + counts[r]) * esz);
            ASSERT_EQ(outv[r], wantv) << "n=" << n << " r=" << r;
            off += counts[r];
          }
        }
      }
    }
  }
}

TEST(InProcessAllToAllTest, EvenUnevenAndInPlace) {
  for (int n : {1, 2, 3, 6, 9, 16}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{10}}) {
      const DataType dt = DataType::kI32;
      // Element (src s, dst d, j) = s * 1000000 + d * 1000 + j: the reference is obvious.
      auto elem = [](int s, int d, size_t j) { return int32_t(s * 1000000 + d * 1000 + j); };
      auto sc = [&](int s, int d) { return (count * (s + 2 * d) + s) % 5; };  // uneven
      std::vector<std::vector<int32_t>> out(n), outv(n), inplace(n);
      absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
        const int r = c.rank();
        std::vector<int32_t> in;
        for (int d = 0; d < n; ++d) for (size_t j = 0; j < count; ++j) in.push_back(elem(r, d, j));
        out[r].assign(n * count, -1);
        absl::Status st = c.AllToAll(in.data(), out[r].data(), count, dt);
        if (!st.ok()) return st;
        inplace[r] = in;
        st = c.AllToAll(inplace[r].data(), inplace[r].data(), count, dt);
        if (!st.ok()) return st;
        std::vector<size_t> send_counts(n), recv_counts(n);
        std::vector<int32_t> inv;
        for (int d = 0; d < n; ++d) {
          send_counts[d] = sc(r, d);
          recv_counts[d] = sc(d, r);
          for (size_t j = 0; j < send_counts[d]; ++j) inv.push_back(elem(r, d, j));
        }
        outv[r].assign(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}), -1);
        return c.AllToAllV(inv.data(), send_counts, outv[r].data(), recv_counts, dt);
      }, Fast());
      ASSERT_TRUE(s.ok()) << s;
      for (int r = 0; r < n; ++r) {
        std::vector<int32_t> want, wantv;
        for (int src = 0; src < n; ++src) {
          for (size_t j = 0; j < count; ++j) want.push_back(elem(src, r, j));
          for (size_t j = 0; j < sc(src, r); ++j) wantv.push_back(elem(src, r, j));
        }
        ASSERT_EQ(out[r], want) << "n=" << n << " r=" << r;
        ASSERT_EQ(inplace[r], want) << "n=" << n << " r=" << r;
        ASSERT_EQ(outv[r], wantv) << "n=" << n << " r=" << r;
      }
    }
  }
}

TEST(InProcessBroadcastTest, EveryRootAndSize) {
  for (int n : {1, 2, 5, 8}) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<double>> buf(n);
      absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
        buf[c.rank()].assign(37, c.rank() == root ? 0.0 : -1.0);
        if (c.rank() == root) std::iota(buf[c.rank()].begin(), buf[c.rank()].end(), root * 100.0);
        return c.Broadcast(buf[c.rank()].data(), 37, DataType::kF64, root);
      }, Fast());
      ASSERT_TRUE(s.ok()) << s;
      std::vector<double> want(37);
      std::iota(want.begin(), want.end(), root * 100.0);
      for (int r = 0; r < n; ++r) ASSERT_EQ(buf[r], want) << "n=" << n << " root=" << root;
    }
  }
}

TEST(InProcessPpermuteTest, ShiftsPartialPermutationsAndInPlace) {
  for (int n : {1, 2, 3, 7, 12}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<std::pair<int, int>> pairs;
      if (variant == 0) for (int r = 0; r < n; ++r) pairs.push_back({r, (r + 1) % n});
      if (variant == 1) for (int r = 0; r + 2 < n; r += 2) pairs.push_back({r, r + 2});  // partial
      if (variant == 2) for (int r = 0; r < n; ++r) pairs.push_back({r, n - 1 - r});
      std::vector<std::vector<float>> out(n), inplace(n);
      absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
        const int r = c.rank();
        std::vector<float> in(9, r + 0.5f);
        out[r].assign(9, -7.0f);
        absl::Status st = c.Ppermute(in.data(), out[r].data(), 9, DataType::kF32, pairs);
        if (!st.ok()) return st;
        inplace[r] = in;
        return c.Ppermute(inplace[r].data(), inplace[r].data(), 9, DataType::kF32, pairs);
      }, Fast());
      ASSERT_TRUE(s.ok()) << s;
      for (int r = 0; r < n; ++r) {
        float want = 0.0f;  // no source: zeros
        for (auto [src, dst] : pairs) if (dst == r) want = src + 0.5f;
        ASSERT_EQ(out[r], std::vector<float>(9, want)) << "n=" << n << " v=" << variant;
        ASSERT_EQ(inplace[r], std::vector<float>(9, want)) << "n=" << n << " v=" << variant;
      }
    }
  }
}

TEST(InProcessSendRecvTest, RingAndOrderedMessages) {
  for (int n : {2, 3, 5}) {
    std::vector<std::vector<int64_t>> got(n);
    absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
      const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      // Even ranks send first, odd ranks receive first: no cycle of blocked senders.
      for (int m = 0; m < 3; ++m) {
        std::vector<int64_t> out(4 + m, r * 10 + m), in(4 + m, -1);
        absl::Status st;
        if (r % 2 == 0) {
          st = c.Send(out.data(), out.size(), DataType::kI64, next);
          if (st.ok()) st = c.Recv(in.data(), in.size(), DataType::kI64, prev);
        } else {
          st = c.Recv(in.data(), in.size(), DataType::kI64, prev);
          if (st.ok()) st = c.Send(out.data(), out.size(), DataType::kI64, next);
        }
        if (!st.ok()) return st;
        got[r].insert(got[r].end(), in.begin(), in.end());
      }
      return absl::OkStatus();
    }, Fast());
    ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < n; ++r) {
      std::vector<int64_t> want;
      const int prev = (r + n - 1) % n;
      for (int m = 0; m < 3; ++m) want.insert(want.end(), 4 + m, prev * 10 + m);
      EXPECT_EQ(got[r], want) << "n=" << n << " r=" << r;
    }
  }
}

TEST(InProcessSplitTest, ColorsKeysNestingAndCollectivesOnSubgroups) {
  for (int n : {1, 4, 6, 7, 16}) {
    std::mutex mu;
    std::vector<std::string> errors;
    absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
      const int r = c.rank();
      auto fail = [&](std::string e) {
        std::lock_guard<std::mutex> l(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e);
      };
      // color r % 3, key -r: groups ordered by descending world rank.
      auto sub = c.Split(r % 3, -r);
      if (!sub.ok()) return sub.status();
      Communicator& g = **sub;
      std::vector<int> members;
      for (int q = n - 1; q >= 0; --q) if (q % 3 == r % 3) members.push_back(q);
      if (g.size() != (int)members.size()) fail("size");
      if (members[g.rank()] != r) fail("rank order");
      int64_t x = r, sum = 0;
      for (int q : members) sum += q;
      absl::Status st = g.AllReduce(&x, &x, 1, DataType::kI64, ReduceOp::kSum);
      if (!st.ok()) return st;
      if (x != sum) fail("sum");
      // Nested split of the sub-group, plus a rank that opts out with a negative color.
      auto sub2 = g.Split(g.rank() == 0 ? -1 : 0, 0);
      if (!sub2.ok()) return sub2.status();
      if (g.rank() == 0) {
        if (*sub2 != nullptr) fail("negative color should give nullptr");
      } else {
        int32_t one = 1;
        st = (*sub2)->AllReduce(&one, &one, 1, DataType::kI32, ReduceOp::kSum);
        if (!st.ok()) return st;
        if (one != g.size() - 1) fail("nested sum");
        if ((*sub2)->name().find("split") == std::string::npos) fail("name");
      }
      return c.Barrier();
    }, Fast());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(errors.empty()) << errors[0];
  }
}

TEST(InProcessTest, ConcurrentCollectivesOnDisjointSubgroups) {
  // tp groups of 2 and dp groups of 3 over 6 ranks, interleaved like a 2-d mesh would.
  const int n = 6;
  std::vector<float> result(n);
  absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
    const int r = c.rank();
    auto tp = c.Split(r / 2, r);
    auto dp = c.Split(r % 2, r);
    if (!tp.ok()) return tp.status();
    if (!dp.ok()) return dp.status();
    std::vector<float> v(1001, r + 1.0f);
    for (int it = 0; it < 20; ++it) {
      absl::Status st = (*tp)->AllReduce(v.data(), v.data(), v.size(), DataType::kF32,
                                         ReduceOp::kAvg);
      if (st.ok()) st = (*dp)->AllReduce(v.data(), v.data(), v.size(), DataType::kF32,
                                         ReduceOp::kMax);
      if (!st.ok()) return st;
    }
    result[r] = v[1000];
    return absl::OkStatus();
  }, Fast());
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < n; ++r) EXPECT_EQ(result[r], 5.5f);  // max over dp of tp means
}

}  // namespace
}  // namespace shardmap::collectives
