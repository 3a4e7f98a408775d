// Test helper: the TcpStore clients of a whole world in one process, as its ranks' processes
// would hold them (rank 0 serves), for tests of what ranks exchange through the store.
//
//   std::vector<std::shared_ptr<TcpStore>> stores = ConnectStoreWorld(3, "my-test-token");
//   // stores[r] is rank r's client; a failed connection is a test failure (stores[r] null)
#ifndef SHARDMAP_COLLECTIVES_STORE_WORLD_TEST_UTIL_H_
#define SHARDMAP_COLLECTIVES_STORE_WORLD_TEST_UTIL_H_

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::testing {

// Connects n clients concurrently (each Create waits for the world), on a free loopback port.
inline std::vector<std::shared_ptr<TcpStore>> ConnectStoreWorld(
    int n, const std::string& token, absl::Duration timeout = absl::Seconds(20)) {
  absl::StatusOr<int> port = internal::PickFreePort();
  EXPECT_TRUE(port.ok()) << port.status();
  std::vector<std::shared_ptr<TcpStore>> stores(n);
  if (!port.ok()) return stores;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TcpStoreOptions o;
      o.port = *port;
      o.rank = r;
      o.world_size = n;
      o.token = token;
      o.timeout = timeout;
      o.shutdown_grace = absl::Milliseconds(200);
      absl::StatusOr<std::unique_ptr<TcpStore>> s = TcpStore::Create(o);
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) stores[r] = std::move(*s);
    });
  }
  for (std::thread& t : threads) t.join();
  return stores;
}

}  // namespace shardmap::collectives::testing

#endif  // SHARDMAP_COLLECTIVES_STORE_WORLD_TEST_UTIL_H_
