// Rank 0's TcpStore server. Every socket is non-blocking and every buffer bounded, so that no
// client (stray, slow, hostile or buggy) can stall the loop or grow its memory without limit:
// - a connection handles one request at a time: the next is parsed only once the previous reply
//   left the buffer, so a client that pipelines requests without reading holds one reply;
// - its input buffer holds at most one maximal frame, and 1 KiB before the hello (which alone
//   may come first, with a short token and value);
// - a reply that makes no progress for options.timeout drops the client (it is not reading);
// - a connection must send a valid hello (with the token) within handshake_timeout, and at most
//   wire::kMaxUnauthenticated of them wait at once: a newcomer evicts the oldest (which keeps
//   its place if its hello has arrived), so strays can never lock the ranks out;
// - stored keys are capped in number (max_stored_keys) and in bytes counted with a per-key
//   overhead (max_stored_bytes), so many tiny keys cannot exceed the byte cap in memory;
// - when accept() runs out of file descriptors the listening socket rests 100 ms (no busy loop).
#include "collectives/tcp_store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "collectives/tcp_store_wire.h"

namespace shardmap::collectives {
namespace {

std::string Errno() { return std::strerror(errno); }

// INADDR_ANY, in6addr_any, or ::ffff:0.0.0.0: an address that binds every interface.
bool IsWildcard(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_UNSPECIFIED(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr32[3] == 0);
  }
  return false;
}

// Keys may hold any bytes: show them escaped and short in messages.
std::string Shown(absl::string_view key) {
  std::string s = absl::CHexEscape(key.substr(0, 64));
  if (key.size() > 64) s += "...";
  return s;
}

constexpr size_t kMaxFrame = wire::kRequestHeader + wire::kMaxKey + wire::kMaxValue;
// Before the hello only a hello may come: a token (<= 256 bytes) and "rank world_size".
constexpr uint32_t kMaxHelloKey = 256;
constexpr uint64_t kMaxHelloValue = 64;
constexpr size_t kMaxUnauthenticatedInput = 1024;
constexpr absl::Duration kAcceptRest = absl::Milliseconds(100);
// A stored key's cost beyond its bytes: the std::map node (~48 bytes) and two std::string
// headers (32 each), rounded up for the allocator.
constexpr int64_t kStoreBytesPerKey = 128;

struct Conn {
  int fd = -1;
  int rank = -1;  // -1 until a valid hello
  std::string in;
  std::string out;
  size_t out_sent = 0;
  bool closing = false;  // close once `out` is sent (after an error reply)
  bool dead = false;
  char waiting = 0;  // 'G' or 'W' while a request waits for waiting_key
  std::string waiting_key;
  absl::Time opened, last_active, last_progress;
  bool has_output() const { return out_sent < out.size(); }
};

}  // namespace

bool ResolvesToAllInterfaces(absl::string_view host) {
  std::string h(host);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (h.empty() || ::getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0) return false;
  bool wildcard = false;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) wildcard |= IsWildcard(a->ai_addr);
  ::freeaddrinfo(res);
  return wildcard;
}

class TcpStore::Server::Loop {
 public:
  explicit Loop(Server& s) : s_(s), o_(s.options_) {}

  void Run() {
    while (true) {
      const absl::Time now = absl::Now();
      ExpireTimeouts(now);
      std::vector<pollfd> fds = {{s_.wake_r_, POLLIN, 0}};
      const bool accepting = now >= accept_rest_until_;
      if (accepting) fds.push_back({s_.listen_fd_, POLLIN, 0});
      const size_t first_conn = fds.size();
      for (auto& [fd, c] : conns_) {
        short ev = POLLRDHUP;
        if (!c.closing && c.in.size() < InputLimit(c)) ev |= POLLIN;
        if (c.has_output()) ev |= POLLOUT;
        fds.push_back({fd, ev, 0});
      }
      if (::poll(fds.data(), fds.size(), PollTimeoutMs(now)) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents != 0) break;
      for (size_t i = first_conn; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = conns_.find(fds[i].fd);
        if (it == conns_.end()) continue;
        Conn& c = it->second;
        if (fds[i].revents & POLLIN) Read(c);
        if (fds[i].revents & (POLLERR | POLLHUP | POLLRDHUP)) c.dead = true;
        if (!c.dead && (fds[i].revents & POLLOUT)) Flush(c);
        ready_.push_back(c.fd);
      }
      while (!ready_.empty()) {
        const int fd = ready_.back();
        ready_.pop_back();
        auto it = conns_.find(fd);
        if (it != conns_.end()) Process(it->second);
      }
      Reap();
      // Last: accepting may evict and close a connection, and a new one may reuse its fd, so
      // no event polled for the old one may be handled after it.
      if (accepting && fds[1].revents != 0) Accept();
    }
    for (auto& [fd, c] : conns_) c.dead = true;
    Reap();
  }

 private:
  void ExpireTimeouts(absl::Time now) {
    for (auto& [fd, c] : conns_) {
      if (c.rank < 0 && now - c.opened > o_.handshake_timeout) c.dead = true;
      if (c.has_output() && now - c.last_progress > o_.timeout) c.dead = true;  // not reading
      if (c.rank >= 0 && !c.has_output() && c.waiting == 0 &&
          now - c.last_active > o_.idle_timeout) {
        c.dead = true;
      }
    }
    Reap();
  }

  int PollTimeoutMs(absl::Time now) const {
    absl::Time next = now + absl::Seconds(1);
    if (now < accept_rest_until_) next = std::min(next, accept_rest_until_);
    for (const auto& [fd, c] : conns_) {
      if (c.rank < 0) next = std::min(next, c.opened + o_.handshake_timeout);
      if (c.has_output()) next = std::min(next, c.last_progress + o_.timeout);
      if (c.rank >= 0 && c.waiting == 0) next = std::min(next, c.last_active + o_.idle_timeout);
    }
    // +1 ms: wake just after a deadline, not just before it.
    return static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(next - now) + 1, 0, 1000));
  }

  void Accept() {
    while (true) {
      const int fd = ::accept4(s_.listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The pending connection stays readable: polling it now would spin.
          accept_rest_until_ = absl::Now() + kAcceptRest;
        }
        return;  // EAGAIN: nothing more to accept
      }
      // The pool of connections still to authenticate is full: make room by evicting the
      // oldest (after a last look at what it sent, so a rank whose hello has arrived keeps its
      // place), never by refusing the newcomer: stray or hostile connections cannot lock the
      // ranks out, they only shorten each other's time to send a hello. A rank evicted before
      // its hello arrived reconnects (TcpStore::Create retries with backoff).
      while (unauthenticated_ >= wire::kMaxUnauthenticated) EvictOldestUnauthenticated();
      internal::TuneStoreSocket(fd);
      Conn& c = conns_[fd];
      c.fd = fd;
      c.opened = c.last_active = c.last_progress = absl::Now();
      ++unauthenticated_;
    }
  }

  void EvictOldestUnauthenticated() {
    while (true) {
      Conn* oldest = nullptr;
      for (auto& [fd, c] : conns_) {
        if (c.rank < 0 && !c.dead && (oldest == nullptr || c.opened < oldest->opened)) {
          oldest = &c;
        }
      }
      if (oldest == nullptr) {  // every one is dead already: reaping frees the room
        Reap();
        return;
      }
      Read(*oldest);
      Process(*oldest);
      if (oldest->rank >= 0) continue;  // it authenticated: no longer in the pool
      oldest->dead = true;
      ++evicted_;
      Reap();
      return;
    }
  }

  // Memory a connection can make the server hold: 1 KiB before the hello, then one frame.
  static size_t InputLimit(const Conn& c) {
    return c.rank < 0 ? kMaxUnauthenticatedInput : kMaxFrame;
  }

  void Read(Conn& c) {
    char buf[65536];
    while (!c.dead && c.in.size() < InputLimit(c)) {
      const size_t want = std::min(sizeof(buf), InputLimit(c) - c.in.size());
      const ssize_t n = ::recv(c.fd, buf, want, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        c.last_active = absl::Now();
        if (c.rank >= 0) NoteActivity(c.last_active);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.dead = true;  // EOF or error
    }
  }

  void Flush(Conn& c) {
    while (c.has_output()) {
      const ssize_t w =
          ::send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (w > 0) {
        c.out_sent += static_cast<size_t>(w);
        c.last_progress = absl::Now();
        if (c.rank >= 0) NoteActivity(c.last_progress);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.dead = true;
      return;
    }
    c.out.clear();
    c.out_sent = 0;
    if (c.closing) c.dead = true;
  }

  void Send(Conn& c, bool ok, absl::string_view payload) {
    if (!c.has_output()) c.last_progress = absl::Now();
    c.out += wire::Reply(ok, payload);
    c.last_active = absl::Now();
    Flush(c);
  }

  // Refuses the request and closes the connection once the refusal is sent.
  void Refuse(Conn& c, absl::string_view why) {
    c.closing = true;
    c.in.clear();
    Send(c, false, why);
  }

  // Handles the complete requests of `c`, one at a time (see the file comment).
  void Process(Conn& c) {
    while (!c.dead && !c.closing && !c.has_output() && c.waiting == 0) {
      if (c.in.empty()) return;
      const char type = c.in[0];
      if (!wire::IsRequestType(type)) return Refuse(c, "malformed request (unknown type)");
      const bool hello_only = c.rank < 0;
      if (hello_only && type != 'H') {
        return Refuse(c, "the first request must be the hello with the job's store token");
      }
      if (c.in.size() < 5) return;
      uint32_t kl;
      std::memcpy(&kl, c.in.data() + 1, 4);
      if (kl > (hello_only ? kMaxHelloKey : wire::kMaxKey)) {
        return Refuse(c, "malformed request (key too long)");
      }
      if (c.in.size() < wire::kRequestHeader + kl) return;
      uint64_t vl;
      std::memcpy(&vl, c.in.data() + 5 + kl, 8);
      if (vl > (hello_only ? kMaxHelloValue : wire::kMaxValue)) {
        return Refuse(c, "malformed request (value too long)");
      }
      const size_t size = wire::kRequestHeader + kl + static_cast<size_t>(vl);
      if (c.in.size() < size) return;
      const std::string key = c.in.substr(5, kl);
      const std::string value = c.in.substr(wire::kRequestHeader + kl, vl);
      c.in.erase(0, size);
      Handle(c, type, key, value);
    }
  }

  void Handle(Conn& c, char type, const std::string& key, const std::string& value) {
    if (type == 'H') return Hello(c, key, value);
    switch (type) {
      case 'S':
        if (Store(c, key, value)) Send(c, true, "");
        return;
      case 'G':
      case 'W': {
        auto it = data_.find(key);
        if (it == data_.end()) {
          c.waiting = type;
          c.waiting_key = key;
          return;
        }
        return Send(c, true, type == 'G' ? absl::string_view(it->second) : "");
      }
      case 'C':
        return Send(c, true, data_.count(key) != 0 ? "1" : "0");
      case 'A':
        return Add(c, key, value);
    }
  }

  void Hello(Conn& c, const std::string& token, const std::string& value) {
    if (c.rank >= 0) return Refuse(c, "a second hello on one connection");
    if (!internal::TokenMatches(token, o_.token)) {
      return Refuse(c, absl::StrCat(
          "wrong store token: this store at port ", o_.port, " belongs to another job, or ",
          kStoreTokenEnvVar, " differs between the ranks (every rank needs the same value)"));
    }
    std::vector<absl::string_view> parts = absl::StrSplit(value, ' ');
    int r = -1, w = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r) ||
        !absl::SimpleAtoi(parts[1], &w)) {
      return Refuse(c, "malformed hello");
    }
    if (w != o_.world_size) {
      return Refuse(c, absl::StrCat("world-size mismatch: rank ", r, " has WORLD_SIZE=", w,
                                    " but the master (rank 0) has WORLD_SIZE=", o_.world_size,
                                    "; every process must be started with the same world size"));
    }
    if (r < 0 || r >= w) return Refuse(c, absl::StrCat("rank ", r, " is outside [0, ", w, ")"));
    if (!ranks_.insert(r).second) {
      return Refuse(c, absl::StrCat("rank ", r, " joined twice: two processes were given RANK=",
                                    r, " (a rank's slot is freed when its connection closes)"));
    }
    c.rank = r;
    --unauthenticated_;
    {
      std::lock_guard<std::mutex> l(s_.mu_);
      ++s_.ranks_connected_;
    }
    Send(c, true, "");
  }

  // Stores key=value within max_stored_bytes and answers waiters; false (and an error reply)
  // when the store is full.
  // What a key costs the server: its bytes plus the map node and string headers.
  static int64_t Footprint(const std::string& key, size_t value_size) {
    return static_cast<int64_t>(key.size() + value_size) + kStoreBytesPerKey;
  }

  bool Store(Conn& c, const std::string& key, const std::string& value) {
    auto it = data_.find(key);
    const bool is_new = it == data_.end();
    const int64_t old = is_new ? 0 : Footprint(key, it->second.size());
    const int64_t total = stored_bytes_ - old + Footprint(key, value.size());
    if (is_new && static_cast<int64_t>(data_.size()) >= o_.max_stored_keys) {
      Send(c, false, absl::StrCat("store full: storing '", Shown(key), "' would make ",
                                  data_.size() + 1, " keys, over max_stored_keys=",
                                  o_.max_stored_keys, " (reuse keys, or raise the limit in "
                                  "TcpStoreOptions on rank 0)"));
      return false;
    }
    if (total > o_.max_stored_bytes) {
      Send(c, false, absl::StrCat("store full: storing '", Shown(key), "' (", value.size(),
                                  " bytes) would hold ", total, " bytes (keys, values and ",
                                  kStoreBytesPerKey, " bytes per key), over max_stored_bytes=",
                                  o_.max_stored_bytes));
      return false;
    }
    stored_bytes_ = total;
    data_[key] = value;
    for (auto& [fd, w] : conns_) {
      if (w.waiting == 0 || w.waiting_key != key || w.dead) continue;
      const char type = w.waiting;
      w.waiting = 0;
      w.waiting_key.clear();
      Send(w, true, type == 'G' ? absl::string_view(value) : "");
      ready_.push_back(fd);  // it may have more requests queued
    }
    return true;
  }

  void Add(Conn& c, const std::string& key, const std::string& value) {
    int64_t delta = 0, current = 0, sum = 0;
    if (!absl::SimpleAtoi(value, &delta)) {
      return Send(c, false, absl::StrCat("Add('", Shown(key), "'): the delta '", Shown(value),
                                         "' is not a decimal int64"));
    }
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return Send(c, false, absl::StrCat("Add('", Shown(key), "'): the key holds '",
                                         Shown(it->second), "', not a decimal int64"));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return Send(c, false, absl::StrCat("Add('", Shown(key), "'): ", current, " + ", delta,
                                         " overflows int64"));
    }
    const std::string total = absl::StrCat(sum);
    if (Store(c, key, total)) Send(c, true, total);
  }

  void NoteActivity(absl::Time t) {
    s_.last_activity_ns_.store(absl::ToUnixNanos(t), std::memory_order_relaxed);
  }

  void Reap() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->second.dead) {
        ++it;
        continue;
      }
      Conn& c = it->second;
      ::close(c.fd);
      if (c.rank >= 0) {
        ranks_.erase(c.rank);  // the slot is free again
        std::lock_guard<std::mutex> l(s_.mu_);
        --s_.ranks_connected_;
        s_.cv_.notify_all();
      } else {
        --unauthenticated_;
      }
      it = conns_.erase(it);
    }
  }

  Server& s_;
  const TcpStoreOptions& o_;
  std::map<int, Conn> conns_;
  std::vector<int> ready_;  // connections that may have requests to handle
  std::map<std::string, std::string> data_;
  int64_t stored_bytes_ = 0;
  std::set<int> ranks_;
  int unauthenticated_ = 0;
  int64_t evicted_ = 0;  // unauthenticated connections evicted to make room
  absl::Time accept_rest_until_ = absl::InfinitePast();
};

absl::StatusOr<std::unique_ptr<TcpStore::Server>> TcpStore::Server::Start(
    const TcpStoreOptions& o) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = absl::StrCat(o.port);
  if (int gai = ::getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res); gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank 0 cannot resolve MASTER_ADDR '", o.host,
                                                   "': ", gai_strerror(gai)));
  }
  // The addresses it would bind, checked after resolution: "0x0", "00" or "0.0x0" are 0.0.0.0.
  for (addrinfo* a = res; a != nullptr && !o.allow_all_interfaces; a = a->ai_next) {
    if (!IsWildcard(a->ai_addr)) continue;
    char shown[NI_MAXHOST] = "?";
    ::getnameinfo(a->ai_addr, a->ai_addrlen, shown, sizeof(shown), nullptr, 0, NI_NUMERICHOST);
    ::freeaddrinfo(res);
    return absl::InvalidArgumentError(absl::StrCat(
        "rank 0 refuses MASTER_ADDR '", o.host, "': it is the wildcard address ", shown,
        ", which would make the rendezvous store listen on every interface of this machine "
        "(anyone who can reach any of them can try the token); set MASTER_ADDR to rank 0's "
        "address on the network the ranks share (127.0.0.1 on one machine), or, if you mean "
        "it, set ", kAllowAllInterfacesEnvVar, "=1 (collectives/launch: --allow_all_interfaces)"));
  }
  int fd = -1;
  std::string error;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    char shown[NI_MAXHOST] = "?";
    ::getnameinfo(a->ai_addr, a->ai_addrlen, shown, sizeof(shown), nullptr, 0, NI_NUMERICHOST);
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      absl::StrAppend(&error, " ", shown, ": socket: ", Errno(), ";");
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) break;
    const int e = errno;
    absl::StrAppend(&error, " ", shown, ": ", std::strerror(e),
                    e == EADDRINUSE ? " (is another job using MASTER_PORT? pick a free port)"
                    : e == EADDRNOTAVAIL
                        ? " (not an address of this machine: rank 0 must run on the host "
                          "MASTER_ADDR names)"
                        : "",
                    ";");
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("rank 0 could not listen on ", o.host, ":",
                                               o.port, ":", error));
  }
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", Errno()));
  }
  return std::unique_ptr<Server>(new Server(o, fd, pipefd[0], pipefd[1]));
}

TcpStore::Server::Server(const TcpStoreOptions& options, int listen_fd, int wake_r, int wake_w)
    : options_(options), listen_fd_(listen_fd), wake_r_(wake_r), wake_w_(wake_w) {
  thread_ = std::thread([this] { Loop(*this).Run(); });
}

TcpStore::Server::~Server() {
  // Give connected ranks a chance to finish their last requests before the store goes away,
  // while they still talk to it: once no rank sent or received a byte for shutdown_grace (a
  // rank that hung, was stopped or is busy elsewhere), stop; at most `timeout` in all.
  {
    const absl::Time deadline = absl::Now() + std::min(options_.timeout, absl::Hours(24));
    last_activity_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
    std::unique_lock<std::mutex> l(mu_);
    while (ranks_connected_ > 0) {
      const absl::Time now = absl::Now();
      const absl::Time quiet_until =
          absl::FromUnixNanos(last_activity_ns_.load(std::memory_order_relaxed)) +
          options_.shutdown_grace;
      const absl::Time until = std::min(deadline, quiet_until);
      if (now >= until) break;
      cv_.wait_for(l, absl::ToChronoMilliseconds(std::min(until - now, absl::Milliseconds(100))));
    }
  }
  char c = 'x';
  (void)!::write(wake_w_, &c, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_r_);
  ::close(wake_w_);
}

}  // namespace shardmap::collectives
