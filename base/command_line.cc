#include "base/command_line.h"

#include <iostream>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace shardmap::base {

std::string ProgramName(absl::string_view argv0) {
  const size_t slash = argv0.rfind('/');
  return std::string(slash == absl::string_view::npos ? argv0 : argv0.substr(slash + 1));
}

absl::Status RejectPositionalArguments(const std::vector<char*>& rest, absl::string_view hint) {
  if (rest.size() <= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected argument '", rest[1], "'",
                   hint.empty() ? "" : absl::StrCat(" (", hint, ")")));
}

bool HelpListsFlagsOf(absl::string_view file, absl::string_view program,
                      const std::vector<std::string>& help_files) {
  for (const std::string& f : help_files) {
    if (!f.empty() && absl::StrContains(file, f)) return true;
  }
  // Abseil's default: the main file, <program>.cc, <program>-main.cc or <program>_main.cc.
  absl::string_view base = file.substr(file.rfind('/') == absl::string_view::npos
                                           ? 0
                                           : file.rfind('/') + 1);
  if (!absl::ConsumePrefix(&base, program)) return false;
  return absl::StartsWith(base, ".") || absl::StartsWith(base, "-main.") ||
         absl::StartsWith(base, "_main.");
}

absl::Status ParseFlagsOnly(int argc, char** argv, const FlagsSpec& spec) {
  absl::SetProgramUsageMessage(spec.usage);
  const std::string program = ProgramName(argc > 0 ? argv[0] : "");
  // The predicate outlives this call: absl keeps it for --help, which runs inside the parse.
  static std::vector<std::string>* files = new std::vector<std::string>();
  static std::string* name = new std::string();
  *files = spec.help_files;
  *name = program;
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view f) {
    return HelpListsFlagsOf(f, *name, *files);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  return RejectPositionalArguments(absl::ParseCommandLine(argc, argv), spec.positional_hint);
}

int ExitWithError(absl::string_view program, const absl::Status& status) {
  std::cerr << program << ": " << status.message() << "\n";
  return 2;
}

}  // namespace shardmap::base
