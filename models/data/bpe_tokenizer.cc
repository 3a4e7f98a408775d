#include "models/data/bpe_tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/data/pretokenize.h"
#include "models/components/bounded_read.h"
#include "nlohmann/json.hpp"

namespace shardmap {

struct BpeTokenizer::Cache {
  std::mutex mu;
  absl::flat_hash_map<std::string, std::vector<int32_t>> pieces;
};

namespace {

// Pieces longer than this are not cached (long runs of spaces or symbols: rare, and unbounded).
constexpr size_t kMaxCachedPiece = 64;
// The cache is emptied when it holds this many pieces (bounds its memory at ~100 MB).
constexpr size_t kMaxCachedPieces = size_t{1} << 20;

bool PrintableLatin1(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

// char -> byte for GPT-2's byte alphabet (U+0000..U+0143); -1 where none.
const std::vector<int>& CharToByte() {
  static const std::vector<int> m = [] {
    std::vector<int> v(0x144, -1);
    for (int b = 0; b < 256; ++b) v[Gpt2ByteToChar(static_cast<uint8_t>(b))] = b;
    return v;
  }();
  return m;
}

std::string Shown(absl::string_view s) {
  std::string out = absl::CHexEscape(s.substr(0, 80));
  if (s.size() > 80) out += "...";
  return out;
}

// GPT-2's encoder.json is 1 MB with 50257 entries, the largest public vocabularies (256k
// tokens) ~10 MB: the limits refuse a wrong or hostile file before it is parsed whole.
constexpr int64_t kMaxFileBytes = int64_t{64} << 20;
constexpr int64_t kMaxVocabEntries = int64_t{1} << 21;
constexpr int64_t kMaxMerges = int64_t{1} << 21;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read the BPE ", what, " '", path, "': ",
                                            std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the BPE ", what, " '", path, "' is a directory; give the file in it (",
        std::string(what) == "vocabulary" ? "encoder.json or vocab.json" : "vocab.bpe or merges.txt",
        ")"));
  }
  absl::StatusOr<std::string> text =
      ReadBoundedFile(path, kMaxFileBytes, absl::StrCat("the BPE ", what));
  if (!text.ok()) return text.status();
  return text;
}

// A token of encoder.json / vocab.bpe (GPT-2's byte characters, in UTF-8) -> its bytes.
absl::StatusOr<std::string> TokenToBytes(absl::string_view token) {
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    char32_t cp = 0x10000;  // not in the alphabet (which ends at U+0143)
    size_t len = 1;
    if (s[i] < 0x80) {
      cp = s[i];
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < token.size() && (s[i + 1] & 0xC0) == 0x80) {
      cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
      len = 2;
    }
    if (cp >= CharToByte().size() || CharToByte()[cp] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "character at byte ", i, " is not one of GPT-2's 256 byte characters (printable "
          "Latin-1 and U+0100..U+0143); this is not a byte-level BPE file"));
    }
    out.push_back(static_cast<char>(CharToByte()[cp]));
    i += len;
  }
  if (out.empty()) return absl::InvalidArgumentError("the token is empty");
  return out;
}

}  // namespace

char32_t Gpt2ByteToChar(uint8_t b) {
  if (PrintableLatin1(b)) return b;
  int n = 0;
  for (int x = 0; x < b; ++x) n += PrintableLatin1(x) ? 0 : 1;
  return 256 + n;
}

BpeTokenizer::BpeTokenizer() : cache_(std::make_unique<Cache>()) {}
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) = default;

absl::StatusOr<BpeTokenizer> BpeTokenizer::Load(const std::string& vocab_path,
                                                const std::string& merges_path) {
  absl::StatusOr<std::string> vocab = ReadFile(vocab_path, "vocabulary");
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<std::string> merges = ReadFile(merges_path, "merges");
  if (!merges.ok()) return merges.status();
  return FromContents(*vocab, *merges, vocab_path, merges_path);
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromContents(absl::string_view vocab_json,
                                                        absl::string_view merges,
                                                        const std::string& vocab_name,
                                                        const std::string& merges_name) {
  auto bad_vocab = [&](auto... a) {
    return absl::InvalidArgumentError(absl::StrCat("BPE vocabulary '", vocab_name, "': ", a...));
  };
  if (absl::Status s = CheckCount(CountJsonMembers(vocab_json), kMaxVocabEntries,
                                  "BPE vocabulary entries", vocab_name);
      !s.ok()) {
    return s;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vocab_json.begin(), vocab_json.end());
  } catch (const nlohmann::json::parse_error& e) {
    return bad_vocab("not valid JSON (", e.what(), "); expected GPT-2's encoder.json or Hugging "
                     "Face's vocab.json: one object of token -> id");
  }
  if (!j.is_object() || j.empty()) {
    return bad_vocab("expected a non-empty JSON object of token -> id (GPT-2's encoder.json), "
                     "got ", j.type_name());
  }
  BpeTokenizer t;
  std::vector<std::string> by_id;
  int64_t count = 0;
  for (const auto& [key, value] : j.items()) {
    ++count;
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= (int64_t{1} << 24)) {
      return bad_vocab("token \"", Shown(key), "\": the id ", value.dump(),
                       " is not a whole number in [0, 2^24)");
    }
    const int64_t id = value.get<int64_t>();
    absl::StatusOr<std::string> bytes = TokenToBytes(key);
    if (!bytes.ok()) {
      return bad_vocab("token \"", Shown(key), "\" (id ", id, "): ", bytes.status().message());
    }
    if (id >= static_cast<int64_t>(by_id.size())) {
      by_id.resize(id + 1);
      t.used_.resize(id + 1, false);
    }
    if (t.used_[id]) {
      return bad_vocab("id ", id, " is given to both \"", Shown(by_id[id]), "\" and \"",
                       Shown(*bytes), "\"; each id names one token");
    }
    if (!t.ids_.emplace(*bytes, static_cast<int32_t>(id)).second) {
      return bad_vocab("token \"", Shown(key), "\" repeats another token's bytes");
    }
    t.used_[id] = true;
    by_id[id] = *bytes;
  }
  t.token_bytes_ = std::move(by_id);
  t.num_tokens_ = count;
  for (int b = 0; b < 256; ++b) {
    auto it = t.ids_.find(std::string(1, static_cast<char>(b)));
    if (it == t.ids_.end()) {
      return bad_vocab("no token for byte 0x", absl::Hex(b, absl::kZeroPad2),
                       "; a byte-level BPE vocabulary has one for each of the 256 bytes");
    }
    t.byte_ids_[b] = it->second;
  }
  if (absl::Status s = t.ReadMerges(merges, merges_name); !s.ok()) return s;
  return t;
}

absl::Status BpeTokenizer::ReadMerges(absl::string_view merges, const std::string& name) {
  const int64_t newlines = std::count(merges.begin(), merges.end(), '\n');
  if (absl::Status s = CheckCount(newlines, kMaxMerges, "BPE merges lines", name);
      !s.ok()) {
    return s;
  }
  std::vector<absl::string_view> lines = absl::StrSplit(merges, '\n');
  while (!lines.empty() && (lines.back().empty() || lines.back() == "\r")) lines.pop_back();
  absl::flat_hash_map<uint64_t, int64_t> line_of;
  int32_t rank = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t line = static_cast<int64_t>(i) + 1;
    absl::string_view l = lines[i];
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (i == 0 && absl::StartsWith(l, "#version")) continue;
    auto bad = [&](auto... a) {
      return absl::InvalidArgumentError(absl::StrCat("BPE merges '", name, "' line ", line, ": ", a...));
    };
    const std::vector<absl::string_view> parts = absl::StrSplit(l, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return bad("expected two tokens separated by one space (GPT-2's vocab.bpe or Hugging "
                 "Face's merges.txt), got \"", Shown(l), "\"");
    }
    int32_t side[2];
    std::string joined;
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<std::string> bytes = TokenToBytes(parts[k]);
      if (!bytes.ok()) return bad("token \"", Shown(parts[k]), "\": ", bytes.status().message());
      auto it = ids_.find(*bytes);
      if (it == ids_.end()) {
        return bad("token \"", Shown(parts[k]), "\" is not in the vocabulary; are the "
                   "vocabulary and the merges from the same tokenizer?");
      }
      side[k] = it->second;
      joined += *bytes;
    }
    auto merged = ids_.find(joined);
    if (merged == ids_.end()) {
      return bad("the merge of \"", Shown(parts[0]), "\" and \"", Shown(parts[1]),
                 "\" makes a token that is not in the vocabulary; are the vocabulary and the "
                 "merges from the same tokenizer?");
    }
    const uint64_t key = BpeMergeKey(side[0], side[1]);
    if (auto [it, fresh] = line_of.emplace(key, line); !fresh) {
      return bad("repeats the merge of line ", it->second);
    }
    merges_[key] = BpeMerge{rank++, merged->second};
  }
  return absl::OkStatus();
}

std::optional<int32_t> BpeTokenizer::TokenId(absl::string_view bytes) const {
  auto it = ids_.find(bytes);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void BpeTokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const {
  std::vector<int32_t> w(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) w[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  MergeWord(merges_, &w);
  out->insert(out->end(), w.begin(), w.end());
}

void BpeTokenizer::EncodeTo(absl::string_view text, std::vector<int32_t>* out) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto& pieces = cache_->pieces;
  for (size_t i = 0; i < text.size();) {
    const size_t n = NextPretokenLength(text, i);
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

std::vector<int32_t> BpeTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  EncodeTo(text, &ids);
  return ids;
}

template <typename Id>
absl::StatusOr<std::string> BpeTokenizer::DecodeIds(absl::Span<const Id> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !used_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot decode token ", i, " of ", ids.size(), ": id ", id,
          " is not in the vocabulary (", num_tokens_, " tokens with ids in [0, ", vocab_size(),
          ")); were these ids made with another tokenizer?"));
    }
    out += token_bytes_[id];
  }
  return out;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int32_t> ids) const {
  return DecodeIds(ids);
}
absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int64_t> ids) const {
  return DecodeIds(ids);
}

}  // namespace shardmap
