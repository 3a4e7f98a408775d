// Backend registry: `--backend` names -> how to make that backend's world, with what a program
// needs to know to pick it (one process per rank or threads of this process, where its buffers
// live, whether this build has it, a line for --help). Built in: inprocess, gloo, nccl and
// shapeonly; tests may register more (RegisterBackend). Every registered backend runs the
// conformance suite (collectives/conformance/), and train_gpt takes any backend by name.
//
//   absl::StatusOr<const Backend*> b = FindBackend("gloo");  // NotFound lists the names
//   std::vector<absl::Status> st = (*b)->run_world(3, [](Communicator& c) -> absl::Status {
//     float x = c.rank();
//     return c.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);  // 3 everywhere
//   }, WorldOptions{});
//
//   // A training program, in one call: this process's rank (process-per-rank backends), or
//   // nullptr when the ranks are threads of this process (inprocess).
//   absl::StatusOr<std::unique_ptr<Communicator>> w = ConnectTrainingWorld("nccl", 8, true);
#ifndef SHARDMAP_COLLECTIVES_BACKEND_REGISTRY_H_
#define SHARDMAP_COLLECTIVES_BACKEND_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"

namespace shardmap::collectives {

// Where a backend's buffers live.
enum class BackendMemory { kHost, kHostOrDevice, kDevice, kMeta };
// "host", "host or device", "device", "meta (no data)".
const char* BackendMemoryName(BackendMemory m);

// Options of a world made in this process by Backend::run_world.
struct WorldOptions {
  // How long a rank waits for its peers in one call before DeadlineExceeded.
  absl::Duration timeout = absl::Seconds(60);
  // Compare every call across ranks where the backend makes that optional (in-process's
  // debug_check_calls); backends that always compare ignore it.
  bool check_calls = true;
};

// Options of this process's rank of a launched world (Backend::create_from_env).
struct ProcessWorldOptions {
  // How long a rank waits for a peer in one call (and for the connection) before the call fails
  // naming the peer: a stopped or hung peer process is detected after this long.
  absl::Duration timeout = absl::Minutes(5);
};

using RankFn = std::function<absl::Status(Communicator&)>;

struct Backend {
  std::string name;         // the --backend value: lower case, no spaces
  std::string description;  // one line for --help
  // True: one process per rank, started by collectives/launch, torchrun or srun
  // (create_from_env); false: the ranks are threads of one process (run_world).
  bool process_per_rank = false;
  BackendMemory memory = BackendMemory::kHost;
  // False for backends that only check calls (shape-only execution): no data moves.
  bool moves_data = true;
  // Whether the program can train on it (shape-only cannot: its results are not data).
  bool trains = true;
  // Empty when this build and machine can run it; else why not ("built without CUDA").
  std::function<std::string()> unavailable_reason = [] { return std::string(); };
  // Runs fn on every rank of a world of n ranks made inside this process (threads, or one after
  // another for backends without peers); every rank's status, index = rank. The conformance
  // suite runs through this, so it must build the same communicator class as create_from_env.
  std::function<std::vector<absl::Status>(int n, const RankFn& fn, const WorldOptions& o)>
      run_world;
  // process_per_rank backends: this process's rank of the world the launcher started
  // (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT or Slurm's variables).
  std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const ProcessWorldOptions&)>
      create_from_env;
};

// Adds a backend (e.g. a test's). InvalidArgument: empty or spaced name, no run_world, or a
// process_per_rank backend without create_from_env; AlreadyExists: the name is taken.
absl::Status RegisterBackend(Backend backend);

// NotFound naming the registered backends when `name` is none of them.
absl::StatusOr<const Backend*> FindBackend(absl::string_view name);

// Every registered backend, built-ins first, then in registration order.
std::vector<const Backend*> Backends();
std::vector<std::string> BackendNames();

// "inprocess: every rank a thread of this process (host or device memory); gloo: ..." for a
// --backend flag's help.
std::string BackendFlagHelp();

// What a training program does with --backend=name for a world of `ranks` ranks whose buffers
// live on a GPU (device_cuda) or on the host: checks the backend exists, trains and fits that
// memory; for a process-per-rank backend connects this process and checks the launched world
// has `ranks` processes; returns nullptr for a thread backend (the program runs its ranks as
// threads). Errors say what to change (the flag, the launcher's process count).
// `options` reach the process-per-rank backend's communicator (its timeout).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectTrainingWorld(
    absl::string_view name, int ranks, bool device_cuda, const ProcessWorldOptions& options = {});

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_BACKEND_REGISTRY_H_
