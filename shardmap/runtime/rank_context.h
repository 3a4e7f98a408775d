// The per-rank context of SPMD code (see context.h for the overview): the mesh, this rank's
// coordinates and device, the communicators per axis set, the type-checking mode and the log of
// the collectives issued. Thread-local: RankContext::Current().
//
//   SingleRankContext one(*Mesh::Create({{"dp", 1}, {"tp", 1}}));  // one rank, this thread
//   RankContext& ctx = RankContext::Get("my_op");   // throws OpError outside SPMD code
//   int dp = ctx.coord(ctx.mesh().AxisIndex("dp"));
#ifndef SHARDMAP_SHARDMAP_RUNTIME_RANK_CONTEXT_H_
#define SHARDMAP_SHARDMAP_RUNTIME_RANK_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "shardmap/mesh.h"
#include "tensor/tensor.h"

namespace shardmap {

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
  DType dtype = DType::kF32;  // of the data this rank contributed
  // Issued again in the backward by a recomputed forward (autograd/checkpoint.h), backward set.
  bool recomputed = false;
  // When it ran, on the steady clock in microseconds (SteadyClockUs; the trace's time base):
  // a blocking call from its start to its return; a started one (async_collectives.h) from its
  // start to the return of its Wait(), the time it was in flight beside the rank's compute.
  double start_us = 0, end_us = 0;
  // A started call (all_reduce_start, ...; set when its Wait() returned): it could overlap.
  bool started = false;
};

// Microseconds on the steady clock (models/gpt/gpt_trace.h's TraceNowUs has the same base).
double SteadyClockUs();

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
  // Pipeline stages (models/parallel/pipeline.h) run different programs: stage 0 issues tp collectives in
  // the embedding, the last stage in the loss. With this on, CommFor numbers each axis set's
  // collectives on its own, so a group still checks that its members agree on its own sequence
  // (op, shape, position) without requiring the same collectives elsewhere in the program.
  // Create the communicators first (a world-wide split at first use must stay in one order).
  void set_number_per_axis_set(bool on) { per_axis_set_ = on; }
  collectives::Communicator& world() { return *world_; }

  // Whether the backward pass is running (set by autograd); tags logged collectives.
  bool in_backward() const { return in_backward_; }
  void set_in_backward(bool b) { in_backward_ = b; }
  // Whether a checkpointed forward is being recomputed (set by autograd/checkpoint.h); tags
  // logged collectives as recomputed.
  bool recomputing() const { return recomputing_; }
  void set_recomputing(bool b) { recomputing_ = b; }

  // Appends to this rank's log and to the CollectiveRecorders active on this thread
  // (collective_recorder.h).
  // start_us / end_us: see CollectiveRecord (0: now).
  void LogCollective(const char* op, AxisMask axes, int64_t bytes, DType dtype,
                     double start_us = 0, double end_us = 0);
  // A started collective's Wait() returned: record `index` of the log (if it is still there)
  // ends now and is marked started.
  void EndCollective(size_t index);
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
  bool recomputing_ = false;
  uint64_t collective_seq_ = 0;
  bool per_axis_set_ = false;
  std::vector<uint64_t> seq_by_mask_;  // with per_axis_set_, indexed by mask
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

// "rank 5 (dp=1,tp=2)"
std::string RankDescription(const Mesh& mesh, int rank);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_RANK_CONTEXT_H_
