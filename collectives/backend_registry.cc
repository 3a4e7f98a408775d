#include "collectives/backend_registry.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/gloo_communicator.h"
#include "collectives/gloo_threads.h"
#include "collectives/in_process.h"
#include "collectives/internal/free_port.h"
#include "collectives/internal/gpu_count.h"
#include "collectives/nccl_communicator.h"
#include "collectives/shape_only_communicator.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {
namespace {

absl::Status RunCaught(const RankFn& fn, Communicator& c) {
  try {
    return fn(c);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("threw an exception: ", e.what()));
  }
}

std::vector<absl::Status> RunInProcessEach(int n, const RankFn& fn, const WorldOptions& o) {
  std::vector<absl::Status> each(std::max(n, 1));
  InProcessOptions io;
  io.timeout = o.timeout;
  io.debug_check_calls = o.check_calls;
  absl::Status all = RunInProcess(n, [&](Communicator& c) -> absl::Status {
    each[c.rank()] = RunCaught(fn, c);
    return each[c.rank()];
  }, io);
  if (n < 1) each[0] = all;
  return each;
}

std::vector<absl::Status> RunGlooEach(int n, const RankFn& fn, const WorldOptions& o) {
  GlooOptions go;
  go.timeout = o.timeout;
  return RunGlooThreadsEach(n, fn, go);
}

// Rank r on GPU r, each rank a thread with its own store client (as its process would have).
std::vector<absl::Status> RunNcclEach(int n, const RankFn& fn, const WorldOptions& o) {
  if (n < 1) {
    return {absl::InvalidArgumentError(absl::StrCat("nccl world: n must be >= 1, got ", n))};
  }
  const int gpus = internal::VisibleGpuCount();
  if (n > gpus) {
    return std::vector<absl::Status>(n, absl::FailedPreconditionError(absl::StrCat(
        "nccl world of ", n, " ranks needs a GPU per rank; ", gpus, " visible")));
  }
  absl::StatusOr<int> port = internal::PickFreePort();
  if (!port.ok()) return std::vector<absl::Status>(n, port.status());
  absl::StatusOr<std::string> token = NewStoreToken();
  if (!token.ok()) return std::vector<absl::Status>(n, token.status());
  std::vector<absl::Status> each(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TcpStoreOptions so;
      so.port = *port;
      so.rank = r;
      so.world_size = n;
      so.timeout = o.timeout;
      so.token = *token;
      absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(so);
      if (!store.ok()) {
        each[r] = store.status();
        return;
      }
      NcclOptions no;
      no.timeout = o.timeout;
      no.device = r;
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          CreateNcclCommunicator(std::shared_ptr<TcpStore>(std::move(*store)), no);
      each[r] = comm.ok() ? RunCaught(fn, **comm) : comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return each;
}

// The ranks of a shape-only world have no peers: one after another on this thread.
std::vector<absl::Status> RunShapeOnlyEach(int n, const RankFn& fn, const WorldOptions&) {
  if (n < 1) {
    return {absl::InvalidArgumentError(absl::StrCat("shape-only world: n must be >= 1, got ", n))};
  }
  std::vector<absl::Status> each(n);
  for (int r = 0; r < n; ++r) {
    ShapeOnlyCommunicator c(n, r);
    each[r] = RunCaught(fn, c);
  }
  return each;
}

std::vector<Backend> BuiltinBackends() {
  std::vector<Backend> b(4);
  b[0].name = "inprocess";
  b[0].description = "every rank a thread of this process";
  b[0].memory = BackendMemory::kHostOrDevice;
  b[0].run_world = RunInProcessEach;

  b[1].name = "gloo";
  b[1].description = "one process per rank over Gloo/TCP";
  b[1].process_per_rank = true;
  b[1].run_world = RunGlooEach;
  b[1].create_from_env = [](const ProcessWorldOptions& o) {
    GlooOptions go;
    go.timeout = o.timeout;
    return CreateGlooCommunicatorFromEnv(go);
  };

  b[2].name = "nccl";
  b[2].description = "one process per GPU over NCCL";
  b[2].process_per_rank = true;
  b[2].memory = BackendMemory::kDevice;
  b[2].unavailable_reason = []() -> std::string {
    if (!NcclCompiledIn()) return "built without CUDA and NCCL";
    if (internal::VisibleGpuCount() == 0) return "no GPU visible";
    return "";
  };
  b[2].run_world = RunNcclEach;
  b[2].create_from_env = [](const ProcessWorldOptions& o) {
    NcclOptions no;
    no.timeout = o.timeout;
    return CreateNcclCommunicatorFromEnv(no);
  };

  b[3].name = "shapeonly";
  b[3].description = "checks every call's arguments and moves no data: shape-only runs";
  b[3].memory = BackendMemory::kMeta;
  b[3].moves_data = false;
  b[3].trains = false;
  b[3].run_world = RunShapeOnlyEach;
  return b;
}

struct Registry {
  std::mutex mu;
  // Pointers stay valid: entries are never removed, and each is its own allocation.
  std::vector<std::unique_ptr<Backend>> backends;
};

Registry& TheRegistry() {
  static Registry* const r = [] {
    auto* reg = new Registry;
    for (Backend& b : BuiltinBackends()) {
      reg->backends.push_back(std::make_unique<Backend>(std::move(b)));
    }
    return reg;
  }();
  return *r;
}

}  // namespace

const char* BackendMemoryName(BackendMemory m) {
  switch (m) {
    case BackendMemory::kHost: return "host memory";
    case BackendMemory::kHostOrDevice: return "host or GPU memory";
    case BackendMemory::kDevice: return "GPU memory";
    case BackendMemory::kMeta: return "no data";
  }
  return "unknown memory";
}

absl::Status RegisterBackend(Backend backend) {
  if (backend.name.empty() || backend.name.find_first_of(" \t=,") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterBackend: name '", backend.name, "' must be a non-empty word (no spaces, '=' "
        "or ','): it is the --backend value"));
  }
  if (!backend.run_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterBackend(", backend.name, "): run_world is not set; the conformance suite and "
        "tests make their worlds through it"));
  }
  if (backend.process_per_rank && !backend.create_from_env) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterBackend(", backend.name, "): a process-per-rank backend needs create_from_env "
        "(a launched process connects through it)"));
  }
  Registry& reg = TheRegistry();
  std::lock_guard<std::mutex> l(reg.mu);
  for (const auto& b : reg.backends) {
    if (b->name == backend.name) {
      return absl::AlreadyExistsError(
          absl::StrCat("RegisterBackend: a backend named '", backend.name, "' exists already"));
    }
  }
  reg.backends.push_back(std::make_unique<Backend>(std::move(backend)));
  return absl::OkStatus();
}

std::vector<const Backend*> Backends() {
  Registry& reg = TheRegistry();
  std::lock_guard<std::mutex> l(reg.mu);
  std::vector<const Backend*> all;
  for (const auto& b : reg.backends) all.push_back(b.get());
  return all;
}

std::vector<std::string> BackendNames() {
  std::vector<std::string> names;
  for (const Backend* b : Backends()) names.push_back(b->name);
  return names;
}

absl::StatusOr<const Backend*> FindBackend(absl::string_view name) {
  for (const Backend* b : Backends()) {
    if (b->name == name) return b;
  }
  return absl::NotFoundError(absl::StrCat("--backend ", name, ": no such backend; the registered "
                                          "backends are ", absl::StrJoin(BackendNames(), ", ")));
}

std::string BackendFlagHelp() {
  std::vector<std::string> lines;
  for (const Backend* b : Backends()) {
    lines.push_back(absl::StrCat(b->name, " (", b->description, "; ", BackendMemoryName(b->memory),
                                 b->process_per_rank ? "; started by collectives/launch, torchrun "
                                                       "or srun" : "",
                                 ")"));
  }
  return absl::StrJoin(lines, ", ");
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectTrainingWorld(
    absl::string_view name, int ranks, bool device_cuda, const ProcessWorldOptions& options) {
  absl::StatusOr<const Backend*> found = FindBackend(name);
  if (!found.ok()) return found.status();
  const Backend& b = **found;
  if (!b.trains) {
    std::vector<std::string> trainable;
    for (const Backend* o : Backends()) {
      if (o->trains) trainable.push_back(o->name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=", name, " (", b.description, ") cannot train; use one of ",
        absl::StrJoin(trainable, ", ")));
  }
  if (b.memory == BackendMemory::kHost && device_cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=", name, " runs on CPU memory: use --device=cpu, or a backend on GPU memory "
        "(nccl) with --device=cuda"));
  }
  if (b.memory == BackendMemory::kDevice && !device_cuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", name, " runs each process on a GPU: add --device=cuda"));
  }
  if (const std::string why = b.unavailable_reason(); !why.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--backend=", name, " cannot run here: ", why));
  }
  if (!b.process_per_rank) {
    // A launcher (collectives/launch, torchrun) started this process as one rank of several: a
    // thread backend would train every process alone, each exiting 0 while a peer on another
    // backend waits for it.
    const char* rank = std::getenv("RANK");
    const char* world = std::getenv("WORLD_SIZE");
    int world_size = 1;
    if (rank != nullptr && world != nullptr && absl::SimpleAtoi(world, &world_size) &&
        world_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend=", name, " runs every rank as a thread of this process, but a launcher "
          "started this process as rank ", rank, " of ", world_size,
          " (RANK and WORLD_SIZE are set), so each process would train alone; use a "
          "process-per-rank backend (--backend=gloo, or nccl with --device=cuda) or start one "
          "process without the launcher"));
    }
    return std::unique_ptr<Communicator>();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> c = b.create_from_env(options);
  if (!c.ok()) {
    // A rendezvous that timed out already says how to start the ranks: say it once.
    const bool says_how = absl::StrContains(
        c.status().message(), absl::StrCat("collectives/launch --nproc_per_node=", ranks, " "));
    return absl::Status(c.status().code(),
                        absl::StrCat("--backend=", name, ": ", c.status().message(),
                                     says_how ? "" : absl::StrCat(
                                         " (start it with collectives/launch --nproc_per_node=",
                                         ranks, " -- <program> ...)")));
  }
  if ((*c)->size() != ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=", name, ": the world has ", (*c)->size(), " processes but the mesh has ", ranks,
        " ranks; launch ", ranks, " processes"));
  }
  return c;
}

}  // namespace shardmap::collectives
