// Writing a file so that no reader ever sees it half written and nothing outside its place is
// touched: the bytes go to a temporary beside it, created exclusively (O_CREAT | O_EXCL |
// O_NOFOLLOW, an unpredictable name: a symlink or file planted there is never followed or
// truncated), fsynced, then renamed over the final name (rename replaces a symlink there, it
// does not write through it).
//
//   absl::Status s = WriteFileAtomically("ckpt.safetensors", [&](int fd) {
//     return WriteAll(fd, bytes.data(), bytes.size());
//   });
//
// The temporary is "<path>.tmp.<pid>.<6 random letters>": a process killed mid-write leaves it,
// and CheckpointRotation::RemoveStaleTemporaries removes those whose pid is dead.
#ifndef SHARDMAP_MODELS_COMPONENTS_ATOMIC_FILE_H_
#define SHARDMAP_MODELS_COMPONENTS_ATOMIC_FILE_H_

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardmap {

struct ExclusiveTemp {
  int fd = -1;  // open for writing; the caller closes it
  std::string path;
};

// Creates a fresh temporary "<base>.tmp.<pid>.<random>" (mode 0644 less the umask); retries on
// a name that exists. FailedPrecondition naming the directory's problem otherwise.
absl::StatusOr<ExclusiveTemp> CreateExclusiveTemp(const std::string& base);

// fill(fd) writes the whole content (false: failed, errno says why); then fsync, close, rename
// over `path`. On any failure the temporary is removed and `path` is as it was.
absl::Status WriteFileAtomically(const std::string& path, const std::function<bool(int fd)>& fill);

// write(2) until n bytes are written; false on an error (errno set).
bool WriteAll(int fd, const void* data, size_t n);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_ATOMIC_FILE_H_
