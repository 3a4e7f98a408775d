#include "models/train/checkpoint_rotation.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "models/components/atomic_file.h"
#include "models/components/checkpoint.h"
#include "models/gpt.h"
#include "models/gpt/gpt_checkpoint.h"

namespace shardmap {
namespace {

class CheckpointRotationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    static int n = 0;
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/rotation_" +
           std::to_string(::getpid()) + "_" + std::to_string(n++);
    ASSERT_EQ(::mkdir(dir_.c_str(), 0755), 0);
  }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir_.c_str());
    while (const dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dir_;
};

std::string Read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A writer that writes `text` whole, atomically (as WriteSafetensors).
std::function<absl::Status(const std::string&)> TextWriter(const std::string& text) {
  return [text](const std::string& path) {
    return WriteFileAtomically(path,
                               [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
  };
}

// A plain file at `path` (not atomic): the files a test plants.
void Plant(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST_F(CheckpointRotationTest, NamesFiles) {
  EXPECT_EQ((CheckpointRotation{dir_, 2}).PathFor(7), dir_ + "/gpt.step7.safetensors");
  EXPECT_EQ((CheckpointRotation{dir_ + "/", 2}).PathFor(7), dir_ + "/gpt.step7.safetensors");
  EXPECT_EQ((CheckpointRotation{dir_ + "/run", 2}).PathFor(12), dir_ + "/run.step12.safetensors");
  EXPECT_EQ((CheckpointRotation{dir_ + "/ckpt.safetensors", 2}).PathFor(3),
            dir_ + "/ckpt.step3.safetensors");
  EXPECT_EQ((CheckpointRotation{"ckpt", 2}).PathFor(3), "./ckpt.step3.safetensors");
}

TEST_F(CheckpointRotationTest, KeepsTheLastKAndFindsTheLatest) {
  CheckpointRotation r{dir_ + "/run", 2};
  ASSERT_TRUE(r.CheckWritable().ok());
  EXPECT_EQ(r.Latest().status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.Latest().status().message().find(dir_ + "/run.step<N>.safetensors"),
            std::string::npos)
      << r.Latest().status();
  for (int64_t step : {10, 20, 30, 40}) {
    absl::StatusOr<std::string> p = r.Save(step, TextWriter("step " + std::to_string(step)));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, r.PathFor(step));
    EXPECT_EQ(Read(*p), "step " + std::to_string(step));
  }
  EXPECT_EQ(Files(), (std::vector<std::string>{"run.step30.safetensors",
                                               "run.step40.safetensors"}));
  EXPECT_EQ(*r.Latest(), r.PathFor(40));
  // Steps compare as numbers (step100 after step40), other prefixes and odd names are ignored.
  TextWriter("x")(dir_ + "/other.step999.safetensors").IgnoreError();
  TextWriter("x")(dir_ + "/run.stepX.safetensors").IgnoreError();
  Plant(dir_ + "/run.step50.safetensors.tmp.123", "x");
  ASSERT_TRUE(r.Save(100, TextWriter("step 100")).ok());
  EXPECT_EQ(*r.Latest(), r.PathFor(100));
  auto list = r.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].first, 40);
  EXPECT_EQ((*list)[1].first, 100);
  EXPECT_EQ(Files(), (std::vector<std::string>{"other.step999.safetensors",
                                               "run.step100.safetensors",
                                               "run.step40.safetensors",
                                               "run.step50.safetensors.tmp.123",
                                               "run.stepX.safetensors"}));
}

TEST_F(CheckpointRotationTest, NewerFilesOfAnotherRunAreNotCountedOrDeleted) {
  CheckpointRotation r{dir_, 1};
  ASSERT_TRUE(r.Save(500, TextWriter("old run")).ok());
  ASSERT_TRUE(r.Save(5, TextWriter("new run")).ok());  // never deletes what it just wrote
  ASSERT_TRUE(r.Save(6, TextWriter("new run")).ok());
  EXPECT_EQ(Files(), (std::vector<std::string>{"gpt.step500.safetensors",
                                               "gpt.step6.safetensors"}));
  CheckpointRotation all{dir_, 0};
  ASSERT_TRUE(all.Save(7, TextWriter("7")).ok());
  ASSERT_TRUE(all.Save(8, TextWriter("8")).ok());
  EXPECT_EQ(Files().size(), 4u);
}

TEST_F(CheckpointRotationTest, AFailedWriteLeavesThePreviousCheckpoints) {
  CheckpointRotation r{dir_ + "/run", 2};
  ASSERT_TRUE(r.Save(1, TextWriter("good 1")).ok());
  ASSERT_TRUE(r.Save(2, TextWriter("good 2")).ok());
  // A writer that dies half way (a full disk): partial bytes, then an error.
  auto dying = [](const std::string& path) {
    return WriteFileAtomically(path, [](int fd) {
      WriteAll(fd, "partial heade", 13);
      errno = ENOSPC;
      return false;
    });
  };
  absl::StatusOr<std::string> s = r.Save(3, dying);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("saving step 3 to '" + r.PathFor(3) + "' failed: writing '" +
                                      r.PathFor(3) + "' failed: No space left on device"),
            std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("earlier checkpoints are untouched"), std::string::npos);
  EXPECT_EQ(Files(), (std::vector<std::string>{"run.step1.safetensors",
                                               "run.step2.safetensors"}));  // no tmp left
  EXPECT_EQ(Read(r.PathFor(1)), "good 1");
  EXPECT_EQ(Read(r.PathFor(2)), "good 2");
  EXPECT_EQ(*r.Latest(), r.PathFor(2));
  // Overwriting an existing step with a failing writer keeps the old file too.
  ASSERT_FALSE(r.Save(2, dying).ok());
  EXPECT_EQ(Read(r.PathFor(2)), "good 2");
  // A writer that reports success but wrote nothing.
  auto lazy = [](const std::string&) { return absl::OkStatus(); };
  EXPECT_EQ(r.Save(4, lazy).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.Save(-1, TextWriter("x")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointRotationTest, CheckWritableBeforeTraining) {
  EXPECT_TRUE((CheckpointRotation{dir_ + "/run", 3}).CheckWritable().ok());
  EXPECT_TRUE(Files().empty());  // the probe is removed
  absl::Status missing = CheckpointRotation{dir_ + "/nodir/run", 3}.CheckWritable();
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.message().find("'" + dir_ + "/nodir' (of '" + dir_ + "/nodir/run') does not "
                                   "exist"),
            std::string::npos)
      << missing;
  TextWriter("x")(dir_ + "/file").IgnoreError();
  absl::Status file = CheckpointRotation{dir_ + "/file/run", 3}.CheckWritable();
  EXPECT_EQ(file.code(), absl::StatusCode::kFailedPrecondition) << file;
  absl::Status proc = CheckpointRotation{"/proc/run", 3}.CheckWritable();
  EXPECT_EQ(proc.code(), absl::StatusCode::kFailedPrecondition) << proc;
  EXPECT_NE(proc.message().find("cannot create files"), std::string::npos) << proc;
  EXPECT_EQ((CheckpointRotation{"", 3}).CheckWritable().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((CheckpointRotation{dir_, -1}).Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GptConfigMetadataTest, RoundTrip) {
  GptConfig c{.layers = 3, .d_model = 24, .heads = 6, .vocab = 50304, .seq = 1024,
              .dtype = DType::kF32};
  c.compute = DType::kBF16;
  c.moe.experts = 8;
  c.moe.topk = 2;
  c.moe.capacity_factor = 1.0 / 3;
  c.moe.aux_loss_coef = 0.01;
  c.moe.expert_axes = {"dp", "ep"};
  absl::StatusOr<GptConfig> back = GptConfigFromMetadata(GptConfigMetadata(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layers, 3);
  EXPECT_EQ(back->d_model, 24);
  EXPECT_EQ(back->heads, 6);
  EXPECT_EQ(back->vocab, 50304);
  EXPECT_EQ(back->seq, 1024);
  EXPECT_EQ(back->dtype, DType::kF32);
  EXPECT_EQ(back->compute, DType::kBF16);
  EXPECT_EQ(back->moe.experts, 8);
  EXPECT_EQ(back->moe.topk, 2);
  EXPECT_EQ(back->moe.capacity_factor, 1.0 / 3);  // exact: 17 significant digits
  EXPECT_EQ(back->moe.aux_loss_coef, 0.01);
  EXPECT_EQ(back->moe.expert_axes, (std::vector<std::string>{"dp", "ep"}));
  GptConfig plain{.dtype = DType::kF64};
  absl::StatusOr<GptConfig> p = GptConfigFromMetadata(GptConfigMetadata(plain));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->compute.has_value());
  EXPECT_EQ(p->dtype, DType::kF64);
  EXPECT_FALSE(p->moe.on());
  EXPECT_TRUE(p->moe.expert_axes.empty());
}

TEST(GptConfigMetadataTest, ValidationErrors) {
  const auto good = GptConfigMetadata(GptConfig{});
  auto with = [&](const std::string& key, const std::string& value) {
    auto m = good;
    m[key] = value;
    return GptConfigFromMetadata(m).status();
  };
  auto expect = [](const absl::Status& s, absl::StatusCode code, const std::string& needle) {
    EXPECT_EQ(s.code(), code) << needle << ": " << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
    EXPECT_NE(s.message().find("--layers"), std::string::npos) << s;  // the fix
  };
  expect(with("gpt.layers", "two"), absl::StatusCode::kInvalidArgument,
         "'gpt.layers' = 'two' is not an integer");
  expect(with("gpt.d_model", "0"), absl::StatusCode::kInvalidArgument,
         "'gpt.d_model' = 0 must be >= 1");
  expect(with("gpt.vocab", "-5"), absl::StatusCode::kInvalidArgument, "'gpt.vocab' = -5");
  expect(with("gpt.seq", "1.5"), absl::StatusCode::kInvalidArgument, "'gpt.seq' = '1.5'");
  expect(with("gpt.heads", "5"), absl::StatusCode::kInvalidArgument,
         "d_model 16 is not divisible by heads 5");
  expect(with("gpt.dtype", "int8"), absl::StatusCode::kInvalidArgument, "'gpt.dtype' = 'int8'");
  expect(with("gpt.compute", "i64"), absl::StatusCode::kInvalidArgument, "'gpt.compute'");
  expect(with("gpt.moe.capacity_factor", "nan"), absl::StatusCode::kInvalidArgument,
         "not a finite number");
  auto moe = good;
  moe["gpt.moe.experts"] = "2";
  moe["gpt.moe.topk"] = "3";  // more choices than experts: ValidateMoeConfig's error
  expect(GptConfigFromMetadata(moe).status(), absl::StatusCode::kInvalidArgument, "metadata: ");
  expect(with("gpt.moe.experts", "-2"), absl::StatusCode::kInvalidArgument,
         "'gpt.moe.experts' = -2");
  auto missing = good;
  missing.erase("gpt.heads");
  expect(GptConfigFromMetadata(missing).status(), absl::StatusCode::kNotFound,
         "lacks 'gpt.heads'");
}

TEST(GptConfigMetadataTest, StepValidation) {
  auto step = [](const std::string& v) { return StepFromMetadata({{"step", v}}); };
  EXPECT_EQ(*step("0"), 0);
  EXPECT_EQ(*step("12345"), 12345);
  EXPECT_EQ(*step("9007199254740992"), int64_t{1} << 53);
  for (const char* bad : {"-1", "9007199254740993", "4611686018427387904", "1e3", "abc", "",
                          "99999999999999999999999"}) {
    EXPECT_EQ(step(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(step("-1").status().message().find("outside [0, 2^53]"), std::string::npos);
  EXPECT_EQ(StepFromMetadata({}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointRotationTest, GptCheckpointWithConfigRoundTrips) {
  GptConfig c{.layers = 1, .d_model = 8, .heads = 2, .vocab = 16, .seq = 4};
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp=1"), c, false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<NamedTensor> params = InitGpt(c, 3);
  AdamState moments{InitGpt(c, 4), InitGpt(c, 5)};
  CheckpointRotation r{dir_ + "/gpt", 2};
  for (int64_t step : {100, 200, 300}) {
    absl::StatusOr<std::string> path = r.Save(step, [&](const std::string& tmp) {
      return SaveGptWithConfig(tmp, *layout, params, &moments, step);
    });
    ASSERT_TRUE(path.ok()) << path.status();
  }
  EXPECT_EQ(Files().size(), 2u);
  absl::StatusOr<std::string> latest = r.Latest();
  ASSERT_TRUE(latest.ok());
  absl::StatusOr<GptCheckpointInfo> info = ReadGptCheckpointInfo(*latest);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 300);
  EXPECT_EQ(info->config.d_model, 8);
  EXPECT_EQ(info->config.seq, 4);
  // The file is a full --resume checkpoint for the existing reader, on another mesh too.
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(*latest);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<GptLayout> tp = GptLayout::Create(*ParseMesh("tp=2"), info->config, false);
  ASSERT_TRUE(tp.ok());
  EXPECT_TRUE(CheckGptCheckpoint(*f, *tp, /*need_optimizer=*/true).ok());
  absl::StatusOr<Tensor> wte = f->Read("wte.weight");
  ASSERT_TRUE(wte.ok());
  EXPECT_EQ(wte->ToVector<float>(), params[0].tensor.ToVector<float>());
  // A parameters-only file (SaveGpt) has no config: a clear error with the fix.
  ASSERT_TRUE(SaveGpt(dir_ + "/plain.safetensors", *layout, params, nullptr, 0).ok());
  absl::StatusOr<GptCheckpointInfo> plain = ReadGptCheckpointInfo(dir_ + "/plain.safetensors");
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(plain.status().message().find("checkpoint '" + dir_ + "/plain.safetensors'"),
            std::string::npos)
      << plain.status();
  EXPECT_NE(plain.status().message().find("--layers"), std::string::npos);
  // Mismatched tensors are refused.
  std::vector<NamedTensor> short_list(params.begin(), params.end() - 1);
  EXPECT_EQ(SaveGptWithConfig(dir_ + "/x.safetensors", *layout, short_list, nullptr, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SaveGptWithConfig(dir_ + "/x.safetensors", *layout, params, nullptr, -1).code(),
            absl::StatusCode::kInvalidArgument);
}

// A save cut short leaves a newest file that is no checkpoint: --resume=auto's LatestComplete
// passes over it, naming it, to the newest complete one.
TEST_F(CheckpointRotationTest, LatestCompleteSkipsACorruptNewestFile) {
  GptConfig c{.layers = 1, .d_model = 8, .heads = 2, .vocab = 16, .seq = 4};
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp=1"), c, false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<NamedTensor> params = InitGpt(c, 3);
  CheckpointRotation r{dir_ + "/gpt", 0};
  absl::StatusOr<std::string> good = r.Save(2, [&](const std::string& tmp) {
    return SaveGptWithConfig(tmp, *layout, params, nullptr, 2);
  });
  ASSERT_TRUE(good.ok()) << good.status();
  std::vector<std::string> skipped;
  EXPECT_EQ(*r.LatestComplete(&skipped), *good);
  EXPECT_TRUE(skipped.empty());
  const std::string full = Read(*good);
  ASSERT_TRUE(TextWriter(full.substr(0, full.size() / 2))(r.PathFor(5)).ok());  // truncated
  ASSERT_TRUE(TextWriter("not a safetensors file")(r.PathFor(7)).ok());
  EXPECT_EQ(*r.Latest(), r.PathFor(7));
  absl::StatusOr<std::string> complete = r.LatestComplete(&skipped);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_EQ(*complete, *good);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].rfind(r.PathFor(7) + ": ", 0), 0u) << skipped[0];
  EXPECT_EQ(skipped[1].rfind(r.PathFor(5) + ": ", 0), 0u) << skipped[1];
  // Nothing complete at all: NotFound naming every file passed over.
  ASSERT_EQ(std::remove(good->c_str()), 0);
  skipped.clear();
  absl::StatusOr<std::string> none = r.LatestComplete(&skipped);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(r.PathFor(5)), std::string::npos) << none.status();
}

// Issue 37: a fresh run under a prefix that held an older run's steps 5 and 10 pruned its own
// step 2 but kept the older 5 and 10, and --resume=auto then continued the older run. With run
// ids, each run prunes and resumes only its own checkpoints, and ListRuns tells them apart.
TEST_F(CheckpointRotationTest, RunIdsKeepRunsApart) {
  GptConfig c{.layers = 1, .d_model = 8, .heads = 2, .vocab = 16, .seq = 4};
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp=1"), c, false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<NamedTensor> params = InitGpt(c, 3);
  auto save = [&](CheckpointRotation& r, int64_t step) {
    absl::StatusOr<std::string> p = r.Save(step, [&](const std::string& tmp) {
      return SaveGptWithConfig(tmp, *layout, params, nullptr, step, {{"run.id", *r.run_id}});
    });
    ASSERT_TRUE(p.ok()) << p.status();
  };
  CheckpointRotation old_run{dir_ + "/gpt", 1, "aaaa"};
  save(old_run, 5);
  old_run.keep_last = 0;
  save(old_run, 10);
  CheckpointRotation new_run{dir_ + "/gpt", 1, "bbbb"};
  save(new_run, 1);
  save(new_run, 2);  // prunes its own step 1, not the other run's 5 and 10
  save(new_run, 3);  // prunes its own step 2
  EXPECT_EQ(Files(), (std::vector<std::string>{"gpt.step10.safetensors", "gpt.step3.safetensors",
                                               "gpt.step5.safetensors"}));
  std::vector<std::string> skipped;
  EXPECT_EQ(*new_run.LatestComplete(&skipped), new_run.PathFor(3));
  EXPECT_EQ(*old_run.LatestComplete(&skipped), old_run.PathFor(10));
  EXPECT_TRUE(skipped.empty());
  // Without a run id, every file counts (what --resume=auto did before run ids).
  CheckpointRotation any{dir_ + "/gpt", 1};
  EXPECT_EQ(*any.LatestComplete(&skipped), any.PathFor(10));
  std::vector<std::string> unreadable;
  ASSERT_TRUE(TextWriter("junk")(any.PathFor(7)).ok());
  auto runs = any.ListRuns(&unreadable);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ(runs->at("aaaa").size(), 2u);
  EXPECT_EQ(runs->at("aaaa")[1].first, 10);
  EXPECT_EQ(runs->at("bbbb").size(), 1u);
  EXPECT_EQ(unreadable, std::vector<std::string>{any.PathFor(7)});
  EXPECT_EQ(*CheckpointRunId(any.PathFor(3)), "bbbb");
  // A run with no checkpoint of its own under the prefix: NotFound naming the run.
  CheckpointRotation third{dir_ + "/gpt", 1, "cccc"};
  absl::Status none = third.LatestComplete(&skipped).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.message().find(any.PathFor(7)), std::string::npos) << none;
  ASSERT_EQ(std::remove(any.PathFor(7).c_str()), 0);
  skipped.clear();
  none = third.LatestComplete(&skipped).status();
  EXPECT_NE(none.message().find("no checkpoint of run cccc under"), std::string::npos) << none;
  // Past the other run's steps, pruning still deletes only its own older files.
  save(new_run, 20);
  EXPECT_EQ(Files(), (std::vector<std::string>{"gpt.step10.safetensors", "gpt.step20.safetensors",
                                               "gpt.step5.safetensors"}));
}

// A killed save leaves <final>.tmp.<pid>: the next run removes those of dead processes and keeps
// a live writer's (and other prefixes' files).
TEST_F(CheckpointRotationTest, RemovesTheTemporariesOfKilledSaves) {
  CheckpointRotation r{dir_ + "/gpt", 3};
  const pid_t dead = ::fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);  // reaped: no such process any more
  const std::string stale = r.PathFor(4) + ".tmp." + std::to_string(dead);
  const std::string live = r.PathFor(6) + ".tmp." + std::to_string(::getpid());
  const std::string other = dir_ + "/other.step4.safetensors.tmp." + std::to_string(dead);
  // Today's names (<final>.tmp.<pid>.<random>) and the doubled ones of older saves.
  const std::string stale_new = r.PathFor(5) + ".tmp." + std::to_string(dead) + ".aB3xYz";
  const std::string stale_doubled =
      r.PathFor(7) + ".tmp." + std::to_string(dead) + ".tmp." + std::to_string(dead);
  // The final --save file's (<prefix>.safetensors) temporary of a killed run.
  const std::string stale_final = dir_ + "/gpt.safetensors.tmp." + std::to_string(dead) + ".q1w2e3";
  for (const std::string& p : {stale, live, other, stale_new, stale_doubled, stale_final}) {
    Plant(p, "x");
  }
  absl::StatusOr<std::vector<std::string>> removed = r.RemoveStaleTemporaries();
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed,
            (std::vector<std::string>{stale_final, stale, stale_new, stale_doubled}));
  EXPECT_EQ(Files(), (std::vector<std::string>{"gpt.step6.safetensors.tmp." +
                                                   std::to_string(::getpid()),
                                               "other.step4.safetensors.tmp." +
                                                   std::to_string(dead)}));
  // A prefix whose directory does not exist yet has nothing to remove.
  const CheckpointRotation missing{dir_ + "/none/gpt", 3};
  EXPECT_TRUE(missing.RemoveStaleTemporaries()->empty());
}

// The fault probe's case: symlinks planted at every name a save used to open with O_TRUNC (the
// probe, the step's temporary and its doubled one) and at the final name. Nothing outside the
// directory is written; the final name is a regular file.
TEST_F(CheckpointRotationTest, PlantedSymlinksAreNeverWrittenThrough) {
  const std::string victim = dir_ + "_victim";
  Plant(victim, "precious");
  CheckpointRotation r{dir_ + "/run", 2};
  const std::string pid = std::to_string(::getpid());
  for (const std::string& name :
       {dir_ + "/.write_probe." + pid, r.PathFor(3) + ".tmp." + pid,
        r.PathFor(3) + ".tmp." + pid + ".tmp." + pid, r.PathFor(3)}) {
    ASSERT_EQ(::symlink(victim.c_str(), name.c_str()), 0) << name;
  }
  ASSERT_TRUE(r.CheckWritable().ok());
  absl::StatusOr<std::string> p = r.Save(3, TextWriter("step 3"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Read(victim), "precious");
  struct stat st;
  ASSERT_EQ(::lstat(p->c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(Read(*p), "step 3");
}

// A FIFO named like the newest checkpoint (no writer: an open that waited would hang forever)
// is passed over, naming it, and the run resumes from the one before.
TEST_F(CheckpointRotationTest, AFifoNamedLikeACheckpointIsPassedOver) {
  CheckpointRotation r{dir_ + "/run", 0};
  ASSERT_EQ(::mkfifo(r.PathFor(9).c_str(), 0600), 0);
  std::vector<std::string> skipped;
  absl::StatusOr<std::string> latest = r.LatestComplete(&skipped);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find(r.PathFor(9) + ": safetensors file '" + r.PathFor(9) +
                            "' is a FIFO (named pipe), not a regular file"),
            std::string::npos)
      << skipped[0];
  std::vector<std::string> unreadable;
  ASSERT_TRUE(r.ListRuns(&unreadable).ok());
  EXPECT_EQ(unreadable, std::vector<std::string>{r.PathFor(9)});
}

}  // namespace
}  // namespace shardmap
