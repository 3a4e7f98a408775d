// PickFreePort: asks the kernel for an unused TCP port on loopback (bind to port 0), for the
// launcher and tests. The port is free when returned; another process could take it before use.
//
//   absl::StatusOr<int> port = PickFreePort();
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_FREE_PORT_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"

namespace shardmap::collectives::internal {

inline absl::StatusOr<int> PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::string e = std::strerror(errno);
    ::close(fd);
    return absl::InternalError("cannot pick a free port: " + e);
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_FREE_PORT_H_
