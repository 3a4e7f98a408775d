// Model FLOPs utilisation for the step line: the peak FLOP/s of where the ranks run and the
// process's resident memory. The FLOPs of a token are nanoGPT's estimate_mfu (6N + 12 L H Q T,
// models/planner/plan.h's ModelFlopsPerStep); this file supplies the denominator.
//
//   absl::StatusOr<CpuPeak> peak = CpuPeakFlops(DType::kF32, DefaultPeakCachePath());
//   // peak->flops: measured once per machine (CPU model, cores, dtype) and then read back.
//   double mfu = flops_per_token * tokens_per_s / peak->flops;
//   int64_t rss = ProcessRssBytes();   // /proc/self/statm's resident pages
//
// The CPU peak is measured, not a datasheet number: every hardware thread runs the framework's
// own GEMM (tensor/ops/matmul.h's Matmul: OpenBLAS, one BLAS thread per thread, as simulated
// ranks run it) on 512x512 operands of the dtype at once, in 10 rounds of 0.05 s; the total FLOP/s
// of the best round is the peak (on a machine shared with other jobs, a neighbour's load lowers
// some rounds: the best one is the least disturbed; a peak read while the machine was busy shows
// as an MFU above 100%: delete the cache file or give --peak_flops). It is cached in a text file (default $XDG_CACHE_HOME/shardmap/
// cpu_peak_flops.txt, else ~/.cache/shardmap/..., else under $TMPDIR), one line per key
// "<CPU model name>|<hardware threads> threads|<dtype>\t<flop/s>". A file that does not parse
// is named and measured over (and rewritten); a key it lacks is measured and added.
#ifndef SHARDMAP_MODELS_TRAIN_MFU_H_
#define SHARDMAP_MODELS_TRAIN_MFU_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "tensor/dtype.h"

namespace shardmap {

// "<model name from /proc/cpuinfo>|<N> threads|<dtype>".
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

// The measurement described above (threads: 0 for every hardware thread).
double MeasureCpuPeakFlops(DType dtype, int threads = 0, double seconds = 0.5);

struct CpuPeak {
  double flops = 0;
  std::string source;  // "measured now, cached in P", "cached in P", "measured now (P: why)"
};
// From the cache when it has the key, else measured and written there (a cache that cannot be
// read or written is said in `source`, never an error).
absl::StatusOr<CpuPeak> CpuPeakFlops(DType dtype, const std::string& cache_path);

// The process's resident set (/proc/self/statm's second field x the page size); -1 if unknown.
int64_t ProcessRssBytes();

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_MFU_H_
