// TiktokenTokenizer against the npm package llama3-tokenizer-js 1.2.0 (Llama 3's vocabulary with
// an independent JavaScript BPE): the ids of a mixed text (English, code, numbers, whitespace
// runs, CRLF, contractions, non-Latin scripts, emoji) and of a chat with special tokens, on the
// vocabulary cut to the tokens those encodings pass through (testdata/llama3/
// make_llama3_fixture.mjs says why that is exact). With SHARDMAP_LLAMA3_TOKENIZER_MODEL naming a
// full tokenizer.model the same texts are checked with it too; without it that test skips.
// Also: round trips, Meta's special tokens, and every error of a bad file or id.
#include "models/data/tiktoken_tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

const std::string kDir = "models/data/testdata/llama3/";

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
    int32_t id = 0;
    EXPECT_TRUE(absl::SimpleAtoi(l, &id)) << path << ": " << l;
    ids.push_back(id);
  }
  return ids;
}

// The known-answer vocabulary; null (and a failure) if it does not load.
const TiktokenTokenizer* Subset() {
  static const TiktokenTokenizer* t = [] {
    absl::StatusOr<TiktokenTokenizer> s = TiktokenTokenizer::Load(kDir + "llama3_subset.tiktoken");
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? new TiktokenTokenizer(*std::move(s)) : nullptr;
  }();
  return t;
}

// The 256 single bytes with ranks 0..255 (base64 of each), plus `extra` lines.
std::string ByteLines(const std::string& extra = "") {
  std::string out;
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&out, absl::Base64Escape(std::string(1, static_cast<char>(b))), " ", b, "\n");
  }
  return out + extra;
}

void ExpectKnownAnswers(const TiktokenTokenizer& t) {
  const std::vector<int32_t> want = ReadIds(kDir + "mixed.ids");
  ASSERT_GT(want.size(), 1000u);
  EXPECT_EQ(t.Encode(Read(kDir + "mixed.txt")), want);
  EXPECT_EQ(t.Encode(Read(kDir + "specials.txt"), SpecialTokens::kAllow),
            ReadIds(kDir + "specials.ids"));
}

TEST(TiktokenTokenizerTest, KnownAnswersOfTheNpmPackage) {
  ASSERT_NE(Subset(), nullptr);
  EXPECT_EQ(Subset()->num_base_tokens(), 1251);
  ExpectKnownAnswers(*Subset());
}

TEST(TiktokenTokenizerTest, FullVocabulary) {
  const char* path = std::getenv("SHARDMAP_LLAMA3_TOKENIZER_MODEL");
  if (path == nullptr || *path == '\0') {
    GTEST_SKIP() << "SHARDMAP_LLAMA3_TOKENIZER_MODEL is not set: run with "
                    "--test_env=SHARDMAP_LLAMA3_TOKENIZER_MODEL=/path/to/tokenizer.model (Meta's, "
                    "or the one make_llama3_fixture.mjs writes from the npm package)";
  }
  absl::StatusOr<TiktokenTokenizer> t = TiktokenTokenizer::Load(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_base_tokens(), 128000);
  EXPECT_EQ(t->vocab_size(), 128256);
  ExpectKnownAnswers(*t);
  // Spot checks that do not depend on the files above (the package's README, Meta's test).
  EXPECT_EQ(t->Encode("Hello world!"), (std::vector<int32_t>{9906, 1917, 0}));
  EXPECT_EQ(t->Encode("This is a test sentence."),
            (std::vector<int32_t>{2028, 374, 264, 1296, 11914, 13}));
}

TEST(TiktokenTokenizerTest, RoundTrips) {
  ASSERT_NE(Subset(), nullptr);
  const TiktokenTokenizer& t = *Subset();
  for (const char* name : {"mixed.txt", "specials.txt"}) {
    const std::string text = Read(kDir + name);
    for (SpecialTokens s : {SpecialTokens::kAsText, SpecialTokens::kAllow}) {
      absl::StatusOr<std::string> back = t.Decode(t.Encode(text, s));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, text) << name;
    }
  }
  std::mt19937 rng(3);  // any bytes, invalid UTF-8 included
  for (int k = 0; k < 50; ++k) {
    std::string s(rng() % 300, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    absl::StatusOr<std::string> back = t.Decode(t.Encode(s, SpecialTokens::kAllow));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, s);
  }
  const std::string long_piece(200000, 'a');  // one piece, no cache
  EXPECT_EQ(*t.Decode(t.Encode(long_piece)), long_piece);
}

TEST(TiktokenTokenizerTest, ThreadsShareOneTokenizer) {
  ASSERT_NE(Subset(), nullptr);
  const std::string text = Read(kDir + "mixed.txt");
  const std::vector<int32_t> want = ReadIds(kDir + "mixed.ids");
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = Subset()->Encode(text); });
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST(TiktokenTokenizerTest, MetasSpecialTokens) {
  const std::vector<std::string>& s = Llama3SpecialTokens();
  ASSERT_EQ(s.size(), 256u);
  ASSERT_NE(Subset(), nullptr);
  const TiktokenTokenizer& t = *Subset();
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eos_id(), 128001);
  // Meta's llama3 tokenizer.py (commit e8f0267): the named ones and the reserved ones around them.
  const std::vector<std::pair<std::string, int32_t>> want = {
      {"<|begin_of_text|>", 128000},           {"<|end_of_text|>", 128001},
      {"<|reserved_special_token_0|>", 128002}, {"<|reserved_special_token_3|>", 128005},
      {"<|start_header_id|>", 128006},         {"<|end_header_id|>", 128007},
      {"<|reserved_special_token_4|>", 128008}, {"<|eot_id|>", 128009},
      {"<|reserved_special_token_5|>", 128010}, {"<|reserved_special_token_250|>", 128255}};
  for (const auto& [text, id] : want) {
    EXPECT_EQ(t.TokenId(text), id) << text;
    EXPECT_EQ(*t.Decode(std::vector<int32_t>{id}), text);
    EXPECT_EQ(t.Encode(text, SpecialTokens::kAllow), std::vector<int32_t>{id});
  }
  EXPECT_EQ(t.TokenId("<|reserved_special_token_251|>"), std::nullopt);
  // As plain text (the default) no id is special, and the text still round-trips.
  const std::string chat = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
  for (int32_t id : t.Encode(chat)) EXPECT_LT(id, 128000);
  EXPECT_EQ(*t.Decode(t.Encode(chat)), chat);
  // Not special: an unknown name, an unclosed one; "<|<|eot_id|>" holds one.
  EXPECT_EQ(t.Encode("<|eot|> <|eot_id|", SpecialTokens::kAllow),
            t.Encode("<|eot|> <|eot_id|", SpecialTokens::kAsText));
  std::vector<int32_t> nested = t.Encode("<|<|eot_id|>", SpecialTokens::kAllow);
  ASSERT_FALSE(nested.empty());
  EXPECT_EQ(nested.back(), 128009);
  EXPECT_EQ(*t.Decode(nested), "<|<|eot_id|>");
}

TEST(TiktokenTokenizerTest, DecodeRejectsUnknownIds) {
  ASSERT_NE(Subset(), nullptr);
  const TiktokenTokenizer& t = *Subset();
  for (int64_t id : {int64_t{-1}, int64_t{128256}, int64_t{127999}}) {  // 127999: not in the subset
    absl::StatusOr<std::string> s = t.Decode(std::vector<int64_t>{0, id});
    ASSERT_FALSE(s.ok()) << id;
    EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("token 1 of 2: id ", id)));
    EXPECT_THAT(s.status().message(), HasSubstr("another tokenizer"));
  }
}

absl::Status ErrorOf(const std::string& contents) {
  return TiktokenTokenizer::FromContents(contents, "t.model").status();
}

TEST(TiktokenTokenizerTest, BadFilesSayWhatAndWhere) {
  EXPECT_TRUE(ErrorOf(ByteLines()).ok()) << ErrorOf(ByteLines());
  EXPECT_TRUE(ErrorOf(ByteLines("\r\n\nYWI= 300\r\n")).ok());  // CRLF and blank lines are fine
  struct Case {
    std::string contents, want;
  };
  const std::vector<Case> cases = {
      {ByteLines("YW@= 300\n"), "line 257: the token \"YW@=\" is not base64: character '@' at column 3"},
      {ByteLines("YWI 300\n"), "line 257: the token \"YWI\" is not base64: its length 3"},
      {ByteLines("YWI= 3x\n"), "line 257: the rank \"3x\" is not a whole number in [0, 128000)"},
      {ByteLines("YWI= 128000\n"), "line 257: the rank \"128000\" is not a whole number"},
      {ByteLines("YWI= -1\n"), "the rank \"-1\""},
      {ByteLines("YWI= 7\n"), "line 257: rank 7 is already given at line 8"},
      {ByteLines("YWI= 300\nYWI= 301\n"), "line 258: the token \"YWI=\" (bytes \"ab\") repeats line 257's"},
      {ByteLines("YWI=300\n"), "line 257: expected a base64 token, one space and its rank"},
      {ByteLines("YWI= 300 x\n"), "line 257: expected a base64 token"},
      {"", "holds no tokens"},
      {"YQ== 0\n", "no token for byte 0x00; a byte-level BPE vocabulary has one for each of the 256"},
      {std::string((size_t{1} << 20) + 1, '\n'), "more than 1048576 lines"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ErrorOf(c.contents);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(s.message(), HasSubstr("tiktoken vocabulary 't.model'")) << c.want;
    EXPECT_THAT(s.message(), HasSubstr(c.want)) << s;
  }
}

TEST(TiktokenTokenizerTest, LoadChecksTheFile) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  absl::Status s = TiktokenTokenizer::Load(dir + "/missing.model").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("cannot read the tokenizer '" + dir + "/missing.model'"));
  s = TiktokenTokenizer::Load(dir).status();
  EXPECT_THAT(s.message(), HasSubstr("is not a regular file"));
  const std::string big = dir + "/big.model";
  { std::ofstream(big) << "IQ== 0\n"; }
  ASSERT_EQ(::truncate(big.c_str(), TiktokenTokenizer::kMaxFileBytes + 1), 0);
  s = TiktokenTokenizer::Load(big).status();
  EXPECT_THAT(s.message(), HasSubstr("has 67108865 bytes, more than the 67108864"));
}

TEST(TiktokenTokenizerTest, LooksLikeTiktoken) {
  EXPECT_TRUE(LooksLikeTiktoken("IQ== 0\nIg== 1\n"));
  EXPECT_TRUE(LooksLikeTiktoken("IQ== 0"));
  EXPECT_TRUE(LooksLikeTiktoken("IQ== 0\r\n"));
  EXPECT_FALSE(LooksLikeTiktoken("{\"!\": 0}"));               // encoder.json
  EXPECT_FALSE(LooksLikeTiktoken("#version: 0.2\nĠ t\n"));     // vocab.bpe
  EXPECT_FALSE(LooksLikeTiktoken("\x0a\x0b\x0a\x05<unk>"));    // SentencePiece
  EXPECT_FALSE(LooksLikeTiktoken("IQ== x\n"));
  EXPECT_FALSE(LooksLikeTiktoken(""));
}

}  // namespace
}  // namespace shardmap
