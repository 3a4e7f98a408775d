// TcpStore over real loopback sockets; ranks are threads here (processes in launch_test).
// Misbehaving clients speak the wire format by hand (tcp_store_test_util.h).
#include "collectives/tcp_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store_test_util.h"
#include "collectives/tcp_store_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RawConnection;

constexpr char kToken[] = "test-token-0123456789abcdef";

TcpStoreOptions Opts(int port, int rank, int n, absl::Duration timeout = absl::Seconds(10)) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = n;
  o.timeout = timeout;
  o.token = kToken;
  return o;
}

int FreePort() {
  absl::StatusOr<int> port = internal::PickFreePort();
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

std::string Hello(int rank, int n, absl::string_view token = kToken) {
  return wire::Request('H', token, absl::StrCat(rank, " ", n));
}

// Retries Create until it works (the server notices a closed connection asynchronously).
absl::StatusOr<std::unique_ptr<TcpStore>> JoinWithin(const TcpStoreOptions& o,
                                                     absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  while (true) {
    auto s = TcpStore::Create(o);
    if (s.ok() || absl::Now() > deadline) return s;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST(TcpStoreTest, EveryRankGetsTheSameBlobAndBarrierWorks) {
  for (int n : {1, 3, 5}) {
    const int port = FreePort();
    std::string blob(100000, '\0');
    for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 131 + n);
    std::vector<std::string> got(n), errors(n);
    std::vector<std::thread> threads;
    for (int r = n - 1; r >= 0; --r) {  // rank 0 starts last: the others must retry
      threads.emplace_back([&, r] {
        auto store = TcpStore::Create(Opts(port, r, n));
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
  const int port = FreePort();
  const absl::Time start = absl::Now();
  auto store = TcpStore::Create(Opts(port, 1, 2, absl::Milliseconds(300)));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("could not reach the master at 127.0.0.1:", port)));
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(TcpStoreTest, WorldSizeMismatchDuplicateRankAndTheSlotIsFreedOnDisconnect) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 4));
  ASSERT_TRUE(master.ok()) << master.status();
  auto bad = TcpStore::Create(Opts(port, 1, 8));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("world-size mismatch: rank 1 has WORLD_SIZE=8 but the master (rank 0) "
                        "has WORLD_SIZE=4"));
  auto one = TcpStore::Create(Opts(port, 2, 4));
  ASSERT_TRUE(one.ok()) << one.status();
  auto twice = TcpStore::Create(Opts(port, 2, 4));
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("rank 2 joined twice"));
  // The first rank 2 goes away (e.g. its process died): a restarted rank 2 may join.
  one->reset();
  auto again = JoinWithin(Opts(port, 2, 4), absl::Seconds(5));
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(TcpStoreTest, ClientsWithoutTheTokenAreRefused) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE((*master)->Set("nccl_id", "secret bytes").ok());

  TcpStoreOptions wrong = Opts(port, 1, 2);
  wrong.token = "another-jobs-token-0123";
  auto refused = TcpStore::Create(wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("wrong store token"));
  EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr(kToken)));
  EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr(wrong.token)));

  // Skipping the hello: the request is refused and the connection closed.
  RawConnection skip(port);
  ASSERT_TRUE(skip.connected());
  ASSERT_TRUE(skip.Send(wire::Request('G', "nccl_id", "")));
  auto reply = skip.ReadReply(absl::Seconds(5));
  ASSERT_TRUE(reply.has_value());
  EXPECT_FALSE(reply->ok);
  EXPECT_THAT(reply->payload, HasSubstr("the first request must be the hello"));
  EXPECT_TRUE(skip.ClosedWithin(absl::Seconds(5)));

  // A wrong token, then a get anyway: refused, closed, nothing leaks.
  RawConnection guess(port);
  ASSERT_TRUE(guess.Send(Hello(1, 2, "guessed-token-0000000") +
                         wire::Request('G', "nccl_id", "")));
  reply = guess.ReadReply(absl::Seconds(5));
  ASSERT_TRUE(reply.has_value());
  EXPECT_FALSE(reply->ok);
  EXPECT_THAT(reply->payload, HasSubstr("wrong store token"));
  EXPECT_TRUE(guess.ClosedWithin(absl::Seconds(5)));

  // The real rank 1 still gets its slot and the value.
  auto good = TcpStore::Create(Opts(port, 1, 2));
  ASSERT_TRUE(good.ok()) << good.status();
  auto v = (*good)->Get("nccl_id");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "secret bytes");
}

TEST(TcpStoreTest, TokenRequiredAndChecked) {
  TcpStoreOptions o = Opts(FreePort(), 0, 2);
  o.token = "";
  auto s = TcpStore::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("no store token"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("SHARDMAP_STORE_TOKEN"));
  o.token = "short";
  s = TcpStore::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("5 characters; use 16 to 256"));
  o.token = std::string(20, 'a') + "\n";
  s = TcpStore::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("printable ASCII without spaces"));
  // One rank alone makes up its own token.
  o = Opts(FreePort(), 0, 1);
  o.token = "";
  s = TcpStore::Create(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->Set("k", "v").ok());
  // Fresh tokens are valid and differ.
  auto t1 = NewStoreToken(), t2 = NewStoreToken();
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_TRUE(CheckStoreToken(*t1).ok());
  EXPECT_EQ(t1->size(), 32u);
  EXPECT_NE(*t1, *t2);
}

TEST(TcpStoreTest, BindsOnlyTheMasterAddress) {
  // 127.0.0.1 and 127.0.0.2 are distinct local addresses: a store bound to one (not to all
  // interfaces) refuses connections to the other.
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_FALSE(RawConnection(port, "127.0.0.2").connected());
  EXPECT_TRUE(RawConnection(port, "127.0.0.1").connected());

  const int port2 = FreePort();
  TcpStoreOptions o = Opts(port2, 0, 1);
  o.host = "127.0.0.2";
  auto other = TcpStore::Create(o);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(RawConnection(port2, "127.0.0.2").connected());
  EXPECT_FALSE(RawConnection(port2, "127.0.0.1").connected());

  // An address that is not this machine's: a clear error, not a store on all interfaces.
  o = Opts(FreePort(), 0, 1);
  o.host = "192.0.2.123";  // TEST-NET-1 (RFC 5737), never local here
  auto foreign = TcpStore::Create(o);
  ASSERT_FALSE(foreign.ok());
  EXPECT_THAT(std::string(foreign.status().message()), HasSubstr("rank 0 could not listen"));
}

// Every spelling of 0.0.0.0 or :: is checked after resolution, inside the server: rank 0 never
// listens on every interface unless allow_all_interfaces says so (torchrun-style ranks with
// MASTER_ADDR=0.0.0.0 go through no launcher check).
TEST(TcpStoreTest, AWildcardAddressIsRefusedInEverySpelling) {
  for (const char* host : {"0.0.0.0", "0", "00", "0x0", "000.000.000.000", "0.0x0", "0.0.0",
                           "::", "0:0::0", "::ffff:0.0.0.0"}) {
    EXPECT_TRUE(ResolvesToAllInterfaces(host)) << host;
    TcpStoreOptions o = Opts(FreePort(), 0, 1);
    o.host = host;
    auto store = TcpStore::Create(o);
    ASSERT_FALSE(store.ok()) << host << " was accepted";
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
    EXPECT_THAT(std::string(store.status().message()),
                HasSubstr(absl::StrCat("rank 0 refuses MASTER_ADDR '", host,
                                       "': it is the wildcard address")));
    EXPECT_THAT(std::string(store.status().message()),
                HasSubstr("SHARDMAP_STORE_ALLOW_ALL_INTERFACES=1"));
  }
  EXPECT_TRUE(ResolvesToAllInterfaces("[::]"));
  for (const char* host : {"127.0.0.1", "localhost", "::1", "127.0.0.2", "0.0.0.1", "", "x.invalid"}) {
    EXPECT_FALSE(ResolvesToAllInterfaces(host)) << host;
  }
  // Told to: the store listens on every interface (loopback included).
  const int port = FreePort();
  TcpStoreOptions o = Opts(port, 0, 2);
  o.host = "0x0";
  o.allow_all_interfaces = true;
  auto master = TcpStore::Create(o);
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(RawConnection(port, "127.0.0.2").connected());
}

TEST(TcpStoreTest, ATimeoutClosesTheConnectionSoNoLaterRequestReadsAStaleReply) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = TcpStore::Create(Opts(port, 1, 2, absl::Milliseconds(200)));
  ASSERT_TRUE(client.ok()) << client.status();
  auto v = (*client)->Get("late");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("Get('late')"));
  // The answer to the timed-out Get arrives now; the next request must not take it for its own.
  ASSERT_TRUE((*master)->Set("late", "the answer to the first Get").ok());
  ASSERT_TRUE((*master)->Set("other", "other").ok());
  absl::SleepFor(absl::Milliseconds(50));
  auto w = (*client)->Get("other");
  ASSERT_FALSE(w.ok()) << *w;
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("the connection was closed after an earlier error"));
  // Its slot is free again: the rank can rejoin with a new store.
  auto again = JoinWithin(Opts(port, 1, 2), absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  auto x = (*again)->Get("other");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(*x, "other");
}

// A rendezvous that times out names every rank missing, not the one key it blocked on (issue 48:
// "TcpStore Wait('gloo/world/1') ... no answer" told a user nothing).
TEST(TcpStoreTest, MissingAfterNamesEveryUnsetKeyAndKeepsTheConnection) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 3));
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE((*master)->Set("r/0", "").ok());
  auto none = (*master)->MissingAfter({"r/0"}, absl::Seconds(5));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  const absl::Time start = absl::Now();
  auto missing = (*master)->MissingAfter({"r/0", "r/1", "r/2"}, absl::Milliseconds(150));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(*missing, (std::vector<std::string>{"r/1", "r/2"}));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  // A key set while waiting ends the wait; the connection still works after a timeout.
  std::thread later([&] {
    auto c = TcpStore::Create(Opts(port, 1, 3));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Set("r/1", "").ok());
  });
  auto joined = (*master)->MissingAfter({"r/1"}, absl::Seconds(30));
  later.join();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(joined->empty());
}

TEST(TcpStoreTest, RanksDidNotJoinSaysWhoTheTimeoutAndTheFix) {
  EXPECT_EQ(RanksDidNotJoin({1}, 2, absl::Seconds(3), "--collective_timeout"),
            "rank 1 of 2 did not join within 3s; start every rank (collectives/launch "
            "--nproc_per_node=2 does), each with the same MASTER_ADDR, MASTER_PORT and "
            "SHARDMAP_STORE_TOKEN, or raise the timeout (--collective_timeout)");
  EXPECT_THAT(RanksDidNotJoin({2, 3}, 4, absl::Seconds(30), ""),
              HasSubstr("ranks 2, 3 of 4 did not join within 30s;"));
}

TEST(TcpStoreTest, AddIsCheckedAndKeepsTheConnection) {
  const int port = FreePort();
  auto store = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(*(*store)->Add("c", 5), 5);
  EXPECT_EQ(*(*store)->Add("c", -7), -2);
  EXPECT_EQ(*(*store)->Add("c", kMax), kMax - 2);
  auto over = (*store)->Add("c", 3);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr(absl::StrCat(kMax - 2, " + 3 overflows int64")));
  EXPECT_EQ(*(*store)->Add("c", 2), kMax);  // unchanged by the failed add, connection kept
  EXPECT_EQ(*(*store)->Add("m", kMin), kMin);
  EXPECT_FALSE((*store)->Add("m", -1).ok());
  ASSERT_TRUE((*store)->Set("text", "abc").ok());
  auto parse = (*store)->Add("text", 1);
  ASSERT_FALSE(parse.ok());
  EXPECT_THAT(std::string(parse.status().message()), HasSubstr("holds 'abc', not a decimal int64"));
  EXPECT_EQ(*(*store)->Get("text"), "abc");
  // A bad delta from a hand-made client is an error reply too.
  RawConnection raw(port);
  ASSERT_TRUE(raw.Send(Hello(1, 2) + wire::Request('A', "c", "1x") +
                       wire::Request('A', "c", "-1")));
  auto hello = raw.ReadReply(absl::Seconds(5));
  auto bad = raw.ReadReply(absl::Seconds(5));
  auto good = raw.ReadReply(absl::Seconds(5));
  ASSERT_TRUE(hello.has_value() && bad.has_value() && good.has_value());
  EXPECT_TRUE(hello->ok);
  EXPECT_FALSE(bad->ok);
  EXPECT_THAT(bad->payload, HasSubstr("Add('c'): the delta '1x' is not a decimal int64"));
  EXPECT_TRUE(good->ok);
  EXPECT_EQ(good->payload, absl::StrCat(kMax - 1));
}

TEST(TcpStoreTest, MalformedOrOversizedRequestsCloseThatConnectionOnly) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  auto frame_with_lengths = [](uint32_t kl, uint64_t vl) {
    std::string f(1, 'S');
    f.append(reinterpret_cast<const char*>(&kl), 4);
    f.append(reinterpret_cast<const char*>(&vl), 8);  // the header only: nothing follows
    return f;
  };
  struct Case {
    std::string bytes;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {frame_with_lengths(0, wire::kMaxValue + 1), "value too long"},
      {frame_with_lengths(0, ~uint64_t{0}), "value too long"},
      {frame_with_lengths(wire::kMaxKey + 1, 0), "key too long"},
      {frame_with_lengths(0xffffffffu, 0), "key too long"},
      {wire::Request('Z', "k", "v"), "unknown type"},
  };
  // Before the hello: nothing but a short hello is read.
  for (const std::string& first :
       {frame_with_lengths(0, 1 << 20), wire::Request('H', std::string(300, 't'), "1 2"),
        wire::Request('H', kToken, std::string(100, '1'))}) {
    RawConnection raw(port);
    ASSERT_TRUE(raw.Send(first));
    auto reply = raw.ReadReply(absl::Seconds(5));
    ASSERT_TRUE(reply.has_value());
    EXPECT_FALSE(reply->ok);
    EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(5)));
  }
  for (const Case& c : cases) {
    RawConnection raw(port);
    ASSERT_TRUE(raw.Send(Hello(1, 2) + c.bytes));
    auto hello = raw.ReadReply(absl::Seconds(5));
    ASSERT_TRUE(hello.has_value() && hello->ok) << c.expect;
    auto reply = raw.ReadReply(absl::Seconds(5));
    ASSERT_TRUE(reply.has_value()) << c.expect;
    EXPECT_FALSE(reply->ok);
    EXPECT_THAT(reply->payload, HasSubstr(c.expect));
    EXPECT_TRUE(raw.ClosedWithin(absl::Seconds(5))) << c.expect;
  }
  // The store is unharmed.
  ASSERT_TRUE((*master)->Set("k", "v").ok());
  EXPECT_EQ(*(*master)->Get("k"), "v");
}

TEST(TcpStoreTest, StoredBytesAreCapped) {
  TcpStoreOptions o = Opts(FreePort(), 0, 1);
  o.max_stored_bytes = 1000 + 2 * 128;  // two keys' overhead (128 bytes each) on top
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("a", std::string(600, 'x')).ok());
  absl::Status full = (*store)->Set("b", std::string(600, 'y'));
  ASSERT_FALSE(full.ok());
  EXPECT_THAT(std::string(full.message()), HasSubstr("store full"));
  EXPECT_THAT(std::string(full.message()), HasSubstr("max_stored_bytes=1256"));
  ASSERT_TRUE((*store)->Set("a", std::string(900, 'z')).ok());  // replacing frees the old value
  EXPECT_EQ(*(*store)->Get("a"), std::string(900, 'z'));
  EXPECT_FALSE((*store)->Set("b", std::string(100, 'y')).ok());
  ASSERT_TRUE((*store)->Set("b", std::string(90, 'y')).ok());
  // Oversized requests never reach the wire.
  EXPECT_FALSE((*store)->Set(std::string(wire::kMaxKey + 1, 'k'), "v").ok());
  EXPECT_TRUE((*store)->Check({"a", "b"}).value());
}

// Many tiny keys cost the server far more than their bytes: each is counted with its overhead,
// and their number is capped, so a token holder cannot grow rank 0 past the byte cap.
TEST(TcpStoreTest, TinyKeysAreCountedWithTheirOverheadAndCapped) {
  TcpStoreOptions o = Opts(FreePort(), 0, 1);
  o.max_stored_bytes = 100000;
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  int stored = 0;
  absl::Status s;
  for (; stored < 100000; ++stored) {  // 7-byte keys, 1-byte values: 8 bytes each
    s = (*store)->Set(absl::StrFormat("k%06d", stored), "v");
    if (!s.ok()) break;
  }
  ASSERT_FALSE(s.ok()) << "100000 keys of 8 bytes fit in max_stored_bytes=100000";
  EXPECT_EQ(stored, 100000 / (8 + 128));
  EXPECT_THAT(std::string(s.message()), HasSubstr("store full"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("128 bytes per key"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_stored_bytes=100000"));
  // The connection is kept and the stored keys are intact.
  EXPECT_EQ(*(*store)->Get("k000000"), "v");

  o = Opts(FreePort(), 0, 1);
  o.max_stored_keys = 10;
  store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*store)->Set(absl::StrCat("key", i), "x").ok());
  s = (*store)->Set("one-more", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("11 keys, over max_stored_keys=10"));
  EXPECT_TRUE((*store)->Set("key3", "replacing an existing key adds none").ok());
  absl::StatusOr<int64_t> add = (*store)->Add("counter", 1);  // Add makes a key too
  ASSERT_FALSE(add.ok());
  EXPECT_THAT(std::string(add.status().message()), HasSubstr("max_stored_keys=10"));
  add = (*store)->Add("key7", 1);  // an existing key: refused for its value, not the cap
  ASSERT_FALSE(add.ok());
  EXPECT_THAT(std::string(add.status().message()), HasSubstr("not a decimal int64"));
}

TEST(TcpStoreTest, WaitAndCheck) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  auto client = TcpStore::Create(Opts(port, 1, 2));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->Check({"a", "b"}).value());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    (void)(*master)->Set("b", "2");
    absl::SleepFor(absl::Milliseconds(50));
    (void)(*master)->Set("a", "1");
  });
  EXPECT_TRUE((*client)->Wait({"a", "b"}).ok());
  setter.join();
  EXPECT_TRUE((*client)->Check({"a", "b"}).value());
  absl::Status late = (*master)->Wait({"a", "never"}, absl::Milliseconds(100));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.message()), HasSubstr("Wait('never')"));
}

TEST(TcpStoreTest, PipelinedRequestsAreAnsweredInOrder) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  RawConnection raw(port);
  ASSERT_TRUE(raw.Send(Hello(1, 2) + wire::Request('G', "x", "") +
                       wire::Request('S', "y", "why") + wire::Request('C', "y", "") +
                       wire::Request('G', "y", "")));
  auto hello = raw.ReadReply(absl::Seconds(5));
  ASSERT_TRUE(hello.has_value() && hello->ok);
  EXPECT_FALSE(raw.ReadReply(absl::Milliseconds(100)).has_value());  // the Get of x waits
  EXPECT_FALSE((*master)->Check({"y"}).value());  // ... and what follows it too
  ASSERT_TRUE((*master)->Set("x", "ex").ok());
  std::vector<std::string> got;
  for (int i = 0; i < 4; ++i) {
    auto r = raw.ReadReply(absl::Seconds(5));
    ASSERT_TRUE(r.has_value() && r->ok) << i;
    got.push_back(r->payload);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"ex", "", "1", "why"}));
}

TEST(TcpStoreTest, AClientThatDoesNotReadIsDroppedAndOthersAreServed) {
  const int port = FreePort();
  // The master's timeout is also how long a reply may make no progress.
  auto master = TcpStore::Create(Opts(port, 0, 3, absl::Milliseconds(1500)));
  ASSERT_TRUE(master.ok()) << master.status();
  absl::Status big = (*master)->Set("big", std::string(512 << 10, 'b'));
  ASSERT_TRUE(big.ok()) << big;
  // Rank 1 asks for the 512 KiB value 64 times (far more than socket buffers hold) and never
  // reads.
  RawConnection greedy(port);
  std::string requests = Hello(1, 3);
  for (int i = 0; i < 64; ++i) requests += wire::Request('G', "big", "");
  ASSERT_TRUE(greedy.Send(requests));
  // Meanwhile another rank is served at once.
  auto other = TcpStore::Create(Opts(port, 2, 3, absl::Seconds(5)));
  ASSERT_TRUE(other.ok()) << other.status();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE((*other)->Add("n", 1).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The greedy client is dropped after the master's timeout (no progress on its replies), which
  // frees rank 1's slot.
  auto rank1 = JoinWithin(Opts(port, 1, 3), absl::Seconds(10));
  EXPECT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_TRUE(greedy.ClosedWithin(absl::Seconds(10)));
}

TEST(TcpStoreTest, StrayAndIdleConnectionsTimeOutAndDoNotDelayShutdown) {
  const int port = FreePort();
  TcpStoreOptions o = Opts(port, 0, 3, absl::Seconds(20));
  o.handshake_timeout = absl::Milliseconds(200);
  o.idle_timeout = absl::Milliseconds(400);
  auto master = TcpStore::Create(o);
  ASSERT_TRUE(master.ok()) << master.status();
  RawConnection silent(port), partial(port);
  ASSERT_TRUE(silent.connected() && partial.connected());
  ASSERT_TRUE(partial.Send(Hello(1, 2).substr(0, 7)));  // half a hello
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(5)));
  EXPECT_TRUE(partial.ClosedWithin(absl::Seconds(5)));

  // An authenticated rank waiting in a Get is not idle; one that is silent past idle_timeout is
  // disconnected (and told so by its next request).
  auto client = TcpStore::Create(Opts(port, 1, 3));
  ASSERT_TRUE(client.ok()) << client.status();
  std::thread setter([&] {  // a fresh rank 2 (any earlier connection would be idle by now)
    absl::SleepFor(absl::Milliseconds(700));
    RawConnection rank2(port);
    (void)rank2.Send(Hello(2, 3) + wire::Request('S', "slow", "done"));
    (void)rank2.ReadReply(absl::Seconds(5));
    (void)rank2.ReadReply(absl::Seconds(5));
  });
  auto slow = (*client)->Get("slow");
  setter.join();
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(*slow, "done");
  absl::SleepFor(absl::Milliseconds(800));
  EXPECT_FALSE((*client)->Get("slow").ok());
  client->reset();

  // A stray connection stays open: rank 0's destructor does not wait 20 s for it.
  RawConnection stray(port);
  ASSERT_TRUE(stray.connected());
  const absl::Time start = absl::Now();
  master->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Idle connections without the token (any local user can make them) never cost a rank its
// place: a newcomer evicts the oldest unauthenticated connection, and a rank whose connection
// was evicted before its hello arrived reconnects within its timeout.
TEST(TcpStoreTest, AFloodOfTokenlessConnectionsDoesNotLockTheRanksOut) {
  const int port = FreePort();
  TcpStoreOptions o = Opts(port, 0, 3);
  o.handshake_timeout = absl::Seconds(60);  // the flood would stay for the whole test
  auto master = TcpStore::Create(o);
  ASSERT_TRUE(master.ok()) << master.status();
  constexpr int kIdle = 3 * wire::kMaxUnauthenticated;
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(std::make_unique<RawConnection>(port));
    ASSERT_TRUE(idle.back()->connected());
  }
  auto rank1 = TcpStore::Create(Opts(port, 1, 3));
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE((*rank1)->Set("k", "v").ok());

  // Now a flood that keeps coming while rank 2 joins (bounded: loopback, 100 open at once).
  std::atomic<bool> stop{false};
  std::atomic<int> made{0};
  std::thread flood([&] {
    std::vector<std::unique_ptr<RawConnection>> ring(100);
    for (int i = 0; !stop.load() && i < 20000; ++i) {
      ring[i % ring.size()] = std::make_unique<RawConnection>(port);
      made.fetch_add(1);
    }
  });
  absl::SleepFor(absl::Milliseconds(50));
  auto rank2 = TcpStore::Create(Opts(port, 2, 3));
  const int during = made.load();
  stop.store(true);
  flood.join();
  ASSERT_TRUE(rank2.ok()) << rank2.status();
  EXPECT_GT(during, wire::kMaxUnauthenticated) << "the flood did not fill the pool";
  EXPECT_EQ(*(*rank2)->Get("k"), "v");
  EXPECT_EQ(*(*master)->Get("k"), "v");
}

// Rank 0's store waits for the other ranks only while they still talk to it: one that hung or
// was stopped (SIGSTOP) does not hold rank 0's exit for `timeout` (300 s in a real job).
TEST(TcpStoreTest, ShutdownWaitsForTalkingRanksButNotForASilentOne) {
  const int port = FreePort();
  TcpStoreOptions o = Opts(port, 0, 2, absl::Seconds(30));
  o.shutdown_grace = absl::Milliseconds(500);
  auto master = TcpStore::Create(o);
  ASSERT_TRUE(master.ok()) << master.status();
  RawConnection silent(port);  // authenticated, then says nothing more
  ASSERT_TRUE(silent.Send(Hello(1, 2)));
  auto r = silent.ReadReply(absl::Seconds(5));
  ASSERT_TRUE(r.has_value() && r->ok);
  absl::Time start = absl::Now();
  master->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "waited for a rank that stopped talking";
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(5)));

  // A rank still making requests (every 100 ms for 1.5 s, longer than the grace) is waited for.
  const int port2 = FreePort();
  o.port = port2;
  master = TcpStore::Create(o);
  ASSERT_TRUE(master.ok()) << master.status();
  auto talker = TcpStore::Create(Opts(port2, 1, 2, absl::Seconds(30)));
  ASSERT_TRUE(talker.ok()) << talker.status();
  std::atomic<int> failures{0};
  std::thread talk([&] {
    for (int i = 0; i < 15; ++i) {
      if (!(*talker)->Set(absl::StrCat("step", i), "x").ok()) failures.fetch_add(1);
      absl::SleepFor(absl::Milliseconds(100));
    }
    talker->reset();
  });
  absl::SleepFor(absl::Milliseconds(100));
  start = absl::Now();
  master->reset();
  const absl::Duration waited = absl::Now() - start;
  talk.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(waited, absl::Milliseconds(1200));
  EXPECT_LT(waited, absl::Seconds(10));
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

TEST(TcpStoreTest, RunningOutOfFileDescriptorsDoesNotSpin) {
  const int port = FreePort();
  auto master = TcpStore::Create(Opts(port, 0, 2));
  ASSERT_TRUE(master.ok()) << master.status();
  // Make the client socket first, then use up every descriptor, then connect: the server's
  // accept() fails with EMFILE while the connection stays pending.
  RawConnection probe(port);  // proves the server answers at all
  ASSERT_TRUE(probe.connected());
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  int highest = client;
  for (int fd = 0; fd < 4096; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1) highest = fd;
  }
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(highest + 8);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  while (true) {
    const int fd = ::dup(client);
    if (fd < 0) break;
    filler.push_back(fd);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int connected = ::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  const double cpu_before = CpuSeconds();
  absl::SleepFor(absl::Seconds(1));
  const double cpu = CpuSeconds() - cpu_before;
  for (int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_EQ(connected, 0);
  EXPECT_FALSE(filler.empty());
  EXPECT_LT(cpu, 0.1) << "the server spins while it cannot accept";
  // Once descriptors are free again the pending connection is served.
  const std::string hello = Hello(1, 2);
  ASSERT_EQ(::send(client, hello.data(), hello.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(hello.size()));
  char head[wire::kReplyHeader];
  pollfd p{client, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  ASSERT_EQ(::recv(client, head, sizeof(head), MSG_WAITALL), static_cast<ssize_t>(sizeof(head)));
  EXPECT_EQ(head[0], 'O');
  ::close(client);
}

TEST(TcpStoreTest, InvalidOptions) {
  EXPECT_FALSE(TcpStore::Create(Opts(1234, 2, 2)).ok());
  EXPECT_FALSE(TcpStore::Create(Opts(0, 0, 2)).ok());
  EXPECT_FALSE(TcpStore::Create(Opts(1234, 0, 0)).ok());
  TcpStoreOptions o = Opts(1234, 0, 1);
  o.max_stored_bytes = -1;
  EXPECT_FALSE(TcpStore::Create(o).ok());
  o = Opts(1234, 0, 1);
  o.handshake_timeout = absl::ZeroDuration();
  EXPECT_FALSE(TcpStore::Create(o).ok());
  o = Opts(1234, 0, 1);
  o.max_stored_keys = -1;
  EXPECT_FALSE(TcpStore::Create(o).ok());
  o = Opts(1234, 0, 1);
  o.shutdown_grace = absl::Seconds(-1);
  EXPECT_FALSE(TcpStore::Create(o).ok());
}

}  // namespace
}  // namespace shardmap::collectives
