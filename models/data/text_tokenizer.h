// The tokenizer a path names (train_gpt / sample_gpt --tokenizer): Llama 3's tokenizer.model
// (tiktoken's format; tiktoken_tokenizer.h), or a folder with GPT-2's encoder.json + vocab.bpe,
// Hugging Face's vocab.json + merges.txt (bpe_tokenizer.h) or a tokenizer.model. A file is told
// by its content, not its name; a file of another kind is an error that says what it looks like.
//
//   absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = LoadTextTokenizer("llama3/tokenizer.model");
//   if (!tok.ok()) return tok.status();
//   std::vector<int32_t> ids = (*tok)->Encode("Hello world!");  // {9906, 1917, 0}
//
// Encode takes special tokens' text as plain text (Llama 3's <|eot_id|> too: training text is
// data, not markup).
#ifndef SHARDMAP_MODELS_DATA_TEXT_TOKENIZER_H_
#define SHARDMAP_MODELS_DATA_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardmap {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual std::vector<int32_t> Encode(absl::string_view text) const = 0;
  // The ids' bytes; InvalidArgument for an id outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const = 0;
  // One past the largest id (GPT-2: 50257, Llama 3: 128256).
  virtual int64_t vocab_size() const = 0;
  // "GPT-2 BPE" or "Llama 3 (tiktoken)".
  virtual std::string kind() const = 0;
};

// The files that make up the tokenizer at `path` (two for GPT-2, one for Llama 3), in the order
// they are read; NotFound or InvalidArgument saying what `path` needs to be.
absl::StatusOr<std::vector<std::string>> TextTokenizerFiles(const std::string& path);
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTextTokenizer(const std::string& path);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_TEXT_TOKENIZER_H_
