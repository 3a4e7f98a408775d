// Host waits: every place where this process's host thread blocks until GPU work is done
// (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a device->host read, an
// NCCL call that waits for its stream) counts itself here, by kind, process-wide and per
// thread. A training step on the GPU waits once (its loss read): NCCL's blocking collectives
// are stream-ordered (collectives/nccl_communicator.h) and wait for nothing; the GPU bundle's
// overlap check (tests/gpu_nccl_overlap_check.cc) reports the count per step and fails on any
// other wait.
//
//   const HostWaitCounts before = HostWaitSnapshot();
//   RunOneStep();
//   const HostWaitCounts step = HostWaitSnapshot() - before;
//   step.total();                          // e.g. 1
//   step.ToString();                       // "d2h_read=1"
//   step[HostWait::kDeviceToHostRead];     // 1
//
// Counted by the callers (collectives/nccl_communicator.cc, tensor/cuda/device_memory.cc,
// tensor/cuda/runtime.cc, tensor/cuda/graph.cc, tensor/cuda/gemm): each blocking call once,
// whether or not the GPU happened to be done already, except where the caller first asks
// without blocking (cudaEventQuery) and then does not wait at all. Depends on nothing: it lives in
// //base, below tensor/ and collectives/, which both count their waits here.
#ifndef SHARDMAP_BASE_HOST_WAITS_H_
#define SHARDMAP_BASE_HOST_WAITS_H_

#include <array>
#include <cstdint>
#include <string>

namespace shardmap::base {

enum class HostWait : uint8_t {
  kNcclBlockingCall,  // an NCCL call waiting for its stream: Barrier(), or any blocking
                      // collective with NcclOptions::blocking_wait (else stream-ordered)
  kStreamSync,        // cudaStreamSynchronize (other than a read)
  kEventSync,         // cudaEventSynchronize
  kDeviceSync,        // cudaDeviceSynchronize
  kDeviceToHostRead,  // a device->host copy the host waits for (the step's loss read)
};
inline constexpr int kHostWaitKinds = 5;

// "nccl_blocking_call", "stream_sync", "event_sync", "device_sync", "d2h_read".
const char* HostWaitName(HostWait kind);

struct HostWaitCounts {
  std::array<int64_t, kHostWaitKinds> by_kind{};

  int64_t operator[](HostWait k) const { return by_kind[static_cast<int>(k)]; }
  int64_t total() const;
  // Kind by kind (a later snapshot minus an earlier one: the waits in between).
  HostWaitCounts operator-(const HostWaitCounts& earlier) const;
  // The kinds with a non-zero count, "name=n" separated by spaces; "none" when all are zero.
  std::string ToString() const;
};

// Counts one host wait of `kind` (thread-safe; a relaxed atomic add and a thread-local add).
void CountHostWait(HostWait kind);
// Every thread's waits so far.
HostWaitCounts HostWaitSnapshot();
// This thread's waits so far (a virtual rank's, when ranks are threads).
HostWaitCounts HostWaitSnapshotThisThread();

}  // namespace shardmap::base

#endif  // SHARDMAP_BASE_HOST_WAITS_H_
