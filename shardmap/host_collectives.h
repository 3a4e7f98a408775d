// Forwarding header: host_collectives.h moved to shardmap/runtime/host_collectives.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_HOST_COLLECTIVES_H_
#define SHARDMAP_SHARDMAP_HOST_COLLECTIVES_H_

#include "shardmap/runtime/host_collectives.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_HOST_COLLECTIVES_H_
