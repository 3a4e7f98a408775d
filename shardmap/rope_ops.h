// Forwarding header: rope_ops.h moved to shardmap/ops/rope_ops.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_ROPE_OPS_H_
#define SHARDMAP_SHARDMAP_ROPE_OPS_H_

#include "shardmap/ops/rope_ops.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_ROPE_OPS_H_
