// Llama 3's tokenizer: byte-level BPE over a tiktoken vocabulary (tokenizer.model: one token per
// line, its bytes in base64 and its rank, "IQ== 0"; the rank is the token's id), Llama 3's
// pre-tokenisation (llama3_pretokenize.h) and its 256 special tokens at ids 128000..128255.
//
//   absl::StatusOr<TiktokenTokenizer> tok = TiktokenTokenizer::Load("llama3/tokenizer.model");
//   if (!tok.ok()) return tok.status();  // "... line 7: the token \"I@==\" is not base64: ..."
//   std::vector<int32_t> ids = tok->Encode("Hello world!");  // {9906, 1917, 0}
//   absl::StatusOr<std::string> text = tok->Decode(ids);      // "Hello world!"
//   tok->Encode("<|eot_id|>", SpecialTokens::kAllow);        // {128009}
//
// Encode follows tiktoken (what Meta's llama3 tokenizer.py calls): a piece that is a token is
// that token; otherwise its bytes become byte tokens and, while some adjacent pair concatenates
// to a token, the pair of lowest rank (the leftmost of equals) merges; in O(n log n), so a long
// piece takes milliseconds. By default the text of a special token encodes as plain text
// (Meta's default, disallowed_special=()); kAllow makes it the special token. Meta's
// tokenizer.py also cuts the text into 400,000-character chunks and runs of over 25,000
// (non-)space characters before tiktoken (a workaround for tiktoken's stack); this does not, as
// Hugging Face's tokenizer and llama3-tokenizer-js do not, so ids can differ at those cuts. Any
// bytes encode (invalid UTF-8 too; a reference that decodes text first sees U+FFFD instead);
// Decode(Encode(s)) == s. Encode and Decode may be called from several threads.
//
// Reading is bounded (a regular file of at most 64 MiB, at most 2^20 lines, ranks below 128000)
// and errors name the file, the line, what is wrong and what was expected: bad base64, a rank
// that is not a number or repeats, a token that repeats, a byte with no token.
#ifndef SHARDMAP_MODELS_DATA_TIKTOKEN_TOKENIZER_H_
#define SHARDMAP_MODELS_DATA_TIKTOKEN_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardmap {

// Llama 3's special tokens in id order from 128000, as Meta's llama3 tokenizer.py makes them
// (github.com/meta-llama/llama3, llama/tokenizer.py at commit e8f0267: <|begin_of_text|>,
// <|end_of_text|>, <|reserved_special_token_0..3|>, <|start_header_id|>, <|end_header_id|>,
// <|reserved_special_token_4|>, <|eot_id|>, then <|reserved_special_token_5..250|>). Llama 3.1
// renamed some reserved ones (128004, 128008, 128010); the ids of the named five are the same.
const std::vector<std::string>& Llama3SpecialTokens();
inline constexpr int32_t kLlama3FirstSpecialId = 128000;

enum class SpecialTokens {
  kAsText,  // "<|eot_id|>" in the text is plain text (Meta's default)
  kAllow,   // "<|eot_id|>" in the text is the special token 128009
};

class TiktokenTokenizer {
 public:
  static constexpr int64_t kMaxFileBytes = int64_t{64} << 20;
  static constexpr int64_t kMaxLines = int64_t{1} << 20;

  // Reads a tokenizer.model (tiktoken's format).
  static absl::StatusOr<TiktokenTokenizer> Load(const std::string& path);
  // The same from the file's contents; `name` appears in errors.
  static absl::StatusOr<TiktokenTokenizer> FromContents(absl::string_view contents,
                                                        const std::string& name = "vocabulary");

  TiktokenTokenizer(TiktokenTokenizer&&);
  TiktokenTokenizer& operator=(TiktokenTokenizer&&);
  ~TiktokenTokenizer();

  std::vector<int32_t> Encode(absl::string_view text,
                              SpecialTokens specials = SpecialTokens::kAsText) const;
  void EncodeTo(absl::string_view text, SpecialTokens specials, std::vector<int32_t>* out) const;
  // The bytes of the ids, concatenated (a special token's are its text). An id outside the
  // vocabulary is an InvalidArgument error naming its position.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const;

  // One past the last special token's id (Llama 3: 128256).
  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  // The tokens of the file (Llama 3: 128000; a subset has fewer, with their original ranks).
  int64_t num_base_tokens() const { return num_base_tokens_; }
  int32_t bos_id() const { return kLlama3FirstSpecialId; }      // <|begin_of_text|>
  int32_t eos_id() const { return kLlama3FirstSpecialId + 1; }  // <|end_of_text|>
  // The id of the token whose bytes are `bytes`, or of the special token `bytes`, if any.
  std::optional<int32_t> TokenId(absl::string_view bytes) const;

 private:
  struct Cache;
  TiktokenTokenizer();
  absl::Status ReadLines(absl::string_view contents, const std::string& name);
  void EncodeOrdinary(absl::string_view text, std::vector<int32_t>* out) const;
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const;
  template <typename Id>
  absl::StatusOr<std::string> DecodeIds(absl::Span<const Id> ids) const;

  std::vector<std::string> token_bytes_;  // by id; "" for an unused id
  std::vector<bool> used_;                // by id
  int64_t num_base_tokens_ = 0;
  absl::flat_hash_map<std::string, int32_t> ranks_;     // token bytes -> rank (the file's)
  absl::flat_hash_map<std::string, int32_t> specials_;  // special token text -> id
  std::unique_ptr<Cache> cache_;
};

// Whether `head` (a file's first bytes) starts as a tiktoken file does: "BASE64 RANK\n".
bool LooksLikeTiktoken(absl::string_view head);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_TIKTOKEN_TOKENIZER_H_
