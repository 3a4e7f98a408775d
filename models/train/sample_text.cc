#include "models/train/sample_text.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"

namespace shardmap {

absl::StatusOr<std::vector<std::string>> TokenizerFiles(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> files = TextTokenizerFiles(path);
  if (!files.ok()) {
    return absl::Status(files.status().code(), absl::StrCat("--", files.status().message()));
  }
  return files;
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizerPath(const std::string& path) {
  if (path.empty()) return std::unique_ptr<TextTokenizer>();
  if (absl::StatusOr<std::vector<std::string>> files = TokenizerFiles(path); !files.ok()) {
    return files.status();
  }
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = LoadTextTokenizer(path);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("--tokenizer: ", tok.status().message()));
  }
  return tok;
}

absl::StatusOr<std::vector<int64_t>> EncodePrompt(const std::string& text,
                                                  const TextTokenizer* tokenizer, bool ids_text,
                                                  int64_t vocab) {
  std::vector<int64_t> ids;
  if (tokenizer != nullptr) {
    for (int32_t id : tokenizer->Encode(text)) ids.push_back(id);
  } else if (ids_text) {
    for (absl::string_view id : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(id, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prompt '", text, "': a model of token files takes comma-separated token ids"));
      }
      ids.push_back(v);
    }
  } else {
    for (unsigned char ch : text) ids.push_back(ch);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt is empty; give at least one token");
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt holds id ", id, ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return ids;
}

std::string DecodeTokens(const std::vector<int64_t>& ids, const TextTokenizer* tokenizer,
                         bool ids_text) {
  std::string text;
  if (tokenizer != nullptr) {
    // Token by token (the bytes concatenate as the whole text's): an id the tokenizer lacks
    // prints as <|id N|> instead of hiding the rest.
    for (int64_t id : ids) {
      absl::StatusOr<std::string> piece = tokenizer->Decode(absl::MakeConstSpan(&id, 1));
      absl::StrAppend(&text, piece.ok() ? *piece : absl::StrCat("<|id ", id, "|>"));
    }
  } else if (ids_text) {
    text = absl::StrJoin(ids, ",");
  } else {
    for (int64_t id : ids) text.push_back(static_cast<char>(id));
  }
  return text;
}

}  // namespace shardmap
