// 64-byte-aligned CPU buffers for tensor storage, with a bounded cache of large blocks.
//
//   void* p = internal::AllocateAligned(n);   // throws OpError(ResourceExhausted) on failure
//   internal::FreeAligned(p, n);               // same n as allocated
//
// Why a cache: glibc hands blocks above its mmap threshold (at most 32 MiB) straight back to the
// kernel, so every large temporary (an activation of [8,1024,4096] f32 is 128 MiB) would be
// page-faulted and zeroed afresh, which costs more than an elementwise op over it. Freed blocks of
// >= 1 MiB are kept (up to SHARDMAP_CPU_CACHE_MB, default 1024, in total; 0 turns caching off)
// and reused for the next request of the same rounded size.
//
// Blocks of 2 MiB and more are mapped at a 2 MiB boundary and advised as transparent huge pages
// (madvise MADV_HUGEPAGE), which made memory-bound row ops and transposes 9-18% faster here;
// SHARDMAP_CPU_HUGE_PAGES=0 maps them with malloc's small pages instead.
#ifndef SHARDMAP_TENSOR_INTERNAL_CPU_ALLOCATOR_H_
#define SHARDMAP_TENSOR_INTERNAL_CPU_ALLOCATOR_H_

#include <cstddef>

namespace shardmap::internal {

void* AllocateAligned(size_t nbytes);
void FreeAligned(void* p, size_t nbytes);

// Bytes currently held in the cache (for tests).
size_t CachedBytes();

}  // namespace shardmap::internal

#endif  // SHARDMAP_TENSOR_INTERNAL_CPU_ALLOCATOR_H_
