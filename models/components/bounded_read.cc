#include "models/components/bounded_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardmap {
namespace {

std::string Kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status NotRegular(const std::string& what, const std::string& path, mode_t mode) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " '", path, "' is ", Kind(mode),
      ", not a regular file: it is not read (it could block or never end); give a file"));
}

absl::Status CannotOpen(const std::string& what, const std::string& path, int err) {
  const std::string msg =
      absl::StrCat(what, " '", path, "': cannot open (", std::strerror(err), ")");
  return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
}

}  // namespace

BoundedFile& BoundedFile::operator=(BoundedFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

BoundedFile::~BoundedFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool BoundedFile::ReadAt(void* data, int64_t n, int64_t offset) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, static_cast<size_t>(n), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= r;
    offset += r;
  }
  return true;
}

absl::StatusOr<BoundedFile> OpenBoundedFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return CannotOpen(what, path, errno);
  BoundedFile f;
  f.fd_ = fd;
  struct stat st;
  if (::fstat(fd, &st) != 0) return CannotOpen(what, path, errno);
  if (!S_ISREG(st.st_mode)) return NotRegular(what, path, st.st_mode);
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", path, "' has ", st.st_size, " bytes, more than the limit of ", max_bytes,
        ": not the file meant, or damaged"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  f.size_ = st.st_size;
  return f;
}

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what) {
  absl::StatusOr<BoundedFile> f = OpenBoundedFile(path, max_bytes, what);
  if (!f.ok()) return f.status();
  std::string out;
  out.reserve(static_cast<size_t>(f->size()));
  char buf[1 << 16];
  while (true) {
    const ssize_t r = ::read(f->fd(), buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", path, "': read failed (", std::strerror(errno), ")"));
    }
    if (r == 0) break;
    if (static_cast<int64_t>(out.size()) + r > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", path, "' grew past the limit of ", max_bytes, " bytes while read"));
    }
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

absl::Status CheckRegularFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return CannotOpen(what, path, errno);
  if (!S_ISREG(st.st_mode)) return NotRegular(what, path, st.st_mode);
  return absl::OkStatus();
}

absl::Status CheckCount(int64_t count, int64_t max, const std::string& what,
                        const std::string& path) {
  if (count <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " in '", path, "': ", count,
                                                 " exceeds the limit of ", max,
                                                 ": not the file meant, or damaged"));
}

int64_t CountJsonMembers(absl::string_view text) {
  int64_t n = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == ':') {
      ++n;
    }
  }
  return n;
}

}  // namespace shardmap
