// In-process world: N ranks as N threads of this process, exchanging buffer addresses over
// shared memory. The default backend for tests, demos and laptops.
//
//   absl::Status s = RunInProcess(8, [](Communicator& comm) -> absl::Status {
//     float x = comm.rank();
//     return comm.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);   // x == 28 everywhere
//   });
//
// If any rank's function returns an error (or throws, or returns while others still wait in a
// collective), the world is poisoned: every other rank's pending and future collectives fail
// within options.timeout with an error naming the failed rank, and RunInProcess returns the first
// failure (annotated with its rank). It never hangs.
//
// Started calls. PpermuteStart posts the buffers and lets whichever partner waits first copy
// (in_process_async.h: no thread). AllReduceStart / AllGatherStart / ReduceScatterStart (host
// memory) run on a lane instead (async_lane.h): a thread per rank's communicator over a
// duplicate group. Why not in_process_async's scheme: a reduction is a group-wide rendezvous
// with work (the sums) that some thread must do; done at Wait() by the first rank to arrive, it
// would happen only when a rank stops computing, so nothing would overlap. On the lane it runs
// while the rank computes, on whatever core is free; on this 2-core machine with more ranks than
// cores the sums still compete with compute (the gain there is the waiting for the slowest rank
// and, under collectives/simulated_link.h, the modelled transfer time), but the bits are the blocking
// calls' (same kernel, rank order). GPU memory: the blocking defaults (every call synchronises
// the rank's stream with the host), so OverlapsStartedCalls() is false there.
#ifndef SHARDMAP_COLLECTIVES_IN_PROCESS_H_
#define SHARDMAP_COLLECTIVES_IN_PROCESS_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"

namespace shardmap::collectives {

struct InProcessOptions {
  // How long a rank waits in a collective for its peers before failing with DeadlineExceeded.
  absl::Duration timeout = absl::Seconds(120);
  // Checks that every rank of a group issues the same collective (op, dtype, count, group,
  // sequence number); reports a mismatch with both call sites.
  bool debug_check_calls = false;
  // Where rank r's buffers live; unset: host memory for every rank. For GPUs return
  // {.device = true, .device_index = g}: several ranks may share one GPU. With a null stream
  // each rank gets a stream of its own (Communicator::memory_space() tells which); calls
  // synchronise it on entry and return when their copies and reductions on it have finished.
  // All ranks of a group must use the same kind of memory. Needs a CUDA build.
  std::function<MemorySpace(int rank)> memory_space;
};

absl::Status RunInProcess(int world_size, const std::function<absl::Status(Communicator&)>& fn,
                          const InProcessOptions& options = {});

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_IN_PROCESS_H_
