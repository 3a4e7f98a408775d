// Text in and out of a GPT for train_gpt --sample and sample_gpt: the tokenizer folder
// (--tokenizer=DIR: GPT-2's encoder.json + vocab.bpe, or Hugging Face's vocab.json + merges.txt),
// the prompt as token ids and the sampled ids as text.
//
//   absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok = LoadTokenizerDir("gpt2/");  // null: ""
//   absl::StatusOr<std::vector<int64_t>> ids =
//       EncodePrompt("Hello", tok->get(), /*ids_text=*/false, /*vocab=*/50304);
//   std::string text = DecodeTokens(*ids, tok->get(), /*ids_text=*/false);
//
// Without a tokenizer a byte-level model's prompt is its bytes and its ids decode to bytes; a
// model of uint16 token files (ids_text) takes and prints comma-separated ids. With one, ids the
// tokenizer lacks (the padding ids past GPT-2's 50257) print as <|id N|>.
#ifndef SHARDMAP_MODELS_TRAIN_SAMPLE_TEXT_H_
#define SHARDMAP_MODELS_TRAIN_SAMPLE_TEXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/bpe_tokenizer.h"

namespace shardmap {

// DIR's two files (GPT-2's names first); NotFound naming what is needed.
absl::StatusOr<std::pair<std::string, std::string>> TokenizerFiles(const std::string& dir);
// The tokenizer of DIR (null for ""); errors are prefixed with "--tokenizer".
absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadTokenizerDir(const std::string& dir);

// InvalidArgument for an empty prompt, ids that do not parse (ids_text) or fall outside
// [0, vocab).
absl::StatusOr<std::vector<int64_t>> EncodePrompt(const std::string& text,
                                                  const BpeTokenizer* tokenizer, bool ids_text,
                                                  int64_t vocab);
std::string DecodeTokens(const std::vector<int64_t>& ids, const BpeTokenizer* tokenizer,
                         bool ids_text);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_SAMPLE_TEXT_H_
