// The command-line part every binary's main shares: the usage message, the flags parsed, a
// positional argument refused with the same words everywhere, and --help listing the flags the
// binary defines in libraries (not only in its main file).
//
//   int main(int argc, char** argv) {
//     const std::string program = shardmap::base::ProgramName(argc > 0 ? argv[0] : "x");
//     if (absl::Status s = shardmap::base::ParseFlagsOnly(argc, argv, {.usage = "x --a=1"});
//         !s.ok()) {
//       return shardmap::base::ExitWithError(program, s);  // "x: unexpected argument 'y' (...)"
//     }
//     ...
#ifndef SHARDMAP_BASE_COMMAND_LINE_H_
#define SHARDMAP_BASE_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardmap::base {

struct FlagsSpec {
  const char* usage = "";  // absl::SetProgramUsageMessage's text (set once per process)
  // Said after "unexpected argument 'X'" (how to pass what the user meant).
  const char* positional_hint = "flags are --name=value";
  // --help lists the flags of the binary's main file (Abseil's rule: <program>.cc,
  // <program>_main.cc) and of every file whose path contains one of these.
  std::vector<std::string> help_files;
};

// The name the binary was run as: argv[0]'s last path component.
std::string ProgramName(absl::string_view argv0);

// rest: what absl::ParseCommandLine left (rest[0] is the program). InvalidArgument
// "unexpected argument 'X' (hint)" for the first positional argument.
absl::Status RejectPositionalArguments(const std::vector<char*>& rest, absl::string_view hint);

// Whether --help lists the flags defined in `file` for `program` (see FlagsSpec::help_files).
bool HelpListsFlagsOf(absl::string_view file, absl::string_view program,
                      const std::vector<std::string>& help_files);

// Sets the usage message and --help's files, parses argv's flags (a malformed flag exits as
// Abseil does) and refuses positional arguments (RejectPositionalArguments). Once per process.
absl::Status ParseFlagsOnly(int argc, char** argv, const FlagsSpec& spec);

// Prints "<program>: <message>" on stderr and returns 2, the exit code of a usage error.
int ExitWithError(absl::string_view program, const absl::Status& status);

}  // namespace shardmap::base

#endif  // SHARDMAP_BASE_COMMAND_LINE_H_
