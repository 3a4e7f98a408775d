#include "models/data/token_files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/components/atomic_file.h"
#include "models/components/bounded_read.h"

namespace shardmap {
namespace {

// The input text is read whole and encoded in memory.
constexpr int64_t kMaxInputBytes = int64_t{16} << 30;

absl::Status Bad(auto... a) { return absl::InvalidArgumentError(absl::StrCat(a...)); }

// An output path may be new or a regular file (never a directory, device or FIFO).
absl::Status CheckOutput(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return Bad("cannot write '", path, "': it exists and is not a regular file; remove it or "
               "pick another --out_dir");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteUint16TokenFile(const std::string& path, absl::Span<const int32_t> ids) {
  if (absl::Status s = CheckOutput(path); !s.ok()) return s;
  std::vector<unsigned char> bytes(ids.size() * 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 65535) {
      return Bad("cannot write '", path, "': token ", i, " has id ", ids[i],
                 ", outside uint16's [0, 65535]");
    }
    bytes[2 * i] = static_cast<unsigned char>(ids[i] & 0xFF);
    bytes[2 * i + 1] = static_cast<unsigned char>(ids[i] >> 8);
  }
  // An exclusive temporary beside it, renamed over: a link planted at "<path>.tmp" is not
  // written through.
  return WriteFileAtomically(path,
                             [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size()); });
}

absl::StatusOr<PreparedData> PrepareTokenFiles(const BpeTokenizer& tokenizer,
                                               const PrepareOptions& o) {
  if (tokenizer.vocab_size() > 65536) {
    return Bad("the vocabulary has ids up to ", tokenizer.vocab_size() - 1,
               "; nanoGPT's uint16 .bin files hold ids up to 65535 only");
  }
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return Bad("--val_fraction=", o.val_fraction, " must be in [0, 1) (0: no val.bin)");
  }
  struct stat st;
  if (o.input.empty() || ::stat(o.input.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("--input '", o.input, "': ",
                                            o.input.empty() ? "not given" : std::strerror(errno),
                                            "; give a UTF-8 text file"));
  }
  if (!S_ISREG(st.st_mode)) return Bad("--input '", o.input, "' is not a regular file; give a text file");
  if (o.out_dir.empty() || ::stat(o.out_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("--out_dir '", o.out_dir,
                                            "' is not an existing folder; create it first"));
  }
  absl::StatusOr<std::string> read = ReadBoundedFile(o.input, kMaxInputBytes, "--input");
  if (!read.ok()) return read.status();
  if (read->empty()) {
    return absl::NotFoundError(
        absl::StrCat("--input '", o.input, "': empty or unreadable; give a UTF-8 text file"));
  }
  PreparedData r;
  const std::string s = *std::move(read);
  r.input_bytes = static_cast<int64_t>(s.size());
  const std::vector<int32_t> ids = tokenizer.Encode(s);
  const auto n = static_cast<int64_t>(ids.size());
  r.train_tokens = static_cast<int64_t>(std::floor(static_cast<double>(n) * (1 - o.val_fraction)));
  r.val_tokens = n - r.train_tokens;
  if (r.train_tokens == 0 || (o.val_fraction > 0 && r.val_tokens == 0)) {
    return Bad("--input '", o.input, "' has ", n, " tokens: too few for a train split",
               o.val_fraction > 0 ? " and a val split" : "", "; give more text");
  }
  r.train_path = o.out_dir + "/train.bin";
  if (o.val_fraction > 0) r.val_path = o.out_dir + "/val.bin";
  if (absl::Status s1 = CheckOutput(r.train_path); !s1.ok()) return s1;
  if (!r.val_path.empty()) {
    if (absl::Status s2 = CheckOutput(r.val_path); !s2.ok()) return s2;
  }
  const absl::Span<const int32_t> all(ids);
  if (absl::Status w = WriteUint16TokenFile(r.train_path, all.subspan(0, r.train_tokens)); !w.ok()) {
    return w;
  }
  if (!r.val_path.empty()) {
    if (absl::Status w = WriteUint16TokenFile(r.val_path, all.subspan(r.train_tokens)); !w.ok()) {
      return w;
    }
  }
  return r;
}

}  // namespace shardmap
