// MemoryTracker: the bytes of tensor storage this thread allocates while it lives, on every
// device (meta, CPU, CUDA), so a shape-only run predicts a real run's memory.
//
//   MemoryTracker mem;                       // RAII; nestable (every live tracker counts)
//   Tensor a = Tensor::Empty({1024}, DType::kF32, Device::Meta());
//   Tensor b = Add(a, a);
//   mem.live_bytes();                        // 8192
//   a = Tensor();                            // frees: live 4096, peak stays 8192
//   mem.ResetPeak();                         // peak := live (e.g. between forward and backward)
//
// What is counted: the requested nbytes of each Storage (numel * dtype size), the same on every
// device. Not counted: CPU's 64-byte alignment and inline small-buffer storage, the CUDA caching
// allocator's rounding and cache, cuBLAS/cuDNN workspaces. Storage allocated before the tracker
// was made is not counted, nor is its free.
//
// Peak is taken between ops: an op's outputs count from the moment it returns, and a buffer an
// op allocates and frees before it returns (a CPU kernel's scratch, the f32 copy of a bf16 op) is
// not counted at all, in live, peak or allocated. So a CPU run and a meta run of the same program
// give EXACTLY the same live, peak and allocated bytes; a real run's true high-water mark may
// exceed peak_bytes() by at most the largest scratch of one op.
//
// Threads: a tracker counts allocations made on its own thread (each rank is a thread). A free
// on any thread decrements the trackers that counted the allocation; a tracker may be destroyed
// before the storage it counted (its state lives on with the storage). Trackers must be
// destroyed in reverse order of construction on their thread.
#ifndef SHARDMAP_TENSOR_MEMORY_TRACKER_H_
#define SHARDMAP_TENSOR_MEMORY_TRACKER_H_

#include <cstdint>
#include <memory>

namespace shardmap {

namespace internal {
struct TrackerState;
}  // namespace internal

class MemoryTracker {
 public:
  MemoryTracker();
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  int64_t live_bytes() const;       // allocated and not yet freed
  int64_t peak_bytes() const;       // the largest live_bytes() between ops
  int64_t allocated_bytes() const;  // total ever allocated (scratch excluded, see above)
  int64_t allocations() const;      // number of storages counted in allocated_bytes()
  void ResetPeak();                 // peak := live

 private:
  std::shared_ptr<internal::TrackerState> state_;
};

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_MEMORY_TRACKER_H_
