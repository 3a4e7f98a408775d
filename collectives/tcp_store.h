// TcpStore: a tiny key/value store for multi-process rendezvous. Rank 0 serves it over TCP;
// every rank (rank 0 included) is a client that sets and gets keyed bytes. Get blocks until the
// key is set (or the timeout passes). Needs no CUDA: NCCL's unique id travels through it.
//
//   TcpStoreOptions o{.host = "127.0.0.1", .port = 29500, .rank = rank, .world_size = n};
//   absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(o);
//   if (rank == 0) (*store)->Set("nccl_id", id_bytes);
//   absl::StatusOr<std::string> id = (*store)->Get("nccl_id");   // same bytes on every rank
//
// Connecting retries until `timeout` (rank 0 may start later than the others). The handshake
// checks that every rank agrees on world_size and that no rank joins twice.
#ifndef SHARDMAP_COLLECTIVES_TCP_STORE_H_
#define SHARDMAP_COLLECTIVES_TCP_STORE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardmap::collectives {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the master's address (MASTER_ADDR)
  int port = 0;                    // MASTER_PORT; rank 0 binds it
  int rank = 0;
  int world_size = 1;
  absl::Duration timeout = absl::Seconds(60);  // for connecting and for each Get
};

class TcpStore {
 public:
  static absl::StatusOr<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore();

  absl::Status Set(absl::string_view key, absl::string_view value);
  // Waits until some rank has set `key`.
  absl::StatusOr<std::string> Get(absl::string_view key);
  // Every rank calls it with the same name; returns when all world_size ranks did.
  absl::Status Barrier(absl::string_view name);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }

  class Server;  // rank 0's serving thread (tcp_store.cc)

 private:
  TcpStore(TcpStoreOptions options, int fd, std::unique_ptr<Server> server);
  absl::StatusOr<std::string> Request(char type, absl::string_view key, absl::string_view value,
                                      absl::string_view what);

  TcpStoreOptions options_;
  int fd_;
  std::unique_ptr<Server> server_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_TCP_STORE_H_
