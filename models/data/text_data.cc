#include "models/data/text_data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <system_error>

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "models/components/bounded_read.h"

namespace shardmap {
namespace {

// The data is held in memory as int64 ids (8 bytes per text byte): beyond this it cannot fit.
constexpr int64_t kMaxDataBytes = int64_t{1} << 36;

const char* Describe(TokenFormat f) {
  return f == TokenFormat::kBytes ? "a text file (its bytes are the tokens)"
                                  : "a file of little-endian uint16 token ids (nanoGPT's "
                                    "prepare.py writes train.bin / val.bin)";
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> LoadTokenFile(const std::string& path, TokenFormat format,
                                                   int64_t vocab, const std::string& flag,
                                                   const TextEncoder& encode) {
  const std::string where = absl::StrCat(flag, " '", path, "'");
  if (vocab < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": vocab ", vocab, " must be >= 1"));
  }
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the path is empty; give ", Describe(format)));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(
          absl::StrCat(where, ": no such file; give ", Describe(format)));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": cannot be read (", std::strerror(err), ")"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": is a directory; give ", Describe(format)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": is not a regular file; give ", Describe(format)));
  }
  // Read through the bounded reader: a file swapped for a FIFO or a device after the check
  // above is refused, never read forever.
  absl::StatusOr<std::string> read = ReadBoundedFile(path, kMaxDataBytes, flag);
  if (!read.ok()) return read.status();
  const std::string bytes = *std::move(read);
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": is empty; give ", Describe(format)));
  }
  std::vector<int64_t> tokens;
  if (format == TokenFormat::kBytes && encode) {
    tokens = encode(bytes);
  } else if (format == TokenFormat::kBytes) {
    tokens.reserve(bytes.size());
    for (unsigned char c : bytes) tokens.push_back(c);
  } else {
    if (bytes.size() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": has ", bytes.size(),
          " bytes, not a whole number of uint16 ids (2 bytes each): the file is truncated or "
          "not a token file; for a text file use --text"));
    }
    tokens.reserve(bytes.size() / 2);
    for (size_t i = 0; i < bytes.size(); i += 2) {
      tokens.push_back(static_cast<unsigned char>(bytes[i]) |
                       (static_cast<int64_t>(static_cast<unsigned char>(bytes[i + 1])) << 8));
    }
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab) {
      int64_t max_id = 0;
      for (int64_t t : tokens) max_id = std::max(max_id, t);
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": token ", i, " is id ", tokens[i], ", outside the vocabulary [0, ", vocab,
          "); the largest id in the file is ", max_id, ": use --vocab=", max_id + 1,
          " or more"));
    }
  }
  return tokens;
}

absl::StatusOr<TokenSplit> SplitTokens(const std::vector<int64_t>& tokens, double val_fraction,
                                       int64_t seq) {
  if (!(val_fraction >= 0 && val_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "validation fraction ", val_fraction,
        " must be in [0, 1) (e.g. 0.1 holds out the last 10% of the tokens)"));
  }
  if (seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat("seq ", seq, " must be >= 1"));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_train =
      static_cast<int64_t>(std::floor(static_cast<double>(n) * (1.0 - val_fraction)));
  TokenSplit s;
  s.train.assign(tokens.begin(), tokens.begin() + n_train);
  s.val.assign(tokens.begin() + n_train, tokens.end());
  if (static_cast<int64_t>(s.train.size()) < seq + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training split has ", s.train.size(), " of ", n,
        " tokens; one sample needs seq+1 = ", seq + 1,
        ": use more data, a smaller --seq or a smaller validation fraction"));
  }
  if (!s.val.empty() && static_cast<int64_t>(s.val.size()) < seq + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the validation split has ", s.val.size(), " of ", n, " tokens (fraction ",
        val_fraction, "); one sample needs seq+1 = ", seq + 1,
        ": raise the fraction, use more data or a smaller --seq"));
  }
  return s;
}

absl::StatusOr<TokenData> LoadTokenData(const TokenDataOptions& o) {
  if (o.text.empty() == o.data.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --data FILE (uint16 token ids) or --text FILE (bytes)");
  }
  if (!o.val_data.empty() && o.val_fraction != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--val_data '", o.val_data, "' and a validation fraction ", o.val_fraction,
        " both give validation data; use one of them"));
  }
  const bool text = !o.text.empty();
  const TokenFormat format = text ? TokenFormat::kBytes : TokenFormat::kUint16;
  absl::StatusOr<std::vector<int64_t>> tokens =
      LoadTokenFile(text ? o.text : o.data, format, o.vocab, text ? "--text" : "--data",
                    o.encode_text);
  if (!tokens.ok()) return tokens.status();
  TokenData d;
  if (!o.val_data.empty()) {
    absl::StatusOr<std::vector<int64_t>> val =
        LoadTokenFile(o.val_data, format, o.vocab, "--val_data", o.encode_text);
    if (!val.ok()) return val.status();
    if (static_cast<int64_t>(val->size()) < o.seq + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--val_data '", o.val_data, "': has ", val->size(),
          " tokens; one sample needs seq+1 = ", o.seq + 1));
    }
    d.val = *std::move(val);
  }
  absl::StatusOr<TokenSplit> split = SplitTokens(*tokens, o.val_fraction, o.seq);
  if (!split.ok()) {
    return absl::Status(split.status().code(),
                        absl::StrCat(text ? "--text '" : "--data '", text ? o.text : o.data,
                                     "': ", split.status().message()));
  }
  d.train = std::move(split->train);
  if (o.val_data.empty()) d.val = std::move(split->val);
  return d;
}

}  // namespace shardmap
