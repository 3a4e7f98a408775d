#include "models/run/cli_main.h"

#include <iostream>
#include <new>

#include "tensor/error.h"

namespace shardmap {

int RunMain(int argc, char** argv, const base::FlagsSpec& spec,
            const std::function<absl::Status(const std::string& program)>& run) {
  const std::string program = base::ProgramName(argc > 0 ? argv[0] : "");
  if (absl::Status s = base::ParseFlagsOnly(argc, argv, spec); !s.ok()) {
    return base::ExitWithError(program, s);
  }
  // Whatever escapes the run is said, not an abort ("terminate called after throwing ...").
  try {
    const absl::Status s = run(program);
    return s.ok() ? 0 : base::ExitWithError(program, s);
  } catch (const OpError& e) {
    std::cerr << program << ": " << e.status().message() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << program << ": out of memory (std::bad_alloc); use a smaller model, batch or seq\n";
  } catch (const std::exception& e) {
    std::cerr << program << ": internal error: " << e.what() << "\n";
  }
  return 2;
}

}  // namespace shardmap
