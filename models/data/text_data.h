// Token data for training: the bytes of a text file (--text, vocab 256) or nanoGPT's uint16 token
// files (--data, prepare.py's train.bin / val.bin, little-endian), checked before the first step,
// and a held-out validation split.
//
//   TokenDataOptions o{.data = "train.bin", .val_data = "val.bin", .vocab = 50304, .seq = 1024};
//   // or {.text = "input.txt", .val_fraction = 0.1, .vocab = 256, .seq = 64}
//   absl::StatusOr<TokenData> d = LoadTokenData(o);
//   if (!d.ok()) return d.status();  // "--data 'x': is a directory; give a file of ..."
//   // d->train, d->val: token ids in [0, vocab). A batch is a function of (step, batch, seq):
//   BatchAt(d->train, step, batch, seq, &ids, &targets);      // models/gpt.h
//   BatchAt(d->val, eval_batch, batch, seq, &ids, &targets);  // eval_batch = 0 .. eval_steps-1
//
// The split is nanoGPT's: with n tokens and fraction f, train is the first floor(n * (1 - f))
// tokens and val the rest (the end of the data), so the same file and fraction always give the
// same split. Errors (InvalidArgument / NotFound) name the flag, the path, what is wrong and the
// fix: a directory, a missing, unreadable or empty file, a .bin of odd length, an id outside the
// vocabulary (its position, the id, the --vocab it needs), a split too short for one sample.
#ifndef SHARDMAP_MODELS_DATA_TEXT_DATA_H_
#define SHARDMAP_MODELS_DATA_TEXT_DATA_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardmap {

enum class TokenFormat {
  kBytes,   // each byte is one token (0..255)
  kUint16,  // little-endian uint16 ids (nanoGPT's .bin files)
};

// The tokens of one file, every id checked to be in [0, vocab). `flag` names the file in errors
// (e.g. "--data").
// A text's token ids (e.g. GPT-2's BPE, models/data/bpe_tokenizer.h); null: one token a byte.
using TextEncoder = std::function<std::vector<int64_t>(const std::string& text)>;

absl::StatusOr<std::vector<int64_t>> LoadTokenFile(const std::string& path, TokenFormat format,
                                                   int64_t vocab,
                                                   const std::string& flag = "token file",
                                                   const TextEncoder& encode = nullptr);

struct TokenSplit {
  std::vector<int64_t> train, val;
};

// train = tokens[0, floor(n * (1 - val_fraction))), val = the rest. val_fraction in [0, 1);
// 0 gives an empty val. Each non-empty part needs at least seq + 1 tokens (one sample).
absl::StatusOr<TokenSplit> SplitTokens(const std::vector<int64_t>& tokens, double val_fraction,
                                       int64_t seq);

struct TokenDataOptions {
  std::string text;  // a text file: its bytes are the tokens (or encode_text's ids)
  TextEncoder encode_text;  // null: bytes
  std::string data;  // a uint16 .bin file (exactly one of text / data)
  // A separate validation file in the same format (nanoGPT's val.bin); not with val_fraction.
  std::string val_data;
  double val_fraction = 0;  // without val_data: the last fraction of the tokens is held out
  int64_t vocab = 256;
  int64_t seq = 8;  // the train part (and a non-empty val part) needs seq + 1 tokens
};

struct TokenData {
  std::vector<int64_t> train, val;  // val empty: no evaluation data
};

absl::StatusOr<TokenData> LoadTokenData(const TokenDataOptions& options);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_TEXT_DATA_H_
