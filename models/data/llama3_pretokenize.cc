#include "models/data/llama3_pretokenize.h"

#include <cstdint>

#include "models/data/pretokenize.h"

namespace shardmap {
namespace {

struct Char {
  CharClass cls;
  uint8_t len;   // bytes
  char32_t cp;   // 0xFFFFFFFF for a byte outside valid UTF-8
};

constexpr char32_t kInvalid = 0xFFFFFFFF;

// The character at s[pos] (pos < size). Invalid UTF-8 (a stray continuation byte, a truncated
// sequence, an overlong form, a surrogate, > U+10FFFF): one byte of class kOther.
Char At(const unsigned char* s, size_t size, size_t pos) {
  const unsigned char b = s[pos];
  if (b < 0x80) return {ClassOfCodePoint(b), 1, b};
  int len;
  char32_t cp;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2, cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, cp = b & 0x07;
  } else {
    return {CharClass::kOther, 1, kInvalid};
  }
  if (pos + len > size) return {CharClass::kOther, 1, kInvalid};
  for (int k = 1; k < len; ++k) {
    const unsigned char c = s[pos + k];
    if ((c & 0xC0) != 0x80) return {CharClass::kOther, 1, kInvalid};
    cp = (cp << 6) | (c & 0x3F);
  }
  if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
    return {CharClass::kOther, 1, kInvalid};
  }
  return {ClassOfCodePoint(cp), static_cast<uint8_t>(len), cp};
}

bool IsCrLf(char32_t cp) { return cp == '\r' || cp == '\n'; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[pos] == '\'': the match's length, 0 if none.
size_t ContractionLength(const unsigned char* s, size_t n, size_t pos) {
  if (pos + 1 >= n) return 0;
  const unsigned char c = s[pos + 1] | 0x20;  // ASCII lower case (letters only matter below)
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  if (s[pos + 1] == 0xC5 && pos + 2 < n && s[pos + 2] == 0xBF) return 3;  // 'ſ
  if (pos + 2 >= n) return 0;
  const unsigned char d = s[pos + 2] | 0x20;
  if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
  return 0;
}

// The end of the run of characters of class `cls` that starts at `pos`, at most `max` of them.
size_t RunEnd(const unsigned char* s, size_t n, size_t pos, CharClass cls, size_t max) {
  size_t count = 0;
  while (pos < n && count < max) {
    const Char c = At(s, n, pos);
    if (c.cls != cls) break;
    pos += c.len;
    ++count;
  }
  return pos;
}

}  // namespace

size_t NextLlama3PretokenLength(absl::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  constexpr size_t kAll = ~size_t{0};
  if (s[pos] == '\'') {
    if (const size_t len = ContractionLength(s, n, pos); len > 0) return len;
  }
  const Char first = At(s, n, pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (first.cls == CharClass::kLetter) return RunEnd(s, n, pos, CharClass::kLetter, kAll) - pos;
  if (first.cls != CharClass::kNumber && !IsCrLf(first.cp) && pos + first.len < n &&
      At(s, n, pos + first.len).cls == CharClass::kLetter) {
    return RunEnd(s, n, pos + first.len, CharClass::kLetter, kAll) - pos;
  }
  // \p{N}{1,3}
  if (first.cls == CharClass::kNumber) return RunEnd(s, n, pos, CharClass::kNumber, 3) - pos;
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  size_t start = pos;
  if (s[pos] == ' ' && pos + 1 < n && At(s, n, pos + 1).cls == CharClass::kOther) start = pos + 1;
  if (At(s, n, start).cls == CharClass::kOther) {
    size_t end = RunEnd(s, n, start, CharClass::kOther, kAll);
    while (end < n && (s[end] == '\r' || s[end] == '\n')) ++end;
    return end - pos;
  }
  // Now `first` is a space. \s*[\r\n]+: up to the run's last CR or LF; \s+(?!\S): the run, less
  // its last character when a non-space follows (and it has more than one); \s+: the run.
  size_t end = pos, last_start = pos, crlf_end = 0, count = 0;
  while (end < n) {
    const Char c = At(s, n, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.len;
    ++count;
    if (IsCrLf(c.cp)) crlf_end = end;
  }
  if (crlf_end > 0) return crlf_end - pos;
  if (end == n || count == 1) return end - pos;
  return last_start - pos;
}

}  // namespace shardmap
