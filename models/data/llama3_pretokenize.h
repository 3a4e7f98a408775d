// Llama 3's pre-tokenisation, written out over UTF-8 (no regex library): the text is cut into the
// pieces that Llama 3's pattern (Meta's llama3 tokenizer.py, pat_str)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// matches, in order; BPE then runs on each piece alone. The pieces concatenate to the text.
//
//   for (size_t i = 0; i < text.size();) {
//     const size_t n = NextLlama3PretokenLength(text, i);  // "Hello world" -> "Hello", " world"
//     Use(text.substr(i, n));
//     i += n;
//   }
//
// Classes as in pretokenize.h (GPT-2's): \p{L}, \p{N} from unicode_tables.inc, \s is Unicode's
// White_Space (as Rust's regex in tiktoken). (?i:'s) also matches 'ſ (U+017F, whose case fold is
// s), as tiktoken's regex does. A byte that is not part of valid UTF-8 is one character that is
// neither letter, number nor space.
#ifndef SHARDMAP_MODELS_DATA_LLAMA3_PRETOKENIZE_H_
#define SHARDMAP_MODELS_DATA_LLAMA3_PRETOKENIZE_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace shardmap {

// The byte length of the piece of `text` that starts at byte `pos` (< text.size()); >= 1.
size_t NextLlama3PretokenLength(absl::string_view text, size_t pos);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_LLAMA3_PRETOKENIZE_H_
