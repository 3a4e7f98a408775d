#include "models/run/resume.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/run/train_flags.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/rank_state.h"
#include "models/train/run_config.h"

namespace shardmap {
namespace {

void ParseEmptyCommandLine() {  // GivenOnCommandLine asks Abseil what the command line named
  static const bool parsed = [] {
    static char program[] = "resume_test";
    char* argv[] = {program, nullptr};
    absl::ParseCommandLine(1, argv);
    return true;
  }();
  (void)parsed;
}

GptConfig Tiny() {
  GptConfig cfg;
  cfg.layers = 1;
  cfg.d_model = 16;
  cfg.heads = 4;
  cfg.vocab = 32;
  cfg.seq = 8;
  return cfg;
}

// A GPT-2 checkpoint of run "r7" (batch 4) at step 2. DamageHeader then breaks its JSON header
// in place: any reader that parses the file again fails, one that keeps the first parse does not.
std::string SaveCheckpoint(const GptLayout& layout) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/ck.safetensors";
  std::map<std::string, std::string> run = RunConfigMetadata({"r7", {{"batch", "4"}}});
  EXPECT_TRUE(SaveGptWithConfig(path, layout, layout.Init(1), nullptr, 2, run).ok());
  return path;
}

void DamageHeader(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "X", 1, 8), 1);  // the header's opening '{' (after its 8-byte length)
  ::close(fd);
  ASSERT_FALSE(OpenGptCheckpoint(path).ok()) << "a second parse must fail for this test to mean it";
}

// Issue 48: a resume parsed the checkpoint's header four times (the model check, the shape, the
// run's settings, the trainer). Each reader now takes the header OpenShapeSource parsed.
TEST(ResumeTest, EveryReaderUsesTheHeaderParsedOnce) {
  ParseEmptyCommandLine();
  absl::FlagSaver saver;
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), Tiny(), false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::string path = SaveCheckpoint(*layout);
  absl::StatusOr<ShapeSource> resume = OpenShapeSource(path, "");
  absl::StatusOr<ShapeSource> init = OpenShapeSource("", path);
  ASSERT_TRUE(resume.ok()) << resume.status();
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_TRUE(resume->resume());
  EXPECT_FALSE(init->resume());
  DamageHeader(path);

  EXPECT_TRUE(CheckFileModel(*resume, "gpt2").ok());
  absl::Status other = CheckFileModel(*resume, "llama3");
  EXPECT_NE(other.message().find("holds a gpt2 model but --model=llama3"), std::string::npos)
      << other;
  GptConfig cfg = Tiny();
  cfg.layers = 3;  // the flags' default; the file's shape wins
  std::string note;
  ASSERT_TRUE(AdoptShapeFrom(*resume, &cfg, &note).ok());
  EXPECT_EQ(cfg.layers, 1);
  EXPECT_EQ(note, "resumed from " + path + " at step 2");
  absl::StatusOr<ResumedRun> run = ContinueOrStartRun(*resume, &note);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->run_id, "r7");
  EXPECT_EQ(absl::GetFlag(FLAGS_batch), 4);

  // The trainer reads its blocks through the same parse (TrainOptions::checkpoint.opened).
  TrainOptions o;
  o.checkpoint.init_path = path;
  o.checkpoint.opened = init->file;
  absl::StatusOr<StateSource> source = OpenStateSource(*layout, {}, o);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->file, init->file);
  o.checkpoint.opened = nullptr;  // parsed again: the damage shows
  EXPECT_FALSE(OpenStateSource(*layout, {}, o).ok());
}

TEST(ResumeTest, AMissingFileIsRefusedNamingIt) {
  absl::StatusOr<ShapeSource> s = OpenShapeSource("/no/such/ck.safetensors", "");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/no/such/ck.safetensors"), std::string::npos) << s.status();
  absl::StatusOr<ShapeSource> none = OpenShapeSource("", "");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->file, nullptr);
  EXPECT_TRUE(CheckFileModel(*none, "llama3").ok());
}

}  // namespace
}  // namespace shardmap
