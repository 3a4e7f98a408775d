#include "models/train/run_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

// An independent reference of HashContent: byte by byte, each word assembled by shifts, the
// lanes kept in an array.
uint64_t ReferenceHash(const std::string& s) {
  uint64_t lane[4];
  for (int i = 0; i < 4; ++i) lane[i] = 0xcbf29ce484222325ull + i;
  for (size_t i = 0, j = 0; i < s.size(); i += 8, ++j) {
    uint64_t w = 0;
    for (size_t k = 0; k < 8 && i + k < s.size(); ++k) {
      w |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
    }
    lane[j % 4] = (lane[j % 4] ^ w) * 0x100000001b3ull;
  }
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  uint64_t h = lane[0] ^ rotl(lane[1], 16) ^ rotl(lane[2], 32) ^ rotl(lane[3], 48) ^ s.size();
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/run_config_" +
         std::to_string(::getpid()) + "_" + name;
}

TEST(RunConfigTest, HashMatchesReferenceInAnyPieces) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(static_cast<char>((i * 131 + 7) % 256));
  for (size_t len : {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 999, 1000}) {
    const std::string part = s.substr(0, len);
    EXPECT_EQ(HashContent(part), ReferenceHash(part)) << len;
    for (size_t cut : {1, 3, 8, 13, 32, 37, 100}) {  // streamed in pieces of `cut` bytes
      ContentHasher h;
      for (size_t i = 0; i < part.size(); i += cut) h.Update(part.substr(i, cut));
      EXPECT_EQ(h.Finish(), ReferenceHash(part)) << len << " in pieces of " << cut;
    }
  }
  // The length counts (a trailing zero byte is another file), and one changed byte shows.
  EXPECT_NE(HashContent(std::string("a")), HashContent(std::string("a\0", 2)));
  std::string t = s;
  t[500] ^= 1;
  EXPECT_NE(HashContent(s), HashContent(t));
  t[500] ^= static_cast<char>(0x81);  // the top bit of a byte
  EXPECT_NE(HashContent(s), HashContent(t));
  // Word order counts, within a lane (words 0 and 4) and across lanes (words 0 and 1).
  for (size_t other : {8, 32}) {
    t = s;
    std::swap_ranges(t.begin(), t.begin() + 8, t.begin() + other);
    EXPECT_NE(HashContent(s), HashContent(t)) << other;
  }
}

TEST(RunConfigTest, IdentifyFileAndItsErrors) {
  const std::string path = TempPath("data.bin");
  std::string content(3 << 20, 'x');  // more than one read buffer
  content[2000000] = 'y';
  std::ofstream(path, std::ios::binary) << content;
  absl::StatusOr<FileIdentity> id = IdentifyFile(path);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->bytes, static_cast<int64_t>(content.size()));
  EXPECT_EQ(id->hash, ReferenceHash(content));
  EXPECT_EQ(id->path, path);
  EXPECT_EQ(IdentifyFile(TempPath("missing")).status().code(), absl::StatusCode::kNotFound);
  absl::Status dir = IdentifyFile("/tmp").status();
  EXPECT_EQ(dir.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(dir.message().find("not a regular file"), std::string::npos) << dir;
  absl::StatusOr<uint64_t> two = HashFiles({path, path});
  ASSERT_TRUE(two.ok());
  EXPECT_NE(*two, *HashFiles({path}));
}

TEST(RunConfigTest, MetadataRoundTrip) {
  RunConfig run;
  run.id = NewRunId();
  run.flags = {{"batch", "4"}, {"lr", "0.01"}, {"mesh", "dp=2,tp=2"}};
  run.data = FileIdentity{"train.bin", 1234, 0xfedcba9876543210ull};
  run.tokenizer_hash = 42;
  std::map<std::string, std::string> m = RunConfigMetadata(run);
  EXPECT_EQ(m.at("run.data.hash"), "fedcba9876543210");
  EXPECT_EQ(m.at("run.flag.batch"), "4");
  absl::StatusOr<RunConfig> back = RunConfigFromMetadata(m);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, run.id);
  EXPECT_EQ(back->flags, run.flags);
  ASSERT_TRUE(back->data.has_value());
  EXPECT_EQ(back->data->hash, run.data->hash);
  EXPECT_EQ(back->data->bytes, 1234);
  EXPECT_EQ(back->data->path, "train.bin");
  EXPECT_EQ(back->tokenizer_hash, 42u);
  EXPECT_EQ(RunConfigFromMetadata({{"step", "3"}}).status().code(), absl::StatusCode::kNotFound);
  m["run.data.hash"] = "xyz";
  absl::Status bad = RunConfigFromMetadata(m).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'run.data.hash' = 'xyz' is not 16 hex digits"), std::string::npos)
      << bad;
}

TEST(RunConfigTest, NewRunIdsAreHexAndDiffer) {
  const std::string a = NewRunId(), b = NewRunId();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

RunConfig Saved() {
  RunConfig run;
  run.flags = {{"batch", "4"}, {"lr", "0.01"}, {"seed", "1"}, {"data_order", "random"},
               {"val_fraction", "0"}, {"text", "a.txt"}, {"data", ""}};
  return run;
}

TEST(RunConfigTest, AdoptsWhatIsNotGivenAndNotesWhatChanges) {
  // Defaults: batch 8, lr 0.001. Not given: the run's values. --lr given: a note.
  std::map<std::string, std::string> now = {{"batch", "8"}, {"lr", "0.02"}, {"seed", "1"},
                                            {"data_order", "random"}, {"val_fraction", "0"},
                                            {"text", ""}, {"data", ""}};
  absl::StatusOr<Reconciled> r = ReconcileRunConfig(Saved(), now, {"lr"}, "ck");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->adopt, (std::map<std::string, std::string>{{"batch", "4"}, {"text", "a.txt"}}));
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_EQ(r->notes[0], "note: --lr=0.02 changes the run's lr '0.01' (ck)");
  // A flag given at its default value is given: --batch=8 changes the run's 4 (not adopted).
  r = ReconcileRunConfig(Saved(), now, {"batch", "lr"}, "ck");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->adopt.count("batch"), 0u);
  ASSERT_EQ(r->notes.size(), 2u);
  EXPECT_EQ(r->notes[0], "note: --batch=8 changes the run's batch '4' (ck)");
  // The data flags are one group: --data given, --text is not taken from the file either.
  now["data"] = "b.bin";
  r = ReconcileRunConfig(Saved(), now, {"data"}, "ck");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->adopt.count("text"), 0u);
  // Settings the file lacks are left alone.
  RunConfig old;
  old.flags = {{"batch", "4"}};
  r = ReconcileRunConfig(old, now, {}, "ck");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->adopt, (std::map<std::string, std::string>{{"batch", "4"}}));
}

TEST(RunConfigTest, RefusesWhatCannotChange) {
  std::map<std::string, std::string> now = Saved().flags;
  now["seed"] = "2";
  absl::Status s = ReconcileRunConfig(Saved(), now, {"seed"}, "ck").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--seed=2 but the run in 'ck' has seed '1' (its batches are drawn "
                             "in random order from that seed), which cannot change mid-run: "
                             "drop --seed"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--init=ck"), std::string::npos) << s;
  // Under sequential order the seed only drew the initial weights: a note.
  RunConfig seq = Saved();
  seq.flags["data_order"] = "sequential";
  now["data_order"] = "sequential";
  absl::StatusOr<Reconciled> r = ReconcileRunConfig(seq, now, {"seed"}, "ck");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->notes.size(), 1u);
  now = Saved().flags;
  now["val_fraction"] = "0.1";
  s = ReconcileRunConfig(Saved(), now, {"val_fraction"}, "ck").status();
  EXPECT_NE(s.message().find("--val_fraction=0.1 but the run in 'ck' has val_fraction '0' (it "
                             "decides which tokens are trained on)"),
            std::string::npos)
      << s;
}

TEST(RunConfigTest, DataAndTokenizerMustBeTheRuns) {
  RunConfig saved;
  saved.data = FileIdentity{"a.txt", 10, 7};
  std::vector<std::string> notes;
  EXPECT_TRUE(CheckSameData(saved, FileIdentity{"a.txt", 10, 7}, std::nullopt, "ck", &notes).ok());
  EXPECT_TRUE(notes.empty());
  EXPECT_TRUE(CheckSameData(saved, FileIdentity{"b.txt", 10, 7}, std::nullopt, "ck", &notes).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], "note: the training data 'b.txt' has the content of the run's 'a.txt'");
  absl::Status s = CheckSameData(saved, FileIdentity{"a.txt", 10, 8}, std::nullopt, "ck", &notes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the training data 'a.txt' (10 bytes, hash 0000000000000008) is not "
                             "the run's: 'ck' was trained on 'a.txt' (10 bytes, hash "
                             "0000000000000007)"),
            std::string::npos)
      << s;
  saved.tokenizer_hash = 5;
  s = CheckSameData(saved, std::nullopt, 6, "ck", &notes);
  EXPECT_NE(s.message().find("the tokenizer (0000000000000006) is not the run's "
                             "(0000000000000005)"),
            std::string::npos)
      << s;
  s = CheckSameData(saved, std::nullopt, std::nullopt, "ck", &notes);
  EXPECT_NE(s.message().find("the tokenizer (none) is not the run's"), std::string::npos) << s;
  EXPECT_TRUE(CheckSameData(saved, std::nullopt, 5, "ck", &notes).ok());
}

}  // namespace
}  // namespace shardmap
