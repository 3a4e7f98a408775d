#include "shardmap/runtime/spmd_runner.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardmap/runtime/collective_recorder.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace shardmap {

namespace {

absl::Status RunBody(RankContext& ctx, const std::function<void(RankContext&)>& body) {
  ScopedRankContext scope(&ctx);
  absl::Status s = CatchOpError([&] { body(ctx); });
  if (!s.ok()) {
    std::vector<std::string> parts;
    for (int i = 0; i < ctx.mesh().num_axes(); ++i) {
      parts.push_back(absl::StrCat(ctx.mesh().axis_names()[i], "=", ctx.coord(i)));
    }
    return absl::Status(s.code(), absl::StrCat("at mesh coordinates (", absl::StrJoin(parts, ","),
                                               "): ", s.message()));
  }
  return s;
}

// Runs body as rank comm.rank(), on the device of comm's memory space: a GPU rank's thread is
// bound to (device, stream) for the body and waits for the stream before returning.
absl::Status RunRank(collectives::Communicator& comm, const Mesh& mesh,
                     const std::function<void(RankContext&)>& body, TypeCheck check) {
  const collectives::MemorySpace m = comm.memory_space();
  if (!m.device) {
    RankContext ctx(mesh, comm.rank(), &comm, check);
    return RunBody(ctx, body);
  }
  RankContext ctx(mesh, comm.rank(), &comm, check, Device::Cuda(m.device_index));
  absl::Status body_status;
  absl::Status s = CatchOpError([&] {
    cuda::StreamScope scope(m.device_index, m.stream);
    body_status = RunBody(ctx, body);
    cuda::Synchronize(m.device_index);
  });
  if (!body_status.ok()) return body_status;
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("on ", RankDescription(mesh, comm.rank()), " (",
                                               ctx.device().ToString(), "): ", s.message()));
  }
  return s;
}

// The ranks' streams are not ordered after the calling thread's: device tensors it made (a host
// -> device copy, a fill) may still be in flight, and blocks it freed after using device tensors
// the ranks made on their streams may be reused there. Wait for the caller's current stream of
// every device the ranks use before they start.
absl::Status WaitForCallerStreams(const std::vector<collectives::MemorySpace>& spaces) {
  std::vector<int> done;
  for (const collectives::MemorySpace& m : spaces) {
    if (!m.device || std::find(done.begin(), done.end(), m.device_index) != done.end()) continue;
    done.push_back(m.device_index);
    absl::Status s = CatchOpError([&] { cuda::Synchronize(m.device_index); });
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("before starting the ranks on cuda:",
                                                 m.device_index, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOnCommunicator(collectives::Communicator& comm, const Mesh& mesh,
                               const std::function<void(RankContext&)>& body, TypeCheck check) {
  if (comm.size() != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh ", mesh.ShortString(), " has ",
                                                   mesh.size(), " ranks but the communicator ",
                                                   comm.name(), " has ", comm.size()));
  }
  if (absl::Status s = WaitForCallerStreams({comm.memory_space()}); !s.ok()) return s;
  return RunRank(comm, mesh, body, check);
}

absl::Status RunSpmd(const Mesh& mesh, const std::function<void(RankContext&)>& body,
                     const SpmdOptions& options) {
  absl::StatusOr<std::vector<collectives::MemorySpace>> spaces =
      RankMemorySpaces(options, mesh.size());
  if (!spaces.ok()) return spaces.status();
  collectives::InProcessOptions comm_options = options.comm;
  bool any_device = false;
  for (const collectives::MemorySpace& m : *spaces) any_device = any_device || m.device;
  if (any_device) {
    if (absl::Status s = WaitForCallerStreams(*spaces); !s.ok()) return s;
    comm_options.memory_space = [spaces = *spaces](int r) { return spaces[r]; };
  }
  // The rank threads record into the CollectiveRecorders of this thread.
  const std::vector<CollectiveRecorder*> recorders = internal::ActiveRecorders();
  return collectives::RunInProcess(
      mesh.size(),
      [&](collectives::Communicator& comm) -> absl::Status {
        internal::ScopedInheritedRecorders inherit(recorders);
        return RunRank(comm, mesh, body, options.check);
      },
      comm_options);
}

}  // namespace shardmap
