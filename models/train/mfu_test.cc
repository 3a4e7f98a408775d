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

namespace shardmap {
namespace {

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  static int n = 0;
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/mfu_" + std::to_string(::getpid()) + "_" +
         std::to_string(n++);
}

// The step line's FLOPs per token (Model::FlopsPerToken, nanoGPT's estimate_mfu) by hand:
// GPT-2 small. N without wpe: per block 12 d^2 + 13 d = 7,087,872 (x12 = 85,054,464), wte
// 50257 x 768 = 38,597,376, ln_f 1,536: 123,653,376 (nanoGPT prints "123.65M"). 6N =
// 741,920,256; attention 12 L H Q T = 12 x 12 x 768 x 1024 = 113,246,208.
TEST(MfuTest, FlopsPerTokenIsNanoGptsEstimate) {
  GptConfig gpt2{.layers = 12, .d_model = 768, .heads = 12, .vocab = 50257, .seq = 1024};
  absl::StatusOr<GptLayout> gpt2_layout = GptLayout::Create(Mesh(), gpt2, false);
  ASSERT_TRUE(gpt2_layout.ok());
  EXPECT_DOUBLE_EQ(gpt2_layout->FlopsPerToken(), 855166464.0);
  // A small model: N counted from its layout's tensors (every parameter but wpe).
  GptConfig small{.layers = 3, .d_model = 16, .heads = 4, .vocab = 96, .seq = 12};
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), small, false);
  ASSERT_TRUE(layout.ok());
  double n = 0;
  for (const ParamInfo& p : layout->params()) {
    if (p.name != "wpe.weight") n += static_cast<double>(NumElements(p.global_shape));
  }
  EXPECT_DOUBLE_EQ(layout->FlopsPerToken(), 6 * n + 12.0 * 3 * 16 * 12);
}

// Two physical cores with two hardware threads each (processors 0-3), one socket.
constexpr char kCpuinfo[] =
    "processor\t: 0\nmodel name\t: Test CPU\ncpu MHz\t\t: 2000.000\nphysical id\t: 0\n"
    "core id\t\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n\n"
    "processor\t: 1\ncpu MHz\t\t: 2500.000\nphysical id\t: 0\ncore id\t\t: 1\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f\n\n"
    "processor\t: 2\ncpu MHz\t\t: 1200.000\nphysical id\t: 0\ncore id\t\t: 0\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f\n\n"
    "processor\t: 3\ncpu MHz\t\t: 1200.000\nphysical id\t: 0\ncore id\t\t: 1\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f\n";

TEST(MfuTest, HardwareFromCpuinfoCountsCoresNotThreads) {
  absl::StatusOr<CpuHardware> hw = CpuHardwareFrom(kCpuinfo, {0, 1, 2, 3}, 0, 0);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->cores, 2);  // SMT siblings share their core's FMA units
  EXPECT_EQ(hw->hz, 2.5e9);  // the highest clock listed
  EXPECT_EQ(hw->clock_from, "/proc/cpuinfo cpu MHz");
  EXPECT_EQ(hw->vector_bits, 512);
  EXPECT_EQ(hw->isa, "avx512f");
  // By hand: 2 cores x 2.5e9 x 2 FMA units x 16 lanes x 2 = 320e9; f64 half the lanes; bf16 at
  // the f32 rate (the CPU GEMM computes in f32).
  EXPECT_DOUBLE_EQ(HardwarePeakFlops(*hw, DType::kF32), 320e9);
  EXPECT_DOUBLE_EQ(HardwarePeakFlops(*hw, DType::kF64), 160e9);
  EXPECT_DOUBLE_EQ(HardwarePeakFlops(*hw, DType::kBF16), 320e9);
  EXPECT_EQ(DescribeHardwarePeak(*hw, DType::kF64),
            "2 cores (/proc/cpuinfo core ids of the 4 CPUs in the affinity mask) x 2.50 GHz "
            "(/proc/cpuinfo cpu MHz) x 2 FMA units x 8 f64 lanes (avx512f) x 2");
  // The affinity mask limits the cores; a higher sysfs or cpuid maximum clock wins.
  hw = CpuHardwareFrom(kCpuinfo, {0, 2}, 3.1e9, 0);
  ASSERT_TRUE(hw.ok());
  EXPECT_EQ(hw->cores, 1);
  EXPECT_EQ(hw->hz, 3.1e9);
  EXPECT_EQ(hw->clock_from, "sysfs cpuinfo_max_freq");
  EXPECT_EQ(CpuHardwareFrom(kCpuinfo, {0}, 0, 3.3e9)->clock_from, "cpuid 0x16 max");
  EXPECT_EQ(CpuHardwareFrom(kCpuinfo, {0}, 3.1e9, 3.3e9, 3.6e9)->hz, 3.6e9);
  // Narrower ISAs.
  std::string avx2 = kCpuinfo;
  for (size_t at; (at = avx2.find(" avx512f")) != std::string::npos;) avx2.erase(at, 8);
  EXPECT_EQ(CpuHardwareFrom(avx2, {0}, 0, 0)->vector_bits, 256);
}

TEST(MfuTest, UnreadableHardwareIsNamed) {
  EXPECT_NE(CpuHardwareFrom(kCpuinfo, {7}, 0, 0).status().message().find("none of the 1 CPUs"),
            std::string::npos);
  absl::Status s = CpuHardwareFrom("processor\t: 0\nflags\t: avx2\n", {0}, 0, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no clock"), std::string::npos) << s;
  s = CpuHardwareFrom("processor\t: 0\ncpu MHz\t: 1000\nflags\t: fpu\n", {0}, 0, 0).status();
  EXPECT_NE(s.message().find("no vector ISA"), std::string::npos) << s;
}

// The property the summary needs: no GEMM this process runs beats the hardware peak, so MFU
// stays at or below 100% (every thread's OpenBLAS GEMM at once, the best of 10 rounds).
TEST(MfuTest, ThisMachinesHardwarePeakBoundsItsMeasuredGemm) {
  absl::StatusOr<CpuHardware> hw = ReadCpuHardware();
#if defined(__x86_64__)
  ASSERT_TRUE(hw.ok()) << hw.status();  // Linux on x86 always lists MHz and flags
#else
  if (!hw.ok()) GTEST_SKIP() << hw.status();
#endif
  for (DType dtype : {DType::kF32, DType::kF64}) {
    const double measured = MeasureCpuPeakFlops(dtype, 0, 0.2);
    EXPECT_LT(measured, HardwarePeakFlops(*hw, dtype)) << DescribeHardwarePeak(*hw, dtype);
  }
  // The trainer's peak is this one (the clock is measured again: compare what it says).
  absl::StatusOr<CpuPeak> p = CpuPeakFlops(DType::kF32, TempDir() + "/unused.txt");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->source.rfind("hardware: " + std::to_string(hw->cores) + " cores", 0), 0)
      << p->source;
  EXPECT_GT(p->flops, MeasureCpuPeakFlops(DType::kF32, 0, 0.2));
}

// Issue 48: the cache (in a shared /tmp without HOME) was written through the fixed name
// "<cache>.tmp.<pid>": a symlink planted there made the write truncate the file it points to.
TEST(MfuTest, CacheWriteNeverFollowsASymlinkAtAPredictableTemporaryName) {
  const std::string base = TempDir();
  const std::string dir = base + "/planted";
  ASSERT_EQ(::mkdir(base.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/peak.txt";
  const std::string victim = base + "/victim.txt";
  { std::ofstream(victim) << "precious\n"; }
  const std::string old_temp = path + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), old_temp.c_str()), 0);
  ASSERT_TRUE(WritePeakCache(path, "cpu B|4 threads|f32", 3e9).ok());
  std::ifstream v(victim);
  std::string content((std::istreambuf_iterator<char>(v)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious\n");  // not written through the planted link
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));  // the cache is a file of its own, not the link
  absl::StatusOr<std::map<std::string, double>> c = ReadPeakCache(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->at("cpu B|4 threads|f32"), 3e9);
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
  // Without readable hardware a cached key is used as it is (nothing measured).
  const absl::StatusOr<CpuHardware> unread = absl::FailedPreconditionError("no clock");
  ASSERT_TRUE(WritePeakCache(path, CpuPeakKey(DType::kF32), 1234.5).ok());
  absl::StatusOr<CpuPeak> p = CpuPeakFlopsWith(unread, DType::kF32, path);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->flops, 1234.5);
  EXPECT_NE(p->source.find("cached in " + path + " (hardware unread: no clock)"),
            std::string::npos)
      << p->source;
  // The same CPU with another build does not match: the key names the build.
  EXPECT_NE(CpuPeakKey(DType::kF32).find("|gcc "), std::string::npos) << CpuPeakKey(DType::kF32);
}

TEST(MfuTest, AnInvalidCacheIsNamed) {
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
  // A cache that cannot be written is an error naming the directory.
  EXPECT_NE(WritePeakCache("/proc/none/peak.txt", "k", 1).message().find("cannot create '/proc/"),
            std::string::npos);
}

TEST(MfuTest, AFallbackMeasurementIsRefusedUnderLoad) {
  absl::Status s = MeasureStableCpuPeakFlops(DType::kF32, 1e6).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the machine is loaded (1-minute load average 1000000.00"),
            std::string::npos)
      << s;
  // Unread hardware and a loaded machine: no peak, and why (the trainer then prints no MFU).
  const absl::StatusOr<CpuHardware> unread = absl::FailedPreconditionError("no clock");
  if (LoadAverage1Min() > 0.25 * std::max(1u, std::thread::hardware_concurrency())) {
    absl::Status p = CpuPeakFlopsWith(unread, DType::kF32, "").status();
    EXPECT_NE(p.message().find("no CPU peak: the hardware cannot be read (no clock) and the "
                               "machine is loaded"),
              std::string::npos)
        << p;
  }
  EXPECT_GE(LoadAverage1Min(), 0);
}

TEST(MfuTest, KeyAndPathNameTheMachine) {
  const std::string key = CpuPeakKey(DType::kBF16);
  EXPECT_NE(key.find("|" + std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
                     " threads|bf16|"),
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
