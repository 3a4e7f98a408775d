// The per-rank context of SPMD code: the mesh, this rank's coordinates, the communicators per
// axis set (split lazily on first use and cached), the type-checking mode, and a log of the
// collectives issued (so tests can assert "one all-reduce forward and one backward per layer").
//
// It is thread-local: shard_map and RunSpmd install one on each rank-thread.
//
//   absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
//     int tp = ctx.coord(ctx.mesh().AxisIndex("tp"));
//     ...typed ops and collectives...
//   });
//
//   // One rank, no threads (overhead measurements, single-device runs): a mesh whose axes all
//   // have size 1 and a trivial communicator.
//   SingleRankContext one(*Mesh::Create({{"dp", 1}, {"tp", 1}}));
//   Value y = gelu(x);   // runs on this thread
//
// Axis sets are used in the same order on every rank in SPMD code, so creating the communicator
// of an axis set lazily (a collective Split over the world) is safe.
//
// GPU ranks (DevicePlacement): each rank runs on a device; per-device code creates its tensors
// there (Tensor::Empty(shape, dtype, ctx.device())) and collectives move device memory:
//
//   SpmdOptions o;
//   o.placement = DevicePlacement::SharedGpu();    // 4 virtual ranks on GPU 0, a stream each
//   // o.placement = DevicePlacement::GpuPerRank(); // rank r on GPU r (needs >= 4 GPUs)
//   RunSpmd(*Mesh::Create({{"tp", 4}}), [&](RankContext& ctx) {
//     Tensor x = Tensor::Ones({8}, DType::kF32, ctx.device());   // on cuda:0, this rank's stream
//     ...
//   }, o);
//
// Each GPU rank thread is bound (cuda::StreamScope) to its device and a stream of its own for
// the body, and the in-process communicator works on device memory ordered on that stream.
// Streams come from a process-wide pool (one per (device, rank slot)), so repeated RunSpmd calls
// reuse them and the caching allocator's per-stream blocks. Before a GPU rank's thread returns
// its stream is synchronised, so the tensors it produced may be read from any thread; before the
// ranks start, the calling thread's current stream of each of their devices is waited for, so
// device tensors the caller made (or freed) just before are ready (or unused) when ranks run.
// RunOnCommunicator over an NCCL communicator binds the thread to the communicator's device and
// stream the same way (one GPU per process).
#ifndef SHARDMAP_SHARDMAP_CONTEXT_H_
#define SHARDMAP_SHARDMAP_CONTEXT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "absl/status/statusor.h"
#include "shardmap/mesh.h"
#include "tensor/tensor.h"

namespace shardmap {

// Where the ranks of an in-process SPMD run live.
//   Cpu()         every rank on the host (the default; CPU kernels, host-memory collectives).
//   GpuPerRank()  rank r on GPU r; an error when there are fewer GPUs than ranks.
//   SharedGpu(g)  every rank on GPU g, each with its own stream (virtual ranks: kernels of the
//                 ranks overlap; collectives are in-process copies/reductions on device memory).
//   Custom(fn)    rank r on fn(r) (GPUs only, or CPU for every rank).
struct DevicePlacement {
  enum class Kind : uint8_t { kCpu, kGpuPerRank, kSharedGpu, kCustom };
  Kind kind = Kind::kCpu;
  int shared_gpu = 0;                     // kSharedGpu
  std::function<Device(int rank)> custom;  // kCustom

  static DevicePlacement Cpu() { return DevicePlacement{}; }
  static DevicePlacement GpuPerRank() { return DevicePlacement{Kind::kGpuPerRank, 0, nullptr}; }
  static DevicePlacement SharedGpu(int gpu = 0) {
    return DevicePlacement{Kind::kSharedGpu, gpu, nullptr};
  }
  static DevicePlacement Custom(std::function<Device(int rank)> fn) {
    return DevicePlacement{Kind::kCustom, 0, std::move(fn)};
  }
  bool is_cpu() const { return kind == Kind::kCpu; }
  std::string ToString() const;  // "cpu", "gpu-per-rank", "shared-gpu(0)", "custom"
};

// The device of each of world_size ranks. FailedPrecondition when a GPU placement is asked for
// without a usable GPU or with fewer GPUs than it needs (the message names both counts and the
// alternative); InvalidArgument for a custom placement that mixes CPU and GPU ranks.
absl::StatusOr<std::vector<Device>> ResolvePlacement(const DevicePlacement& placement,
                                                     int world_size);

// kOn: every op evaluates its type rule and fails on a violation (the default).
// kErased: no rule is evaluated; values carry a cheap kind-only summary (no S(d), no checks) that
// only serves to seed the backward pass (see autograd/value_and_grad.h); numbers are bitwise the
// same as with kOn.
enum class TypeCheck : uint8_t { kOn, kErased };

struct CollectiveRecord {
  const char* op;     // "all_reduce", "all_gather", ...
  AxisMask axes;
  int64_t bytes;      // bytes this rank contributed
  bool backward;      // issued while running the backward pass
};

struct SpmdOptions {
  TypeCheck check = TypeCheck::kOn;
  collectives::InProcessOptions comm;
  // Where the ranks run. A GPU placement sets comm.memory_space (device, index, the rank's
  // stream); leave comm.memory_space unset then. With the default (CPU) placement, a
  // comm.memory_space that puts ranks on GPUs places them there too.
  DevicePlacement placement;
};

class RankContext {
 public:
  RankContext(Mesh mesh, int rank, collectives::Communicator* world, TypeCheck check,
              Device device = Device::Cpu());
  ~RankContext();
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  // The context of this thread, or nullptr.
  static RankContext* Current() { return current_; }
  // The context of this thread; throws OpError naming `op` when there is none.
  static RankContext& Get(const char* op);

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  int coord(int axis) const { return coords_[axis]; }
  // The device this rank runs on (its tensors live there; collectives move its memory).
  Device device() const { return device_; }
  bool checked() const { return check_ == TypeCheck::kOn; }
  TypeCheck check() const { return check_; }
  void set_check(TypeCheck c) { check_ = c; }

  // The communicator of this rank's group over `mask` (its rank is GroupIndex). Throws OpError.
  collectives::Communicator& Comm(AxisMask mask);
  // Comm(mask), with its next call tagged as typed collective `op` of x over `mask` and numbered
  // in this rank's program order (collectives::CallTag). Under SPMD every rank issues its n-th
  // collective with the same op, axes, dtype and shape, so a rank that disagrees (rank-dependent
  // control flow, per-rank shapes) fails the call on every rank of the group with both
  // descriptions, instead of meeting a peer that is doing something else. The communicator of an
  // axis set is created (a Split over the world) at its first use, with the same tag, so ranks
  // whose first collectives name different axes fail there too. ragged_dim: a dim of x whose size
  // may differ across ranks (the uneven variants), left out of the comparison.
  collectives::Communicator& CommFor(const char* op, AxisMask mask, const Tensor& x,
                                     int ragged_dim = -1);
  // Typed collectives issued so far by this rank (the program order CommFor numbers).
  uint64_t collective_count() const { return collective_seq_; }
  collectives::Communicator& world() { return *world_; }

  // Whether the backward pass is running (set by autograd); tags logged collectives.
  bool in_backward() const { return in_backward_; }
  void set_in_backward(bool b) { in_backward_ = b; }

  void LogCollective(const char* op, AxisMask axes, int64_t bytes) {
    log_.push_back({op, axes, bytes, in_backward_});
  }
  const std::vector<CollectiveRecord>& collective_log() const { return log_; }
  void ClearCollectiveLog() { log_.clear(); }
  // Number of logged collectives named `op` over `axes` in the given direction.
  int CountCollectives(const char* op, AxisMask axes, bool backward) const;

 private:
  friend class ScopedRankContext;
  AxisMask AllAxes() const;
  static inline thread_local RankContext* current_ = nullptr;

  Mesh mesh_;
  int rank_;
  std::vector<int> coords_;
  collectives::Communicator* world_;
  TypeCheck check_;
  Device device_;
  bool in_backward_ = false;
  uint64_t collective_seq_ = 0;
  std::vector<std::unique_ptr<collectives::Communicator>> comms_;  // indexed by mask
  std::vector<CollectiveRecord> log_;
};

// Installs ctx as this thread's context for the scope.
class ScopedRankContext {
 public:
  explicit ScopedRankContext(RankContext* ctx) : prev_(RankContext::current_) {
    RankContext::current_ = ctx;
  }
  ~ScopedRankContext() { RankContext::current_ = prev_; }
  ScopedRankContext(const ScopedRankContext&) = delete;
  ScopedRankContext& operator=(const ScopedRankContext&) = delete;

 private:
  RankContext* prev_;
};

// A context over one rank (every mesh axis must have size 1), installed on this thread for the
// object's lifetime. No threads, no communication.
class SingleRankContext {
 public:
  explicit SingleRankContext(Mesh mesh, TypeCheck check = TypeCheck::kOn);
  ~SingleRankContext();
  RankContext& ctx() { return *ctx_; }

 private:
  std::unique_ptr<collectives::Communicator> self_;
  std::unique_ptr<RankContext> ctx_;
  std::unique_ptr<ScopedRankContext> scope_;
};

// Runs body on mesh.size() in-process ranks, each with its RankContext installed. An OpError (or
// another exception) thrown by a rank becomes that rank's Status; a failing rank poisons the world
// so the others do not hang. Returns the first failure, annotated with its rank and coordinates.
absl::Status RunSpmd(const Mesh& mesh, const std::function<void(RankContext&)>& body,
                     const SpmdOptions& options = {});

// Runs body with a RankContext over an existing communicator (the local view in a multi-process
// program: comm is this process's world, comm.size() == mesh.size()). When the communicator
// works on device memory (NCCL), the rank runs on that GPU: the thread is bound to the
// communicator's device and stream for the body (so kernels and collectives are ordered on one
// stream), ctx.device() is that GPU, and the stream is synchronised before returning.
absl::Status RunOnCommunicator(collectives::Communicator& comm, const Mesh& mesh,
                               const std::function<void(RankContext&)>& body,
                               TypeCheck check = TypeCheck::kOn);

// The memory space of each rank of an in-process run under `options` (placement or
// comm.memory_space), with streams from the process-wide pool filled in; FailedPrecondition or
// InvalidArgument as ResolvePlacement, or when both disagree. Public for tests and tools.
absl::StatusOr<std::vector<collectives::MemorySpace>> RankMemorySpaces(const SpmdOptions& options,
                                                                       int world_size);

// Collectives on host buffers (shape records, hashes, small masks) over any communicator: when
// comm works on device memory, the buffers are staged through device memory on this thread's
// current stream of that device (the rank's stream inside RunSpmd / RunOnCommunicator).
absl::Status AllGatherHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t send_count, collectives::DataType dtype);
absl::Status AllReduceHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t count, collectives::DataType dtype, collectives::ReduceOp op);

// "rank 5 (dp=1,tp=2)"
std::string RankDescription(const Mesh& mesh, int rank);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_CONTEXT_H_
