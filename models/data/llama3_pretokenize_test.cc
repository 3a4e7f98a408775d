// Llama 3's pre-tokenisation against JavaScript's regex (llama3-tokenizer-js's pattern, run by
// testdata/llama3/make_llama3_fixture.mjs: the byte length of each piece of mixed.txt) and hand
// cases for each alternative of the pattern.
#include "models/data/llama3_pretokenize.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

std::vector<std::string> Pieces(absl::string_view text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = NextLlama3PretokenLength(text, i);
    EXPECT_GE(n, 1u);
    EXPECT_LE(i + n, text.size());
    out.emplace_back(text.substr(i, n));
    i += n;
  }
  return out;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Llama3PretokenizeTest, PiecesOfTheMixedTextMatchJavaScriptsRegex) {
  const std::string dir = "models/data/testdata/llama3/";
  const std::string text = Read(dir + "mixed.txt");
  std::vector<size_t> want;
  for (absl::string_view l : absl::StrSplit(Read(dir + "mixed.pieces"), '\n', absl::SkipEmpty())) {
    size_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(l, &n)) << l;
    want.push_back(n);
  }
  ASSERT_GT(want.size(), 900u);
  size_t pos = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_LT(pos, text.size());
    ASSERT_EQ(NextLlama3PretokenLength(text, pos), want[k])
        << "piece " << k << " at byte " << pos << ": \"" << text.substr(pos, want[k]) << "\"";
    pos += want[k];
  }
  EXPECT_EQ(pos, text.size());
}

TEST(Llama3PretokenizeTest, Contractions) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("it's"), (V{"it", "'s"}));
  EXPECT_EQ(Pieces("WE'LL I'M"), (V{"WE", "'LL", " I", "'M"}));
  EXPECT_EQ(Pieces("'sunday"), (V{"'s", "unday"}));  // the contraction comes first
  EXPECT_EQ(Pieces("'hello"), (V{"'hello"}));         // else a mark joins the letters
  EXPECT_EQ(Pieces("'\xC5\xBFx"), (V{"'\xC5\xBF", "x"}));  // 'ſ folds to 's (tiktoken)
  EXPECT_EQ(Pieces("'"), (V{"'"}));
}

TEST(Llama3PretokenizeTest, LettersTakeOneLeadingNonLetter) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Pieces("x.append(y)"), (V{"x", ".append", "(y", ")"}));
  EXPECT_EQ(Pieces("..hi"), (V{"..", "hi"}));
  EXPECT_EQ(Pieces("\thi"), (V{"\thi"}));
  EXPECT_EQ(Pieces("\nhi"), (V{"\n", "hi"}));  // not CR or LF
  EXPECT_EQ(Pieces("  hi"), (V{" ", " hi"}));
}

TEST(Llama3PretokenizeTest, NumbersInThrees) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(Pieces(" 12"), (V{" ", "12"}));  // a space does not join a number
  EXPECT_EQ(Pieces("\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4"),  // Arabic-Indic digits: chars, not bytes
            (V{"\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"}));
}

TEST(Llama3PretokenizeTest, PunctuationTakesASpaceAndTrailingNewlines) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("a !!!\n\nb"), (V{"a", " !!!\n\n", "b"}));
  EXPECT_EQ(Pieces("};\r\n}"), (V{"};\r\n", "}"}));
  EXPECT_EQ(Pieces("\xFF\xFE"), (V{"\xFF\xFE"}));  // invalid bytes are neither letters nor spaces
}

TEST(Llama3PretokenizeTest, WhitespaceRuns) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("a  \n  b"), (V{"a", "  \n", " ", " b"}));  // up to the last newline
  EXPECT_EQ(Pieces("a\r\n\r\nb"), (V{"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(Pieces("a   1"), (V{"a", "  ", " ", "1"}));  // the run less its last space
  EXPECT_EQ(Pieces("a   "), (V{"a", "   "}));           // at the end: all of it
  EXPECT_EQ(Pieces("a \xC2\xA0" "b"), (V{"a", " ", "\xC2\xA0" "b"}));  // NBSP is a space
}

}  // namespace
}  // namespace shardmap
