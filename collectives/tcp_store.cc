// TcpStore's client side: connecting, the handshake, one request at a time with a deadline.
// The wire format is in tcp_store_wire.h, rank 0's server in tcp_store_server.cc.
#include "collectives/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "collectives/internal/status_macros.h"
#include "collectives/tcp_store_server.h"
#include "collectives/tcp_store_wire.h"

namespace shardmap::collectives {
namespace {

std::string Errno() { return std::strerror(errno); }

int PollMs(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// Writes all of `data` on a non-blocking socket, or fails at the deadline.
absl::Status WriteAll(int fd, absl::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    ssize_t w = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (w >= 0) {
      data.remove_prefix(static_cast<size_t>(w));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("write failed: ", Errno()));
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("timed out sending");
    pollfd p{fd, POLLOUT, 0};
    (void)::poll(&p, 1, PollMs(deadline));
  }
  return absl::OkStatus();
}

// Reads exactly len bytes or fails at the deadline / on EOF.
absl::Status ReadAll(int fd, char* data, size_t len, absl::Time deadline) {
  while (len > 0) {
    ssize_t n = ::recv(fd, data, len, 0);
    if (n > 0) {
      data += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("the master closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("read failed: ", Errno()));
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("timed out");
    pollfd p{fd, POLLIN, 0};
    (void)::poll(&p, 1, PollMs(deadline));
  }
  return absl::OkStatus();
}

// Constant-time comparison: the time taken does not tell how much of a guess was right.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Connects to host:port, retrying until the deadline (the master may not be up yet).
absl::StatusOr<int> ConnectWithRetry(const TcpStoreOptions& o, absl::Time deadline,
                                     std::string last_error = "no attempt made") {
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
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
          last_error = Errno();
          continue;
        }
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          internal::TuneStoreSocket(fd);
          return fd;
        }
        last_error = Errno();
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
  return absl::UnavailableError(absl::StrCat(
      "rank ", o.rank, " could not reach the master at ", o.host, ":", o.port, " within ",
      absl::FormatDuration(o.timeout), " (last error: ", last_error,
      "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same for every rank?"));
}

}  // namespace

namespace internal {

void TuneStoreSocket(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Find peers whose host died (no FIN, no RST) within ~2 minutes.
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 60, interval = 10, count = 6;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

bool TokenMatches(absl::string_view presented, absl::string_view expected) {
  return SameToken(presented, expected);
}

}  // namespace internal

absl::StatusOr<std::string> NewStoreToken() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("getrandom: ", Errno()));
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

absl::Status CheckStoreToken(absl::string_view token) {
  // The token itself never goes into a message: it is a secret.
  if (token.size() < 16 || token.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the store token has ", token.size(), " characters; use 16 to 256 (e.g. 32 random hex "
        "digits: head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')"));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "the store token may hold only printable ASCII without spaces");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  TcpStoreOptions o = options;
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
  if (o.timeout <= absl::ZeroDuration() || o.handshake_timeout <= absl::ZeroDuration() ||
      o.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "TcpStore: timeout, handshake_timeout and idle_timeout must be positive");
  }
  if (o.max_stored_bytes < 0 || o.max_stored_keys < 0) {
    return absl::InvalidArgumentError(
        "TcpStore: max_stored_bytes and max_stored_keys must be >= 0");
  }
  if (o.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("TcpStore: shutdown_grace must be >= 0");
  }
  if (o.token.empty()) {
    if (o.world_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TcpStore: no store token (rank ", o.rank, " of ", o.world_size,
          "): every rank needs the job's shared secret; collectives/launch passes one in ",
          kStoreTokenEnvVar, ", with torchrun or srun export the same random value to every "
          "rank (e.g. `export ", kStoreTokenEnvVar,
          "=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')`)"));
    }
    SM_COLL_ASSIGN_OR_RETURN(o.token, NewStoreToken());  // only this process connects
  }
  if (absl::Status s = CheckStoreToken(o.token); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore: ", s.message()));
  }
  std::unique_ptr<Server> server;
  if (o.rank == 0) {
    SM_COLL_ASSIGN_OR_RETURN(server, Server::Start(o));
  }
  // A handshake whose connection drops (the master evicted it before its hello arrived, or
  // restarted) is tried again on a new connection, with backoff, until the deadline; a refusal
  // from the master (FAILED_PRECONDITION: wrong token, duplicate rank...) is final.
  const absl::Time deadline = absl::Now() + o.timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  std::string last_error = "no attempt made";
  int attempts = 0;
  while (true) {
    SM_COLL_ASSIGN_OR_RETURN(int fd, ConnectWithRetry(o, deadline, last_error));
    ++attempts;
    std::unique_ptr<TcpStore> store(new TcpStore(o, fd, nullptr));
    absl::Status hello =
        store->Request('H', o.token, absl::StrCat(o.rank, " ", o.world_size), "handshake",
                       std::max(deadline - absl::Now(), absl::Milliseconds(1)))
            .status();
    if (hello.ok()) {
      store->server_ = std::move(server);
      return store;
    }
    if (!absl::IsUnavailable(hello) || absl::Now() + backoff >= deadline) {
      if (attempts == 1) return hello;
      return absl::Status(hello.code(), absl::StrCat(hello.message(), " (after ", attempts,
                                                     " attempts within ",
                                                     absl::FormatDuration(o.timeout), ")"));
    }
    last_error = std::string(hello.message());
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

TcpStore::TcpStore(TcpStoreOptions options, int fd, std::unique_ptr<Server> server)
    : options_(std::move(options)), fd_(fd), server_(std::move(server)) {}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();  // rank 0: waits (bounded) for the other ranks to disconnect
}

absl::StatusOr<std::string> TcpStore::Request(char type, absl::string_view key,
                                              absl::string_view value, absl::string_view what,
                                              absl::Duration timeout) {
  auto annotate = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("TcpStore ", what, " (rank ", options_.rank,
                                               ", master ", options_.host, ":", options_.port,
                                               "): ", s.message()));
  };
  if (key.size() > wire::kMaxKey || value.size() > wire::kMaxValue) {
    return annotate(absl::InvalidArgumentError(
        absl::StrCat("key (", key.size(), " bytes) or value (", value.size(),
                     " bytes) too large; the limits are ", wire::kMaxKey, " and ",
                     wire::kMaxValue)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    return annotate(absl::FailedPreconditionError(absl::StrCat(
        "the connection was closed after an earlier error (", broken_.message(),
        "); create a new TcpStore")));
  }
  // Any failure below leaves the connection in an unknown state (a reply may still come): close
  // it so that no later request can read a reply meant for this one.
  auto drop = [&](const absl::Status& s) {
    ::close(fd_);
    fd_ = -1;
    broken_ = annotate(s);
    return broken_;
  };
  const absl::Time deadline = absl::Now() + timeout;
  if (absl::Status s = WriteAll(fd_, wire::Request(type, key, value), deadline); !s.ok()) {
    return drop(s);
  }
  char head[wire::kReplyHeader];
  if (absl::Status s = ReadAll(fd_, head, sizeof(head), deadline); !s.ok()) {
    if (absl::IsDeadlineExceeded(s)) {
      return drop(absl::DeadlineExceededError(absl::StrCat(
          "no answer within ", absl::FormatDuration(timeout),
          " (a Get or Wait waits until some rank sets the key)")));
    }
    return drop(s);
  }
  uint64_t len;
  std::memcpy(&len, head + 1, 8);
  if ((head[0] != 'O' && head[0] != 'E') || len > wire::kMaxValue + wire::kMaxKey) {
    return drop(absl::DataLossError("corrupt reply from the master"));
  }
  std::string payload(len, '\0');
  if (absl::Status s = ReadAll(fd_, payload.data(), len, deadline); !s.ok()) return drop(s);
  if (head[0] != 'O') return annotate(absl::FailedPreconditionError(payload));
  return payload;
}

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  return Request('S', key, value, absl::StrCat("Set('", key, "')"), options_.timeout).status();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key) {
  return Get(key, options_.timeout);
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key, absl::Duration timeout) {
  return Request('G', key, "", absl::StrCat("Get('", key, "')"), timeout);
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  SM_COLL_ASSIGN_OR_RETURN(std::string total, Request('A', key, absl::StrCat(delta),
                                                      absl::StrCat("Add('", key, "')"),
                                                      options_.timeout));
  int64_t t = 0;
  if (!absl::SimpleAtoi(total, &t)) {
    return absl::DataLossError(absl::StrCat("TcpStore Add('", key, "'): the master answered a "
                                            "non-integer"));
  }
  return t;
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys) {
  return Wait(keys, options_.timeout);
}

absl::Status TcpStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& k : keys) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    SM_COLL_RETURN_IF_ERROR(Request('W', k, "", absl::StrCat("Wait('", k, "')"), left).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    SM_COLL_ASSIGN_OR_RETURN(std::string has, Request('C', k, "", absl::StrCat("Check('", k,
                                                                              "')"),
                                                      options_.timeout));
    if (has != "1") return false;
  }
  return true;
}

absl::Status TcpStore::Barrier(absl::string_view name) {
  const std::string key = absl::StrCat("__barrier/", name);
  SM_COLL_ASSIGN_OR_RETURN(int64_t c, Add(key, 1));
  if (c == options_.world_size) return Set(absl::StrCat(key, "/done"), "");
  if (c > options_.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TcpStore Barrier('", name, "') entered more than world_size=", options_.world_size,
        " times: barrier names must be unique per use"));
  }
  return Get(absl::StrCat(key, "/done")).status();
}

absl::StatusOr<std::vector<std::string>> TcpStore::MissingAfter(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> missing = keys;
  while (true) {
    std::vector<std::string> still;
    for (const std::string& k : missing) {
      SM_COLL_ASSIGN_OR_RETURN(bool has, Check({k}));
      if (!has) still.push_back(k);
    }
    missing = std::move(still);
    if (missing.empty() || absl::Now() >= deadline) return missing;
    absl::SleepFor(std::min(absl::Milliseconds(20), deadline - absl::Now()));
  }
}

std::string RanksDidNotJoin(const std::vector<int>& missing, int world_size,
                            absl::Duration timeout, absl::string_view timeout_hint) {
  return absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
                      " of ", world_size, " did not join within ", absl::FormatDuration(timeout),
                      "; start every rank (collectives/launch --nproc_per_node=", world_size,
                      " does), each with the same MASTER_ADDR, MASTER_PORT and "
                      "SHARDMAP_STORE_TOKEN, or raise the timeout",
                      timeout_hint.empty() ? "" : absl::StrCat(" (", timeout_hint, ")"));
}

}  // namespace shardmap::collectives
