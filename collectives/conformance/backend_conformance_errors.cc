// The conformance cases about groups and errors (backend_conformance.h): Split, a failing rank,
// a silent rank, mismatched calls and bad arguments.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/backend_registry.h"
#include "collectives/communicator.h"
#include "collectives/conformance/backend_conformance.h"
#include "gmock/gmock.h"

namespace shardmap::collectives::conformance {
namespace {

using ::testing::HasSubstr;

const Backend* Find(const std::string& name) {
  absl::StatusOr<const Backend*> b = FindBackend(name);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : nullptr;
}

// Skips (with the reason) when the backend cannot run here, e.g. NCCL without a GPU.
#define SKIP_IF_UNAVAILABLE(b)                                                  \
  do {                                                                          \
    ASSERT_NE(b, nullptr);                                                      \
    const std::string why = (b)->unavailable_reason();                          \
    if (!why.empty()) GTEST_SKIP() << (b)->name << " cannot run here: " << why; \
  } while (0)

// The cases below need peers that can fail, wait and disagree.
#define SKIP_WITHOUT_PEERS(b)                                                                   \
  do {                                                                                          \
    if (!(b)->moves_data) {                                                                     \
      GTEST_SKIP() << (b)->name << " has no peers (each rank runs alone, on paper): there is "  \
                   << "no other rank to fail, to wait for or to disagree with";                 \
    }                                                                                           \
  } while (0)

std::vector<int> SizesFrom(const ConformanceTarget& t, int min_n) {
  std::vector<int> out;
  for (int n : t.world_sizes) {
    if (n >= min_n) out.push_back(n);
  }
  return out;
}

// The GPU buffers of a device backend (one int64 per rank is all these cases move).
class Scalar {
 public:
  Scalar(const ConformanceTarget& t, const Communicator& c, int64_t v)
      : t_(t), device_(c.memory_space().device), index_(c.memory_space().device_index) {
    if (device_) {
      p_ = t.device.alloc(index_, 64);
      t.device.to_device(index_, p_, &v, sizeof(v));
    } else {
      host_[0] = v;
      p_ = &host_;
    }
  }
  ~Scalar() {
    if (device_) t_.device.free(index_, p_);
  }
  void* p() const { return p_; }
  int64_t Get() const {
    int64_t v = host_[0];
    if (device_) t_.device.to_host(index_, &v, p_, sizeof(v));
    return v;
  }

 private:
  const ConformanceTarget& t_;
  bool device_;
  int index_;
  void* p_ = nullptr;
  int64_t host_[8] = {};
};

}  // namespace

TEST_P(BackendConformanceTest, SplitMakesGroupsOrderedByKey) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  if (!b->moves_data) {
    GTEST_SKIP() << b->name << ": a rank alone cannot see its peers' colors, so Split needs the "
                 << "program's SplitResolver (shape_only_communicator.h), not a backend world";
  }
  for (int n : t.world_sizes) {
    EXPECT_THAT(b->run_world(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      // Rank 0 opts out (color -1); the others split by parity, ordered by descending rank.
      const int color = me == 0 ? -1 : me % 2;
      absl::StatusOr<std::unique_ptr<Communicator>> sub = c.Split(color, /*key=*/n - me);
      if (!sub.ok()) return sub.status();
      if (me == 0) {
        EXPECT_EQ(*sub, nullptr) << "color -1 must give no group";
      } else {
        std::vector<int> members;  // world ranks of my group, in key order
        for (int r = n - 1; r >= 1; --r) {
          if (r % 2 == color) members.push_back(r);
        }
        EXPECT_NE(*sub, nullptr);
        if (*sub == nullptr) return absl::InternalError("no group");
        Communicator& g = **sub;
        EXPECT_EQ(g.size(), static_cast<int>(members.size())) << "n=" << n << " rank " << me;
        const int pos = std::find(members.begin(), members.end(), me) - members.begin();
        EXPECT_EQ(g.rank(), pos) << "n=" << n << " rank " << me;
        // The group's collectives see exactly its members, in key order.
        Scalar x(t, g, 1000 + me);
        absl::Status s = g.AllReduce(x.p(), x.p(), 1, DataType::kI64, ReduceOp::kSum);
        if (!s.ok()) return s;
        int64_t want = 0;
        for (int r : members) want += 1000 + r;
        EXPECT_EQ(x.Get(), want) << "group AllReduce, n=" << n << " rank " << me;
        Scalar root_value(t, g, me);
        s = g.Broadcast(root_value.p(), 1, DataType::kI64, /*root=*/0);
        if (!s.ok()) return s;
        EXPECT_EQ(root_value.Get(), members[0]) << "group rank 0 is the lowest key, n=" << n;
      }
      // The parent still works after the split, with every rank.
      Scalar all(t, c, 1);
      absl::Status s = c.AllReduce(all.p(), all.p(), 1, DataType::kI64, ReduceOp::kSum);
      if (!s.ok()) return s;
      EXPECT_EQ(all.Get(), n);
      return absl::OkStatus();
    }, {}), ::testing::Each(absl::OkStatus())) << "Split n=" << n;
  }
}

TEST_P(BackendConformanceTest, AFailingRankFailsItsPeersWithoutAHang) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  SKIP_WITHOUT_PEERS(b);
  if (SizesFrom(t, 2).empty()) {
    GTEST_SKIP() << "needs a world of 2 ranks or more; " << t.backend << " runs sizes up to "
                 << t.world_sizes.back() << " here";
  }
  for (int n : SizesFrom(t, 2)) {
    const int failed = n - 1;
    WorldOptions o;
    o.timeout = absl::Seconds(60);  // far beyond the bound below: the failure must be seen
    const absl::Time start = absl::Now();
    std::vector<absl::Status> all = b->run_world(n, [&](Communicator& c) -> absl::Status {
      Scalar x(t, c, 1);
      absl::Status s = c.AllReduce(x.p(), x.p(), 1, DataType::kI64, ReduceOp::kSum);
      if (!s.ok() || c.rank() == failed) {
        return s.ok() ? absl::UnavailableError("conformance: disk on fire") : s;
      }
      for (int i = 0; i < 1000; ++i) {  // until the failure reaches this rank
        s = c.AllReduce(x.p(), x.p(), 1, DataType::kI64, ReduceOp::kSum);
        if (!s.ok()) return s;
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
        EXPECT_THAT(std::string(all[r].message()), HasSubstr("disk on fire")) << all[r];
      }
    }
  }
}

TEST_P(BackendConformanceTest, ASilentRankTimesOutItsPeers) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  SKIP_WITHOUT_PEERS(b);
  if (SizesFrom(t, 2).empty()) {
    GTEST_SKIP() << "needs a world of 2 ranks or more; " << t.backend << " runs sizes up to "
                 << t.world_sizes.back() << " here";
  }
  for (int n : SizesFrom(t, 2)) {
    if (n > 3) continue;  // each world sleeps past its timeout: two sizes are enough
    WorldOptions o;
    o.timeout = absl::Milliseconds(1500);
    const absl::Time start = absl::Now();
    std::vector<absl::Status> all = b->run_world(n, [&](Communicator& c) -> absl::Status {
      Scalar x(t, c, 1);
      absl::Status s = c.AllReduce(x.p(), x.p(), 1, DataType::kI64, ReduceOp::kSum);
      if (!s.ok()) return s;  // the world works before rank 0 goes silent
      if (c.rank() == 0) {  // alive, connected, never calls again
        std::this_thread::sleep_for(std::chrono::seconds(5));
        return absl::OkStatus();
      }
      return c.Barrier();
    }, o);
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "n=" << n;
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(all[r].code(), absl::StatusCode::kDeadlineExceeded) << "n=" << n << " rank " << r
                                                                    << ": " << all[r];
    }
  }
}

namespace {

// How rank `last` of a world disagrees with the others.
struct Mismatch {
  const char* what;
  DataType dtype_last;
  ReduceOp op_last;
  size_t count_last;
  bool gather_last;      // the last rank calls AllGather instead of AllReduce
  const char* ours;      // in every rank's message: how the others' call is described
  const char* theirs;    // and the last rank's
};

}  // namespace

TEST_P(BackendConformanceTest, MismatchedCallsFailOnEveryRankNamingBoth) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  SKIP_WITHOUT_PEERS(b);
  const Mismatch cases[] = {
      {"count", DataType::kF32, ReduceOp::kSum, 5, false, "count=4", "count=5"},
      {"dtype", DataType::kF64, ReduceOp::kSum, 4, false, "f32", "f64"},
      {"reduce op", DataType::kF32, ReduceOp::kMax, 4, false, "sum", "max"},
      {"op", DataType::kF32, ReduceOp::kSum, 4, true, "AllReduce", "AllGather"},
  };
  if (SizesFrom(t, 2).empty()) {
    GTEST_SKIP() << "needs a world of 2 ranks or more; " << t.backend << " runs sizes up to "
                 << t.world_sizes.back() << " here";
  }
  for (int n : SizesFrom(t, 2)) {
    for (const Mismatch& m : cases) {
      WorldOptions o;
      o.timeout = absl::Seconds(30);
      const absl::Time start = absl::Now();
      std::vector<absl::Status> all = b->run_world(n, [&](Communicator& c) -> absl::Status {
        const bool last = c.rank() == n - 1;
        // Big enough for either call (AllGather of 4 f64 from every rank).
        std::vector<char> host(8 * 4 * n + 64, 0);
        void* p = host.data();
        std::unique_ptr<char, std::function<void(char*)>> dev;
        if (c.memory_space().device) {
          const int d = c.memory_space().device_index;
          dev = {static_cast<char*>(t.device.alloc(d, host.size())),
                 [&t, d](char* q) { t.device.free(d, q); }};
          t.device.to_device(d, dev.get(), host.data(), host.size());
          p = dev.get();
        }
        if (last && m.gather_last) {  // in place: its slice of the gathered buffer
          return c.AllGather(static_cast<char*>(p) + 16 * (n - 1), p, 4, DataType::kF32);
        }
        return c.AllReduce(p, p, last ? m.count_last : 4, last ? m.dtype_last : DataType::kF32,
                           last ? m.op_last : ReduceOp::kSum);
      }, o);
      EXPECT_LT(absl::Now() - start, absl::Seconds(25)) << m.what << " n=" << n;
      ASSERT_EQ(all.size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument)
            << "mismatched " << m.what << ", n=" << n << " rank " << r << ": " << all[r];
        EXPECT_THAT(std::string(all[r].message()), AllOf(HasSubstr(m.ours), HasSubstr(m.theirs)))
            << "mismatched " << m.what << ", n=" << n << " rank " << r;
      }
    }
  }
}

TEST_P(BackendConformanceTest, BadArgumentsAreRefusedOnEveryRank) {
  const ConformanceTarget& t = GetParam();
  const Backend* b = Find(t.backend);
  SKIP_IF_UNAVAILABLE(b);
  struct Bad {
    const char* what;
    std::function<absl::Status(Communicator&, void*)> call;
  };
  const Bad cases[] = {
      {"root out of range",
       [](Communicator& c, void* p) { return c.Broadcast(p, 1, DataType::kF32, c.size()); }},
      {"invalid dtype",
       [](Communicator& c, void* p) {
         return c.AllReduce(p, p, 1, static_cast<DataType>(99), ReduceOp::kSum);
       }},
      {"invalid reduce op",
       [](Communicator& c, void* p) {
         return c.AllReduce(p, p, 1, DataType::kF32, static_cast<ReduceOp>(77));
       }},
      {"counts of the wrong length",
       [](Communicator& c, void* p) {
         const std::vector<size_t> counts(c.size() + 1, 1);
         return c.AllGatherV(p, p, counts, DataType::kF32);
       }},
      {"a rank twice as a ppermute source",
       [](Communicator& c, void* p) {
         const std::vector<std::pair<int, int>> pairs = {{0, 0}, {0, 0}};
         return c.Ppermute(p, p, 1, DataType::kF32, pairs);
       }},
      {"peer out of range", [](Communicator& c, void* p) {
         return c.Send(p, 1, DataType::kF32, c.size());
       }},
  };
  for (int n : t.world_sizes) {
    for (const Bad& bad : cases) {
      WorldOptions o;
      o.timeout = absl::Seconds(30);
      std::vector<absl::Status> all = b->run_world(n, [&](Communicator& c) -> absl::Status {
        Scalar x(t, c, 0);  // 64 bytes: room for every call above
        return bad.call(c, x.p());
      }, o);
      ASSERT_EQ(all.size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument)
            << bad.what << ", n=" << n << " rank " << r << ": " << all[r];
      }
    }
  }
}

}  // namespace shardmap::collectives::conformance
