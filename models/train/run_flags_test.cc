#include "models/train/run_flags.h"

#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"
#include "models/train/run_config.h"

// Two of the trainer's run settings, as the trainer defines them.
ABSL_FLAG(int64_t, batch, 8, "global batch");
ABSL_FLAG(double, lr, 1e-3, "learning rate");

namespace shardmap {
namespace {

// GivenOnCommandLine asks Abseil which flags the command line named: parse an empty one first.
void ParseEmptyCommandLine() {
  static const bool parsed = [] {
    static char program[] = "run_flags_test";
    char* argv[] = {program, nullptr};
    absl::ParseCommandLine(1, argv);
    return true;
  }();
  (void)parsed;
}

// The run's settings come from the header the caller parsed: no file is opened again (the path
// only names it in messages), so a resume reads its checkpoint's header once.
TEST(RunFlagsTest, AdoptsTheRunFromTheParsedHeaderWithoutOpeningTheFile) {
  ParseEmptyCommandLine();
  absl::FlagSaver saver;
  RunConfig saved{"run-abc", {{"batch", "4"}, {"lr", "0.02"}}};
  std::vector<std::string> notes;
  absl::StatusOr<ResumedRun> run =
      AdoptRunFlags(RunConfigMetadata(saved), "/no/such/dir/ck.step4.safetensors", &notes);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->run_id, "run-abc");
  ASSERT_TRUE(run->saved.has_value());
  EXPECT_EQ(absl::GetFlag(FLAGS_batch), 4);
  EXPECT_EQ(absl::GetFlag(FLAGS_lr), 0.02);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], "from the checkpoint's run: --batch=4 --lr=0.02");
}

TEST(RunFlagsTest, AHeaderWithoutARunChangesNothing) {
  ParseEmptyCommandLine();
  absl::FlagSaver saver;
  std::vector<std::string> notes;
  absl::StatusOr<ResumedRun> run =
      AdoptRunFlags({{"step", "3"}}, "/no/such/dir/old.safetensors", &notes);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->run_id, "");
  EXPECT_FALSE(run->saved.has_value());
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(absl::GetFlag(FLAGS_batch), 8);
}

TEST(RunFlagsTest, ADamagedSettingNamesTheFileAndTheKey) {
  ParseEmptyCommandLine();
  absl::FlagSaver saver;
  std::map<std::string, std::string> meta = RunConfigMetadata({"r1", {{"batch", "four"}}});
  std::vector<std::string> notes;
  absl::StatusOr<ResumedRun> run = AdoptRunFlags(meta, "ck.safetensors", &notes);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("checkpoint 'ck.safetensors': run.flag.batch = 'four'"),
            std::string::npos)
      << run.status();
  EXPECT_NE(run.status().message().find("give --batch explicitly"), std::string::npos);
  EXPECT_EQ(absl::GetFlag(FLAGS_batch), 8);
}

}  // namespace
}  // namespace shardmap
