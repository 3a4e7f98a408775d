// Reading a file the user named, without trusting it: the path must be a regular file (a FIFO,
// a device such as /dev/zero or a directory is refused at once, never read), no larger than the
// caller's limit, and read at most that far even if it grows meanwhile. Every reader of a
// user-supplied path (checkpoints, tokenizers, profiles, caches, data) goes through here.
//
//   absl::StatusOr<std::string> text = ReadBoundedFile(path, 64 << 20, "--profile");
//   absl::StatusOr<BoundedFile> f = OpenBoundedFile(path, kMaxCheckpoint, "checkpoint");
//   ... ::pread(f->fd(), ...) within [0, f->size()) ...
//   absl::Status s = CheckCount(entries, 1 << 20, "encoder.json entries", path);
//
// Errors are InvalidArgument (NotFound for a missing file) and name the role, the path, the
// reason and the limit.
#ifndef SHARDMAP_MODELS_COMPONENTS_BOUNDED_READ_H_
#define SHARDMAP_MODELS_COMPONENTS_BOUNDED_READ_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardmap {

// An open regular file (closed on destruction), its size at open time.
class BoundedFile {
 public:
  BoundedFile() = default;
  BoundedFile(BoundedFile&& o) noexcept : fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }
  BoundedFile& operator=(BoundedFile&& o) noexcept;
  BoundedFile(const BoundedFile&) = delete;
  BoundedFile& operator=(const BoundedFile&) = delete;
  ~BoundedFile();

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  // Reads [offset, offset + n) whole; false on a short read (the file shrank) or an error.
  bool ReadAt(void* data, int64_t n, int64_t offset) const;

 private:
  friend absl::StatusOr<BoundedFile> OpenBoundedFile(const std::string&, int64_t,
                                                     const std::string&);
  int fd_ = -1;
  int64_t size_ = 0;
};

// Opens `path` for reading without blocking on a FIFO; refuses anything but a regular file of at
// most max_bytes. `what` names the file's role in errors (e.g. "--resume", "encoder.json").
absl::StatusOr<BoundedFile> OpenBoundedFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what);

// The whole file (as OpenBoundedFile); a file that grows past max_bytes while read is refused.
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what);

// OK when `path` is a regular file (following symlinks) without opening it; the reason otherwise.
absl::Status CheckRegularFile(const std::string& path, const std::string& what);

// InvalidArgument "<what> in '<path>': <count> exceeds the limit of <max>" when count > max.
absl::Status CheckCount(int64_t count, int64_t max, const std::string& what,
                        const std::string& path);

// The number of JSON object members (':' outside strings) in `text`, counted before parsing so
// that a huge object is refused without building it.
int64_t CountJsonMembers(absl::string_view text);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_BOUNDED_READ_H_
