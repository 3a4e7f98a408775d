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
#ifndef SHARDMAP_SHARDMAP_ASYNC_COLLECTIVES_H_
#define SHARDMAP_SHARDMAP_ASYNC_COLLECTIVES_H_

#include <memory>
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

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_ASYNC_COLLECTIVES_H_
