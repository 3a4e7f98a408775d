// TcpStore over real loopback sockets; ranks are threads here (processes in launch_test).
#include "collectives/tcp_store.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/internal/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;

TcpStoreOptions Opts(int port, int rank, int n, absl::Duration timeout = absl::Seconds(10)) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = n;
  o.timeout = timeout;
  return o;
}

TEST(TcpStoreTest, EveryRankGetsTheSameBlobAndBarrierWorks) {
  for (int n : {1, 3, 5}) {
    auto port = internal::PickFreePort();
    ASSERT_TRUE(port.ok());
    std::string blob(100000, '\0');
    for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 131 + n);
    std::vector<std::string> got(n), errors(n);
    std::vector<std::thread> threads;
    for (int r = n - 1; r >= 0; --r) {  // rank 0 starts last: the others must retry
      threads.emplace_back([&, r] {
        auto store = TcpStore::Create(Opts(*port, r, n));
        if (!store.ok()) { errors[r] = store.status().ToString(); return; }
        if (r == 0) {
          absl::SleepFor(absl::Milliseconds(50));  // Gets block until the Set
          if (auto s = (*store)->Set("blob", blob); !s.ok()) { errors[r] = s.ToString(); return; }
        }
        auto v = (*store)->Get("blob");
        if (!v.ok()) { errors[r] = v.status().ToString(); return; }
        got[r] = *v;
        if (auto s = (*store)->Set(absl::StrCat("from/", r), absl::StrCat(r * r)); !s.ok()) {
          errors[r] = s.ToString();
          return;
        }
        for (int q = 0; q < n; ++q) {
          auto w = (*store)->Get(absl::StrCat("from/", q));
          if (!w.ok() || *w != absl::StrCat(q * q)) { errors[r] = "bad from/"; return; }
        }
        if (auto s = (*store)->Barrier("end"); !s.ok()) errors[r] = s.ToString();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[r], "") << "n=" << n << " rank " << r;
      EXPECT_TRUE(got[r] == blob) << "n=" << n << " rank " << r;
    }
  }
}

TEST(TcpStoreTest, UnreachableMasterFailsAfterTheDeadline) {
  auto port = internal::PickFreePort();
  ASSERT_TRUE(port.ok());
  const absl::Time start = absl::Now();
  auto store = TcpStore::Create(Opts(*port, 1, 2, absl::Milliseconds(300)));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("could not reach the master at 127.0.0.1:", *port)));
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(TcpStoreTest, WorldSizeMismatchAndDuplicateRank) {
  auto port = internal::PickFreePort();
  ASSERT_TRUE(port.ok());
  auto master = TcpStore::Create(Opts(*port, 0, 4));
  ASSERT_TRUE(master.ok()) << master.status();
  auto bad = TcpStore::Create(Opts(*port, 1, 8));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("world-size mismatch: rank 1 has WORLD_SIZE=8 but the master (rank 0) "
                        "has WORLD_SIZE=4"));
  auto one = TcpStore::Create(Opts(*port, 2, 4));
  ASSERT_TRUE(one.ok()) << one.status();
  auto twice = TcpStore::Create(Opts(*port, 2, 4));
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("rank 2 joined twice"));
}

TEST(TcpStoreTest, GetOfAMissingKeyTimesOut) {
  auto port = internal::PickFreePort();
  ASSERT_TRUE(port.ok());
  auto store = TcpStore::Create(Opts(*port, 0, 1, absl::Milliseconds(200)));
  ASSERT_TRUE(store.ok()) << store.status();
  auto v = (*store)->Get("never");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("Get('never')"));
}

TEST(TcpStoreTest, InvalidOptions) {
  EXPECT_FALSE(TcpStore::Create(Opts(1234, 2, 2)).ok());
  EXPECT_FALSE(TcpStore::Create(Opts(0, 0, 2)).ok());
  EXPECT_FALSE(TcpStore::Create(Opts(1234, 0, 0)).ok());
}

}  // namespace
}  // namespace shardmap::collectives
