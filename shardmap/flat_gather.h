// Forwarding header: flat_gather.h moved to shardmap/runtime/flat_gather.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_FLAT_GATHER_H_
#define SHARDMAP_SHARDMAP_FLAT_GATHER_H_

#include "shardmap/runtime/flat_gather.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_FLAT_GATHER_H_
