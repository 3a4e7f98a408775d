// A non-blocking typed ppermute: start the transfer, compute, then wait for it. The building
// block of collective matmuls (models/parallel/async_tp.h), where each ring step's transfer overlaps the
// previous step's matmul.
//
//   PendingPpermute next = ppermute_start(chunk, "tp", {{0, 1}, {1, 2}, {2, 0}});  // R/V -> V
//   Value part = chunk.matmul(w);     // runs while the chunk moves to the next device
//   Value got = next.Wait();          // the same value and type as ppermute(chunk, "tp", ...)
//
// What it is typed as. The handle is move-only and must be waited exactly once: Wait() on a
// waited or moved-from handle throws OpError; a handle destroyed without Wait() fails the program
// on the in-process backend (the world is poisoned with "started but never waited", so every
// rank's next collective and RunSpmd/shard_map return that error; no rank hangs). A handle
// dropped while an exception unwinds just abandons the transfer (the exception is the error).
// x must not be modified in place before Wait() (typed ops never do).
//
// Backends. The communicator's PpermuteStart: the in-process backend copies while the ranks
// compute (collectives/in_process_async.h says how); the others (NCCL, Gloo, one device) run the
// blocking ppermute at the start, so the same code works there without overlap, and a dropped
// handle is not reported there.
//
// Autograd: start and Wait() are two tape ops joined by a token (an empty value); their
// transposes swap roles. The VJP of Wait() *starts* the inverse ppermute of the cotangent; the
// VJP of the start *waits* for it. The tape runs VJPs in reverse order, so the ops recorded
// between start and Wait() (the step's matmul) have their VJPs run between those two as well:
// the backward pass overlaps its transfers exactly as the forward pass does. Types and the
// collective log are those of ppermute (one "ppermute" record per start, forward or backward).
//
// Started all-reduce, reduce-scatter and all-gather (the overlapped training step:
// models/train/grad_buckets.h, models/train/fsdp_params.h):
//
//   PendingValue r = all_reduce_start(bucket, {"dp"});          // P -> R, as all_reduce
//   ... the backward of earlier layers runs ...
//   Value reduced = r.Wait();
//   PendingValue w = all_gather_start(shard, 0, {"dp_shard"});  // S(0) -> R, as all_gather
//   Value full = w.Wait();                                      // on a tape: differentiable
//
// They run on the communicator's started-call lane (Communicator::AllReduceStart: a background
// thread over a duplicate group, or a communication stream), so they proceed while the rank
// computes where the backend overlaps (OverlapsStartedCalls) and complete at the start
// otherwise. Types, checks, the agreement tag and the collective log are the blocking op's;
// numbers are bitwise the blocking op's. all_reduce_start and reduce_scatter_start are for
// values off the tape (gradients: they throw on a value being recorded); all_gather_start is
// differentiable the way ppermute_start is: the VJP of Wait() starts the reduce-scatter of the
// cotangent and the VJP of the start waits for it, so in the backward each reduce-scatter
// overlaps the VJPs recorded between the two (FSDP's backward prefetch, mirrored).
#ifndef SHARDMAP_SHARDMAP_RUNTIME_ASYNC_COLLECTIVES_H_
#define SHARDMAP_SHARDMAP_RUNTIME_ASYNC_COLLECTIVES_H_

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "shardmap/axis_names.h"
#include "shardmap/value.h"

namespace shardmap {

class PendingPpermute {
 public:
  PendingPpermute();
  PendingPpermute(PendingPpermute&&) noexcept;
  PendingPpermute& operator=(PendingPpermute&&) noexcept;
  ~PendingPpermute();

  // The received value (zeros on a device that is no destination). Throws OpError.
  [[nodiscard]] Value Wait();
  // Started and not yet waited.
  bool pending() const { return state_ != nullptr; }

  struct State;

 private:
  friend PendingPpermute ppermute_start(const Value&, const Axes&,
                                        std::vector<std::pair<int, int>>);
  std::unique_ptr<State> state_;
};

// pairs (source, destination) of group indices along `axes`, as ppermute. Throws OpError.
[[nodiscard]] PendingPpermute ppermute_start(const Value& x, const Axes& axes,
                                             std::vector<std::pair<int, int>> pairs);
inline Value ppermute_wait(PendingPpermute& p) { return p.Wait(); }

// A started all-reduce, reduce-scatter or all-gather; Wait() exactly once (as PendingPpermute).
class PendingValue {
 public:
  PendingValue();
  PendingValue(PendingValue&&) noexcept;
  PendingValue& operator=(PendingValue&&) noexcept;
  ~PendingValue();

  // The blocking op's value and type. Throws OpError.
  [[nodiscard]] Value Wait();
  bool pending() const { return state_ != nullptr; }

  struct State;

 private:
  friend struct PendingValueAccess;
  std::unique_ptr<State> state_;
};

// Sum over axes where x is P (P -> R). x must not be on a tape. Throws OpError.
[[nodiscard]] PendingValue all_reduce_start(const Value& x, const Axes& axes);
// Sum over axes and keep this device's chunk of dim (P -> S(dim)); dim divisible by the group.
[[nodiscard]] PendingValue reduce_scatter_start(const Value& x, int dim, const Axes& axes);
// Concatenate the devices' x along dim (S(dim) -> R, or V -> R). Differentiable. With
// gather_dtype (FSDP2's param_dtype), x is cast to it first, so the transfer moves that dtype;
// the backward casts the cotangent back to x's dtype before the reduce-scatter (FSDP2's
// reduce_dtype = the parameter's): bitwise all_gather(x) followed by cast(., gather_dtype).
[[nodiscard]] PendingValue all_gather_start(const Value& x, int dim, const Axes& axes,
                                            std::optional<DType> gather_dtype = std::nullopt);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_ASYNC_COLLECTIVES_H_
