// Wire format (all integers little-endian host order: both ends run the same binary family):
//   request: type u8 | key_len u32 | key | value_len u64 | value
//   reply:   'O' or 'E' u8 | len u64 | payload (value, counter, or error message)
// Types: 'H' hello (value "rank world_size"), 'S' set, 'G' get (answered once the key exists),
// 'A' add (value: decimal delta; reply: the new decimal total).
#include "collectives/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "collectives/internal/status_macros.h"

namespace shardmap::collectives {
namespace {

std::string Errno() { return std::strerror(errno); }

absl::Status WriteAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t w = ::send(fd, data, len, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("write failed: ", Errno()));
    }
    data += w;
    len -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Reads exactly len bytes or fails at the deadline / on EOF.
absl::Status ReadAll(int fd, char* data, size_t len, absl::Time deadline) {
  while (len > 0) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("timed out");
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::UnavailableError(absl::StrCat("poll failed: ", Errno()));
    if (r == 0) continue;
    ssize_t n = ::recv(fd, data, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("read failed: ", Errno()));
    if (n == 0) return absl::UnavailableError("the master closed the connection");
    data += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string Frame(char type, absl::string_view key, absl::string_view value) {
  std::string f(1, type);
  const uint32_t kl = key.size();
  const uint64_t vl = value.size();
  f.append(reinterpret_cast<const char*>(&kl), 4);
  f.append(key.data(), key.size());
  f.append(reinterpret_cast<const char*>(&vl), 8);
  f.append(value.data(), value.size());
  return f;
}

std::string Reply(bool ok, absl::string_view payload) {
  std::string f(1, ok ? 'O' : 'E');
  const uint64_t l = payload.size();
  f.append(reinterpret_cast<const char*>(&l), 8);
  f.append(payload.data(), payload.size());
  return f;
}

void CloseFd(int fd) {
  if (fd >= 0) ::close(fd);
}

// Keys, values and frames are bounded so a stray connection cannot make us allocate wildly.
constexpr uint32_t kMaxKey = 4096;
constexpr uint64_t kMaxValue = uint64_t{1} << 30;

}  // namespace

// Single-threaded poll() loop serving every client; stopped through a self-pipe.
class TcpStore::Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const TcpStoreOptions& o) {
    int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    bool v6 = fd >= 0;
    if (!v6) fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", Errno()));
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      int zero = 0;  // dual stack: accept IPv4 clients too
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(o.port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(o.port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    if (rc != 0 || ::listen(fd, 1024) != 0) {
      std::string e = Errno();
      CloseFd(fd);
      return absl::UnavailableError(absl::StrCat(
          "rank 0 could not listen on port ", o.port, ": ", e,
          " (is another job using MASTER_PORT? pick a free port)"));
    }
    int pipefd[2];
    if (::pipe(pipefd) != 0) {
      CloseFd(fd);
      return absl::InternalError(absl::StrCat("pipe: ", Errno()));
    }
    return std::unique_ptr<Server>(new Server(o, fd, pipefd[0], pipefd[1]));
  }

  ~Server() {
    // Give connected ranks a chance to finish their last requests before the store goes away.
    const absl::Time deadline = absl::Now() + options_.timeout;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_until(l, absl::ToChronoTime(deadline), [this] { return open_clients_ <= 1; });
    }
    char c = 'x';
    (void)!::write(wake_w_, &c, 1);
    thread_.join();
    CloseFd(listen_fd_);
    CloseFd(wake_r_);
    CloseFd(wake_w_);
  }

 private:
  struct Client {
    std::string in;
    int rank = -1;
  };

  Server(TcpStoreOptions o, int listen_fd, int wake_r, int wake_w)
      : options_(std::move(o)), listen_fd_(listen_fd), wake_r_(wake_r), wake_w_(wake_w) {
    thread_ = std::thread([this] { Loop(); });
  }

  void Loop() {
    std::map<int, Client> clients;
    std::map<std::string, std::string> data;
    std::map<std::string, std::vector<int>> waiting;  // key -> fds with a pending Get
    std::set<int> ranks_joined;
    auto drop = [&](int fd) {
      for (auto& [k, fds] : waiting) fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
      ::close(fd);
      clients.erase(fd);
      std::lock_guard<std::mutex> l(mu_);
      open_clients_ = static_cast<int>(clients.size());
      cv_.notify_all();
    };
    while (true) {
      std::vector<pollfd> fds = {{wake_r_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (auto& [fd, c] : clients) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents) break;
      if (fds[1].revents & POLLIN) {
        int c = ::accept(listen_fd_, nullptr, nullptr);
        if (c >= 0) {
          int one = 1;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          clients[c];
          std::lock_guard<std::mutex> l(mu_);
          open_clients_ = static_cast<int>(clients.size());
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        const int fd = fds[i].fd;
        char buf[65536];
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          drop(fd);
          continue;
        }
        Client& cl = clients[fd];
        cl.in.append(buf, static_cast<size_t>(n));
        bool close_it = false;
        // Handle every complete frame.
        while (!close_it) {
          if (cl.in.size() < 5) break;
          uint32_t kl;
          std::memcpy(&kl, cl.in.data() + 1, 4);
          if (kl > kMaxKey) { close_it = true; break; }
          if (cl.in.size() < 5 + kl + 8) break;
          uint64_t vl;
          std::memcpy(&vl, cl.in.data() + 5 + kl, 8);
          if (vl > kMaxValue) { close_it = true; break; }
          if (cl.in.size() < 13 + kl + vl) break;
          const char type = cl.in[0];
          std::string key = cl.in.substr(5, kl);
          std::string value = cl.in.substr(13 + kl, vl);
          cl.in.erase(0, 13 + kl + vl);
          std::string reply;
          switch (type) {
            case 'H': {
              std::vector<std::string> parts = absl::StrSplit(value, ' ');
              int r = -1, w = -1;
              if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r) ||
                  !absl::SimpleAtoi(parts[1], &w)) {
                reply = Reply(false, "malformed hello");
                close_it = true;
              } else if (w != options_.world_size) {
                reply = Reply(false, absl::StrCat(
                    "world-size mismatch: rank ", r, " has WORLD_SIZE=", w,
                    " but the master (rank 0) has WORLD_SIZE=", options_.world_size,
                    "; every process must be started with the same world size"));
                close_it = true;
              } else if (r < 0 || r >= w) {
                reply = Reply(false, absl::StrCat("rank ", r, " is outside [0, ", w, ")"));
                close_it = true;
              } else if (!ranks_joined.insert(r).second) {
                reply = Reply(false, absl::StrCat(
                    "rank ", r, " joined twice: two processes were given RANK=", r));
                close_it = true;
              } else {
                cl.rank = r;
                reply = Reply(true, "");
              }
              break;
            }
            case 'S': {
              data[key] = value;
              auto it = waiting.find(key);
              if (it != waiting.end()) {
                const std::string r = Reply(true, value);
                for (int wfd : it->second) (void)WriteAll(wfd, r.data(), r.size());
                waiting.erase(it);
              }
              reply = Reply(true, "");
              break;
            }
            case 'G': {
              auto it = data.find(key);
              if (it != data.end()) {
                reply = Reply(true, it->second);
              } else {
                waiting[key].push_back(fd);
              }
              break;
            }
            case 'A': {
              int64_t delta = 0, cur = 0;
              if (!absl::SimpleAtoi(value, &delta)) {
                reply = Reply(false, "malformed add");
                break;
              }
              auto it = data.find(key);
              if (it != data.end()) (void)absl::SimpleAtoi(it->second, &cur);
              data[key] = absl::StrCat(cur + delta);
              reply = Reply(true, data[key]);
              auto wt = waiting.find(key);
              if (wt != waiting.end()) {
                const std::string r = Reply(true, data[key]);
                for (int wfd : wt->second) (void)WriteAll(wfd, r.data(), r.size());
                waiting.erase(wt);
              }
              break;
            }
            default:
              reply = Reply(false, "unknown request");
              close_it = true;
          }
          if (!reply.empty()) (void)WriteAll(fd, reply.data(), reply.size());
        }
        if (close_it) drop(fd);
      }
    }
    for (auto& [fd, c] : clients) ::close(fd);
  }

  const TcpStoreOptions options_;
  const int listen_fd_, wake_r_, wake_w_;
  std::thread thread_;
  // std::mutex: ThreadSanitizer cannot see Debian's (uninstrumented) absl::Mutex.
  std::mutex mu_;
  std::condition_variable cv_;
  int open_clients_ = 0;  // guarded by mu_
};

namespace {

// Connects to host:port, retrying until the deadline (the master may not be up yet).
absl::StatusOr<int> ConnectWithRetry(const TcpStoreOptions& o) {
  const absl::Time deadline = absl::Now() + o.timeout;
  std::string last_error = "no attempt made";
  const std::string port = absl::StrCat(o.port);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      last_error = absl::StrCat("cannot resolve '", o.host, "': ", gai_strerror(gai));
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        last_error = Errno();
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat(
      "rank ", o.rank, " could not reach the master at ", o.host, ":", o.port, " within ",
      absl::FormatDuration(o.timeout), " (last error: ", last_error,
      "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same for every rank?"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& o) {
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: world_size must be >= 1, got ", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: rank ", o.rank,
                                                   " is outside [0, ", o.world_size, ")"));
  }
  if (o.port <= 0 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: port must be in [1, 65535], got ", o.port));
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("TcpStore: timeout must be positive");
  }
  std::unique_ptr<Server> server;
  if (o.rank == 0) {
    SM_COLL_ASSIGN_OR_RETURN(server, Server::Start(o));
  }
  SM_COLL_ASSIGN_OR_RETURN(int fd, ConnectWithRetry(o));
  std::unique_ptr<TcpStore> store(new TcpStore(o, fd, std::move(server)));
  absl::StatusOr<std::string> hello =
      store->Request('H', "", absl::StrCat(o.rank, " ", o.world_size), "handshake");
  if (!hello.ok()) return hello.status();
  return store;
}

TcpStore::TcpStore(TcpStoreOptions options, int fd, std::unique_ptr<Server> server)
    : options_(std::move(options)), fd_(fd), server_(std::move(server)) {}

TcpStore::~TcpStore() {
  CloseFd(fd_);
  server_.reset();  // rank 0: waits (bounded) for the other ranks to disconnect
}

absl::StatusOr<std::string> TcpStore::Request(char type, absl::string_view key,
                                              absl::string_view value, absl::string_view what) {
  auto annotate = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("TcpStore ", std::string(what), " (rank ",
                                               options_.rank, ", master ", options_.host, ":",
                                               options_.port, "): ", s.message()));
  };
  if (key.size() > kMaxKey || value.size() > kMaxValue) {
    return annotate(absl::InvalidArgumentError("key or value too large"));
  }
  const std::string f = Frame(type, key, value);
  if (absl::Status s = WriteAll(fd_, f.data(), f.size()); !s.ok()) return annotate(s);
  const absl::Time deadline = absl::Now() + options_.timeout;
  char head[9];
  if (absl::Status s = ReadAll(fd_, head, 9, deadline); !s.ok()) {
    if (absl::IsDeadlineExceeded(s)) {
      return annotate(absl::DeadlineExceededError(absl::StrCat(
          "no answer within ", absl::FormatDuration(options_.timeout),
          " (a Get waits until some rank sets the key)")));
    }
    return annotate(s);
  }
  uint64_t len;
  std::memcpy(&len, head + 1, 8);
  if (len > kMaxValue) return annotate(absl::DataLossError("corrupt reply"));
  std::string payload(len, '\0');
  if (absl::Status s = ReadAll(fd_, payload.data(), len, deadline); !s.ok()) return annotate(s);
  if (head[0] != 'O') return annotate(absl::FailedPreconditionError(payload));
  return payload;
}

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  return Request('S', key, value, absl::StrCat("Set('", std::string(key), "')")).status();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key) {
  return Request('G', key, "", absl::StrCat("Get('", std::string(key), "')"));
}

absl::Status TcpStore::Barrier(absl::string_view name) {
  const std::string key = absl::StrCat("__barrier/", std::string(name));
  SM_COLL_ASSIGN_OR_RETURN(std::string count, Request('A', key, "1", "Barrier"));
  int64_t c = 0;
  if (!absl::SimpleAtoi(count, &c)) return absl::DataLossError("TcpStore Barrier: bad counter");
  if (c == options_.world_size) return Set(absl::StrCat(key, "/done"), "");
  if (c > options_.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TcpStore Barrier('", std::string(name), "') entered more than world_size=",
        options_.world_size, " times: barrier names must be unique per use"));
  }
  return Get(absl::StrCat(key, "/done")).status();
}

}  // namespace shardmap::collectives
