// The NCCL unique-id keys are numbered by a counter in the store, per store: host-side, no GPU
// needed. Ranks are threads here, each with its own stores, as processes would be.
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/internal/free_port.h"
#include "collectives/nccl_communicator.h"
#include "collectives/tcp_store.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

TcpStoreOptions Opts(int port, int rank, int n) {
  TcpStoreOptions o;
  o.port = port;
  o.rank = rank;
  o.world_size = n;
  o.timeout = absl::Seconds(20);
  o.token = "nccl-key-test-token-0123";
  return o;
}

TEST(NcclUniqueIdKeyTest, NumberedPerStoreSoUnevenUseElsewhereCannotMisnumber) {
  constexpr int kWorld = 3;
  auto port_a = internal::PickFreePort(), port_b = internal::PickFreePort();
  ASSERT_TRUE(port_a.ok() && port_b.ok());
  std::vector<std::vector<std::string>> keys(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      auto fail = [&](const absl::Status& s) { errors[r] = s.ToString(); };
      // Rank 1 first made two communicators through a store of its own (e.g. an earlier job
      // phase); the others made none. A process-wide counter would now be off by two on rank 1.
      if (r == 1) {
        auto solo_port = internal::PickFreePort();
        if (!solo_port.ok()) return fail(solo_port.status());
        auto solo = TcpStore::Create(Opts(*solo_port, 0, 1));
        if (!solo.ok()) return fail(solo.status());
        for (int i = 0; i < 2; ++i) {
          auto k = internal::NextNcclUniqueIdKey(**solo);
          if (!k.ok()) return fail(k.status());
          if (*k != absl::StrCat("nccl/unique_id/", i + 1)) return fail(absl::InternalError(*k));
        }
      }
      auto a = TcpStore::Create(Opts(*port_a, r, kWorld));
      if (!a.ok()) return fail(a.status());
      auto b = TcpStore::Create(Opts(*port_b, r, kWorld));
      if (!b.ok()) return fail(b.status());
      // Three communicators through A and two through B, interleaved, on every rank.
      for (TcpStore* s : {a->get(), b->get(), a->get(), a->get(), b->get()}) {
        auto k = internal::NextNcclUniqueIdKey(*s);
        if (!k.ok()) return fail(k.status());
        keys[r].push_back(absl::StrCat(s == a->get() ? "A:" : "B:", *k));
      }
      if (auto s = (*a)->Barrier("done"); !s.ok()) return fail(s);
      if (auto s = (*b)->Barrier("done"); !s.ok()) return fail(s);
    });
  }
  for (auto& t : ranks) t.join();
  const std::vector<std::string> expected = {"A:nccl/unique_id/1", "B:nccl/unique_id/1",
                                             "A:nccl/unique_id/2", "A:nccl/unique_id/3",
                                             "B:nccl/unique_id/2"};
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(keys[r], expected) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardmap::collectives
