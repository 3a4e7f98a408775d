// Forwarding header: context.h moved to shardmap/runtime/context.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_CONTEXT_H_
#define SHARDMAP_SHARDMAP_CONTEXT_H_

#include "shardmap/runtime/context.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_CONTEXT_H_
