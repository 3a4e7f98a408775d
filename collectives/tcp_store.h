// TcpStore: a tiny key/value store for multi-process rendezvous. Rank 0 serves it over TCP;
// every rank (rank 0 included) is a client that sets and gets keyed bytes. Get blocks until the
// key is set (or the timeout passes). Needs no CUDA: NCCL's unique id travels through it.
//
//   absl::StatusOr<DistributedEnv> env = DistributedEnvFromEnvironment();  // distributed_env.h
//   absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(env->store_options());
//   // or by hand: TcpStoreOptions{.host = "127.0.0.1", .port = 29500, .rank = rank,
//   //                             .world_size = n, .token = token}
//   if (rank == 0) (*store)->Set("nccl_id", id_bytes);
//   absl::StatusOr<std::string> id = (*store)->Get("nccl_id");   // same bytes on every rank
//
// Security model (the store is a network service):
// - Rank 0 binds only the address `host` resolves to (MASTER_ADDR): loopback for a one-machine
//   job, that one interface when the job spans hosts. Never all interfaces: the address it
//   resolves to is checked before binding, and a wildcard (0.0.0.0, ::, however spelled) is
//   refused unless options.allow_all_interfaces (SHARDMAP_STORE_ALLOW_ALL_INTERFACES=1).
// - Every client must present the job's token (SHARDMAP_STORE_TOKEN, a random secret the
//   launcher generates) in its first request; anything else is refused and disconnected. The
//   token is compared in constant time but travels in clear text: it keeps out other jobs, other
//   users and stray connections, not an attacker who can sniff the network between the hosts.
// - Frames, values, stored keys and bytes, per-client output buffers and unauthenticated
//   connections are all bounded (a new stray connection evicts the oldest one still to
//   authenticate, never a rank's); a client that breaks the protocol, stalls, or does not read its
//   replies is disconnected without affecting the others. A rank's slot is freed when its
//   connection drops, so a restarted rank can join again.
// - After any error on the connection (timeout, I/O or protocol error) the client closes it and
//   every later call fails: a later request can never read the reply meant for an earlier one.
//   Errors the store answers (a non-integer value under Add, a full store) keep the connection.
//
// Connecting retries until `timeout`, with backoff (rank 0 may start later than the others, and
// a connection the master dropped before its hello arrived, e.g. under a flood of stray
// connections, is made again). The handshake checks the token, that every rank agrees on
// world_size and that no rank joins twice; a refusal (wrong token, ...) is final. Calls
// from several threads are serialized (one request at a time on the rank's connection).
#ifndef SHARDMAP_COLLECTIVES_TCP_STORE_H_
#define SHARDMAP_COLLECTIVES_TCP_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardmap::collectives {

// The environment variable that carries the job's store token to every rank. collectives/launch
// sets it; with torchrun or Slurm, export the same random value to every rank yourself, e.g.
//   export SHARDMAP_STORE_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
inline constexpr char kStoreTokenEnvVar[] = "SHARDMAP_STORE_TOKEN";

// A fresh random token (32 hex digits from the kernel's CSPRNG).
absl::StatusOr<std::string> NewStoreToken();

// OK when `token` is usable: 16 to 256 printable ASCII characters without spaces.
absl::Status CheckStoreToken(absl::string_view token);

// Set to 1 to let rank 0's store bind a wildcard MASTER_ADDR (every interface); see
// TcpStoreOptions::allow_all_interfaces. collectives/launch --allow_all_interfaces sets it.
inline constexpr char kAllowAllInterfacesEnvVar[] = "SHARDMAP_STORE_ALLOW_ALL_INTERFACES";

// Whether `host` resolves to a wildcard address (0.0.0.0 or ::, in any spelling the resolver
// accepts: 0, 00, 0x0, 0.0x0, 000.000.000.000, [::], ::ffff:0.0.0.0): binding it listens on
// every interface. A name that does not resolve is not a wildcard.
bool ResolvesToAllInterfaces(absl::string_view host);

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the master's address (MASTER_ADDR); rank 0 binds it
  int port = 0;                    // MASTER_PORT
  int rank = 0;
  int world_size = 1;
  absl::Duration timeout = absl::Seconds(60);  // for connecting and for each request
  // The job's shared secret (SHARDMAP_STORE_TOKEN). Required when world_size > 1; a one-rank
  // store with an empty token makes up a random one (only rank 0 itself connects).
  std::string token;
  // Rank 0 refuses a `host` that resolves to a wildcard address (the store would listen on
  // every interface: anyone who can reach any of them can try the token) unless this is set.
  bool allow_all_interfaces = false;
  // Server limits (rank 0 only).
  // Keys + values held at once, each key counted with 128 bytes of overhead (the server's
  // bookkeeping), and the number of keys.
  int64_t max_stored_bytes = int64_t{256} << 20;
  int64_t max_stored_keys = int64_t{1} << 20;
  // A connection must present the token within this time after connecting.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // An authenticated rank silent this long with no request pending is disconnected (dead hosts
  // are also found by TCP keep-alive). Infinite by default: ranks may keep the store for a run.
  absl::Duration idle_timeout = absl::InfiniteDuration();
  // Rank 0's destructor waits for the other ranks to disconnect, but only while they still
  // talk to the store: after this long without a byte from or to any rank (one hung or
  // stopped) it stops serving. Bounded by `timeout` too.
  absl::Duration shutdown_grace = absl::Seconds(3);
};

// What a rendezvous that timed out tells its user: "rank 1 of 4 did not join within 30s; start
// every rank (collectives/launch --nproc_per_node=4 does), each with the same MASTER_ADDR,
// MASTER_PORT and SHARDMAP_STORE_TOKEN, or raise the timeout (--collective_timeout)".
// `missing`: the ranks absent (sorted); `timeout_hint`: how to raise the timeout ("": none).
std::string RanksDidNotJoin(const std::vector<int>& missing, int world_size,
                            absl::Duration timeout, absl::string_view timeout_hint);

class TcpStore {
 public:
  static absl::StatusOr<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  // Rank 0 waits for the other ranks to disconnect before it stops serving, while they still
  // talk to the store (see shutdown_grace), at most `timeout`.
  ~TcpStore();

  absl::Status Set(absl::string_view key, absl::string_view value);
  // Waits until some rank has set `key` (at most `timeout`, default options().timeout).
  absl::StatusOr<std::string> Get(absl::string_view key);
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout);
  // Atomically adds `delta` to the decimal integer stored under `key` (0 when unset) and returns
  // the new value. Errors (connection kept): the value is not an integer, or int64 overflow.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // Waits until every key exists (all within `timeout`, default options().timeout).
  absl::Status Wait(const std::vector<std::string>& keys);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  // Whether every key exists now (does not wait).
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  // Every rank calls it with the same name; returns when all world_size ranks did.
  absl::Status Barrier(absl::string_view name);
  // The keys still unset after `timeout` (empty: all were set in time). Checks every key every
  // 20 ms rather than blocking on one, so that a timeout names every missing key (a rendezvous
  // then says which ranks did not join, RanksDidNotJoin).
  absl::StatusOr<std::vector<std::string>> MissingAfter(const std::vector<std::string>& keys,
                                                        absl::Duration timeout);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const TcpStoreOptions& options() const { return options_; }

  class Server;  // rank 0's serving thread (tcp_store_server.cc)

 private:
  TcpStore(TcpStoreOptions options, int fd, std::unique_ptr<Server> server);
  absl::StatusOr<std::string> Request(char type, absl::string_view key, absl::string_view value,
                                      absl::string_view what, absl::Duration timeout);

  TcpStoreOptions options_;
  std::mutex mu_;          // one request at a time on the connection
  int fd_;                 // -1 once the connection was dropped after an error
  absl::Status broken_;    // why fd_ was dropped
  std::unique_ptr<Server> server_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_TCP_STORE_H_
