// LoadTextTokenizer tells the tokenizer by the path's content: Llama 3's tokenizer.model (the
// known-answer subset of testdata/llama3), a folder of GPT-2's files (the subset of testdata)
// or of a tokenizer.model; anything else is an error saying what the path looks like.
#include "models/data/text_tokenizer.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
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

void Write(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

std::vector<int32_t> ReadIds(const std::string& path) {
  std::vector<int32_t> ids;
  for (absl::string_view l : absl::StrSplit(Read(path), '\n', absl::SkipEmpty())) {
    int32_t id = 0;
    EXPECT_TRUE(absl::SimpleAtoi(l, &id)) << l;
    ids.push_back(id);
  }
  return ids;
}

std::string TmpDir(const std::string& name) {
  const std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

TEST(TextTokenizerTest, ATokenizerModelIsLlama3) {
  const std::string path = kDir + "llama3/llama3_subset.tiktoken";  // told by content, not name
  absl::StatusOr<std::unique_ptr<TextTokenizer>> t = LoadTextTokenizer(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), "Llama 3 (tiktoken)");
  EXPECT_EQ((*t)->vocab_size(), 128256);
  EXPECT_EQ((*t)->Encode(Read(kDir + "llama3/mixed.txt")), ReadIds(kDir + "llama3/mixed.ids"));
  EXPECT_EQ(*TextTokenizerFiles(path), std::vector<std::string>{path});
  // A folder holding a tokenizer.model.
  const std::string dir = TmpDir("llama3");
  Write(dir + "/tokenizer.model", Read(path));
  t = LoadTextTokenizer(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), "Llama 3 (tiktoken)");
}

TEST(TextTokenizerTest, AFolderOfGpt2Files) {
  const std::string dir = TmpDir("gpt2");
  Write(dir + "/encoder.json", Read(kDir + "gpt2_subset_encoder.json"));
  Write(dir + "/vocab.bpe", Read(kDir + "gpt2_subset_vocab.bpe"));
  absl::StatusOr<std::unique_ptr<TextTokenizer>> t = LoadTextTokenizer(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), "GPT-2 BPE");
  EXPECT_EQ((*t)->Encode(Read(kDir + "texts/english.txt")), ReadIds(kDir + "english.ids"));
  EXPECT_EQ(*TextTokenizerFiles(dir),
            (std::vector<std::string>{dir + "/encoder.json", dir + "/vocab.bpe"}));
}

TEST(TextTokenizerTest, OtherPathsSayWhatTheyLookLike) {
  const std::string dir = TmpDir("bad");
  Write(dir + "/sp.model", std::string("\x0a\x0b\x0a\x05<unk>", 9));
  Write(dir + "/empty.model", "");
  Write(dir + "/words.txt", "hello world\n");
  Write(dir + "/broken.model", "IQ== 0\nIg== 0\n");
  struct Case {
    std::string path, want;
  };
  const std::vector<Case> cases = {
      {kDir + "gpt2_subset_encoder.json", "it looks like JSON"},
      {kDir + "gpt2_subset_vocab.bpe", "it looks like GPT-2's vocab.bpe"},
      {dir + "/sp.model", "SentencePiece model (Llama 1 and 2's tokenizer.model)"},
      {dir + "/empty.model", "it is empty"},
      {dir + "/words.txt", "is neither a tiktoken tokenizer.model"},
      {dir, "needs encoder.json and vocab.bpe (GPT-2's files) or vocab.json and merges.txt "
            "(Hugging Face's) or tokenizer.model (Llama 3's)"},
      {dir + "/missing", "give Llama 3's tokenizer.model or a folder"},
      {dir + "/broken.model", "line 2: rank 0 is already given at line 1"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<TextTokenizer>> t = LoadTextTokenizer(c.path);
    ASSERT_FALSE(t.ok()) << c.path;
    EXPECT_THAT(t.status().message(), HasSubstr(c.path)) << t.status();
    EXPECT_THAT(t.status().message(), HasSubstr(c.want)) << t.status();
  }
}

}  // namespace
}  // namespace shardmap
