// A caching allocator for device memory: freed blocks are kept per (stream, size class) and handed
// out again, so a training step that allocates the same sizes every iteration calls the raw
// allocator (cudaMalloc) only in its first steps. The raw allocator is injected, so the caching
// logic is the same (and tested) with host memory on machines without a GPU.
//
//   CachingAllocator alloc({.malloc = RawMalloc, .free = RawFree, .synchronize = DeviceSync},
//                          "cuda:0");
//   void* p = alloc.Allocate(1 << 20, stream);   // cudaMalloc once...
//   alloc.Free(p);
//   void* q = alloc.Allocate(1 << 20, stream);   // ...then reused: q == p, no cudaMalloc
//   alloc.stats().raw_allocs;                    // 1
//
// Stream ordering: a block freed by a tensor last used on stream s is reused only by allocations
// on s, whose work is ordered after the freed block's work, so no event or sync is needed.
//
// Private pools (for CUDA graph capture): between BeginPool(pool, s) and EndPool(pool), every
// allocation on stream s comes from `pool` and blocks of that pool go back to it when freed, never
// to the default pool. A replayed graph therefore owns its memory: no eager allocation can be
// given an address the graph writes. A block from outside the pool (e.g. an eager tensor the
// captured function drops) freed while its stream, or the freeing thread's stream, is captured may
// still be read or written by every replay: the pool keeps it (handed to nobody) until
// ReleasePool. ReleasePool hands the pool's cached and kept blocks back. A block of a released
// pool freed while any stream is between BeginPool and EndPool (another graph's capture) is not
// handed back then (the synchronize and cudaFree would invalidate that capture): it waits, counted
// in cached_bytes, until the last EndPool (or EmptyCache outside a capture).
//
// Out of memory: the cache is emptied (after `synchronize`) and the request retried once; a second
// failure throws OpError(ResourceExhausted) naming the device, the request and the usage. While
// any stream is between BeginPool and EndPool (a CUDA graph capture, during which a device-wide
// synchronize is invalid) the cache is not emptied: the first failure throws.
#ifndef SHARDMAP_TENSOR_CUDA_CACHING_ALLOCATOR_H_
#define SHARDMAP_TENSOR_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/cuda/runtime.h"

namespace shardmap::cuda {

class CachingAllocator {
 public:
  struct RawOps {
    std::function<void*(size_t)> malloc;  // nullptr when out of memory
    std::function<void(void*)> free;
    std::function<void()> synchronize;    // before cached blocks are handed back (may be empty)
  };
  struct Stats {
    int64_t raw_allocs = 0;       // calls of the raw malloc that succeeded
    int64_t raw_frees = 0;
    int64_t cache_hits = 0;       // allocations served from the cache
    int64_t allocated_bytes = 0;  // in blocks handed out now (rounded sizes)
    int64_t cached_bytes = 0;     // in free blocks kept for reuse
    int64_t peak_allocated_bytes = 0;
  };
  using PoolId = uint64_t;  // 0 is the default pool

  CachingAllocator(RawOps raw, std::string device_name);
  ~CachingAllocator();  // hands every cached block back; blocks still allocated are leaked
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least nbytes (nbytes 0 gives a valid 512-byte block) for use on `stream`.
  void* Allocate(size_t nbytes, StreamHandle stream);
  // p must come from Allocate of this allocator (else OpError); nullptr is ignored.
  void Free(void* p);
  // As Free(p), from a thread whose current stream (allocator key) is `current`: when `current`
  // is being captured into a pool, a default-pool block is kept by that pool (see above).
  void Free(void* p, StreamHandle current);
  // Hands the default pool's cached blocks back to the raw allocator (none while a stream is
  // between BeginPool and EndPool: they stay cached).
  void EmptyCache();
  Stats stats() const;
  // Starts a new peak window: peak_allocated_bytes = allocated_bytes now (e.g. per training run).
  void ResetPeakStats();

  PoolId CreatePool();
  // Allocations on `stream` come from `pool` until EndPool. One pool per stream at a time.
  void BeginPool(PoolId pool, StreamHandle stream);
  void EndPool(PoolId pool);
  // The pool's cached blocks go back to the raw allocator (while another stream is between
  // BeginPool and EndPool: at the last EndPool, as deferred frees); its blocks still allocated
  // are handed back when freed. The pool id must not be used again.
  void ReleasePool(PoolId pool);

  // Sizes are rounded up to 512 bytes, and above 1 MiB to an eighth of their power of two (so
  // at most 12.5% waste) to keep the number of distinct classes small.
  static size_t RoundSize(size_t nbytes);

 private:
  struct Block {
    size_t size;
    StreamHandle stream;
    PoolId pool;
  };
  using FreeKey = std::tuple<PoolId, StreamHandle, size_t>;

  void* RawMallocLocked(size_t size);
  void FreeImpl(void* p, const StreamHandle* current);
  void ReleaseCachedLocked(PoolId pool);
  void FlushDeferredLocked();  // hands deferred_ back once no stream is captured

  RawOps raw_;
  std::string device_name_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;            // handed out
  std::map<FreeKey, std::vector<void*>> free_;       // cached, by (pool, stream, size)
  std::unordered_map<StreamHandle, PoolId> capturing_;  // stream -> pool while in BeginPool
  std::unordered_map<PoolId, bool> released_pools_;
  // Default-pool blocks freed during a capture into the pool: (pointer, size), freed at release.
  std::unordered_map<PoolId, std::vector<std::pair<void*, size_t>>> kept_;
  // Blocks of released pools freed during a capture: (pointer, size), freed after it.
  std::vector<std::pair<void*, size_t>> deferred_;
  PoolId next_pool_ = 1;
  Stats stats_;
};

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_CACHING_ALLOCATOR_H_
