// Copies that bypass the cache on the way to memory (non-temporal stores), for large outputs
// that nobody reads soon: writing a line normally reads it first, streaming does not.
//
//   StreamCopy(dst, src, bytes);  // dst[0, bytes) = src[0, bytes), visible to other threads
//                                 // once they synchronize with this one (it ends with a fence)
//
// Same result as memcpy; on CPUs without SSE2 it is memcpy. dst and src must not overlap.
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_STREAM_COPY_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_STREAM_COPY_H_

#include <cstddef>

namespace shardmap::collectives::internal {

void StreamCopy(void* dst, const void* src, size_t bytes);

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_STREAM_COPY_H_
