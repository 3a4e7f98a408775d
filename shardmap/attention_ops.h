// Forwarding header: attention_ops.h moved to shardmap/ops/attention_ops.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_ATTENTION_OPS_H_
#define SHARDMAP_SHARDMAP_ATTENTION_OPS_H_

#include "shardmap/ops/attention_ops.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_ATTENTION_OPS_H_
