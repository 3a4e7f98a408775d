// Fuzzes a live TcpStore on 127.0.0.1 with random bytes and mutated valid frames (a bounded
// number of connections, within a time budget), some with the right token so the fuzzing gets
// past the handshake. Afterwards the store must still serve well-behaved ranks correctly.
// The seed is printed; set SHARDMAP_FUZZ_SEED to replay one.
#include <sys/socket.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"
#include "collectives/tcp_store_test_util.h"
#include "collectives/tcp_store_wire.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using testing::RawConnection;

constexpr char kToken[] = "fuzz-token-0123456789abcdef";
constexpr int kWorld = 4;
constexpr int kConnections = 400;
constexpr absl::Duration kBudget = absl::Seconds(8);
constexpr size_t kOpenAtOnce = 8;

class Fuzzer {
 public:
  explicit Fuzzer(uint64_t seed) : gen_(seed) {}

  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }

  std::string RandomBytes(size_t max) {
    std::string s(static_cast<size_t>(Int(0, static_cast<int>(max))), '\0');
    for (char& c : s) c = static_cast<char>(Int(0, 255));
    return s;
  }

  std::string Key() {
    static const char* kKeys[] = {"a", "b", "counter", "nccl/unique_id/0", "__barrier/x", ""};
    return Int(0, 4) == 0 ? RandomBytes(12) : kKeys[Int(0, 5)];
  }

  // A well-formed request of a random type.
  std::string ValidFrame() {
    switch (Int(0, 6)) {
      case 0:
        return wire::Request('H', Int(0, 3) == 0 ? "wrong-token-000000000000" : kToken,
                             absl::StrCat(Int(-1, kWorld), " ", Int(0, 3) == 0 ? 7 : kWorld));
      case 1:
        return wire::Request('S', Key(), RandomBytes(64));
      case 2:
        return wire::Request('A', Key(), Int(0, 3) == 0 ? RandomBytes(8)
                                                        : absl::StrCat(Int(-1000, 1000)));
      case 3:
        return wire::Request('C', Key(), "");
      case 4:
        return wire::Request('G', Key(), "");
      case 5:
        return wire::Request('W', Key(), "");
      default:
        return wire::Request('S', Key(), absl::StrCat(INT64_MAX - Int(0, 2)));
    }
  }

  // Flips, truncates, inserts, or overwrites a length field with an extreme value.
  std::string Mutate(std::string f) {
    const int edits = Int(1, 4);
    for (int e = 0; e < edits && !f.empty(); ++e) {
      const size_t at = static_cast<size_t>(Int(0, static_cast<int>(f.size()) - 1));
      switch (Int(0, 4)) {
        case 0:
          f[at] = static_cast<char>(f[at] ^ (1 << Int(0, 7)));
          break;
        case 1:
          f.resize(at);
          break;
        case 2:
          f.insert(at, RandomBytes(16));
          break;
        case 3: {  // key length
          static const uint32_t kLens[] = {0, 1, wire::kMaxKey, wire::kMaxKey + 1, 0xffffffffu};
          const uint32_t kl = kLens[Int(0, 4)];
          if (f.size() >= 5) std::memcpy(f.data() + 1, &kl, 4);
          break;
        }
        default: {  // value length, where a frame with an empty key has it
          static const uint64_t kLens[] = {0, 7, wire::kMaxValue, wire::kMaxValue + 1,
                                           ~uint64_t{0}, uint64_t{1} << 63};
          const uint64_t vl = kLens[Int(0, 5)];
          if (f.size() >= 13) std::memcpy(f.data() + 5, &vl, 8);
          break;
        }
      }
    }
    return f;
  }

  // What one connection sends.
  std::string Session() {
    std::string out;
    const int mode = Int(0, 3);
    if (mode == 0) return RandomBytes(256);
    if (mode >= 2) out = wire::Request('H', kToken, absl::StrCat(Int(1, kWorld - 1), " ", kWorld));
    const int frames = Int(1, 6);
    for (int i = 0; i < frames; ++i) {
      std::string f = ValidFrame();
      if (mode != 3 || Int(0, 1) == 0) f = Mutate(f);
      out += f;
    }
    return out;
  }

 private:
  std::mt19937_64 gen_;
};

uint64_t Seed() {
  uint64_t seed = 0;
  if (const char* s = std::getenv("SHARDMAP_FUZZ_SEED"); s && absl::SimpleAtoi(s, &seed)) {
    return seed;
  }
  return std::random_device{}();
}

TEST(TcpStoreFuzzTest, RandomAndMutatedFramesLeaveTheStoreHealthy) {
  const uint64_t seed = Seed();
  SCOPED_TRACE(absl::StrCat("SHARDMAP_FUZZ_SEED=", seed));
  auto port = internal::PickFreePort();
  ASSERT_TRUE(port.ok());
  TcpStoreOptions o;
  o.port = *port;
  o.world_size = kWorld;
  o.token = kToken;
  o.timeout = absl::Seconds(2);
  o.handshake_timeout = absl::Milliseconds(500);
  o.max_stored_bytes = 1 << 20;
  auto master = TcpStore::Create(o);
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE((*master)->Set("before", "fuzzing").ok());

  Fuzzer fuzz(seed);
  std::deque<std::unique_ptr<RawConnection>> open;
  const absl::Time deadline = absl::Now() + kBudget;
  int sent = 0, replies = 0;
  for (; sent < kConnections && absl::Now() < deadline; ++sent) {
    auto c = std::make_unique<RawConnection>(*port);
    ASSERT_TRUE(c->connected()) << "the store stopped accepting after " << sent;
    (void)c->Send(fuzz.Session(), absl::Milliseconds(50));
    if (fuzz.Int(0, 2) == 0) {
      while (c->ReadReply(absl::Milliseconds(5)).has_value()) ++replies;
    }
    if (fuzz.Int(0, 3) == 0) {  // an abrupt close: RST instead of FIN
      linger l{1, 0};
      ::setsockopt(c->fd(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    open.push_back(std::move(c));
    if (open.size() > kOpenAtOnce) open.pop_front();
  }
  open.clear();
  EXPECT_GE(sent, 50) << "too few sessions within the budget to mean anything";

  // The master's own connection still works, and a good rank joins (its slot may have been
  // taken by a fuzzing connection that is being dropped) and sees consistent data.
  auto before = (*master)->Get("before");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, "fuzzing");
  TcpStoreOptions r1 = o;
  r1.rank = 1;
  r1.timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<TcpStore>> good = absl::UnknownError("not tried");
  for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
    good = TcpStore::Create(r1);
    if (good.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("good/key", "good value").ok());
  auto v = (*master)->Get("good/key");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "good value");
  auto a = (*good)->Add("good/counter", 41);
  auto b = (*master)->Add("good/counter", 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*b, 42);
  // And still refuses strangers.
  RawConnection stranger(*port);
  ASSERT_TRUE(stranger.Send(wire::Request('G', "good/key", "")));
  auto refused = stranger.ReadReply(absl::Seconds(5));
  ASSERT_TRUE(refused.has_value());
  EXPECT_FALSE(refused->ok);
  std::printf("fuzzed %d connections (%d replies read), seed %llu\n", sent, replies,
              static_cast<unsigned long long>(seed));
}

}  // namespace
}  // namespace shardmap::collectives
