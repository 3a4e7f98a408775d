// Forwarding header: async_collectives.h moved to shardmap/runtime/async_collectives.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_ASYNC_COLLECTIVES_H_
#define SHARDMAP_SHARDMAP_ASYNC_COLLECTIVES_H_

#include "shardmap/runtime/async_collectives.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_ASYNC_COLLECTIVES_H_
