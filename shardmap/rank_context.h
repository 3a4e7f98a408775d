// Forwarding header: rank_context.h moved to shardmap/runtime/rank_context.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_RANK_CONTEXT_H_
#define SHARDMAP_SHARDMAP_RANK_CONTEXT_H_

#include "shardmap/runtime/rank_context.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_RANK_CONTEXT_H_
