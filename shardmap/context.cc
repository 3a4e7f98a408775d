#include "shardmap/context.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardmap/internal/self_communicator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace shardmap {

RankContext::RankContext(Mesh mesh, int rank, collectives::Communicator* world, TypeCheck check,
                         Device device)
    : mesh_(std::move(mesh)), rank_(rank), coords_(mesh_.Coords(rank)), world_(world),
      check_(check), device_(device) {
  comms_.resize(size_t{1} << mesh_.num_axes());
}

RankContext::~RankContext() = default;

RankContext& RankContext::Get(const char* op) {
  if (current_ == nullptr) {
    OpFail(op, ": no SPMD context on this thread; typed ops run inside shard_map, RunSpmd or a "
               "SingleRankContext");
  }
  return *current_;
}

namespace {

// CallTag words of a typed collective.
enum TagWord { kOpHash, kOpName, kMask, kSeq, kDtype, kRank, kDims, kTagWords = kDims + 8 };
static_assert(kTagWords <= collectives::CallTag::kWords);
constexpr uint64_t kRaggedDim = ~uint64_t{0};

// "all_reduce over 'tp' of f32[4,8] (collective #3 of its program)"; axis names from the
// formatting thread's context (the ranks of one world share the mesh).
std::string DescribeTypedCollective(const uint64_t* w) {
  std::string axes = absl::StrCat("axes mask ", w[kMask]);
  if (RankContext* ctx = RankContext::Current()) {
    axes = ctx->mesh().MaskToString(static_cast<AxisMask>(w[kMask]));
  }
  std::vector<std::string> dims;
  for (uint64_t d = 0; d < w[kRank] && d < 8; ++d) {
    dims.push_back(w[kDims + d] == kRaggedDim ? "*" : absl::StrCat(w[kDims + d]));
  }
  if (w[kRank] > 8) dims.push_back("...");
  return absl::StrCat(reinterpret_cast<const char*>(w[kOpName]), " over ", axes, " of ",
                      DTypeName(static_cast<DType>(w[kDtype])), "[", absl::StrJoin(dims, ","),
                      "] (collective #", w[kSeq], " of its program)");
}

uint64_t HashName(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s != 0; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

}  // namespace

collectives::Communicator& RankContext::CommFor(const char* op, AxisMask mask, const Tensor& x,
                                                int ragged_dim) {
  collectives::CallTag tag;
  uint64_t* w = tag.words;
  w[kOpHash] = HashName(op);
  w[kOpName] = reinterpret_cast<uint64_t>(op);
  w[kMask] = mask;
  w[kSeq] = ++collective_seq_;
  w[kDtype] = static_cast<uint64_t>(x.dtype());
  w[kRank] = static_cast<uint64_t>(x.rank());
  for (int d = 0; d < x.rank(); ++d) {
    const uint64_t size = d == ragged_dim ? kRaggedDim : static_cast<uint64_t>(x.dim(d));
    if (d < 8) {
      w[kDims + d] = size;
    } else {  // fold the dims past the 8th into the last word
      w[kDims + 7] = (w[kDims + 7] ^ size) * 1099511628211ull;
    }
  }
  tag.describe = &DescribeTypedCollective;
  if (comms_[mask] == nullptr && mask != AllAxes()) world_->TagNextCall(tag);  // the Split
  collectives::Communicator& comm = Comm(mask);
  comm.TagNextCall(tag);
  return comm;
}

AxisMask RankContext::AllAxes() const { return (AxisMask{1} << mesh_.num_axes()) - 1; }

collectives::Communicator& RankContext::Comm(AxisMask mask) {
  if (mask == AllAxes()) return *world_;
  std::unique_ptr<collectives::Communicator>& c = comms_[mask];
  if (c == nullptr) {
    absl::StatusOr<std::unique_ptr<collectives::Communicator>> split =
        world_->Split(mesh_.GroupColor(rank_, mask), mesh_.GroupIndex(rank_, mask));
    if (!split.ok()) {
      throw OpError(absl::Status(split.status().code(),
                                 absl::StrCat("while creating the communicator of axes ",
                                              mesh_.MaskToString(mask), ": ",
                                              split.status().message())));
    }
    c = *std::move(split);
  }
  return *c;
}

int RankContext::CountCollectives(const char* op, AxisMask axes, bool backward) const {
  int n = 0;
  for (const CollectiveRecord& r : log_) {
    if (std::string(r.op) == op && r.axes == axes && r.backward == backward) ++n;
  }
  return n;
}

SingleRankContext::SingleRankContext(Mesh mesh, TypeCheck check)
    : self_(std::make_unique<internal::SelfCommunicator>()) {
  if (mesh.size() != 1) {
    throw OpError(absl::InvalidArgumentError(absl::StrCat(
        "SingleRankContext needs a mesh of one rank (all axes of size 1), got ",
        mesh.ShortString())));
  }
  ctx_ = std::make_unique<RankContext>(std::move(mesh), 0, self_.get(), check);
  scope_ = std::make_unique<ScopedRankContext>(ctx_.get());
}

SingleRankContext::~SingleRankContext() = default;

std::string RankDescription(const Mesh& mesh, int rank) {
  std::vector<std::string> parts;
  for (int i = 0; i < mesh.num_axes(); ++i) {
    parts.push_back(absl::StrCat(mesh.axis_names()[i], "=", mesh.Coord(rank, i)));
  }
  return absl::StrCat("rank ", rank, " (", absl::StrJoin(parts, ","), ")");
}

std::string DevicePlacement::ToString() const {
  switch (kind) {
    case Kind::kCpu: return "cpu";
    case Kind::kGpuPerRank: return "gpu-per-rank";
    case Kind::kSharedGpu: return absl::StrCat("shared-gpu(", shared_gpu, ")");
    case Kind::kCustom: return "custom";
  }
  return "?";
}

absl::StatusOr<std::vector<Device>> ResolvePlacement(const DevicePlacement& placement,
                                                     int world_size) {
  std::vector<Device> devices(world_size, Device::Cpu());
  if (placement.is_cpu()) return devices;
  auto no_gpu = [&]() {
    return absl::FailedPreconditionError(absl::StrCat(
        "device placement ", placement.ToString(), " needs a GPU but none is usable: ",
        cuda::UnavailableReason(), "; run on the CPU (DevicePlacement::Cpu(), the default)"));
  };
  const int gpus = cuda::DeviceCount();
  switch (placement.kind) {
    case DevicePlacement::Kind::kCpu:
      return devices;
    case DevicePlacement::Kind::kGpuPerRank:
      if (gpus == 0) return no_gpu();
      if (gpus < world_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device placement gpu-per-rank puts each of the ", world_size,
            " ranks on its own GPU but only ", gpus, " GPU", gpus == 1 ? " is" : "s are",
            " visible; use DevicePlacement::SharedGpu() to run several ranks on one GPU (each "
            "with its own stream), or a smaller mesh"));
      }
      for (int r = 0; r < world_size; ++r) devices[r] = Device::Cuda(r);
      return devices;
    case DevicePlacement::Kind::kSharedGpu:
      if (gpus == 0) return no_gpu();
      if (placement.shared_gpu < 0 || placement.shared_gpu >= gpus) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device placement shared-gpu(", placement.shared_gpu, ") names GPU ",
            placement.shared_gpu, " but ", gpus, " GPU", gpus == 1 ? " is" : "s are",
            " visible"));
      }
      for (int r = 0; r < world_size; ++r) devices[r] = Device::Cuda(placement.shared_gpu);
      return devices;
    case DevicePlacement::Kind::kCustom: {
      if (!placement.custom) {
        return absl::InvalidArgumentError("device placement custom has no function");
      }
      int on_gpu = 0;
      for (int r = 0; r < world_size; ++r) {
        devices[r] = placement.custom(r);
        if (!devices[r].is_cuda()) continue;
        ++on_gpu;
        if (gpus == 0) return no_gpu();
        if (devices[r].index < 0 || devices[r].index >= gpus) {
          return absl::FailedPreconditionError(absl::StrCat(
              "device placement custom puts rank ", r, " on ", devices[r].ToString(), " but ",
              gpus, " GPU", gpus == 1 ? " is" : "s are", " visible"));
        }
      }
      if (on_gpu != 0 && on_gpu != world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device placement custom puts ", on_gpu, " of ", world_size,
            " ranks on GPUs and the others on the CPU; a collective needs every rank's memory "
            "of one kind: place all ranks on GPUs or all on the CPU"));
      }
      return devices;
    }
  }
  return devices;
}

namespace {

// One stream per (device, rank slot), created on first use and kept for the process: repeated
// RunSpmd calls reuse them, and with them the caching allocator's per-stream blocks.
absl::StatusOr<cuda::StreamHandle> PooledStream(int device, int slot) {
  static std::mutex mu;
  static auto* pool = new std::map<std::pair<int, int>, cuda::StreamHandle>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = pool->find({device, slot});
  if (it != pool->end()) return it->second;
  cuda::StreamHandle s = nullptr;
  absl::Status st = CatchOpError([&] { s = cuda::NewStream(device); });
  if (!st.ok()) return st;
  (*pool)[{device, slot}] = s;
  return s;
}

}  // namespace

absl::StatusOr<std::vector<collectives::MemorySpace>> RankMemorySpaces(const SpmdOptions& options,
                                                                       int world_size) {
  std::vector<collectives::MemorySpace> spaces(world_size);
  if (!options.placement.is_cpu()) {
    absl::StatusOr<std::vector<Device>> devices = ResolvePlacement(options.placement, world_size);
    if (!devices.ok()) return devices.status();
    for (int r = 0; r < world_size; ++r) {
      const Device d = (*devices)[r];
      spaces[r] = collectives::MemorySpace{d.is_cuda(), d.index, nullptr};
      if (options.comm.memory_space) {
        collectives::MemorySpace m = options.comm.memory_space(r);
        if (m.device != d.is_cuda() || (m.device && m.device_index != d.index)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", r, " is placed on ", d.ToString(), " by placement ",
              options.placement.ToString(), " but comm.memory_space puts its buffers on ",
              m.device ? absl::StrCat("cuda:", m.device_index) : std::string("cpu"),
              "; set only the placement"));
        }
        spaces[r].stream = m.stream;
      }
    }
  } else if (options.comm.memory_space) {
    const int gpus = cuda::DeviceCount();
    int on_gpu = 0;
    for (int r = 0; r < world_size; ++r) {
      spaces[r] = options.comm.memory_space(r);
      if (!spaces[r].device) continue;
      ++on_gpu;
      if (spaces[r].device_index < 0 || spaces[r].device_index >= gpus) {
        return absl::FailedPreconditionError(absl::StrCat(
            "comm.memory_space puts rank ", r, " on cuda:", spaces[r].device_index, " but ", gpus,
            " GPU", gpus == 1 ? " is" : "s are", " visible",
            gpus == 0 ? absl::StrCat(" (", cuda::UnavailableReason(), ")") : std::string(),
            "; DevicePlacement::SharedGpu() runs several ranks on one GPU"));
      }
    }
    if (on_gpu != 0 && on_gpu != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "comm.memory_space puts ", on_gpu, " of ", world_size,
          " ranks on GPUs and the others on the CPU; all ranks need the same kind of memory"));
    }
  }
  std::map<int, int> next_slot;  // device -> rank slots handed out
  for (int r = 0; r < world_size; ++r) {
    collectives::MemorySpace& m = spaces[r];
    if (!m.device || m.stream != nullptr) continue;
    absl::StatusOr<cuda::StreamHandle> s = PooledStream(m.device_index, next_slot[m.device_index]++);
    if (!s.ok()) return s.status();
    m.stream = *s;
  }
  return spaces;
}

namespace {

// Host bytes -> a device tensor of `count` elements on `device` (current stream).
Tensor Staged(const void* host, size_t count, collectives::DataType dtype, Device device) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(count)}, static_cast<DType>(dtype));
  if (count > 0) std::memcpy(t.raw_data(), host, t.nbytes());
  return t.To(device);
}

void Unstage(const Tensor& dev, void* host) {
  Tensor t = dev.To(Device::Cpu());
  if (t.numel() > 0) std::memcpy(host, t.raw_data(), t.nbytes());
}

}  // namespace

absl::Status AllGatherHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t send_count, collectives::DataType dtype) {
  const collectives::MemorySpace m = comm.memory_space();
  if (!m.device) return comm.AllGather(send, recv, send_count, dtype);
  absl::Status result;
  absl::Status s = CatchOpError([&] {
    const Device d = Device::Cuda(m.device_index);
    Tensor in = Staged(send, send_count, dtype, d);
    Tensor out = Tensor::Empty({static_cast<int64_t>(send_count) * comm.size()},
                               static_cast<DType>(dtype), d);
    result = comm.AllGather(in.raw_data(), out.raw_data(), send_count, dtype);
    if (result.ok()) Unstage(out, recv);
  });
  return s.ok() ? result : s;
}

absl::Status AllReduceHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t count, collectives::DataType dtype, collectives::ReduceOp op) {
  const collectives::MemorySpace m = comm.memory_space();
  if (!m.device) return comm.AllReduce(send, recv, count, dtype, op);
  absl::Status result;
  absl::Status s = CatchOpError([&] {
    Tensor buf = Staged(send, count, dtype, Device::Cuda(m.device_index));
    result = comm.AllReduce(buf.raw_data(), buf.raw_data(), count, dtype, op);
    if (result.ok()) Unstage(buf, recv);
  });
  return s.ok() ? result : s;
}

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
  return collectives::RunInProcess(
      mesh.size(),
      [&](collectives::Communicator& comm) -> absl::Status {
        return RunRank(comm, mesh, body, options.check);
      },
      comm_options);
}

}  // namespace shardmap
