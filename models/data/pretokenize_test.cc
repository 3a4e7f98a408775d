// GPT-2's pre-tokenisation pattern, rule by rule, on hand-worked cases (the token ids of whole
// texts are checked against the npm package's JavaScript regex in bpe_tokenizer_test).
#include "models/data/pretokenize.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

using ::testing::ElementsAreArray;

std::vector<std::string> Pieces(absl::string_view text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = NextPretokenLength(text, i);
    EXPECT_GE(n, 1u);
    EXPECT_LE(i + n, text.size());
    out.emplace_back(text.substr(i, n));
    i += n;
  }
  return out;
}

TEST(PretokenizeTest, WordsNumbersAndSymbolsTakeOneLeadingSpace) {
  EXPECT_THAT(Pieces("Hello world"), ElementsAreArray({"Hello", " world"}));
  EXPECT_THAT(Pieces("abc123def"), ElementsAreArray({"abc", "123", "def"}));
  EXPECT_THAT(Pieces("x = (a+b);"), ElementsAreArray({"x", " =", " (", "a", "+", "b", ");"}));
  EXPECT_THAT(Pieces(" 42 ...!"), ElementsAreArray({" 42", " ...!"}));
}

TEST(PretokenizeTest, Contractions) {
  EXPECT_THAT(Pieces("it's we're I've I'm we'll he'd can't"),
              ElementsAreArray({"it", "'s", " we", "'re", " I", "'ve", " I", "'m", " we", "'ll",
                                " he", "'d", " can", "'t"}));
  // Lowercase only; "'t" splits off even before more letters; other quotes are symbols.
  EXPECT_THAT(Pieces("DON'T 'tis ''s 'x"),
              ElementsAreArray({"DON", "'", "T", " '", "tis", " ''", "s", " '", "x"}));
  EXPECT_THAT(Pieces("'ll'"), ElementsAreArray({"'ll", "'"}));
}

TEST(PretokenizeTest, WhitespaceRunsLeaveTheirLastSpaceToTheNextWord) {
  EXPECT_THAT(Pieces("a   b"), ElementsAreArray({"a", "  ", " b"}));
  EXPECT_THAT(Pieces("a\n\nb"), ElementsAreArray({"a", "\n", "\n", "b"}));
  EXPECT_THAT(Pieces("a \tb"), ElementsAreArray({"a", " ", "\t", "b"}));
  EXPECT_THAT(Pieces("a  \n"), ElementsAreArray({"a", "  \n"}));  // a run to the end: whole
  EXPECT_THAT(Pieces("\n"), ElementsAreArray({"\n"}));
  EXPECT_THAT(Pieces(" "), ElementsAreArray({" "}));
  // U+3000 and U+00A0 are spaces but only U+0020 joins the next word.
  EXPECT_THAT(Pieces("a\u3000b\u00a0\u00a0c"),
              ElementsAreArray({"a", "\u3000", "b", "\u00a0", "\u00a0", "c"}));
}

TEST(PretokenizeTest, UnicodeClasses) {
  EXPECT_THAT(Pieces("Café naïve 東京 ½Ⅻ٣ 😀👍"),
              ElementsAreArray({"Café", " naïve", " 東京", " ½Ⅻ٣", " 😀👍"}));
  EXPECT_EQ(ClassOfCodePoint(U'é'), CharClass::kLetter);
  EXPECT_EQ(ClassOfCodePoint(U'京'), CharClass::kLetter);
  EXPECT_EQ(ClassOfCodePoint(U'Ⅻ'), CharClass::kNumber);   // Nl
  EXPECT_EQ(ClassOfCodePoint(U'½'), CharClass::kNumber);   // No
  EXPECT_EQ(ClassOfCodePoint(U'٣'), CharClass::kNumber);   // Nd
  EXPECT_EQ(ClassOfCodePoint(0x85), CharClass::kSpace);
  EXPECT_EQ(ClassOfCodePoint(0x2029), CharClass::kSpace);
  EXPECT_EQ(ClassOfCodePoint(0xFEFF), CharClass::kOther);
  EXPECT_EQ(ClassOfCodePoint(U'😀'), CharClass::kOther);
  EXPECT_EQ(ClassOfCodePoint(U'_'), CharClass::kOther);
  EXPECT_EQ(ClassOfCodePoint(0x1C), CharClass::kOther);    // not White_Space
}

TEST(PretokenizeTest, InvalidUtf8IsOneSymbolByteEach) {
  EXPECT_THAT(Pieces("a\xff\xfe b\xc3"), ElementsAreArray({"a", "\xff\xfe", " b", "\xc3"}));
  EXPECT_THAT(Pieces("\xed\xa0\x80x"), ElementsAreArray({"\xed\xa0\x80", "x"}));  // surrogate
  EXPECT_THAT(Pieces("\xc0\xafz"), ElementsAreArray({"\xc0\xaf", "z"}));          // overlong
}

}  // namespace
}  // namespace shardmap
