#include "bench/bench_help.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"

namespace shardmap::bench {
namespace {

// Google Benchmark's help printer takes no arguments: what it prints is set here first.
std::string& HelpText() {
  static std::string* text = new std::string;
  return *text;
}

void PrintHelp() {
  std::fputs(HelpText().c_str(), stdout);
  std::printf("\nGoogle Benchmark's flags:\n");
  benchmark::PrintDefaultHelp();
}

}  // namespace

std::string FlagsHelp(const std::string& file_substring) {
  std::vector<std::string> lines;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), file_substring)) continue;
    lines.push_back(absl::StrCat("  --", name, " (", flag->Help(), ") default: ",
                                 flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(),
                                 "\n"));
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) out += l;
  return out;
}

void InitializeBenchmark(int* argc, char** argv, const std::string& program,
                         const std::string& extra_help) {
  std::string& text = HelpText();
  text = absl::StrCat(absl::ProgramUsageMessage(), "\n\n", program, "'s flags:\n",
                      FlagsHelp(program), extra_help);
  benchmark::Initialize(argc, argv, &PrintHelp);
}

}  // namespace shardmap::bench
