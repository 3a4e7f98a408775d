#include "models/data/pretokenize.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace shardmap {
namespace {

struct CodePointRange {
  char32_t lo, hi;
};

#include "models/data/unicode_tables.inc"

bool InRanges(const CodePointRange* begin, const CodePointRange* end, char32_t cp) {
  const CodePointRange* it =
      std::upper_bound(begin, end, cp, [](char32_t c, const CodePointRange& r) { return c < r.lo; });
  return it != begin && cp <= std::prev(it)->hi;
}

// Unicode's White_Space property (PropList.txt; unchanged since Unicode 6.3).
bool IsWhiteSpace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

CharClass Classify(char32_t cp) {
  if (IsWhiteSpace(cp)) return CharClass::kSpace;
  if (InRanges(std::begin(kLetterRanges), std::end(kLetterRanges), cp)) return CharClass::kLetter;
  if (InRanges(std::begin(kNumberRanges), std::end(kNumberRanges), cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

const std::array<CharClass, 128> kAscii = [] {
  std::array<CharClass, 128> t{};
  for (char32_t c = 0; c < 128; ++c) t[c] = Classify(c);
  return t;
}();

struct Char {
  CharClass cls;
  uint8_t len;  // bytes
};

// The character at text[pos] (pos < size): its class and length. Invalid UTF-8 (a stray
// continuation byte, a truncated sequence, an overlong form, a surrogate, > U+10FFFF): one byte
// of class kOther.
Char At(const unsigned char* s, size_t size, size_t pos) {
  const unsigned char b = s[pos];
  if (b < 0x80) return {kAscii[b], 1};
  int len;
  char32_t cp;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2, cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, cp = b & 0x07;
  } else {
    return {CharClass::kOther, 1};
  }
  if (pos + len > size) return {CharClass::kOther, 1};
  for (int k = 1; k < len; ++k) {
    const unsigned char c = s[pos + k];
    if ((c & 0xC0) != 0x80) return {CharClass::kOther, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
    return {CharClass::kOther, 1};
  }
  return {Classify(cp), static_cast<uint8_t>(len)};
}

}  // namespace

CharClass ClassOfCodePoint(char32_t cp) { return cp < 128 ? kAscii[cp] : Classify(cp); }

size_t NextPretokenLength(absl::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // 's 't 'm 'd, then 're 've 'll (no two alternatives start with the same letter).
  if (s[pos] == '\'' && pos + 1 < n) {
    const unsigned char c = s[pos + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
    if (pos + 2 < n && ((c == 'r' && s[pos + 2] == 'e') || (c == 'v' && s[pos + 2] == 'e') ||
                        (c == 'l' && s[pos + 2] == 'l'))) {
      return 3;
    }
  }
  Char first = At(s, n, pos);
  size_t end = pos;
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional ASCII space, then a run of one class.
  if (s[pos] == ' ' && pos + 1 < n) {
    const Char next = At(s, n, pos + 1);
    if (next.cls != CharClass::kSpace) {
      first = next;
      end = pos + 1;
    }
  }
  if (first.cls != CharClass::kSpace) {
    end += first.len;
    while (end < n) {
      const Char c = At(s, n, end);
      if (c.cls != first.cls) break;
      end += c.len;
    }
    return end - pos;
  }
  // "\s+(?!\S)|\s+": a run of spaces, less its last character when a non-space follows and the
  // run has more than one (that character starts the next piece, e.g. " word").
  size_t last = pos;
  end = pos + first.len;
  while (end < n) {
    const Char c = At(s, n, end);
    if (c.cls != CharClass::kSpace) return (last > pos ? last : end) - pos;
    last = end;
    end += c.len;
  }
  return end - pos;
}

}  // namespace shardmap
