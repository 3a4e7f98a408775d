// Test helpers for TcpStore: a raw loopback connection that speaks (or breaks) the wire format
// by hand, for the store's tests and its fuzz test.
//
//   RawConnection c(port);
//   c.Send(wire::Request('H', token, "1 2"));
//   std::optional<RawReply> r = c.ReadReply(absl::Seconds(1));   // r->ok, r->payload
#ifndef SHARDMAP_COLLECTIVES_TCP_STORE_TEST_UTIL_H_
#define SHARDMAP_COLLECTIVES_TCP_STORE_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/tcp_store_wire.h"

namespace shardmap::collectives::testing {

struct RawReply {
  bool ok = false;
  std::string payload;
};

class RawConnection {
 public:
  // Connects to ip:port (an IPv4 literal); connected() tells whether it worked.
  explicit RawConnection(int port, const char* ip = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // Sends everything or fails (the peer closed, or no room for `timeout`).
  bool Send(absl::string_view bytes, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!bytes.empty()) {
      ssize_t w = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        bytes.remove_prefix(static_cast<size_t>(w));
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
      if (absl::Now() >= deadline) return false;
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 20);
    }
    return true;
  }

  // Reads exactly n bytes; false on EOF, error or timeout.
  bool Read(char* data, size_t n, absl::Time deadline) {
    while (n > 0) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000))) <= 0) continue;
      ssize_t r = ::recv(fd_, data, n, MSG_DONTWAIT);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) return false;
      data += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }

  std::optional<RawReply> ReadReply(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    char head[wire::kReplyHeader];
    if (!Read(head, sizeof(head), deadline)) return std::nullopt;
    uint64_t len;
    std::memcpy(&len, head + 1, 8);
    if (len > wire::kMaxValue + wire::kMaxKey) return std::nullopt;
    RawReply r;
    r.ok = head[0] == 'O';
    r.payload.resize(len);
    if (!Read(r.payload.data(), len, deadline)) return std::nullopt;
    return r;
  }

  // True when the peer closes the connection within `timeout` (what arrives is discarded).
  bool ClosedWithin(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    char buf[65536];
    while (absl::Now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      ssize_t r = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (r == 0) return true;
      if (r < 0 && errno != EINTR && errno != EAGAIN) return true;  // reset
    }
    return false;
  }

 private:
  int fd_ = -1;
};

}  // namespace shardmap::collectives::testing

#endif  // SHARDMAP_COLLECTIVES_TCP_STORE_TEST_UTIL_H_
