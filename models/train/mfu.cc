#include "models/train/mfu.h"

#include <sys/stat.h>
#include <unistd.h>

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
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "models/components/bounded_read.h"
#include "tensor/ops/matmul.h"
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

}  // namespace

std::string CpuPeakKey(DType dtype) {
  std::string model = CpuModelName();
  for (char& c : model) {
    if (c == '|' || c == '\t') c = ' ';
  }
  return absl::StrCat(model, "|", HardwareThreads(), " threads|", DTypeName(dtype));
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
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp);
    for (const auto& [k, v] : all) out << k << "\t" << absl::StrFormat("%.6g", v) << "\n";
    if (!out) {
      std::remove(tmp.c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot write '", tmp, "'"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot replace '", path, "': ", std::strerror(errno)));
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

absl::StatusOr<CpuPeak> CpuPeakFlops(DType dtype, const std::string& cache_path) {
  const std::string key = CpuPeakKey(dtype);
  CpuPeak peak;
  std::string why;
  if (!cache_path.empty()) {
    absl::StatusOr<std::map<std::string, double>> cache = ReadPeakCache(cache_path);
    if (cache.ok() && cache->count(key)) {
      peak.flops = cache->at(key);
      peak.source = absl::StrCat("cached in ", cache_path);
      return peak;
    }
    if (!cache.ok() && !absl::IsNotFound(cache.status())) why = std::string(cache.status().message());
  }
  peak.flops = MeasureCpuPeakFlops(dtype);
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

int64_t ProcessRssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace shardmap
