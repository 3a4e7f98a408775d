// Forwarding header: device_placement.h moved to shardmap/runtime/device_placement.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_DEVICE_PLACEMENT_H_
#define SHARDMAP_SHARDMAP_DEVICE_PLACEMENT_H_

#include "shardmap/runtime/device_placement.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_DEVICE_PLACEMENT_H_
