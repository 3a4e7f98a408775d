// Rank 0's TcpStore server (private to //collectives:tcp_store): one thread running a poll()
// loop over non-blocking sockets. See tcp_store.h for the security model and tcp_store_wire.h
// for the protocol.
#ifndef SHARDMAP_COLLECTIVES_TCP_STORE_SERVER_H_
#define SHARDMAP_COLLECTIVES_TCP_STORE_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

namespace internal {
// Non-blocking, no Nagle delay, TCP keep-alive (a dead host is noticed).
void TuneStoreSocket(int fd);
// Constant-time token comparison.
bool TokenMatches(absl::string_view presented, absl::string_view expected);
}  // namespace internal

class TcpStore::Server {
 public:
  // Binds the address options.host resolves to (never all interfaces) and starts serving.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const TcpStoreOptions& options);
  // Waits until no authenticated rank is connected, or none sent or received a byte for
  // options.shutdown_grace, at most options.timeout; then stops. Unauthenticated (stray)
  // connections do not delay it, nor does a rank that hung or was stopped.
  ~Server();

 private:
  class Loop;  // the serving thread's state (tcp_store_server.cc)

  Server(const TcpStoreOptions& options, int listen_fd, int wake_r, int wake_w);

  const TcpStoreOptions options_;
  const int listen_fd_, wake_r_, wake_w_;
  std::thread thread_;
  // std::mutex: ThreadSanitizer cannot see Debian's (uninstrumented) absl::Mutex.
  std::mutex mu_;
  std::condition_variable cv_;
  int ranks_connected_ = 0;  // guarded by mu_
  // When an authenticated rank last sent or received a byte (the serving thread writes it).
  std::atomic<int64_t> last_activity_ns_{0};
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_TCP_STORE_SERVER_H_
