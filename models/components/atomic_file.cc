#include "models/components/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace shardmap {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

absl::StatusOr<ExclusiveTemp> CreateExclusiveTemp(const std::string& base) {
  static constexpr char kLetters[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device rd;
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(6, 'a');
    for (char& c : suffix) c = kLetters[rd() % (sizeof(kLetters) - 1)];
    ExclusiveTemp t;
    t.path = absl::StrCat(base, ".tmp.", ::getpid(), ".", suffix);
    t.fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (t.fd >= 0) return t;
    err = errno;
    if (err != EEXIST) break;
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot create a temporary file beside '",
                                                    base, "' (", std::strerror(err),
                                                    "); check the directory and its permissions"));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::function<bool(int fd)>& fill) {
  absl::StatusOr<ExclusiveTemp> t = CreateExclusiveTemp(path);
  if (!t.ok()) return t.status();
  bool ok = fill(t->fd) && ::fsync(t->fd) == 0;
  int err = errno;
  if (::close(t->fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(t->path.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(t->path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("writing '", path, "' failed: ", std::strerror(err),
                     " (the previous file, if any, is unchanged)"));
  }
  return absl::OkStatus();
}

}  // namespace shardmap
