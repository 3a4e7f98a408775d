// Forwarding header: ops.h moved to shardmap/ops/ops.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_H_

#include "shardmap/ops/ops.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_OPS_H_
