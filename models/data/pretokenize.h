// GPT-2's pre-tokenisation, written out over UTF-8 (no regex library): the text is cut into the
// pieces that GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matches, in order; BPE then runs on each piece alone. The pieces concatenate to the text.
//
//   for (size_t i = 0; i < text.size();) {
//     const size_t n = NextPretokenLength(text, i);  // "Hello world" -> "Hello", " world"
//     Use(text.substr(i, n));
//     i += n;
//   }
//
// Classes: \p{L} and \p{N} are Unicode's general categories L* and N* (unicode_tables.inc,
// generated from Python's unicodedata: see gen_unicode_tables.py); \s is Unicode's White_Space
// property, as in the `regex` module GPT-2's own encoder.py uses (U+0085 is a space, U+FEFF is
// not; JavaScript's \s has it the other way round). A byte that is not part of valid UTF-8
// counts as one character of its own that is neither letter, number nor space.
#ifndef SHARDMAP_MODELS_DATA_PRETOKENIZE_H_
#define SHARDMAP_MODELS_DATA_PRETOKENIZE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace shardmap {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// The class of a Unicode code point (see the file comment).
CharClass ClassOfCodePoint(char32_t cp);

// The byte length of the piece of `text` that starts at byte `pos` (< text.size()); >= 1.
size_t NextPretokenLength(absl::string_view text, size_t pos);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_PRETOKENIZE_H_
