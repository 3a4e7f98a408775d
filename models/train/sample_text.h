// Text in and out of a GPT for train_gpt --sample and sample_gpt: the tokenizer (--tokenizer=PATH:
// Llama 3's tokenizer.model, or a folder with GPT-2's encoder.json + vocab.bpe or Hugging Face's
// vocab.json + merges.txt; models/data/text_tokenizer.h), the prompt as token ids and the sampled
// ids as text.
//
//   absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = LoadTokenizerPath("gpt2/");  // null: ""
//   absl::StatusOr<std::vector<int64_t>> ids =
//       EncodePrompt("Hello", tok->get(), /*ids_text=*/false, /*vocab=*/50304);
//   std::string text = DecodeTokens(*ids, tok->get(), /*ids_text=*/false);
//
// Without a tokenizer a byte-level model's prompt is its bytes and its ids decode to bytes; a
// model of uint16 token files (ids_text) takes and prints comma-separated ids. With one, ids the
// tokenizer lacks (the padding ids past GPT-2's 50257) print as <|id N|>; Llama 3's special tokens
// print as their text.
#ifndef SHARDMAP_MODELS_TRAIN_SAMPLE_TEXT_H_
#define SHARDMAP_MODELS_TRAIN_SAMPLE_TEXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/text_tokenizer.h"

namespace shardmap {

// PATH's files, in the order they are hashed (GPT-2: encoder.json and vocab.bpe; Llama 3: the
// tokenizer.model); errors are prefixed with "--".
absl::StatusOr<std::vector<std::string>> TokenizerFiles(const std::string& path);
// The tokenizer of PATH (null for ""); errors are prefixed with "--tokenizer".
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizerPath(const std::string& path);

// InvalidArgument for an empty prompt, ids that do not parse (ids_text) or fall outside
// [0, vocab).
absl::StatusOr<std::vector<int64_t>> EncodePrompt(const std::string& text,
                                                  const TextTokenizer* tokenizer, bool ids_text,
                                                  int64_t vocab);
std::string DecodeTokens(const std::vector<int64_t>& ids, const TextTokenizer* tokenizer,
                         bool ids_text);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_SAMPLE_TEXT_H_
