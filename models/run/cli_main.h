// The main of the run binaries (train, sample): flags parsed as every binary parses them
// (base/command_line.h), then the run; its error, or anything that escapes it (an op's error,
// out of memory, an exception), said as "<program>: <message>" with exit code 2, never an abort.
//
//   int main(int argc, char** argv) {
//     return shardmap::RunMain(argc, argv, {.usage = "..."}, [](const std::string& program) {
//       return Run();
//     });
//   }
#ifndef SHARDMAP_MODELS_RUN_CLI_MAIN_H_
#define SHARDMAP_MODELS_RUN_CLI_MAIN_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "base/command_line.h"

namespace shardmap {

// `run` gets the name the binary was run as ("train", or its old name "train_gpt").
int RunMain(int argc, char** argv, const base::FlagsSpec& spec,
            const std::function<absl::Status(const std::string& program)>& run);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_CLI_MAIN_H_
