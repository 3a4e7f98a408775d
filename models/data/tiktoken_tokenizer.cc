#include "models/data/tiktoken_tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "models/data/llama3_pretokenize.h"
#include "models/data/rank_bpe.h"

namespace shardmap {

struct TiktokenTokenizer::Cache {
  std::mutex mu;
  absl::flat_hash_map<std::string, std::vector<int32_t>> pieces;
};

namespace {

// Pieces longer than this are not cached; the cache is emptied when it holds this many.
constexpr size_t kMaxCachedPiece = 64;
constexpr size_t kMaxCachedPieces = size_t{1} << 20;

std::string Shown(absl::string_view s) {
  std::string out = absl::CHexEscape(s.substr(0, 60));
  if (s.size() > 60) out += "...";
  return out;
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with its padding (as tiktoken's files are written); strict, unlike Python's
// b64decode, so a damaged file is caught where it is damaged.
absl::StatusOr<std::string> DecodeBase64(absl::string_view s) {
  if (s.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("its length ", s.size(), " is not a multiple of 4"));
  }
  size_t pad = 0;
  while (pad < 2 && pad < s.size() && s[s.size() - 1 - pad] == '=') ++pad;
  std::string out;
  uint32_t acc = 0;
  for (size_t i = 0; i < s.size() - pad; ++i) {
    const int v = Base64Value(s[i]);
    if (v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "character '", absl::CHexEscape(s.substr(i, 1)), "' at column ", i + 1,
          " is not a base64 digit (A-Z a-z 0-9 + /, '=' only as padding at the end)"));
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    if (i % 4 == 3) {
      out.push_back(static_cast<char>(acc >> 16));
      out.push_back(static_cast<char>(acc >> 8));
      out.push_back(static_cast<char>(acc));
      acc = 0;
    }
  }
  if (pad == 1) {
    out.push_back(static_cast<char>(acc >> 10));
    out.push_back(static_cast<char>(acc >> 2));
  } else if (pad == 2) {
    out.push_back(static_cast<char>(acc >> 4));
  }
  if (out.empty()) return absl::InvalidArgumentError("it decodes to no bytes");
  return out;
}

absl::StatusOr<std::string> ReadBounded(const std::string& path) {
  auto fail = [&](const char* what) {
    return absl::NotFoundError(absl::StrCat("cannot read the tokenizer '", path, "': ", what, ": ",
                                            std::strerror(errno)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return fail("stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer '", path, "' is not a regular file; give Llama 3's tokenizer.model"));
  }
  if (st.st_size > TiktokenTokenizer::kMaxFileBytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer '", path, "' has ", st.st_size, " bytes, more than the ",
        TiktokenTokenizer::kMaxFileBytes, " a tiktoken vocabulary may have (Llama 3's is 2.2 MB)"));
  }
  // Read at most the limit and one byte more, so a file that grows while read is caught too.
  std::string out(static_cast<size_t>(TiktokenTokenizer::kMaxFileBytes) + 1, '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      ::close(fd);
      return fail("read");
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (got > static_cast<size_t>(TiktokenTokenizer::kMaxFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("the tokenizer '", path, "' grew past ",
                                                   TiktokenTokenizer::kMaxFileBytes,
                                                   " bytes while it was read"));
  }
  out.resize(got);
  return out;
}

}  // namespace

const std::vector<std::string>& Llama3SpecialTokens() {
  static const std::vector<std::string> tokens = [] {
    std::vector<std::string> t = {
        "<|begin_of_text|>",           "<|end_of_text|>",
        "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
        "<|start_header_id|>",         "<|end_header_id|>",
        "<|reserved_special_token_4|>", "<|eot_id|>"};
    for (int i = 5; i < 256 - 5; ++i) t.push_back(absl::StrCat("<|reserved_special_token_", i, "|>"));
    return t;
  }();
  return tokens;
}

bool LooksLikeTiktoken(absl::string_view head) {
  size_t i = 0;
  while (i < head.size() && (Base64Value(head[i]) >= 0 || head[i] == '=')) ++i;
  if (i == 0 || i >= head.size() || head[i] != ' ') return false;
  size_t digits = ++i;
  while (i < head.size() && absl::ascii_isdigit(static_cast<unsigned char>(head[i]))) ++i;
  if (i == digits) return false;
  return i == head.size() || head[i] == '\n' || head[i] == '\r';
}

TiktokenTokenizer::TiktokenTokenizer() : cache_(std::make_unique<Cache>()) {}
TiktokenTokenizer::~TiktokenTokenizer() = default;
TiktokenTokenizer::TiktokenTokenizer(TiktokenTokenizer&&) = default;
TiktokenTokenizer& TiktokenTokenizer::operator=(TiktokenTokenizer&&) = default;

absl::StatusOr<TiktokenTokenizer> TiktokenTokenizer::Load(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadBounded(path);
  if (!contents.ok()) return contents.status();
  return FromContents(*contents, path);
}

absl::StatusOr<TiktokenTokenizer> TiktokenTokenizer::FromContents(absl::string_view contents,
                                                                  const std::string& name) {
  TiktokenTokenizer t;
  if (absl::Status s = t.ReadLines(contents, name); !s.ok()) return s;
  for (int b = 0; b < 256; ++b) {
    if (!t.ranks_.contains(std::string(1, static_cast<char>(b)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tiktoken vocabulary '", name, "': no token for byte 0x", absl::Hex(b, absl::kZeroPad2),
          "; a byte-level BPE vocabulary has one for each of the 256 bytes (is the file cut "
          "short?)"));
    }
  }
  const std::vector<std::string>& specials = Llama3SpecialTokens();
  t.token_bytes_.resize(kLlama3FirstSpecialId + specials.size());
  t.used_.resize(t.token_bytes_.size(), false);
  for (const auto& [bytes, rank] : t.ranks_) {
    t.token_bytes_[rank] = bytes;
    t.used_[rank] = true;
  }
  for (size_t i = 0; i < specials.size(); ++i) {
    const int32_t id = kLlama3FirstSpecialId + static_cast<int32_t>(i);
    t.token_bytes_[id] = specials[i];
    t.used_[id] = true;
    t.specials_[specials[i]] = id;
  }
  return t;
}

// The lines "BASE64 RANK" -> ranks_. Blank lines are skipped (as tiktoken's loader does).
absl::Status TiktokenTokenizer::ReadLines(absl::string_view contents, const std::string& name) {
  std::vector<int64_t> line_of_rank(kLlama3FirstSpecialId, 0);
  absl::flat_hash_map<std::string, int64_t> line_of_token;
  int64_t line = 0;
  for (size_t pos = 0; pos < contents.size();) {
    size_t eol = contents.find('\n', pos);
    if (eol == absl::string_view::npos) eol = contents.size();
    absl::string_view l = contents.substr(pos, eol - pos);
    pos = eol + 1;
    if (++line > kMaxLines) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tiktoken vocabulary '", name, "': more than ", kMaxLines,
          " lines; Llama 3's tokenizer.model has 128000 (is this the right file?)"));
    }
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty()) continue;
    auto bad = [&](auto... a) {
      return absl::InvalidArgumentError(
          absl::StrCat("tiktoken vocabulary '", name, "' line ", line, ": ", a...));
    };
    const size_t space = l.find(' ');
    if (space == absl::string_view::npos || l.find(' ', space + 1) != absl::string_view::npos) {
      return bad("expected a base64 token, one space and its rank (\"IQ== 0\", tiktoken's "
                 "format as in Llama 3's tokenizer.model), got \"", Shown(l), "\"");
    }
    const absl::string_view token = l.substr(0, space), rank_text = l.substr(space + 1);
    absl::StatusOr<std::string> bytes = DecodeBase64(token);
    if (!bytes.ok()) return bad("the token \"", Shown(token), "\" is not base64: ", bytes.status().message());
    int64_t rank = -1;
    if (rank_text.empty() || !absl::c_all_of(rank_text, [](char c) { return c >= '0' && c <= '9'; }) ||
        rank_text.size() > 9 || !absl::SimpleAtoi(rank_text, &rank) || rank >= kLlama3FirstSpecialId) {
      return bad("the rank \"", Shown(rank_text), "\" is not a whole number in [0, ",
                 kLlama3FirstSpecialId, ") (Llama 3's special tokens take the ids from ",
                 kLlama3FirstSpecialId, ")");
    }
    if (line_of_rank[rank] != 0) {
      return bad("rank ", rank, " is already given at line ", line_of_rank[rank],
                 "; each rank names one token");
    }
    if (auto [it, fresh] = line_of_token.emplace(*bytes, line); !fresh) {
      return bad("the token \"", Shown(token), "\" (bytes \"", Shown(*bytes),
                 "\") repeats line ", it->second, "'s; each token has one rank");
    }
    line_of_rank[rank] = line;
    ranks_.emplace(*std::move(bytes), static_cast<int32_t>(rank));
  }
  if (ranks_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tiktoken vocabulary '", name, "' holds no tokens; expected lines \"BASE64 RANK\""));
  }
  num_base_tokens_ = static_cast<int64_t>(ranks_.size());
  return absl::OkStatus();
}

std::optional<int32_t> TiktokenTokenizer::TokenId(absl::string_view bytes) const {
  if (auto it = ranks_.find(bytes); it != ranks_.end()) return it->second;
  if (auto it = specials_.find(bytes); it != specials_.end()) return it->second;
  return std::nullopt;
}

void TiktokenTokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const {
  if (auto it = ranks_.find(piece); it != ranks_.end()) {
    out->push_back(it->second);
    return;
  }
  RankBpe(piece, ranks_, out);
}

void TiktokenTokenizer::EncodeOrdinary(absl::string_view text, std::vector<int32_t>* out) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto& pieces = cache_->pieces;
  for (size_t i = 0; i < text.size();) {
    const size_t n = NextLlama3PretokenLength(text, i);
    const absl::string_view piece = text.substr(i, n);
    i += n;
    if (piece.size() > kMaxCachedPiece) {
      EncodePiece(piece, out);
      continue;
    }
    auto it = pieces.find(piece);
    if (it == pieces.end()) {
      if (pieces.size() >= kMaxCachedPieces) pieces.clear();
      std::vector<int32_t> ids;
      EncodePiece(piece, &ids);
      it = pieces.emplace(std::string(piece), std::move(ids)).first;
    }
    out->insert(out->end(), it->second.begin(), it->second.end());
  }
}

void TiktokenTokenizer::EncodeTo(absl::string_view text, SpecialTokens specials,
                                 std::vector<int32_t>* out) const {
  if (specials == SpecialTokens::kAsText) return EncodeOrdinary(text, out);
  // Cut at each special token's text, leftmost first ("<|...|>": no special token holds "|>"
  // before its end, so at most one starts at a position).
  size_t done = 0;
  for (size_t at = text.find("<|"); at != absl::string_view::npos; at = text.find("<|", at + 1)) {
    const size_t close = text.find("|>", at + 2);
    if (close == absl::string_view::npos) break;
    auto it = specials_.find(text.substr(at, close + 2 - at));
    if (it == specials_.end()) continue;
    EncodeOrdinary(text.substr(done, at - done), out);
    out->push_back(it->second);
    done = close + 2;
    at = close + 1;
  }
  EncodeOrdinary(text.substr(done), out);
}

std::vector<int32_t> TiktokenTokenizer::Encode(absl::string_view text,
                                               SpecialTokens specials) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 1);
  EncodeTo(text, specials, &ids);
  return ids;
}

template <typename Id>
absl::StatusOr<std::string> TiktokenTokenizer::DecodeIds(absl::Span<const Id> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !used_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot decode token ", i, " of ", ids.size(), ": id ", id, " is not in the vocabulary (",
          num_base_tokens_, " tokens and ", specials_.size(), " special ones, ids in [0, ",
          vocab_size(), ")); were these ids made with another tokenizer?"));
    }
    out += token_bytes_[id];
  }
  return out;
}

absl::StatusOr<std::string> TiktokenTokenizer::Decode(absl::Span<const int32_t> ids) const {
  return DecodeIds(ids);
}
absl::StatusOr<std::string> TiktokenTokenizer::Decode(absl::Span<const int64_t> ids) const {
  return DecodeIds(ids);
}

}  // namespace shardmap
