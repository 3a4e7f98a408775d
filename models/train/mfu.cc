#include "models/train/mfu.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <set>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "models/components/atomic_file.h"
#include "models/components/bounded_read.h"
#include "tensor/ops/matmul.h"
#include <cblas.h>  // OpenBLAS's: openblas_get_config
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

std::string CpuModelName() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown CPU";
}

int HardwareThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    absl::StrAppend(&partial, part, "/");
    if (part.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create '", partial, "': ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// The build's part of the cache key: what changes the GEMM's speed without changing the CPU.
std::string BuildKey() {
  const char* blas = openblas_get_config();
  return absl::StrCat("gcc ", __VERSION__, ", ", blas != nullptr ? blas : "unknown BLAS");
}

double ReadDouble(const std::string& path) {
  std::ifstream f(path);
  double v = 0;
  return (f >> v) ? v : 0;
}

// cpuid leaf 0x16's maximum frequency (Intel; 0 elsewhere and in most VMs).
double CpuidMaxHz() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) >= 0x16 && __get_cpuid(0x16, &a, &b, &c, &d)) {
    return (b & 0xffff) * 1e6;
  }
#endif
  return 0;
}

// The core's clock now, from a chain of dependent integer adds (one cycle each on every x86
// core): 100 adds x 1,000 iterations, the best of 300 trials of ~30 us. Preemption or a busy
// sibling only slows a trial, so the best one is the unloaded clock (turbo included, which the
// nominal "cpu MHz" of a VM leaves out). 0 off x86.
double MeasuredClockHz() {
#if defined(__x86_64__)
  double best = 0;
  for (int trial = 0; trial < 300; ++trial) {
    uint64_t x = trial;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) {
      asm volatile(".rept 100\n\taddq $1, %0\n\t.endr" : "+r"(x));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, 100.0 * 1000 / s);
  }
  return best;
#else
  return 0;
#endif
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) out.push_back(i);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<CpuHardware> CpuHardwareFrom(const std::string& cpuinfo, const std::vector<int>& cpus,
                                            double sysfs_max_hz, double cpuid_max_hz,
                                            double measured_hz) {
  const std::set<int> allowed(cpus.begin(), cpus.end());
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  int processors = 0, without_core_id = 0;
  double mhz = 0;
  std::string flags;
  // One block per logical CPU, fields "name\t: value", blocks separated by blank lines.
  std::map<std::string, std::string> block;
  auto flush = [&] {
    if (block.count("processor") == 0) return;
    int id = -1;
    if (!absl::SimpleAtoi(block["processor"], &id) || allowed.count(id) == 0) return;
    ++processors;
    if (block.count("core id")) {
      cores.insert({block["physical id"], block["core id"]});
    } else {
      ++without_core_id;
    }
    double m = 0;
    if (absl::SimpleAtod(block["cpu MHz"], &m)) mhz = std::max(mhz, m);
    if (flags.empty() && block.count("flags")) flags = block["flags"];
  };
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (absl::StripAsciiWhitespace(line).empty()) {
      flush();
      block.clear();
    } else if (colon != absl::string_view::npos) {
      block[std::string(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  flush();
  if (processors == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "/proc/cpuinfo lists none of the ", cpus.size(), " CPUs this process may run on"));
  }
  CpuHardware hw;
  hw.cores = static_cast<int>(cores.size()) + without_core_id;
  hw.cores_from = without_core_id == 0
                      ? absl::StrCat("/proc/cpuinfo core ids of the ", processors,
                                     " CPUs in the affinity mask")
                      : absl::StrCat(processors, " CPUs in the affinity mask");
  hw.hz = std::max({sysfs_max_hz, cpuid_max_hz, mhz * 1e6, measured_hz});
  hw.clock_from = hw.hz == sysfs_max_hz   ? "sysfs cpuinfo_max_freq"
                  : hw.hz == cpuid_max_hz ? "cpuid 0x16 max"
                  : hw.hz == measured_hz  ? "measured: dependent adds, best of 300"
                                          : "/proc/cpuinfo cpu MHz";
  if (hw.hz <= 0) {
    return absl::FailedPreconditionError(
        "no clock: /proc/cpuinfo has no 'cpu MHz', sysfs no cpuinfo_max_freq, cpuid no leaf 0x16");
  }
  const std::vector<std::string> words = absl::StrSplit(flags, ' ', absl::SkipEmpty());
  const std::set<std::string> has(words.begin(), words.end());
  if (has.count("avx512f")) {
    hw.vector_bits = 512, hw.isa = "avx512f";
  } else if (has.count("avx2") || has.count("fma")) {
    hw.vector_bits = 256, hw.isa = has.count("avx2") ? "avx2" : "fma";
  } else if (has.count("sse2") || has.count("asimd")) {
    hw.vector_bits = 128, hw.isa = has.count("sse2") ? "sse2" : "asimd";
  } else {
    return absl::FailedPreconditionError(
        "no vector ISA: /proc/cpuinfo's flags name none of avx512f, avx2, fma, sse2, asimd");
  }
  return hw;
}

absl::StatusOr<CpuHardware> ReadCpuHardware() {
  std::ifstream f("/proc/cpuinfo");
  std::stringstream text;
  text << f.rdbuf();
  const std::vector<int> cpus = AllowedCpus();
  double sysfs = 0;
  for (int cpu : cpus) {
    sysfs = std::max(sysfs, 1e3 * ReadDouble(absl::StrCat("/sys/devices/system/cpu/cpu", cpu,
                                                          "/cpufreq/cpuinfo_max_freq")));
  }
  return CpuHardwareFrom(text.str(), cpus, sysfs, CpuidMaxHz(), MeasuredClockHz());
}

double HardwarePeakFlops(const CpuHardware& hw, DType dtype) {
  const int lanes = hw.vector_bits / (dtype == DType::kF64 ? 64 : 32);
  return static_cast<double>(hw.cores) * hw.hz * hw.fma_units * lanes * 2;
}

std::string DescribeHardwarePeak(const CpuHardware& hw, DType dtype) {
  const bool f64 = dtype == DType::kF64;
  return absl::StrFormat("%d cores (%s) x %.2f GHz (%s) x %d FMA units x %d %s lanes (%s) x 2",
                         hw.cores, hw.cores_from, hw.hz / 1e9, hw.clock_from, hw.fma_units,
                         hw.vector_bits / (f64 ? 64 : 32), f64 ? "f64" : "f32", hw.isa);
}

double LoadAverage1Min() {
  std::ifstream f("/proc/loadavg");
  double v = -1;
  return (f >> v) ? v : -1;
}

std::string CpuPeakKey(DType dtype) {
  std::string model = CpuModelName();
  for (char& c : model) {
    if (c == '|' || c == '\t') c = ' ';
  }
  std::string build = BuildKey();
  for (char& c : build) {
    if (c == '|' || c == '\t' || c == '\n') c = ' ';
  }
  return absl::StrCat(model, "|", HardwareThreads(), " threads|", DTypeName(dtype), "|", build);
}

std::string DefaultPeakCachePath() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] != '\0') return absl::StrCat(xdg, "/shardmap/cpu_peak_flops.txt");
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    return absl::StrCat(home, "/.cache/shardmap/cpu_peak_flops.txt");
  }
  const char* tmp = std::getenv("TMPDIR");  // e.g. under bazel test, which sets neither
  return absl::StrCat(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp", "/shardmap-", ::getuid(),
                      "/cpu_peak_flops.txt");
}

absl::StatusOr<std::map<std::string, double>> ReadPeakCache(const std::string& path) {
  // A cache of a few lines: a FIFO or device at its path is refused, never read forever.
  absl::StatusOr<std::string> text = ReadBoundedFile(path, 1 << 20, "the CPU peak cache");
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
  }
  if (!text.ok()) return text.status();
  std::istringstream f(*text);
  std::map<std::string, double> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    const size_t tab = line.rfind('\t');
    double v = 0;
    if (tab == std::string::npos || tab == 0 || !absl::SimpleAtod(line.substr(tab + 1), &v) ||
        !std::isfinite(v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "' line ", n, " ('", line,
          "') is not '<key><TAB><flop/s>'; the file is damaged (it is measured over)"));
    }
    out[line.substr(0, tab)] = v;
  }
  return out;
}

absl::Status WritePeakCache(const std::string& path, const std::string& key, double flops) {
  std::map<std::string, double> all;
  if (absl::StatusOr<std::map<std::string, double>> old = ReadPeakCache(path); old.ok()) {
    all = *std::move(old);
  }
  all[key] = flops;
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(path.substr(0, slash)); !s.ok()) return s;
  }
  std::string text;
  for (const auto& [k, v] : all) absl::StrAppend(&text, k, "\t", absl::StrFormat("%.6g", v), "\n");
  // An exclusive, unpredictable temporary renamed over the cache (models/components/
  // atomic_file.h): a symlink planted at a guessable name in a shared /tmp is never written
  // through.
  absl::Status s = WriteFileAtomically(
      path, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write the CPU peak cache '", path, "': ", s.message()));
  }
  return absl::OkStatus();
}

double MeasureCpuPeakFlops(DType dtype, int threads, double seconds) {
  if (threads <= 0) threads = HardwareThreads();
  constexpr int kRounds = 10;
  constexpr int64_t kN = 512;
  const double flops_per_call = 2.0 * kN * kN * kN;
  const auto window = std::chrono::duration<double>(seconds / kRounds);
  // Every thread's operands once; each round starts them together and sums their own rates
  // (calls / the time to the end of their last call: no thread start-up or overrun counted).
  std::vector<std::pair<Tensor, Tensor>> operands;
  for (int t = 0; t < threads; ++t) {
    operands.emplace_back(RandomNormal({kN, kN}, 100 + t, 0.0, 1.0, dtype),
                          RandomNormal({kN, kN}, 200 + t, 0.0, 1.0, dtype));
  }
  double best = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> rates(threads, 0.0);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        PinBlasToOneThread();
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        const auto start = std::chrono::steady_clock::now();
        auto now = start;
        int64_t calls = 0;
        do {
          Matmul(operands[t].first, operands[t].second);
          ++calls;
          now = std::chrono::steady_clock::now();
        } while (now - start < window);
        rates[t] = calls * flops_per_call / std::chrono::duration<double>(now - start).count();
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    go.store(true);
    for (std::thread& t : pool) t.join();
    double total = 0;
    for (double r : rates) total += r;
    best = std::max(best, total);
  }
  return best;
}

absl::StatusOr<double> MeasureStableCpuPeakFlops(DType dtype, double load_1min) {
  const int threads = HardwareThreads();
  if (load_1min > 0.25 * threads) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the machine is loaded (1-minute load average %.2f on %d threads): a peak measured now "
        "would be its neighbours' share; measure when it is idle or give --peak_flops",
        load_1min, threads));
  }
  double last = MeasureCpuPeakFlops(dtype);
  for (int i = 1; i < 5; ++i) {
    const double now = MeasureCpuPeakFlops(dtype);
    if (std::abs(now - last) <= 0.03 * std::max(now, last)) return std::max(now, last);
    last = now;
  }
  return absl::FailedPreconditionError(
      "5 peak measurements never agreed within 3% (the machine's load changes); give --peak_flops");
}

absl::StatusOr<CpuPeak> CpuPeakFlopsWith(const absl::StatusOr<CpuHardware>& hw, DType dtype,
                                         const std::string& cache_path) {
  CpuPeak peak;
  if (hw.ok()) {
    peak.flops = HardwarePeakFlops(*hw, dtype);
    peak.source = absl::StrCat("hardware: ", DescribeHardwarePeak(*hw, dtype));
    return peak;
  }
  const std::string key = CpuPeakKey(dtype);
  std::string why;
  if (!cache_path.empty()) {
    absl::StatusOr<std::map<std::string, double>> cache = ReadPeakCache(cache_path);
    if (cache.ok() && cache->count(key)) {
      peak.flops = cache->at(key);
      peak.source = absl::StrCat("measured on an idle machine with this build, cached in ",
                                 cache_path, " (hardware unread: ", hw.status().message(), ")");
      return peak;
    }
    if (!cache.ok() && !absl::IsNotFound(cache.status())) why = std::string(cache.status().message());
  }
  absl::StatusOr<double> measured = MeasureStableCpuPeakFlops(dtype, LoadAverage1Min());
  if (!measured.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("no CPU peak: the hardware cannot be read (",
                                                      hw.status().message(), ") and ",
                                                      measured.status().message()));
  }
  peak.flops = *measured;
  if (cache_path.empty()) {
    peak.source = "measured now (no cache file)";
  } else if (absl::Status s = WritePeakCache(cache_path, key, peak.flops); !s.ok()) {
    peak.source = absl::StrCat("measured now (not cached: ", s.message(), ")");
  } else {
    peak.source = absl::StrCat("measured now, cached in ", cache_path,
                               why.empty() ? "" : absl::StrCat(" (", why, ")"));
  }
  return peak;
}

absl::StatusOr<CpuPeak> CpuPeakFlops(DType dtype, const std::string& cache_path) {
  return CpuPeakFlopsWith(ReadCpuHardware(), dtype, cache_path);
}

int64_t ProcessRssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace shardmap
