#include "models/train/mfu.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/planner/plan.h"

namespace shardmap {
namespace {

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  static int n = 0;
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/mfu_" + std::to_string(::getpid()) + "_" +
         std::to_string(n++);
}

// The step line's FLOPs per token (ModelFlopsPerStep / tokens, nanoGPT's estimate_mfu) by hand:
// GPT-2 small. N without wpe: per block 12 d^2 + 13 d = 7,087,872 (x12 = 85,054,464), wte
// 50257 x 768 = 38,597,376, ln_f 1,536: 123,653,376 (nanoGPT prints "123.65M"). 6N =
// 741,920,256; attention 12 L H Q T = 12 x 12 x 768 x 1024 = 113,246,208.
TEST(MfuTest, FlopsPerTokenIsNanoGptsEstimate) {
  GptConfig gpt2{.layers = 12, .d_model = 768, .heads = 12, .vocab = 50257, .seq = 1024};
  EXPECT_DOUBLE_EQ(planner::ModelFlopsPerStep(gpt2, 1) / 1024, 855166464.0);
  EXPECT_DOUBLE_EQ(planner::ModelFlopsPerStep(gpt2, 8) / (8 * 1024), 855166464.0);
  // A small model: N counted from its layout's tensors (every parameter but wpe).
  GptConfig small{.layers = 3, .d_model = 16, .heads = 4, .vocab = 96, .seq = 12};
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), small, false);
  ASSERT_TRUE(layout.ok());
  double n = 0;
  for (const ParamInfo& p : layout->params()) {
    if (p.name != "wpe.weight") n += static_cast<double>(NumElements(p.global_shape));
  }
  EXPECT_DOUBLE_EQ(planner::ModelFlopsPerStep(small, 1) / 12, 6 * n + 12.0 * 3 * 16 * 12);
}

TEST(MfuTest, CacheWritesReadsAndKeepsOtherKeys) {
  const std::string path = TempDir() + "/sub/dir/peak.txt";  // directories are created
  ASSERT_TRUE(WritePeakCache(path, "cpu A|2 threads|f32", 1.5e9).ok());
  ASSERT_TRUE(WritePeakCache(path, "cpu A|2 threads|f64", 7e8).ok());
  ASSERT_TRUE(WritePeakCache(path, "cpu A|2 threads|f32", 2.5e9).ok());  // replaced
  absl::StatusOr<std::map<std::string, double>> c = ReadPeakCache(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, (std::map<std::string, double>{{"cpu A|2 threads|f32", 2.5e9},
                                               {"cpu A|2 threads|f64", 7e8}}));
  EXPECT_EQ(ReadPeakCache(TempDir() + "/none.txt").status().code(), absl::StatusCode::kNotFound);
  // A cached key is used as it is (nothing measured: the value is the file's).
  ASSERT_TRUE(WritePeakCache(path, CpuPeakKey(DType::kF32), 1234.5).ok());
  absl::StatusOr<CpuPeak> p = CpuPeakFlops(DType::kF32, path);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->flops, 1234.5);
  EXPECT_EQ(p->source, "cached in " + path);
}

TEST(MfuTest, AnInvalidCacheIsNamedAndMeasuredOver) {
  const std::string dir = TempDir();
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/peak.txt";
  for (const std::string& bad : {std::string("no tab here\n"), std::string("k\t-5\n"),
                                 std::string("k\tnan\n"), std::string("\t3\n")}) {
    std::ofstream(path) << "ok key\t3e9\n" << bad;
    absl::Status s = ReadPeakCache(path).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("line 2"), std::string::npos) << s;
  }
  absl::StatusOr<CpuPeak> p = CpuPeakFlops(DType::kF64, path);
  ASSERT_TRUE(p.ok());
  EXPECT_GT(p->flops, 1e6);
  EXPECT_NE(p->source.find("measured now, cached in " + path + " ('" + path + "' line 2"),
            std::string::npos)
      << p->source;
  absl::StatusOr<std::map<std::string, double>> c = ReadPeakCache(path);  // rewritten, valid
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->at(CpuPeakKey(DType::kF64)), std::stod(absl::StrFormat("%.6g", p->flops)));
  // A cache that cannot be written: measured, and said so.
  absl::StatusOr<CpuPeak> q = CpuPeakFlops(DType::kF64, "/proc/none/peak.txt");
  ASSERT_TRUE(q.ok());
  EXPECT_NE(q->source.find("measured now (not cached: cannot create '/proc/none/"),
            std::string::npos)
      << q->source;
}

TEST(MfuTest, KeyAndPathNameTheMachine) {
  const std::string key = CpuPeakKey(DType::kBF16);
  EXPECT_NE(key.find("|" + std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
                     " threads|bf16"),
            std::string::npos)
      << key;
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(DefaultPeakCachePath(), "/x/cache/shardmap/cpu_peak_flops.txt");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(DefaultPeakCachePath(), "/home/u/.cache/shardmap/cpu_peak_flops.txt");
  ::unsetenv("HOME");
  ::setenv("TMPDIR", "/t", 1);
  EXPECT_EQ(DefaultPeakCachePath(), "/t/shardmap-" + std::to_string(::getuid()) + "/cpu_peak_flops.txt");
}

TEST(MfuTest, MeasuredPeakAndRss) {
  const double one = MeasureCpuPeakFlops(DType::kF32, 1, 0.05);
  EXPECT_TRUE(std::isfinite(one));
  EXPECT_GT(one, 1e7);  // any CPU's GEMM does more than 10 MFLOP/s
  const int64_t before = ProcessRssBytes();
  ASSERT_GT(before, 0);
  std::vector<char> big(64 << 20);
  std::memset(big.data(), 1, big.size());  // touched: resident
  EXPECT_GE(ProcessRssBytes() - before, 60 << 20);
  EXPECT_EQ(big[12345], 1);
}

}  // namespace
}  // namespace shardmap
