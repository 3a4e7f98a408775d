// PrepareTokenFiles / WriteUint16TokenFile: the files hold the tokenizer's ids as little-endian
// uint16 (read back here byte by byte), split as text_data.h splits; bad paths, vocabularies past
// uint16 and bad fractions are clear errors.
#include "models/data/token_files.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

const std::string kDir = "models/data/testdata/";

std::string Tmp() { return std::getenv("TEST_TMPDIR"); }

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> ReadUint16(const std::string& path) {
  const std::string b = Read(path);
  EXPECT_EQ(b.size() % 2, 0u) << path;
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < b.size(); i += 2) {
    ids.push_back(static_cast<unsigned char>(b[i]) | (static_cast<unsigned char>(b[i + 1]) << 8));
  }
  return ids;
}

BpeTokenizer Subset() {
  absl::StatusOr<BpeTokenizer> t =
      BpeTokenizer::Load(kDir + "gpt2_subset_encoder.json", kDir + "gpt2_subset_vocab.bpe");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(TokenFilesTest, TrainAndValHoldTheIdsSplitAtTheEnd) {
  const BpeTokenizer t = Subset();
  const std::string input = kDir + "texts/english.txt";
  const std::vector<int32_t> ids = t.Encode(Read(input));
  for (double f : {0.0, 0.1, 0.37}) {
    const std::string out = Tmp() + "/split" + std::to_string(static_cast<int>(f * 100));
    ASSERT_EQ(::mkdir(out.c_str(), 0755), 0);
    absl::StatusOr<PreparedData> r = PrepareTokenFiles(t, {.input = input, .out_dir = out,
                                                           .val_fraction = f});
    ASSERT_TRUE(r.ok()) << r.status();
    const auto cut = static_cast<size_t>(static_cast<double>(ids.size()) * (1 - f));
    EXPECT_EQ(r->train_tokens, static_cast<int64_t>(cut));
    EXPECT_EQ(ReadUint16(out + "/train.bin"),
              std::vector<int32_t>(ids.begin(), ids.begin() + cut));
    if (f == 0) {
      EXPECT_TRUE(r->val_path.empty());
      struct stat st;
      EXPECT_NE(::stat((out + "/val.bin").c_str(), &st), 0);
    } else {
      EXPECT_EQ(ReadUint16(out + "/val.bin"), std::vector<int32_t>(ids.begin() + cut, ids.end()));
    }
  }
}

TEST(TokenFilesTest, IdsPastUint16AreRefused) {
  const std::string path = Tmp() + "/wide.bin";
  const std::vector<int32_t> ok = {0, 255, 256, 65535};
  ASSERT_TRUE(WriteUint16TokenFile(path, ok).ok());
  EXPECT_EQ(Read(path), std::string("\x00\x00\xff\x00\x00\x01\xff\xff", 8));
  EXPECT_THAT(WriteUint16TokenFile(path, std::vector<int32_t>{1, 65536}).ToString(),
              HasSubstr("token 1 has id 65536, outside uint16's [0, 65535]"));
  // A vocabulary with ids past 65535: refused before anything is read.
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    const char32_t c = Gpt2ByteToChar(static_cast<uint8_t>(b));
    const int id = b == 255 ? 70000 : b;
    std::string u = c < 0x80 ? std::string(1, static_cast<char>(c))
                             : std::string{static_cast<char>(0xC0 | (c >> 6)),
                                           static_cast<char>(0x80 | (c & 0x3F))};
    if (u == "\"" || u == "\\") u = "\\" + u;
    absl::StrAppend(&vocab, b ? ", " : "", "\"", u, "\": ", id);
  }
  vocab += "}";
  absl::StatusOr<BpeTokenizer> wide = BpeTokenizer::FromContents(vocab, "");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_THAT(PrepareTokenFiles(*wide, {.input = kDir + "texts/english.txt", .out_dir = Tmp()})
                  .status()
                  .ToString(),
              HasSubstr("ids up to 70000; nanoGPT's uint16 .bin files hold ids up to 65535"));
}

TEST(TokenFilesTest, BadPathsAndFractionsAreClearErrors) {
  const BpeTokenizer t = Subset();
  const std::string text = kDir + "texts/english.txt";
  const std::string empty = Tmp() + "/empty.txt";
  std::ofstream(empty).close();
  const std::string blocked = Tmp() + "/blocked";
  ASSERT_EQ(::mkdir(blocked.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((blocked + "/train.bin").c_str(), 0755), 0);
  struct Case {
    PrepareOptions o;
    std::string want;
  };
  const Case cases[] = {
      {{.input = "/no/such.txt", .out_dir = Tmp()}, "--input '/no/such.txt': No such file"},
      {{.input = "", .out_dir = Tmp()}, "--input '': not given"},
      {{.input = Tmp(), .out_dir = Tmp()}, "is not a regular file"},
      {{.input = empty, .out_dir = Tmp()}, "empty or unreadable"},
      {{.input = text, .out_dir = "/no/such/dir"}, "--out_dir '/no/such/dir' is not an existing folder"},
      {{.input = text, .out_dir = text}, "is not an existing folder"},
      {{.input = text, .out_dir = Tmp(), .val_fraction = 1}, "--val_fraction=1 must be in [0, 1)"},
      {{.input = text, .out_dir = Tmp(), .val_fraction = -0.5}, "must be in [0, 1)"},
      {{.input = text, .out_dir = blocked}, "train.bin': it exists and is not a regular file"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PreparedData> r = PrepareTokenFiles(t, c.o);
    ASSERT_FALSE(r.ok()) << c.want;
    EXPECT_THAT(r.status().ToString(), HasSubstr(c.want));
  }
}

}  // namespace
}  // namespace shardmap
