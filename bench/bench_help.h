// --help for benchmark binaries: Google Benchmark's own --help lists only its --benchmark_*
// flags, so a user cannot discover the binary's flags (tp_bench's --device, --placement).
// InitializeBenchmark prints the binary's Abseil flags (those defined in its main file) and any
// extra text first, then Google Benchmark's flags.
//
//   int main(int argc, char** argv) {
//     absl::SetProgramUsageMessage("tp_bench: ...");
//     bench::InitializeBenchmark(&argc, argv, "tp_bench");   // --help prints both and exits
//     absl::ParseCommandLine(argc, argv);
#ifndef SHARDMAP_BENCH_BENCH_HELP_H_
#define SHARDMAP_BENCH_BENCH_HELP_H_

#include <string>

namespace shardmap::bench {

// The help text of the Abseil flags whose defining file's name contains `file_substring`, one
// "  --name (help) default: value" line each, sorted by name.
std::string FlagsHelp(const std::string& file_substring);

// benchmark::Initialize(argc, argv) whose --help prints the program's usage message, its own
// flags (FlagsHelp(program)), `extra_help` and then Google Benchmark's flags.
void InitializeBenchmark(int* argc, char** argv, const std::string& program,
                         const std::string& extra_help = "");

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_BENCH_HELP_H_
