#include "models/data/text_data.h"

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

class TextDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/text_data_test_" +
           std::to_string(::getpid());
    ::mkdir(dir_.c_str(), 0755);
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  // uint16 little-endian, written byte by byte (independent of the loader's decoding).
  std::string WriteBin(const std::string& name, const std::vector<int>& ids) {
    std::string bytes;
    for (int id : ids) {
      bytes.push_back(static_cast<char>(id & 0xff));
      bytes.push_back(static_cast<char>((id >> 8) & 0xff));
    }
    return Write(name, bytes);
  }
  std::string dir_;
};

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), code) << s;
  for (const std::string& n : needles) {
    EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
  }
}

TEST_F(TextDataTest, ReadsBytesAndUint16) {
  const std::string text = Write("a.txt", std::string("hi\xff\x00!", 5));
  auto t = LoadTokenFile(text, TokenFormat::kBytes, 256, "--text");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<int64_t>{'h', 'i', 255, 0, '!'}));

  const std::string bin = WriteBin("a.bin", {0, 1, 255, 256, 50256, 65535});
  auto b = LoadTokenFile(bin, TokenFormat::kUint16, 65536, "--data");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (std::vector<int64_t>{0, 1, 255, 256, 50256, 65535}));
}

// With a text encoder (train_gpt --tokenizer) a text file's tokens are its ids, checked against
// the vocabulary like any token file's, in --text and in --val_data alike.
TEST_F(TextDataTest, ATextEncoderGivesTheTokens) {
  const std::string path = Write("words.txt", "a bb ccc dddd");
  // One token a word: its length.
  TextEncoder lengths = [](const std::string& text) {
    std::vector<int64_t> ids;
    int64_t n = 0;
    for (char c : text + " ") {
      if (c != ' ') {
        ++n;
      } else if (n > 0) {
        ids.push_back(n);
        n = 0;
      }
    }
    return ids;
  };
  absl::StatusOr<std::vector<int64_t>> ids =
      LoadTokenFile(path, TokenFormat::kBytes, 8, "--text", lengths);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{1, 2, 3, 4}));
  absl::Status small = LoadTokenFile(path, TokenFormat::kBytes, 4, "--text", lengths).status();
  EXPECT_NE(small.message().find("id 4, outside the vocabulary [0, 4)"), std::string::npos)
      << small;
  TokenDataOptions o;
  o.text = Write("long.txt", "a bb ccc dddd a bb ccc dddd a bb ccc dddd");
  o.val_data = path;
  o.encode_text = lengths;
  o.seq = 2;
  absl::StatusOr<TokenData> d = LoadTokenData(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.size(), 12u);
  EXPECT_EQ(d->val, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST_F(TextDataTest, LoadingErrorsNameThePathAndTheFix) {
  ExpectError(LoadTokenFile(dir_, TokenFormat::kBytes, 256, "--text").status(),
              absl::StatusCode::kInvalidArgument, {"--text '" + dir_ + "'", "is a directory"});
  ExpectError(LoadTokenFile(dir_, TokenFormat::kUint16, 256, "--data").status(),
              absl::StatusCode::kInvalidArgument, {"--data '" + dir_ + "'", "is a directory",
                                                   "uint16"});
  const std::string missing = dir_ + "/nope.bin";
  ExpectError(LoadTokenFile(missing, TokenFormat::kUint16, 256, "--data").status(),
              absl::StatusCode::kNotFound, {missing, "no such file"});
  ExpectError(LoadTokenFile(dir_ + "/a/b/c", TokenFormat::kBytes, 256, "--text").status(),
              absl::StatusCode::kNotFound, {"no such file"});
  ExpectError(LoadTokenFile("", TokenFormat::kBytes, 256, "--text").status(),
              absl::StatusCode::kInvalidArgument, {"--text", "empty"});
  const std::string empty = Write("empty.txt", "");
  ExpectError(LoadTokenFile(empty, TokenFormat::kBytes, 256, "--text").status(),
              absl::StatusCode::kInvalidArgument, {empty, "is empty"});
  const std::string odd = Write("odd.bin", "abc");
  ExpectError(LoadTokenFile(odd, TokenFormat::kUint16, 256, "--data").status(),
              absl::StatusCode::kInvalidArgument,
              {odd, "3 bytes", "not a whole number of uint16 ids", "--text"});
  const std::string big = WriteBin("big.bin", {1, 2, 300, 5, 1000, 3});
  ExpectError(LoadTokenFile(big, TokenFormat::kUint16, 256, "--data").status(),
              absl::StatusCode::kInvalidArgument,
              {big, "token 2 is id 300", "[0, 256)", "largest id in the file is 1000",
               "--vocab=1001"});
  const std::string text = Write("t.txt", "abc");  // 'a' = 97
  ExpectError(LoadTokenFile(text, TokenFormat::kBytes, 64, "--text").status(),
              absl::StatusCode::kInvalidArgument, {"token 0 is id 97", "--vocab=100"});
  ExpectError(LoadTokenFile(text, TokenFormat::kBytes, 0, "--text").status(),
              absl::StatusCode::kInvalidArgument, {"vocab 0"});
#ifdef __linux__
  ExpectError(LoadTokenFile("/dev/null", TokenFormat::kBytes, 256, "--text").status(),
              absl::StatusCode::kInvalidArgument, {"not a regular file"});
#endif
}

TEST_F(TextDataTest, SplitIsNanoGptsAndDeterministic) {
  std::vector<int64_t> tokens(103);
  for (int i = 0; i < 103; ++i) tokens[i] = i % 7;
  auto s = SplitTokens(tokens, 0.1, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  // nanoGPT: train = data[:int(n*0.9)] -> int(92.7) = 92
  ASSERT_EQ(s->train.size(), 92u);
  ASSERT_EQ(s->val.size(), 11u);
  EXPECT_TRUE(std::equal(s->train.begin(), s->train.end(), tokens.begin()));
  EXPECT_TRUE(std::equal(s->val.begin(), s->val.end(), tokens.begin() + 92));
  auto again = SplitTokens(tokens, 0.1, 4);
  EXPECT_EQ(again->train, s->train);
  EXPECT_EQ(again->val, s->val);
  auto none = SplitTokens(tokens, 0.0, 4);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->train, tokens);
  EXPECT_TRUE(none->val.empty());
}

TEST_F(TextDataTest, SplitErrors) {
  std::vector<int64_t> tokens(20, 1);
  for (double bad : {-0.1, 1.0, 1.5, std::nan("")}) {
    ExpectError(SplitTokens(tokens, bad, 4).status(), absl::StatusCode::kInvalidArgument,
                {"must be in [0, 1)"});
  }
  // val = 20 - floor(20 * 0.9) = 2 < seq+1 = 5
  ExpectError(SplitTokens(tokens, 0.1, 4).status(), absl::StatusCode::kInvalidArgument,
              {"validation split has 2 of 20 tokens", "seq+1 = 5"});
  // floor(20 * (1 - 0.9)) = floor(1.99999...) = 1, as Python's int(n * (1 - 0.9))
  ExpectError(SplitTokens(tokens, 0.9, 4).status(), absl::StatusCode::kInvalidArgument,
              {"training split has 1 of 20 tokens"});
  ExpectError(SplitTokens(tokens, 0.0, 0).status(), absl::StatusCode::kInvalidArgument,
              {"seq 0"});
}

TEST_F(TextDataTest, LoadTokenDataCombinesFlags) {
  std::string text(200, 'x');
  for (int i = 0; i < 200; ++i) text[i] = static_cast<char>('a' + i % 26);
  const std::string txt = Write("d.txt", text);
  auto d = LoadTokenData({.text = txt, .val_fraction = 0.25, .vocab = 256, .seq = 8});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.size(), 150u);
  EXPECT_EQ(d->val.size(), 50u);
  EXPECT_EQ(d->val[0], 'a' + 150 % 26);

  std::vector<int> ids(40), vids(12);
  for (int i = 0; i < 40; ++i) ids[i] = 1000 + i;
  for (int i = 0; i < 12; ++i) vids[i] = 2000 + i;
  const std::string train = WriteBin("train.bin", ids), val = WriteBin("val.bin", vids);
  auto b = LoadTokenData({.data = train, .val_data = val, .vocab = 4096, .seq = 8});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->train.size(), 40u);
  EXPECT_EQ(b->val, std::vector<int64_t>(vids.begin(), vids.end()));

  ExpectError(LoadTokenData({.vocab = 256}).status(), absl::StatusCode::kInvalidArgument,
              {"exactly one of --data"});
  ExpectError(LoadTokenData({.text = txt, .data = train}).status(),
              absl::StatusCode::kInvalidArgument, {"exactly one of --data"});
  ExpectError(LoadTokenData({.data = train, .val_data = val, .val_fraction = 0.1,
                             .vocab = 4096}).status(),
              absl::StatusCode::kInvalidArgument, {"use one of them"});
  ExpectError(LoadTokenData({.data = train, .val_data = dir_, .vocab = 4096}).status(),
              absl::StatusCode::kInvalidArgument, {"--val_data '" + dir_, "is a directory"});
  ExpectError(LoadTokenData({.data = train, .val_data = val, .vocab = 4096, .seq = 12})
                  .status(),
              absl::StatusCode::kInvalidArgument, {"--val_data", "has 12 tokens", "seq+1 = 13"});
  ExpectError(LoadTokenData({.data = train, .vocab = 4096, .seq = 40}).status(),
              absl::StatusCode::kInvalidArgument, {"--data '" + train, "training split"});
  ExpectError(LoadTokenData({.data = train, .vocab = 1024}).status(),
              absl::StatusCode::kInvalidArgument, {"--vocab=1040"});
}

}  // namespace
}  // namespace shardmap
