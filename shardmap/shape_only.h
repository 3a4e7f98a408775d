// Forwarding header: shape_only.h moved to shardmap/runtime/shape_only.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_SHAPE_ONLY_H_
#define SHARDMAP_SHARDMAP_SHAPE_ONLY_H_

#include "shardmap/runtime/shape_only.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_SHAPE_ONLY_H_
