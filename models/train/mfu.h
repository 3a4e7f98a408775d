// Model FLOPs utilisation for the step line: the peak FLOP/s of where the ranks run and the
// process's resident memory. The FLOPs of a token are nanoGPT's estimate_mfu (6N + 12 L H Q T:
// Model::FlopsPerToken, which the planner's ModelFlopsPerStep also uses); this file supplies the
// denominator.
//
//   absl::StatusOr<CpuPeak> peak = CpuPeakFlops(DType::kF32, DefaultPeakCachePath());
//   // peak->flops: this CPU's hardware peak; peak->source says how it was derived.
//   double mfu = flops_per_token * tokens_per_s / peak->flops;
//   int64_t rss = ProcessRssBytes();   // /proc/self/statm's resident pages
//
// The CPU peak comes from the hardware, not from a measurement (a GEMM timed on a machine shared
// with other jobs measures the neighbours' load: a peak read while the machine was busy showed
// MFU far above 100%): physical cores this process may run on (sched_getaffinity and
// /proc/cpuinfo's core ids) x the highest clock known (sysfs cpuinfo_max_freq, cpuid leaf 0x16,
// /proc/cpuinfo's "cpu MHz", and the clock measured by a chain of dependent adds: a VM's "cpu MHz"
// is nominal and leaves out turbo) x 2 FMA units x the lanes of the widest vector ISA the CPU has
// (avx512f: 512 bits, avx2/fma: 256, else 128; OpenBLAS picks that ISA at run time) x 2 FLOPs per
// FMA. Two FMA pipes per core is what the widest x86 cores have, so this is an upper bound: MFU
// cannot exceed 100% whatever the load. bf16 and f16 count at the f32 rate (the CPU GEMM computes
// them in f32). Only where the hardware cannot be read (no clock or no ISA flags) is the peak
// measured: refused while the machine is loaded (1-minute load average above a quarter of its
// threads), repeated until two rounds agree within 3%, and cached in a text file (default
// $XDG_CACHE_HOME/shardmap/cpu_peak_flops.txt, else ~/.cache/shardmap/..., else under $TMPDIR),
// one line per key "<CPU model>|<threads> threads|<dtype>|<build>" (the build: compiler and
// OpenBLAS configuration), so a peak never outlives the build that measured it.
#ifndef SHARDMAP_MODELS_TRAIN_MFU_H_
#define SHARDMAP_MODELS_TRAIN_MFU_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tensor/dtype.h"

namespace shardmap {

// "<model name from /proc/cpuinfo>|<N> threads|<dtype>|<compiler, OpenBLAS configuration>".
std::string CpuPeakKey(DType dtype);
// $XDG_CACHE_HOME/shardmap/cpu_peak_flops.txt, else $HOME/.cache/shardmap/..., else
// ${TMPDIR:-/tmp}/shardmap-<uid>/cpu_peak_flops.txt.
std::string DefaultPeakCachePath();

// The cache file's entries. NotFound when the file does not exist; InvalidArgument naming the
// file and the line when a line is not "<key>\t<positive finite number>".
absl::StatusOr<std::map<std::string, double>> ReadPeakCache(const std::string& path);
// Adds (or replaces) one entry, keeping the others that parse; creates the directory; writes a
// temporary file and renames it.
absl::Status WritePeakCache(const std::string& path, const std::string& key, double flops);

// What bounds this CPU's arithmetic, each figure with where it was read.
struct CpuHardware {
  int cores = 0;          // physical cores among the CPUs this process may run on
  std::string cores_from;
  double hz = 0;          // the highest clock known
  std::string clock_from;
  int vector_bits = 0;    // the widest vector ISA: 512, 256 or 128
  std::string isa;        // its /proc/cpuinfo flag: "avx512f", "avx2", "sse2", ...
  int fma_units = 2;      // per core: the most any x86 core has (an upper bound)
};
// From /proc/cpuinfo's text for the logical CPUs `cpus` (their "processor" numbers), the sysfs
// and cpuid maximum clocks and the measured clock in Hz (0: unknown); the highest clock counts. FailedPrecondition naming what is missing when
// the text has none of those CPUs, no clock or no flags line.
absl::StatusOr<CpuHardware> CpuHardwareFrom(const std::string& cpuinfo, const std::vector<int>& cpus,
                                            double sysfs_max_hz, double cpuid_max_hz,
                                            double measured_hz = 0);
// The same for this process (sched_getaffinity, /proc/cpuinfo, sysfs, cpuid, a measured clock).
absl::StatusOr<CpuHardware> ReadCpuHardware();
// cores x hz x fma_units x lanes (vector_bits / 64 for f64, / 32 otherwise) x 2.
double HardwarePeakFlops(const CpuHardware& hw, DType dtype);
// "2 cores (...) x 2.60 GHz (...) x 2 FMA units x 16 f32 lanes (avx512f) x 2".
std::string DescribeHardwarePeak(const CpuHardware& hw, DType dtype);

// The measurement of the fallback (threads: 0 for every hardware thread): every thread runs the
// framework's GEMM (OpenBLAS, one thread each) on 512x512 operands, 10 rounds; the best round.
double MeasureCpuPeakFlops(DType dtype, int threads = 0, double seconds = 0.5);
// The fallback: FailedPrecondition when `load_1min` (the 1-minute load average) exceeds a
// quarter of the hardware threads, or when 5 measurements never have two in a row within 3%.
absl::StatusOr<double> MeasureStableCpuPeakFlops(DType dtype, double load_1min);
// /proc/loadavg's first field; -1 if unknown.
double LoadAverage1Min();

struct CpuPeak {
  double flops = 0;
  std::string source;  // "hardware: 2 cores (...) x ...", "measured now, cached in P", ...
};
// The hardware peak when the hardware can be read; else the cache's entry for the key, else a
// stable measurement on an idle machine written there (a cache that cannot be read or written is
// said in `source`); FailedPrecondition saying why when neither a hardware peak nor a trustworthy
// measurement exists (give --peak_flops).
absl::StatusOr<CpuPeak> CpuPeakFlops(DType dtype, const std::string& cache_path);
// As above with the hardware given (an error: it could not be read, and why).
absl::StatusOr<CpuPeak> CpuPeakFlopsWith(const absl::StatusOr<CpuHardware>& hw, DType dtype,
                                         const std::string& cache_path);

// The process's resident set (/proc/self/statm's second field x the page size); -1 if unknown.
int64_t ProcessRssBytes();

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_MFU_H_
