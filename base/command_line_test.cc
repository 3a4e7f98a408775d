#include "base/command_line.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, command_line_test_n, 1, "a flag for the test");

namespace shardmap::base {
namespace {

TEST(CommandLineTest, ProgramNameIsTheLastPathComponent) {
  EXPECT_EQ(ProgramName("bazel-bin/models/run/train_gpt"), "train_gpt");
  EXPECT_EQ(ProgramName("train"), "train");
  EXPECT_EQ(ProgramName(""), "");
}

TEST(CommandLineTest, RejectsTheFirstPositionalArgumentWithTheHint) {
  char prog[] = "prog", a[] = "stray", b[] = "more";
  EXPECT_TRUE(RejectPositionalArguments({prog}, "flags are --name=value").ok());
  const absl::Status s = RejectPositionalArguments({prog, a, b}, "put the program after --");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "unexpected argument 'stray' (put the program after --)");
  EXPECT_EQ(RejectPositionalArguments({prog, b}, "").message(), "unexpected argument 'more'");
}

TEST(CommandLineTest, HelpListsTheMainFileAndTheNamedLibraries) {
  const std::vector<std::string> libs = {"models/run/train_flags"};
  EXPECT_TRUE(HelpListsFlagsOf("models/run/train.cc", "train", {}));
  EXPECT_TRUE(HelpListsFlagsOf("models/run/train_main.cc", "train", {}));
  EXPECT_TRUE(HelpListsFlagsOf("x/train-main.cc", "train", {}));
  EXPECT_FALSE(HelpListsFlagsOf("models/run/train_gpt.cc", "train", {}));
  EXPECT_FALSE(HelpListsFlagsOf("models/run/train_flags.cc", "train_gpt", {}));
  EXPECT_TRUE(HelpListsFlagsOf("models/run/train_flags.cc", "train_gpt", libs));
  EXPECT_FALSE(HelpListsFlagsOf("models/planner/plan_gpt.cc", "train_gpt", libs));
}

TEST(CommandLineTest, ParsesFlagsAndRefusesAPositionalArgument) {
  char prog[] = "/bin/prog", flag[] = "--command_line_test_n=7", stray[] = "stray";
  char* argv[] = {prog, flag, stray, nullptr};
  const absl::Status s = ParseFlagsOnly(3, argv, {.usage = "prog --command_line_test_n=N"});
  EXPECT_EQ(s.message(), "unexpected argument 'stray' (flags are --name=value)");
  EXPECT_EQ(absl::GetFlag(FLAGS_command_line_test_n), 7);
}

TEST(CommandLineTest, ExitWithErrorReturnsTheUsageExitCode) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(ExitWithError("prog", absl::InvalidArgumentError("bad --x")), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: bad --x\n");
}

}  // namespace
}  // namespace shardmap::base
