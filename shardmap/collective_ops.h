// Forwarding header: collective_ops.h moved to shardmap/ops/collective_ops.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_COLLECTIVE_OPS_H_
#define SHARDMAP_SHARDMAP_COLLECTIVE_OPS_H_

#include "shardmap/ops/collective_ops.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_COLLECTIVE_OPS_H_
