#include "collectives/gloo_store.h"

#include <string>
#include <vector>

#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"
#include "gloo/common/error.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

TcpStoreOptions Opts(int port, int n) {
  TcpStoreOptions o;
  o.port = port;
  o.world_size = n;
  o.timeout = absl::Seconds(10);
  o.token = "test-token-0123456789abcdef";
  return o;
}

// Issue 48: Gloo's rendezvous waits for each peer's key; a peer that never joins was reported as
// "TcpStore Wait('gloo/world/1') ... no answer". It is now the rank, the timeout and the fix.
TEST(GlooStoreTest, ARankThatDoesNotJoinIsNamedWithTheTimeoutAndTheFix) {
  absl::StatusOr<int> port = internal::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto tcp = TcpStore::Create(Opts(*port, 3));
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  GlooStore store(**tcp, "gloo/world");
  store.set("0", {'a'});
  store.wait({"0"}, std::chrono::milliseconds(100));  // set: returns at once
  std::string message;
  try {
    store.wait({"1", "2"}, std::chrono::milliseconds(200));
  } catch (const gloo::IoException& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("ranks 1, 2 of 3 did not join within 200ms; start every rank "
                         "(collectives/launch --nproc_per_node=3 does)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("raise the timeout (train: --collective_timeout)"), std::string::npos)
      << message;
  // The store's connection survives the timeout: a later rendezvous step still works.
  store.set("1", {'b'});
  EXPECT_EQ(store.get("1"), std::vector<char>{'b'});
}

// A group formed mid-run (a Split) waits for members that joined the job long ago: a missing one
// is named by its world rank (the keys are group ranks) and is not told to "start every rank"
// (train_gpt_gloo_test's stopped peer can be caught here, when it is stopped before a Split).
TEST(GlooStoreTest, AMemberMissingFromALaterGroupIsNamedByItsWorldRank) {
  absl::StatusOr<int> port = internal::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto tcp = TcpStore::Create(Opts(*port, 6));
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  GlooStore store(**tcp, "gloo/world/split#3/color0",
                  GlooStoreGroup{{0, 2, 4}, "the rendezvous of Split() #3"});
  store.set("0", {'a'});
  std::string message;
  try {
    store.wait({"0", "2"}, std::chrono::milliseconds(150));  // group rank 2 = world rank 4
  } catch (const gloo::IoException& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("rank 4 of 6 did not reach the rendezvous of Split() #3 within 150ms "
                         "(it joined the job earlier: stopped, hung, or busy that long "
                         "elsewhere)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("raise the timeout (train: --collective_timeout)"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("start every rank"), std::string::npos) << message;
}

}  // namespace
}  // namespace shardmap::collectives
