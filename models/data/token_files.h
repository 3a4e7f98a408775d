// nanoGPT-style token files from text: GPT-2 BPE ids as little-endian uint16, no header
// (prepare.py's train.bin / val.bin, what train_gpt --data reads).
//
//   absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Load("encoder.json", "vocab.bpe");
//   absl::StatusOr<PreparedData> r = PrepareTokenFiles(
//       *tok, {.input = "input.txt", .out_dir = "data", .val_fraction = 0.1});
//   // data/train.bin: the first floor(n * 0.9) of the text's n tokens; data/val.bin: the rest
//
// The split is text_data.h's (by tokens, the end held out). A vocabulary with ids past 65535 is
// refused (uint16 cannot hold them), as are a missing, unreadable, empty or directory input, a
// missing output folder, and an output path that exists and is not a regular file. Files are
// written under a temporary name and renamed, so a failed run leaves no partial file.
#ifndef SHARDMAP_MODELS_DATA_TOKEN_FILES_H_
#define SHARDMAP_MODELS_DATA_TOKEN_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/data/bpe_tokenizer.h"

namespace shardmap {

// Writes ids as little-endian uint16; each must be in [0, 65535].
absl::Status WriteUint16TokenFile(const std::string& path, absl::Span<const int32_t> ids);

struct PrepareOptions {
  std::string input;    // a UTF-8 text file
  std::string out_dir;  // an existing folder: train.bin (and val.bin) go there
  double val_fraction = 0.1;  // in [0, 1); 0 writes no val.bin
};

struct PreparedData {
  std::string train_path, val_path;  // val_path empty when val_fraction is 0
  int64_t input_bytes = 0, train_tokens = 0, val_tokens = 0;
};

absl::StatusOr<PreparedData> PrepareTokenFiles(const BpeTokenizer& tokenizer,
                                               const PrepareOptions& options);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_TOKEN_FILES_H_
